"""The one reader (and the writer of `latest` and bsops.json) of a run's checkpoint folder: tags,
`latest`, bsops.json, what each global_stepN holds.

DeepSpeed writes `global_stepN/` then names it in `latest`; the trainer writes bsops.json into the
folder before `latest` moves (trainer/checkpointing.py). So a checkpoint is complete when it has
bsops.json and its step is not after the one `latest` names: a newer folder is a save in progress.

Inside a folder: `layer_XX-model_states.pt` (pipeline stages' weights), `mp_rank_XX_model_states.pt`
(engine state; with ZeRO-0 it also holds the optimizer state), `*optim_states.pt` (ZeRO and bf16
optimizer partitions), `rng_state_NNN.pt`, bsops.json. Pure Python: no torch here.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.errors import BsopsError

META = "bsops.json"
"""The trainer's record in each checkpoint folder (written with write_meta)."""
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


class CheckpointError(BsopsError):
    """A checkpoint folder cannot be read or resumed from: names the folder, what is wrong, and what to do."""


@dataclass(frozen=True)
class Checkpoint:
    """One global_stepN folder."""

    tag: str
    step: int
    path: Path

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
        file = self.path / META
        try:
            return json.loads(file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{file}: unreadable ({exc})") from None


def _kind(path: Path) -> str:
    if path.is_symlink():
        return f"a symbolic link to {os.readlink(path)!r}"
    if path.is_dir():
        return "a folder"
    return "a special file (FIFO, device or socket)" if path.exists() else "missing"


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
    """Every global_stepN folder, oldest step first (complete or not)."""
    checkpoints = Path(checkpoints)
    if not checkpoints.is_dir():
        return []
    found = [Checkpoint(p.name, step, p) for p in checkpoints.iterdir()
             if p.is_dir() and (step := step_of(p.name)) is not None]
    return sorted(found, key=lambda c: c.step)


def latest_tag(checkpoints: Path) -> str | None:
    """The tag `latest` names, None when there is no `latest` file.

    The one parser of `latest` (the trainer's resume, the ledger, backup and retention, warm starts):
    one line `global_stepN` as DeepSpeed writes it; anything else is a CheckpointError naming the file,
    what it holds and the checkpoints the folder does hold.
    """
    file = Path(checkpoints) / LATEST
    if not file.exists():
        return None
    expected = "expected one line 'global_stepN' as DeepSpeed writes it"
    if not file.is_file():  # a FIFO would block the reader for good
        raise CheckpointError(f"{file}: is {_kind(file)}, not a plain file; {expected}")
    try:
        with open(file, "rb") as handle:
            tag = handle.read(200).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file}: unreadable ({exc}); {expected}") from None
    if step_of(tag) is None:
        held = ", ".join(c.tag for c in list_checkpoints(checkpoints)[-5:]) or "none"
        raise CheckpointError(f"{file}: got {tag[:60]!r}; {expected} (last checkpoints in the folder: {held})")
    return tag


def latest_step(checkpoints: Path) -> int | None:
    """The step of the checkpoint `latest` names, None when there is no `latest` file."""
    tag = latest_tag(checkpoints)
    return None if tag is None else step_of(tag)


def write_latest(checkpoints: Path, tag: str) -> None:
    """Point `latest` at `tag` in one atomic step (a reader sees the old tag or the new one, never half)."""
    if step_of(tag) is None:
        raise ValueError(f"latest must name a tag 'global_stepN'; got {tag!r}")
    folder = Path(checkpoints)
    tmp = folder / f".{LATEST}.{os.getpid()}.tmp"
    tmp.write_text(tag, encoding="utf-8")
    os.replace(tmp, folder / LATEST)


def write_meta(path: Path, meta: dict) -> None:
    """Write a checkpoint folder's bsops.json in one atomic step (before `latest` names the folder)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".{META}.tmp"
    tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path / META)


def complete_checkpoints(checkpoints: Path) -> list[Checkpoint]:
    """The checkpoints a copy may read: with bsops.json and not newer than `latest` (a newer one is being saved)."""
    tag = latest_tag(checkpoints)
    if tag is None:
        return []
    last = step_of(tag)
    return [c for c in list_checkpoints(checkpoints) if c.step <= last and (c.path / META).is_file()]


def run_id(checkpoints: Path) -> str | None:
    """The run id of the folder (see RUN_ID), None when it has none; anything else is a CheckpointError."""
    file = Path(checkpoints) / RUN_ID
    if not file.exists() and not file.is_symlink():
        return None
    if file.is_symlink() or not file.is_file():
        raise CheckpointError(f"{file}: is {_kind(file)}, not a plain file; expected one line of 32 hex digits")
    try:
        with open(file, "rb") as handle:
            value = handle.read(100).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file}: unreadable ({exc}); expected one line of 32 hex digits") from None
    if not _RUN_ID.fullmatch(value):
        raise CheckpointError(f"{file}: got {value[:80]!r}; expected one line of 32 hex digits (delete the file and "
                              "the next backup names the run afresh)")
    return value


def new_run_id(checkpoints: Path) -> str:
    """Name the folder's run afresh (a training starting from scratch), replacing any earlier id."""
    folder = Path(checkpoints)
    folder.mkdir(parents=True, exist_ok=True)
    value = uuid.uuid4().hex
    tmp = folder / f".{RUN_ID}.{os.getpid()}.tmp"
    tmp.write_text(value + "\n", encoding="utf-8")
    os.replace(tmp, folder / RUN_ID)
    return value


def ensure_run_id(checkpoints: Path) -> str:
    """The folder's run id, created when it has none (checkpoints saved before run ids existed)."""
    return run_id(checkpoints) or new_run_id(checkpoints)
