"""git and git-lfs for the Hub clones: one runner, the token passed per command, LFS tracking, pushes that retry.

The token is never written anywhere and never appears in a process argument. Each git command
gets, through its environment only (`GIT_CONFIG_KEY_n` / `GIT_CONFIG_VALUE_n`), a credential helper
scoped to `https://<hub.host>`: a shell function that reads git's request and prints
`password=$<token_env>` only when it asks for protocol https and exactly that host. git and git-lfs
ask it when a remote wants credentials; any other host (a foreign remote, an LFS server named by a
remote's .lfsconfig, a redirect), and plain http, get nothing. The helpers configured elsewhere (a
credential store that would save the token) are switched off the same way, and git may speak only
https, ssh and file (`GIT_ALLOW_PROTOCOL`: no http, git://, or `ext::`, which runs a command).
Every error is scrubbed of the token and anything else that looks like a credential.

Every command has a total time (Git.timeout_s, and what is left of Git.deadline, the limit of a whole
sync), not a time per read: git and what it starts (git-remote-https, git-lfs, ssh, the credential
helper) run in a process group of their own, with no terminal and no stdin, and when the time is up
the whole group is stopped (SIGTERM, so git removes its lock files, then SIGKILL), never only git
while its children go on pushing. A push that keeps failing never waits past the deadline either.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bigscience_ops.errors import BsopsError
from bigscience_ops.redact import scrub

GIT_TIMEOUT_S = 1800  # a push of large LFS objects may take long; a hung one must still end
STOP_GRACE_S = 5.0
"""How long a timed-out command's processes have to end after SIGTERM (git removes its lock files) before SIGKILL."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOST = re.compile(r"[a-z0-9.-]+(:[0-9]+)?")  # hub_remote checks hub.host fully; this keeps the helper's quoting sound
_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no space: anything else could add lines to git's credential protocol
ALLOWED_PROTOCOLS = "https:ssh:file"
IDENTITY = {"GIT_AUTHOR_NAME": "bsops", "GIT_AUTHOR_EMAIL": "bsops@localhost",
            "GIT_COMMITTER_NAME": "bsops", "GIT_COMMITTER_EMAIL": "bsops@localhost"}


class GitError(BsopsError):
    """A git or git-lfs command failed: carries argv, exit code and stderr (scrubbed: never the token)."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, hint: str = "",
                 secrets: Sequence[str] = ()) -> None:
        self.argv = [scrub(a, secrets) for a in argv]
        self.returncode, self.stderr = returncode, scrub(stderr, secrets)
        status = "timed out" if returncode is None else f"exited {returncode}"
        said = " / ".join(line.strip() for line in self.stderr.strip().split("\n") if line.strip())  # one line
        text = f"`{' '.join(self.argv)}` {status}: {said[-2000:] or '(no stderr)'}"
        super().__init__(text + (f". {hint}" if hint else ""))


class TokenError(BsopsError):
    """The token's environment variable, or the host it goes to, cannot be used safely."""


def credential_helper(token_env: str, host: str) -> str:
    """The helper git runs as `sh -c`: answers `get` with the token, for protocol https and `host` only."""
    if not _ENV_NAME.fullmatch(token_env):
        raise TokenError(f"hub.token_env: got {token_env!r}; allowed: the name of an environment variable "
                         "(letters, digits, _)")
    if not _HOST.fullmatch(host):
        raise TokenError(f"hub.host: got {scrub(host)!r}; allowed: a lower-case host name and an optional port")
    return ('!f() { test "$1" = get || return 0; p=; h=; '
            'while IFS= read -r l; do case "$l" in protocol=*) p="${l#protocol=}";; host=*) h="${l#host=}";; '
            '"") break;; esac; done; '
            f'test "$p" = https && test "$h" = \'{host}\' || return 0; echo username=bsops; '
            f'printf "password=%s\\n" "${{{token_env}}}"; }}; f')


def check_token(token_env: str, env: dict[str, str] | os._Environ) -> None:
    """Refuse a token that could break git's credential protocol (a newline adds a line of its own)."""
    token = env.get(token_env)
    if token and not _TOKEN.fullmatch(token):
        raise TokenError(f"environment variable {token_env} (hub.token_env): got a value with a space, line break or "
                         "non-ASCII character (not shown); allowed: the token alone, printable ASCII without spaces")


def git_env(token_env: str | None, host: str | None = None, *, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every git command: identity, no prompts, only https/ssh/file, and the token helper
    for https://<host> when a token and a host are set."""
    env = dict(os.environ if base is None else base)
    env.update(IDENTITY)
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GCM_INTERACTIVE"] = "never"
    env["GIT_ALLOW_PROTOCOL"] = ALLOWED_PROTOCOLS
    # The clones only ever add files: LFS contents already pushed are never downloaded again.
    env["GIT_LFS_SKIP_SMUDGE"] = "1"
    pairs = [("credential.helper", "")]  # drops every helper configured elsewhere (a store would save the token)
    if token_env and host and env.get(token_env):
        check_token(token_env, env)
        pairs.append((f"credential.https://{host}.helper", credential_helper(token_env, host)))
    count = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
    for i, (key, value) in enumerate(pairs, start=count):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    env["GIT_CONFIG_COUNT"] = str(count + len(pairs))
    return env


@dataclass(frozen=True)
class Git:
    """git commands in one work tree, with the token helper for https://<host> in their environment."""

    cwd: Path
    token_env: str | None = None
    host: str | None = None
    timeout_s: float = GIT_TIMEOUT_S
    """The whole of one command at most, with everything it starts."""
    deadline: float | None = None
    """time.monotonic() by which every command on this clone must be over (a whole sync's limit); None: each
    command has timeout_s alone."""

    def time_left(self) -> float:
        """Seconds the next command may take: timeout_s, or less when the deadline is nearer."""
        if self.deadline is None:
            return self.timeout_s
        return min(self.timeout_s, self.deadline - time.monotonic())

    def run(self, *args: str, check: bool = True, hint: str = "", extra_env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
        argv = ["git", *args]
        env = {**git_env(self.token_env, self.host), **(extra_env or {})}
        secrets = [env[self.token_env]] if self.token_env and env.get(self.token_env) else []
        limit = self.time_left()
        if limit <= 0:
            raise GitError(argv, None, "not started: the sync's time limit has passed", hint, secrets)
        proc = run_within(argv, self.cwd, env, limit)
        if proc.returncode is None:
            stopped = f"it ran out of its {limit:g} s and was stopped, with every process it started"
            raise GitError(argv, None, proc.stderr, f"{stopped}. {hint}" if hint else stopped, secrets)
        if check and proc.returncode != 0:
            raise GitError(argv, proc.returncode, proc.stderr, hint, secrets)
        return proc

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()


def run_within(argv: Sequence[str], cwd: Path, env: dict[str, str], timeout_s: float
               ) -> subprocess.CompletedProcess:
    """Run `argv` in a session of its own (no terminal, stdin empty) for `timeout_s` seconds in all; when the time
    is up its whole process group is stopped (SIGTERM, then SIGKILL after STOP_GRACE_S) and the result has
    returncode None with what was written until then."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
            return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
        except subprocess.TimeoutExpired as exc:
            partial = (exc.stdout, exc.stderr)
        _stop_group(proc)
        try:  # the group is gone, so are the pipes' writers: what it wrote before
            stdout, stderr = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:  # a process that left the group holds a pipe: keep what came
            stdout, stderr = _text(partial[0]), _text(partial[1])
        return subprocess.CompletedProcess(list(argv), None, stdout, stderr)  # type: ignore[arg-type]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group `proc` leads; SIGKILL to whatever of it is left after STOP_GRACE_S."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < end and _group_alive(proc.pid):
        try:
            proc.wait(0.05)  # reaped, the leader no longer counts: only what it started does
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def without_credentials(url: str) -> str:
    """`url` without user-info, query and fragment (where credentials hide in a URL)."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return scrub(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def clone_or_open(remote: str, path: Path, token_env: str | None, host: str | None = None, branch: str = "main", *,
                  deadline: float | None = None) -> Git:
    """A clone of `remote` at `path` with LFS hooks and filters installed; an existing clone is reused as it is.

    An empty remote gives a clone on `branch` with no commit yet. New clones check symlinks out as
    plain files (core.symlinks false): a link committed in the remote never points out of the clone.
    An existing clone must push to `remote`; a credential an older clone holds in its origin URL is
    removed from its config first. `deadline` (time.monotonic()) bounds every command on the clone, these
    and all that the returned Git runs (Git.deadline).
    """
    path = Path(path)
    if (path / ".git").is_dir():
        git = Git(path, token_env, host, deadline=deadline)
        url = git.out("remote", "get-url", "origin")
        if scrub(url) != url:
            url = without_credentials(url)
            git.run("remote", "set-url", "origin", url)
        if url != remote:
            raise GitError(["git", "remote", "get-url", "origin"], 0,
                           f"the clone {path} pushes to {scrub(url)!r}, not {scrub(remote)!r}",
                           "move the clone away (it is rebuilt from the remote) or pass the remote it was made for")
        return git
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".cloning")
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink()
    elif tmp.exists():
        shutil.rmtree(tmp)
    Git(path.parent, token_env, host, deadline=deadline).run(
        "clone", "--quiet", "--no-recurse-submodules", "-c", "core.symlinks=false", "--", remote, str(tmp),
        hint="check the remote URL and that the token in hub.token_env may read it")
    git = Git(tmp, token_env, host, deadline=deadline)
    git.run("lfs", "install", "--local", hint="install git-lfs (apt-get install git-lfs)")
    if git.run("rev-parse", "--verify", "--quiet", "HEAD", check=False).returncode != 0:
        git.run("symbolic-ref", "HEAD", f"refs/heads/{branch}")
    tmp.rename(path)
    return Git(path, token_env, host, deadline=deadline)


def lfs_patterns(git: Git) -> set[str]:
    """The patterns .gitattributes sends through the LFS filter."""
    attributes = git.cwd / ".gitattributes"
    if not attributes.is_file():
        return set()
    # git ends a line at '\n' and splits it at spaces and tabs only: str.split() would also cut at U+2028,
    # U+0085 and other Unicode spaces a remote's file may hold inside a pattern.
    rows = [line.strip(" \t\r").replace("\t", " ").split(" ")
            for line in attributes.read_text(encoding="utf-8").split("\n")]
    return {words[0] for words in rows if "filter=lfs" in words[1:]}


def track(git: Git, patterns: Sequence[str]) -> list[str]:
    """`git lfs track` each pattern not tracked yet; returns the new ones."""
    new = [p for p in patterns if p not in lfs_patterns(git)]
    if new:
        git.run("lfs", "track", "--", *new)
    return new


def lfs_pattern_for(relpath: str) -> str:
    """A .gitattributes pattern matching exactly one file: rooted, with special characters escaped."""
    return "/" + re.sub(r"([\[\]*?!\\ #])", r"\\\1", relpath)


def has_changes(git: Git) -> bool:
    return bool(git.out("status", "--porcelain", "--untracked-files=all"))


def commit_all(git: Git, message: str) -> str | None:
    """Stage everything (through the LFS filters) and commit; None when nothing changed."""
    git.run("add", "--all")
    if git.run("diff", "--cached", "--quiet", check=False).returncode == 0:
        return None
    git.run("commit", "--quiet", "--no-verify", "-m", message)
    return git.out("rev-parse", "HEAD")


MAX_WAIT_S = 300.0
"""The longest wait between two pushes: hub.push_attempts (at most 10) then wait 25 minutes in all, less
than the hourly period of the job that pushes."""


def push(git: Git, attempts: int, backoff_s: float = 10.0, sleep: Callable[[float], None] = time.sleep) -> int:
    """Push HEAD to origin's branch, rebasing onto what others pushed in between; returns the attempts used.

    Waits backoff_s, 2 * backoff_s, ... (never more than MAX_WAIT_S) between tries, and raises the last
    GitError after `attempts`, or as soon as the next try could not start before the clone's deadline.
    """
    branch = git.out("symbolic-ref", "--short", "HEAD")
    for attempt in range(1, attempts + 1):
        wait = min(backoff_s * 2 ** min(attempt - 1, 30), MAX_WAIT_S)
        try:
            git.run("push", "--quiet", "origin", f"HEAD:refs/heads/{branch}",
                    hint="check the remote and that the token in hub.token_env may write to it")
            return attempt
        except GitError:
            if attempt == attempts or (git.deadline is not None and time.monotonic() + wait >= git.deadline):
                raise  # no try left, or none that could start before the deadline
        sleep(wait)
        if git.run("fetch", "--quiet", "origin", check=False).returncode == 0 and \
                git.run("rev-parse", "--verify", "--quiet", f"refs/remotes/origin/{branch}", check=False).returncode == 0:
            git.run("rebase", "--quiet", f"origin/{branch}", hint="the remote changed in a way that conflicts; "
                    f"resolve it in the clone {git.cwd} or move the clone away")
    raise AssertionError("unreachable")
