"""Which checkpoints stay on the training's scratch space: a pure decision, then the deletion.

Kept: the one `latest` names and every one after it (a save in progress, or checkpoints a rollback
set aside: they stay until the run passes them again), every checkpoint without a verified copy in
the backup, the newest `keep_last` up to `latest`, and every step that is a multiple of `keep_every`.
Everything else may go.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bigscience_ops.checkpoints.layout import UNIVERSAL_SUFFIX, Checkpoint


@dataclass(frozen=True)
class Decision:
    keep: dict[int, str] = field(default_factory=dict)  # step -> why
    delete: list[int] = field(default_factory=list)


def decide(steps: Iterable[int], latest_step: int | None, verified: set[int], keep_last: int | None,
           keep_every: int | None) -> Decision:
    """Split `steps` into kept (with the reason) and deletable; keep_last None deletes nothing."""
    steps = sorted(set(steps))
    keep: dict[int, str] = {}
    delete = []
    upto = [s for s in steps if latest_step is None or s <= latest_step]
    newest = set(upto[-keep_last:]) if keep_last else set(steps)
    for step in steps:
        if step == latest_step:
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


def apply(checkpoints: list[Checkpoint], decision: Decision, still_verified: Callable[[Checkpoint], bool]) -> list[str]:
    """Delete the decided checkpoints, each only if `still_verified` confirms its backup right before; returns tags.

    A checkpoint's universal copy (global_stepN_universal, derived from it for a layout change) goes with it.
    """
    deleted = []
    for ckpt in checkpoints:
        if ckpt.step in decision.delete and still_verified(ckpt):
            shutil.rmtree(ckpt.path)
            universal_copy = ckpt.path.with_name(ckpt.path.name + UNIVERSAL_SUFFIX)
            if universal_copy.is_dir():
                shutil.rmtree(universal_copy)
            deleted.append(ckpt.tag)
    return deleted
