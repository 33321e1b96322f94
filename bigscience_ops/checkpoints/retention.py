"""Which checkpoints stay on the training's scratch space: a pure decision, then the deletion.

Only complete checkpoints are ever deleted (a committed manifest, checkpoints/manifest.py); a folder without
one is a save in progress or cut short, which the trainer's resume sets aside, never retention.
Kept: the one the run resumes from (`latest` when it names a complete checkpoint, else the newest complete one:
layout.resume_step) and every one after it, every checkpoint without a verified copy in the backup, the newest
`keep_last` up to it, every step that is a multiple of `keep_every`, and the newest resumable checkpoint (its
optimizer state included, its files verified against its manifest) unless a verified whole copy of it, optimizer
state included, is in the store: a weights-only copy never makes the last state the run can resume from exactly
deletable (`protect_resumable`). Everything else may go.

A checkpoint's universal copy (global_stepN_universal: DeepSpeed's reshaped copy of global_stepN,
made for a layout change, and never backed up itself) goes only with its checkpoint: right after
global_stepN was deleted, which needs a copy of global_stepN verified right before. It can be made
again only from a whole global_stepN, so while global_stepN stays on scratch its universal copy
stays too, and one whose checkpoint is gone already is never deleted by bsops. Nothing is followed
through a symbolic link: a checkpoint or universal folder that is one (or is not a folder) is left in
place and refused, naming its path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.checkpoints.layout import UNIVERSAL_SUFFIX, Checkpoint
from bigscience_ops.checkpoints.manifest import Manifest

UNCOPIED_RESUMABLE = ("the newest resumable checkpoint (optimizer state included, verified against its manifest) "
                      "has no verified whole copy in the store")


@dataclass(frozen=True)
class Decision:
    keep: dict[int, str] = field(default_factory=dict)  # step -> why
    delete: list[int] = field(default_factory=list)


def decide(steps: Iterable[int], latest_step: int | None, verified: set[int], keep_last: int | None,
           keep_every: int | None, protected: Mapping[int, str] | None = None) -> Decision:
    """Split `steps` into kept (with the reason) and deletable; keep_last None deletes nothing. `latest_step` is the
    step the run resumes from; `protected` steps are kept with their reason (protect_resumable)."""
    steps = sorted(set(steps))
    keep: dict[int, str] = {}
    delete = []
    upto = [s for s in steps if latest_step is None or s <= latest_step]
    newest = set(upto[-keep_last:]) if keep_last else set(steps)
    protected = protected or {}
    for step in steps:
        if step in protected:
            keep[step] = protected[step]
        elif step == latest_step:
            keep[step] = "latest"
        elif latest_step is None:
            keep[step] = "no `latest`: nothing is deleted"
        elif step > latest_step:
            keep[step] = "after latest: a save in progress, or set aside by a rollback"
        elif step not in verified:
            keep[step] = "not verified in the backup"
        elif step in newest:
            keep[step] = "one of the newest" if keep_last else "no keep_last: nothing is deleted"
        elif keep_every and step % keep_every == 0:
            keep[step] = f"multiple of keep_every={keep_every}"
        else:
            delete.append(step)
    return Decision(keep, delete)


def protect_resumable(complete: list[Checkpoint], whole_copy: Callable[[Checkpoint], bool],
                      mismatch: Callable[[Checkpoint, Manifest], str | None]) -> dict[int, str]:
    """The steps kept so the run can always resume exactly: walking the complete checkpoints from the newest, those
    whose files do not match their manifest (`mismatch` says how; kept for inspection, the next resume sets them
    aside), down to the first with its optimizer state that matches: kept unless `whole_copy` says a verified whole
    copy of it is in the store. Weights-only checkpoints (a warm start) are passed over."""
    protected: dict[int, str] = {}
    for ckpt in sorted(complete, key=lambda c: c.step, reverse=True):
        found = ckpt.committed()
        if found is None or not found.optimizer:
            continue
        if whole_copy(ckpt):
            break
        why = mismatch(ckpt, found)
        if why is None:
            protected[ckpt.step] = UNCOPIED_RESUMABLE
            break
        protected[ckpt.step] = f"does not match its manifest ({why}): kept for inspection, the next resume sets it aside"
    return protected


@dataclass(frozen=True)
class Applied:
    deleted: list[str] = field(default_factory=list)  # global_stepN, each followed by its _universal copy if any
    refused: dict[str, str] = field(default_factory=dict)  # folder name -> why it was left in place


def apply(checkpoints: list[Checkpoint], decision: Decision, still_verified: Callable[[Checkpoint], bool]) -> Applied:
    """Delete the decided checkpoints, each only if `still_verified` confirms its backup right before, and
    each one's universal copy right after it. A folder that is a symbolic link or not a folder, or that
    cannot be deleted, is refused (its path and why) and the others go on."""
    done = Applied()
    for ckpt in checkpoints:
        if ckpt.step not in decision.delete:
            continue
        refusal = _not_a_folder(ckpt.path)
        if refusal is not None:
            done.refused[ckpt.tag] = refusal
            continue
        if not still_verified(ckpt) or not _delete(ckpt.path, done):
            continue
        universal = ckpt.path.with_name(ckpt.path.name + UNIVERSAL_SUFFIX)
        if not (universal.exists() or universal.is_symlink()):
            continue
        refusal = _not_a_folder(universal)
        if refusal is not None:
            done.refused[universal.name] = refusal
        else:
            _delete(universal, done)
    return done


def _not_a_folder(path: Path) -> str | None:
    """Why `path` must not be deleted as a checkpoint folder, or None when it is a plain folder."""
    if path.is_symlink():
        return (f"{path} is a symbolic link to {os.readlink(path)!r}; retention never follows a link, so it and "
                "what it points to were left in place (remove the link by hand if it is not needed)")
    if not path.is_dir():
        return f"{path} is not a folder; retention deletes checkpoint folders only, so it was left in place"
    return None


def _delete(path: Path, done: Applied) -> bool:
    try:
        shutil.rmtree(path)  # does not follow links inside the folder: it removes them
    except OSError as exc:
        done.refused[path.name] = f"{path} could not be deleted: {exc.strerror or exc}"
        return False
    done.deleted.append(path.name)
    return True
