"""Hub sync: keep a git clone per Hub repo under the run folder and push what the training wrote.

`sync` mirrors the run's logs/, tensorboard/ and codecarbon/ folders into clones of hub.logs_repo,
hub.tensorboard_repo and hub.codecarbon_repo (under <run>/hub/<what>/): it copies the files that
changed, the run's evaluation results (<run>/eval/global_stepN.json, ops/evaluate/results.py) into the logs
clone's eval/ folder, writes the run's chronicle (ops/keep/chronicle.py) as CHRONICLE.md at the top of the logs clone,
stores growing and large files with git-lfs (main_log.txt, TensorBoard event files,
anything over hub.lfs_size_mb), commits only when something changed and pushes with retries. One
flock per clone makes an overlapping run wait (up to wait_s) or skip; it never touches the clone
while another run holds it. `publish_folder` puts one folder (a converted checkpoint) under a
sub-folder of hub.checkpoints_repo's clone the same way: one folder per step, not one branch.

The remote is the Hub (`https://<hub.host>/<repo>`, created private when missing, with
huggingface_hub), or any git remote: hub.remote_template with {repo}, or an explicit URL, each
checked by hub_remote.py (no credential inside, no http, no `ext::`). The token comes from the
environment variable hub.token_env and is handed to git per command, for https://<hub.host> only
(see gitlfs.py); every error is scrubbed of it.

The remote's files are untrusted: hub-sync never follows a link in its clone. New clones check
links out as plain files, a file is never written at or under a path the clone records as a link
(or that is one on disk): it is refused and reported, and the rest is pushed. A remote whose
.lfsconfig would send LFS uploads elsewhere, or whose .gitattributes is a link, is refused.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from bigscience_ops import hub_remote
from bigscience_ops.deadline import Deadline, in_time
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.evaluate import results as eval_results
from bigscience_ops.ops.keep import chronicle, gitlfs
from bigscience_ops.redact import scrub
from bigscience_ops.run import log as runlog
from bigscience_ops.schema import Experiment, HubConfig

WHATS = ("logs", "tensorboard", "codecarbon")
# Growing files go through LFS from the first byte, so history never holds their full copies.
ALWAYS_LFS = {"logs": (runlog.LOG_NAME,), "tensorboard": ("*tfevents*",), "codecarbon": (),
              "checkpoints": ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.h5", "*.msgpack", "*.onnx")}


class HubSyncError(BsopsError):
    """A sync cannot run as asked: a missing repo setting, a bad --what, an unusable remote."""


@dataclass(frozen=True)
class HubSettings:
    """What the Hub sync takes of the experiment, taken out once by `settings` (the command, the hourly job)."""

    name: str
    """The experiment's name: in commit messages, errors, and the repo name a --remote push makes up."""
    hub: HubConfig
    """The hub section: the repos, where the token goes (host, token_env, remote_template), LFS, pushes."""
    output: str | None
    """paths.output: the run folder; the clones are under <output>/hub/, the eval results under <output>/eval/."""
    logs: str | None
    """paths.logs: mirrored into the logs repo's clone (with the eval results and CHRONICLE.md)."""
    tensorboard: str | None
    """paths.tensorboard: mirrored into the tensorboard repo's clone."""
    codecarbon: str | None
    """paths.codecarbon: mirrored into the codecarbon repo's clone."""
    chronicle: Callable[[], str]
    """The run's chronicle as CHRONICLE.md holds it (ops/keep/chronicle.py reads the run as `bsops chronicle` does)."""

    def folder(self, what: str) -> Path:
        """The run's folder of one of WHATS."""
        return Path(getattr(self, what))


def settings(exp: Experiment) -> HubSettings:
    """The Hub sync's settings from the experiment (the hub section as the experiment file says today)."""
    paths = exp.paths
    return HubSettings(exp.name, exp.hub, paths.output, paths.logs, paths.tensorboard, paths.codecarbon,
                       lambda: chronicle.markdown(exp, writer="`bsops hub-sync`", stamped=False))


@dataclass
class SyncResult:
    """What one repo's sync did."""

    what: str
    repo: str
    remote: str
    clone: Path
    copied: list[str] = field(default_factory=list)
    lfs_patterns_added: list[str] = field(default_factory=list)
    commit: str | None = None
    push_attempts: int = 0
    skipped: str | None = None
    refused: list[str] = field(default_factory=list)
    """Files not written because the clone holds a link at or above them (see the module's doc)."""
    chronicle: str | None = None
    """logs only: `updated` when CHRONICLE.md changed, or why it could not be written; None when unchanged."""
    too_large: list[str] = field(default_factory=list)
    """logs only: eval result files larger than results.MAX_RESULT (no reader reads them), not pushed."""

    def describe(self) -> str:
        if self.skipped:
            return f"{self.what}: skipped: {self.skipped}"
        pushed = f"; pushed ({self.push_attempts} attempt(s))" if self.push_attempts else ""
        made = f"committed {self.commit[:12]}" if self.commit else "nothing new to commit"
        refused = f"; {len(self.refused)} refused (a link in the clone): {', '.join(self.refused[:5])}" \
            if self.refused else ""
        told = f"; {chronicle.FILE_NAME} {self.chronicle}" if self.chronicle else ""
        large = (f"; {len(self.too_large)} eval result(s) over {eval_results.MAX_RESULT >> 20} MiB not pushed (not "
                 f"one bsops eval wrote): {', '.join(self.too_large[:5])}" if self.too_large else "")
        return f"{self.what} -> {self.repo}: {len(self.copied)} file(s) copied{told}, {made}{pushed}{refused}{large}"


def remote_for(run: HubSettings, repo: str, override: str | None = None) -> tuple[str, bool]:
    """(git URL, whether it is the Hub) for one repo; raises ConfigError for a remote hub_remote refuses."""
    if override:
        hub_remote.check_remote(override, "--remote", "hub-sync")
        return override, False
    if run.hub.remote_template:
        url = run.hub.remote_template.replace("{repo}", repo)
        hub_remote.check_remote(url, "hub.remote_template", run.name)
        return url, False
    url = f"{hub_endpoint(run)}/{repo}"
    hub_remote.check_remote(url, f"hub.{repo}", run.name)
    return url, True


def hub_endpoint(run: HubSettings) -> str:
    """https://<hub.host>; HF_ENDPOINT, when set, must name that same place (the token goes nowhere else)."""
    endpoint = hub_remote.endpoint(run.hub.host)
    env = os.environ.get("HF_ENDPOINT")
    if env and env.rstrip("/").lower() != endpoint:
        raise HubSyncError(f"HF_ENDPOINT: got {scrub(env)!r} while hub.host is {run.hub.host!r}; allowed: "
                           f"{endpoint} or unset: the Hub token goes only to https://<hub.host>, so set hub.host "
                           "in the experiment to use another Hub")
    return endpoint


HUB_API_S = 60.0
"""Seconds the Hub's API may take to create (or find) a repo: huggingface_hub's call takes no total timeout."""
SYNC_LIMIT_S = 45 * 60.0
"""Seconds one `bsops hub-sync` of a run may take, every git and git-lfs command and the waits between pushes
included: the hourly job's Slurm limit is longer, so a stuck sync still ends in time to send its alert."""


def ensure_hub_repo(run: HubSettings, repo: str) -> None:
    """Create the repo on the Hub when missing (private unless hub.private is false)."""
    from huggingface_hub import HfApi  # lazy: only Hub remotes need it

    token = os.environ.get(run.hub.token_env)
    if not token:
        raise HubSyncError(f"environment variable {run.hub.token_env} (hub.token_env) is not set; export a Hub token "
                           f"with write access to {repo!r} in it, or set hub.remote_template for another git remote")
    gitlfs.check_token(run.hub.token_env, os.environ)
    try:
        in_time(lambda: HfApi(endpoint=hub_endpoint(run), token=token).create_repo(
            repo, private=run.hub.private, exist_ok=True), Deadline(HUB_API_S), f"creating Hub repo {repo!r}")
    except HubSyncError:
        raise
    except Exception as exc:  # huggingface_hub raises many types; the message matters here
        raise HubSyncError(f"could not create or find Hub repo {repo!r} on {hub_endpoint(run)}: "
                           f"{scrub(str(exc), [token])}") from None


def run_dir(run: HubSettings) -> Path:
    if not run.output:
        raise HubSyncError(f"experiment {run.name!r} has no paths.output; load it through bsops so paths are derived")
    return Path(run.output)


def clone_path(run: HubSettings, what: str) -> Path:
    return run_dir(run) / "hub" / what


@contextmanager
def locked(lock_file: Path, wait_s: float) -> Iterator[bool]:
    """flock on `lock_file`: yields True once held, False when another process held it for wait_s seconds."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


BOOKKEEPING = ".bsops-"  # prefix of the files bsops keeps beside the logs for itself


def _walk_files(root: Path) -> Iterator[Path]:
    """The regular files under root, never entering or yielding a link."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(folder, d)))
        for name in sorted(files):
            path = Path(folder, name)
            if not path.is_symlink() and path.is_file():
                yield path


def linked_paths(git: gitlfs.Git) -> frozenset[str]:
    """The paths the clone's index records as links (mode 120000), whatever core.symlinks made of them on disk."""
    out = git.run("ls-files", "-s", "-z").stdout
    return frozenset(entry.split("\t", 1)[1] for entry in out.split("\0") if entry.startswith("120000 "))


def _link_at(root: Path, rel: PurePosixPath, links: frozenset[str]) -> str | None:
    """The first part of root/rel (itself or a folder above it) that is a link in the index or on disk, else None."""
    for i in range(1, len(rel.parts) + 1):
        part = PurePosixPath(*rel.parts[:i])
        path = root.joinpath(*part.parts)
        if part.as_posix() in links or path.is_symlink():
            return part.as_posix()
        if i < len(rel.parts) and path.exists() and not path.is_dir():
            return part.as_posix()  # a file where a folder must be: no place to write below it
    return None


def copy_changed(src: Path, clone: Path, links: frozenset[str] = frozenset(), prefix: PurePosixPath = PurePosixPath(),
                 keep: Callable[[PurePosixPath], bool] | None = None) -> tuple[list[str], list[str]]:
    """Copy each file of src whose size or mtime differs from its copy in the clone's `prefix` folder:
    (copied, refused) paths relative to src.

    Links in src are not followed. A file whose place in the clone is, or lies under, a link (`links`:
    the paths the clone records as links) is refused, never written through. bsops' own bookkeeping
    beside the logs (`.bsops-*`: the alert state with its error texts, its lock) stays on the cluster. `keep`: only
    the files (path relative to src) it says yes to.
    """
    copied, refused = [], []
    dst = clone.joinpath(*prefix.parts)
    for path in _walk_files(src):
        rel = PurePosixPath(path.relative_to(src).as_posix())
        if rel.parts[0] in (".git", ".gitattributes", ".lfsconfig", ".gitmodules") or path.name.startswith(BOOKKEEPING):
            continue
        if keep is not None and not keep(rel):
            continue
        if _link_at(clone, prefix / rel, links) is not None:
            refused.append(rel.as_posix())
            continue
        target = dst.joinpath(*rel.parts)
        stat = path.stat()
        if target.is_file():
            have = target.stat()
            if have.st_size == stat.st_size and have.st_mtime_ns == stat.st_mtime_ns:
                continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.bsops-tmp")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()  # a link there would take the copy elsewhere
        shutil.copy2(path, tmp)
        os.replace(tmp, target)
        copied.append(rel.as_posix())
    return copied, refused


def copy_results(output: Path, clone: Path, links: frozenset[str] = frozenset()
                 ) -> tuple[list[str], list[str], list[str]]:
    """The run's evaluation result files (<output>/eval/global_stepN.json: plain files, no link followed) copied
    into the clone's eval/ folder where changed, as copy_changed does: (copied, refused, too large) as eval/NAME.
    The eval folder's other files (the scheduler's jobs.jsonl, temporaries) stay on the cluster, and so does a
    result file larger than results.MAX_RESULT, which no reader reads."""
    src = output / eval_results.FOLDER
    if src.is_symlink() or not src.is_dir():
        return [], [], []
    prefix = PurePosixPath(eval_results.FOLDER)
    oversized = [path.name for path in _walk_files(src) if path.parent == src
                 and eval_results.FILE.fullmatch(path.name) and path.stat().st_size > eval_results.MAX_RESULT]
    copied, refused = copy_changed(src, clone, links, prefix, keep=lambda rel: len(rel.parts) == 1 and bool(
        eval_results.FILE.fullmatch(rel.name)) and rel.name not in oversized)
    return ([f"{prefix}/{name}" for name in copied], [f"{prefix}/{name}" for name in refused],
            [f"{prefix}/{name}" for name in oversized])


def write_chronicle(run: HubSettings, clone: Path, links: frozenset[str]) -> str | None:
    """Write the run's chronicle as CHRONICLE.md at the top of the logs clone: `updated` when it changed,
    None when it did not, or why it was not written (a link there, an unreadable record): one line that
    never stops the logs' sync. Unstamped, so it changes only when the run does."""
    name = chronicle.FILE_NAME
    if _link_at(clone, PurePosixPath(name), links) is not None:
        return "not written: it is a link in the clone"
    try:
        text = run.chronicle()
    except (BsopsError, OSError) as exc:
        return f"not written: {scrub(' '.join(str(exc).split()))}"
    target = clone / name
    if target.is_file() and target.read_bytes() == text.encode("utf-8"):
        return None
    tmp = clone / f".{name}.bsops-tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return "updated"


def large_files(root: Path, limit_mb: float) -> list[str]:
    limit = limit_mb * 1024 * 1024
    return sorted(p.relative_to(root).as_posix() for p in _walk_files(root)
                  if ".git" not in p.relative_to(root).parts and p.stat().st_size > limit)


def check_clone(git: gitlfs.Git, links: frozenset[str]) -> None:
    """Refuse a clone whose remote steers git-lfs elsewhere (.lfsconfig) or links its .gitattributes out."""
    if (git.cwd / ".lfsconfig").exists() or (git.cwd / ".lfsconfig").is_symlink():
        raise HubSyncError(f"the remote of {git.cwd} holds .lfsconfig: got a file that can send LFS uploads to another "
                           "server; allowed: no .lfsconfig (remove it from the remote, then move the clone away)")
    if ".gitattributes" in links or (git.cwd / ".gitattributes").is_symlink():
        raise HubSyncError(f"the remote of {git.cwd} holds .gitattributes as a link: got a link git-lfs would write "
                           "through; allowed: a plain .gitattributes file (fix the remote, then move the clone away)")


def _unpushed(git: gitlfs.Git) -> bool:
    if git.run("rev-parse", "--verify", "--quiet", "HEAD", check=False).returncode != 0:
        return False  # no commit at all
    branch = git.out("symbolic-ref", "--short", "HEAD")
    upstream = f"refs/remotes/origin/{branch}"
    if git.run("rev-parse", "--verify", "--quiet", upstream, check=False).returncode != 0:
        return True
    return git.out("rev-list", "--count", f"{upstream}..HEAD") != "0"


def _commit_and_push(run: HubSettings, git: gitlfs.Git, what: str, message: str, backoff_s: float,
                     result: SyncResult) -> None:
    patterns = list(ALWAYS_LFS[what]) + [gitlfs.lfs_pattern_for(p) for p in large_files(git.cwd, run.hub.lfs_size_mb)]
    result.lfs_patterns_added = gitlfs.track(git, patterns)
    result.commit = gitlfs.commit_all(git, message)
    if _unpushed(git):  # this commit, or one an earlier run could not push
        result.push_attempts = gitlfs.push(git, run.hub.push_attempts, backoff_s)


def _open_clone(run: HubSettings, what: str, repo: str, remote: str | None,
                deadline: float | None = None) -> tuple[gitlfs.Git, str, frozenset[str]]:
    """The clone, its remote and the links its index records, checked (see check_clone); `deadline`
    (time.monotonic()) bounds every git command on it."""
    url, is_hub = remote_for(run, repo, remote)
    path = clone_path(run, what)
    if is_hub and not (path / ".git").is_dir():
        ensure_hub_repo(run, repo)
    try:
        git = gitlfs.clone_or_open(url, path, run.hub.token_env, run.hub.host, deadline=deadline)
    except gitlfs.GitError as exc:
        if url.lower().startswith("https://") and not hub_remote.offers_token(url, run.hub.host):
            raise gitlfs.GitError(exc.argv, exc.returncode, exc.stderr,
                                  f"the token in hub.token_env goes only to https://{run.hub.host} (hub.host), not to "
                                  "this remote: set hub.host if it is your Hub") from None
        raise
    links = linked_paths(git)
    check_clone(git, links)
    return git, url, links


def repo_name(run: HubSettings, what: str, remote: str | None) -> str:
    """The Hub repository `what` (logs, checkpoints) goes to: hub.<what>_repo, else <run>-<what> under a --remote
    URL; a HubSyncError without either (`bsops hub-sync --dry-run` names it through here too)."""
    repo = getattr(run.hub, f"{what}_repo")
    if repo:
        return repo
    if remote:
        return f"{run.name}-{what}"
    raise HubSyncError(f"hub.{what}_repo is not set for {run.name!r}; set it in the experiment, or pass --remote URL")


def selected(run: HubSettings, what: Sequence[str] | None, remote: str | None) -> list[str]:
    """The kinds to sync: those asked for, else every kind with a configured repo."""
    if what:
        unknown = [w for w in what if w not in WHATS]
        if unknown:
            raise HubSyncError(f"--what: got {', '.join(unknown)}; allowed: {', '.join(WHATS)}")
        chosen = list(dict.fromkeys(what))
    else:
        chosen = [w for w in WHATS if getattr(run.hub, f"{w}_repo")]
        if not chosen:
            raise HubSyncError(f"{run.name!r} sets none of hub.logs_repo, hub.tensorboard_repo, hub.codecarbon_repo; "
                               "set them, or pass --what with --remote URL")
    if remote and len(chosen) != 1:
        raise HubSyncError(f"--remote pushes one repo: got --what {','.join(chosen) or '(all)'}; pass exactly one of "
                           f"{', '.join(WHATS)}")
    return chosen


def sync(run: HubSettings, what: Sequence[str] | None = None, remote: str | None = None, wait_s: float = 0.0,
         backoff_s: float = 10.0, limit_s: float | None = SYNC_LIMIT_S) -> list[SyncResult]:
    """Sync each selected kind; one result per repo. All of it ends within `limit_s` (None: no limit): a git
    command still running then is stopped and its sync fails with a GitError naming it."""
    deadline = None if limit_s is None else time.monotonic() + limit_s
    return [sync_one(run, w, remote, wait_s, backoff_s, deadline) for w in selected(run, what, remote)]


def sync_one(run: HubSettings, what: str, remote: str | None = None, wait_s: float = 0.0,
             backoff_s: float = 10.0, deadline: float | None = None) -> SyncResult:
    repo = repo_name(run, what, remote)
    src = run.folder(what)
    path = clone_path(run, what)
    url = remote_for(run, repo, remote)[0]
    result = SyncResult(what, repo, url, path)
    with locked(path.with_name(f"{what}.lock"), wait_s) as held:
        if not held:
            result.skipped = f"another sync of {path} has held its lock for {wait_s:g} s; this run leaves it alone"
            return result
        git, result.remote, links = _open_clone(run, what, repo, remote, deadline)
        if src.is_dir():
            result.copied, result.refused = copy_changed(src, path, links)
            if what == "logs":
                evaluated, refused, result.too_large = copy_results(run_dir(run), path, links)
                result.copied += evaluated
                result.refused += refused
                result.chronicle = write_chronicle(run, path, links)
        elif not _unpushed(git):
            result.skipped = f"{src} does not exist yet"
            return result
        now = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %z")
        _commit_and_push(run, git, what, f"{what} of {run.name} at {now}: {len(result.copied)} file(s)",
                         backoff_s, result)
    return result


def _check_subdir(dest_subdir: str) -> PurePosixPath:
    sub = PurePosixPath(dest_subdir)
    if not dest_subdir or sub.is_absolute() or any(part in ("..", ".", ".git", "") for part in sub.parts):
        raise HubSyncError(f"dest_subdir: got {dest_subdir!r}; allowed: a relative folder such as 'global_step1000', "
                           "without '..', '.' or '.git'")
    return sub


def publish_folder(run: HubSettings, src: Path, dest_subdir: str, *, remote: str | None = None,
                   wait_s: float = 600.0, backoff_s: float = 10.0) -> str:
    """Put the files of `src` under `dest_subdir` of hub.checkpoints_repo and push.

    The sub-folder is replaced as a whole (files no longer in src are removed); large files and
    model weights go through git-lfs. Returns the new commit's sha, or "unchanged".
    """
    sub = _check_subdir(dest_subdir)
    src = Path(src)
    if not src.is_dir():
        raise HubSyncError(f"publish: {src} is not a folder")
    repo = repo_name(run, "checkpoints", remote)
    path = clone_path(run, "checkpoints")
    with locked(path.with_name("checkpoints.lock"), wait_s) as held:
        if not held:
            raise HubSyncError(f"another upload has held the lock on {path} for {wait_s:g} s; try again when it is done")
        git, url, links = _open_clone(run, "checkpoints", repo, remote)
        link = _link_at(path, sub, links)
        if link is not None:
            raise HubSyncError(f"dest_subdir: got {dest_subdir!r}, but {link} is a link in the clone {path} (committed "
                               "in the remote); allowed: a folder that is no link and lies under none")
        target = path.joinpath(*sub.parts)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        result = SyncResult("checkpoints", repo, url, path)
        result.copied, result.refused = copy_changed(src, path, links, sub)
        if result.refused:
            raise HubSyncError(f"publish: {len(result.refused)} file(s) of {src} lie under a link in the clone {path}: "
                               f"{', '.join(result.refused[:5])}; allowed: no link in the remote's {sub}")
        _commit_and_push(run, git, "checkpoints", f"{sub} of {run.name}", backoff_s, result)
    return result.commit or "unchanged"
