"""The one reader (and the writer of `latest` and bsops.json) of a run's checkpoint folder: tags,
`latest`, bsops.json, what each global_stepN holds and whether it is complete.

A checkpoint is complete when its manifest is committed (checkpoints/manifest.py): the trainer writes
every rank's files, then the manifest, then `latest` (trainer/checkpointing.py). A global_stepN folder
without a committed manifest is a save that did not finish; no command resumes from, backs up, counts,
rolls back to, evaluates or deletes because of it. `latest` names the checkpoint a resume takes first;
the trainer's resume checks it against its manifest and falls back (checkpoints/resume.py).

Inside a folder: `layer_XX-model_states.pt` (pipeline stages' weights), `mp_rank_XX_model_states.pt`
(engine state; with ZeRO-0 it also holds the optimizer state), `*optim_states.pt` (ZeRO and bf16
optimizer partitions), `rng_state_NNN.pt`, bsops.json, manifest.json. Pure Python: no torch here.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.checkpoints import manifest as manifests
from bigscience_ops.checkpoints.manifest import Manifest, ManifestError
from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import Problem, RecordFileError, excerpt, kind_of, read_small, write_atomically

META = "bsops.json"
"""The trainer's record in each checkpoint folder (written with write_meta)."""
COMMIT_KEY = "commit"
"""bsops.json of a save that commits with a manifest says so (`"commit": "manifest"`): such a folder without its
manifest is a save that did not finish, never a checkpoint from before manifests (which may be adopted)."""
TAG = re.compile(r"global_step([0-9]{1,18})")
"""ASCII digits only (`\\d` also takes Unicode digits: global_step１０ would be step 10), and few enough for int()."""
LATEST = "latest"
UNIVERSAL_SUFFIX = "_universal"
"""global_stepN_universal: DeepSpeed's universal copy of global_stepN, made when a run changes layout."""
RUN_ID = "bsops-run-id"
"""One line of 32 hex digits naming the run whose checkpoints the folder holds; a fresh start writes a new one."""
_RUN_ID = re.compile(r"[0-9a-f]{32}")
OPTIMIZER_FILE = re.compile(r"(.*_)?optim_states\.pt")
MODEL_STATES_FILE = re.compile(r"mp_rank_[0-9]+_model_states\.pt")


META_LIMIT = 1 << 20
"""The largest bsops.json read: the trainer writes a few kB."""


class CheckpointError(BsopsError):
    """A checkpoint folder cannot be read or resumed from: names the folder, what is wrong, and what to do."""


@dataclass(frozen=True)
class Checkpoint:
    """One global_stepN folder (or a link of that name: listed so it can be refused by name, never read)."""

    tag: str
    step: int
    path: Path

    @property
    def is_link(self) -> bool:
        """Whether the folder is a symbolic link: refused by every command (backup, retention, rollback, info)."""
        return self.path.is_symlink()

    def refusal(self) -> str | None:
        """Why this is not a checkpoint folder any command may use (a link, not a folder), None when it is one."""
        if self.is_link:
            return (f"{self.path} is {kind_of(self.path)}, not the checkpoint's own folder; a checkpoint that is a "
                    "link is refused by every command (move the folder itself there)")
        if not self.path.is_dir():
            return f"{self.path} is {kind_of(self.path)}, not a checkpoint folder"
        return None

    def files(self) -> list[str]:
        """Every file below the folder, as sorted relative POSIX paths.

        A checkpoint holds plain files and folders only: a symbolic link (which could make a copy read,
        or a deletion reach, something outside the folder) or a FIFO or device is a CheckpointError.
        """
        found = []
        for p in sorted(self.path.rglob("*")):
            if p.is_symlink() or not (p.is_file() or p.is_dir()):
                raise CheckpointError(f"{p}: is {_kind(p)} inside checkpoint {self.tag}; a checkpoint holds plain "
                                      "files and folders only: not read")
            if p.is_file():
                found.append(p.relative_to(self.path).as_posix())
        return found

    def meta(self) -> dict:
        """The folder's bsops.json (a JSON object); a link, a FIFO, a huge or unreadable file is a CheckpointError."""
        file = self.path / META
        refusal = self.refusal()
        if refusal is not None:
            raise CheckpointError(refusal)
        try:
            data = read_small(file, META_LIMIT)
            if data is None:
                raise CheckpointError(f"{file}: missing; the save did not finish, or it was not written by bsops")
            meta = json.loads(data.decode("utf-8"))
        except RecordFileError as exc:
            raise CheckpointError(str(exc)) from None
        except (ValueError, RecursionError) as exc:
            raise CheckpointError(f"{file}: unreadable ({type(exc).__name__}); expected the JSON object the trainer "
                                  "writes") from None
        if not isinstance(meta, dict):
            raise CheckpointError(f"{file}: got a JSON {type(meta).__name__}; expected the JSON object the trainer "
                                  "writes")
        return meta

    def manifest(self) -> Manifest | None:
        """The folder's committed manifest, None when it has none; a folder that is a link, or a manifest that cannot
        be read, is a CheckpointError."""
        refusal = self.refusal()
        if refusal is not None:
            raise CheckpointError(refusal)
        try:
            return manifests.read(self.path)
        except ManifestError as exc:
            raise CheckpointError(str(exc)) from None

    def committed(self) -> Manifest | None:
        """The manifest when the checkpoint is complete: committed, readable, and every file it lists there with its
        size (a stat each, no content read); None otherwise."""
        try:
            found = self.manifest()
        except CheckpointError:
            return None
        if found is None or not manifests.verify(self.path, found, hashes=False).ok:
            return None
        return found

    def saved_before_manifests(self) -> bool:
        """Whether the folder is a save from before manifests: bsops.json without the commit key, no manifest."""
        if self.is_link or (self.path / manifests.MANIFEST).exists():
            return False
        try:
            return COMMIT_KEY not in self.meta()
        except CheckpointError:
            return False


def _kind(path: Path) -> str:
    return kind_of(Path(path))


def is_optimizer_file(relpath: str) -> bool:
    """ZeRO / bf16 optimizer partitions: never part of a weights-only copy."""
    return OPTIMIZER_FILE.fullmatch(Path(relpath).name) is not None


def is_model_states_file(relpath: str) -> bool:
    """DeepSpeed's engine state per model-parallel rank; holds the optimizer state under ZeRO-0."""
    return MODEL_STATES_FILE.fullmatch(Path(relpath).name) is not None


def step_of(tag: str) -> int | None:
    match = TAG.fullmatch(tag)
    return int(match.group(1)) if match else None


def list_checkpoints(checkpoints: Path) -> list[Checkpoint]:
    """Every global_stepN folder, oldest step first (complete or not). A global_stepN that is a link (to a
    folder) is listed too, so that each command can refuse it by name (Checkpoint.refusal); it is never complete."""
    checkpoints = Path(checkpoints)
    if not checkpoints.is_dir():
        return []
    found = [Checkpoint(p.name, step, p) for p in checkpoints.iterdir()
             if p.is_dir() and (step := step_of(p.name)) is not None]
    return sorted(found, key=lambda c: c.step)


def linked_checkpoints(checkpoints: Path) -> list[Problem]:
    """A problem for each global_stepN of the folder that is a symbolic link (refused by every command)."""
    return [Problem(str(c.path), 0, f"is {kind_of(c.path)}: a checkpoint that is a link is refused by every command")
            for c in list_checkpoints(checkpoints) if c.is_link]


def saved_checkpoints(checkpoints: Path) -> list[Checkpoint]:
    """The complete checkpoints, whatever `latest` says: what the watchdog falls back on to say where a run stands
    while `latest` cannot be read."""
    return complete_checkpoints(checkpoints)


def latest_tag(checkpoints: Path) -> str | None:
    """The tag `latest` names, None when there is no `latest` file.

    The one parser of `latest` (the trainer's resume, the ledger, backup and retention, warm starts):
    one line `global_stepN` as DeepSpeed writes it; anything else is a CheckpointError naming the file,
    what is wrong (with at most a short repr of what it holds) and the checkpoints the folder does hold.
    A `latest` that is a link is refused unread, as a FIFO (a reader would block on it) or a folder is.
    """
    file = Path(checkpoints) / LATEST
    expected = "expected one line 'global_stepN' as DeepSpeed writes it"
    try:
        data = read_small(file, 200)
    except RecordFileError as exc:
        raise CheckpointError(f"{exc}; {expected}") from None
    if data is None:
        if file.is_symlink():  # a link to nothing
            raise CheckpointError(f"{file}: is {kind_of(file)}, not a plain file; {expected}")
        return None
    try:
        tag = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{file}: unreadable (not UTF-8 text: {excerpt(data)}); {expected}") from None
    if step_of(tag) is None:
        held = ", ".join(c.tag for c in list_checkpoints(checkpoints)[-5:]) or "none"
        raise CheckpointError(f"{file}: got {excerpt(tag)}; {expected} (last checkpoints in the folder: {held})")
    return tag


def latest_step(checkpoints: Path) -> int | None:
    """The step of the checkpoint `latest` names, None when there is no `latest` file."""
    tag = latest_tag(checkpoints)
    return None if tag is None else step_of(tag)


def latest_checkpoint(checkpoints: Path) -> Checkpoint | None:
    """The checkpoint `latest` names, None when there is no `latest`; a `latest` that cannot be read, or that names
    a folder that is missing, a link or not a folder, is a CheckpointError."""
    tag = latest_tag(checkpoints)
    if tag is None:
        return None
    ckpt = Checkpoint(tag, step_of(tag), Path(checkpoints) / tag)
    if not (ckpt.path.exists() or ckpt.path.is_symlink()):
        held = ", ".join(c.tag for c in list_checkpoints(checkpoints)[-5:]) or "none"
        raise CheckpointError(f"{Path(checkpoints) / LATEST}: names {tag}, which is not in the folder (last "
                              f"checkpoints there: {held}); a write of `latest` was cut short, or the folder moved")
    refusal = ckpt.refusal()
    if refusal is not None:
        raise CheckpointError(f"{Path(checkpoints) / LATEST}: names {tag}, but {refusal}")
    return ckpt


def write_latest(checkpoints: Path, tag: str) -> None:
    """Point `latest` at `tag` in one atomic step (a reader sees the old tag or the new one, never half):
    written beside it, fsynced, renamed over it."""
    if step_of(tag) is None:
        raise ValueError(f"latest must name a tag 'global_stepN'; got {tag!r}")
    write_atomically(Path(checkpoints) / LATEST, tag.encode("utf-8"))


def write_meta(path: Path, meta: dict) -> None:
    """Write a checkpoint folder's bsops.json in one atomic step (before `latest` names the folder)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_atomically(path / META, (json.dumps(meta, indent=2) + "\n").encode("utf-8"))


def complete_checkpoints(checkpoints: Path) -> list[Checkpoint]:
    """The checkpoints every command may read, oldest first: those with a committed manifest whose files are all
    there at their recorded sizes (Checkpoint.committed); a folder that is a link is never one. Whether `latest`
    names them does not matter: the trainer moves `latest` only after the manifest."""
    return [c for c in list_checkpoints(checkpoints) if c.committed() is not None]


def resume_step(checkpoints: Path) -> int | None:
    """The step a resume starts from, as far as the folder tells without reading a file's content: the checkpoint
    `latest` names when it is complete (or saved before manifests: the trainer adopts it), else the newest complete
    one; None when there is none. A `latest` that cannot be read, or that names a save that did not finish, is not
    believed (the trainer's resume falls back the same way, after checking the files' content too)."""
    try:
        named = latest_checkpoint(checkpoints)
    except CheckpointError:
        named = None
    if named is not None and (named.committed() is not None or named.saved_before_manifests()):
        return named.step
    complete = complete_checkpoints(checkpoints)
    return complete[-1].step if complete else None


def incomplete_checkpoints(checkpoints: Path) -> list[Checkpoint]:
    """The global_stepN folders that are not complete checkpoints (links left out): saves that did not finish,
    folders whose files no longer match their manifest, and saves from before manifests not yet adopted."""
    return [c for c in list_checkpoints(checkpoints) if not c.is_link and c.committed() is None]


def run_id(checkpoints: Path) -> str | None:
    """The run id of the folder (see RUN_ID), None when it has none; anything else is a CheckpointError."""
    file = Path(checkpoints) / RUN_ID
    expected = "expected one line of 32 hex digits"
    try:
        data = read_small(file, 100)
    except RecordFileError as exc:
        raise CheckpointError(f"{exc}; {expected}") from None
    if data is None:
        if file.is_symlink():
            raise CheckpointError(f"{file}: is {kind_of(file)}, not a plain file; {expected}")
        return None
    try:
        value = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{file}: unreadable (not UTF-8 text: {excerpt(data)}); {expected}") from None
    if not _RUN_ID.fullmatch(value):
        raise CheckpointError(f"{file}: got {excerpt(value)}; {expected} (delete the file and the next backup names "
                              "the run afresh)")
    return value


def new_run_id(checkpoints: Path) -> str:
    """Name the folder's run afresh (a training starting from scratch), replacing any earlier id."""
    value = uuid.uuid4().hex
    write_run_id(checkpoints, value)
    return value


def write_run_id(folder: Path, value: str) -> None:
    """Record run id `value` in `folder` (a checkpoints folder, or the run folder beside it), replacing any."""
    if not _RUN_ID.fullmatch(value):
        raise ValueError(f"a run id is 32 hex digits; got {value!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / RUN_ID, (value + "\n").encode("utf-8"))


def ensure_run_id(checkpoints: Path) -> str:
    """The folder's run id, created when it has none (checkpoints saved before run ids existed)."""
    return run_id(checkpoints) or new_run_id(checkpoints)
