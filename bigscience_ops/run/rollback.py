"""`bsops rollback`: move a run back to an earlier checkpoint, safely, optionally skipping the data after it.

What the BigScience runs did by hand after a loss spike (edit `latest`, edit the YAML, hope retention
does not delete what was set aside), as one step:
- the target must be a complete checkpoint (bsops.json) at or before the one `latest` names, a folder and
  not a link (neither the target nor `latest` is ever read through a link), and no
  array task of the run may be training now (the CLI asks the task ledger; --force overrides);
- every later checkpoint (and its universal copy) moves into <checkpoints>/rolled-back-<time>/, where
  nothing reads or deletes it: retention only ever looks at global_stepN folders at the top, and the
  trainer saves its new global_stepN without meeting the old one. Nothing is deleted;
- `latest` is rewritten atomically to name the target;
- the event (and the skipped range) goes into <run>/rollbacks.jsonl (rollbacks.py), which every
  command then reads: the plan shows the skip, render writes it, the trainer steps over it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.run import rollbacks
from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import BsopsError
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schedule.batch_lr import parse_skip_ranges
from bigscience_ops.schema import Experiment

SET_ASIDE_PREFIX = "rolled-back-"


class RollbackError(BsopsError):
    """A rollback cannot be done as asked: names the value and what is allowed."""


@dataclass(frozen=True)
class Done:
    record: rollbacks.Rollback
    moved: list[str]  # tags set aside


def rollback(exp: Experiment, to_step: int, skip: str | None = None, now: float | None = None,
             dry_run: bool = False) -> Done:
    """Move `exp`'s run back to global_step`to_step`; `skip` ("A-B") is stepped over when trained again. With
    `dry_run`, everything is checked and what would be done returned, and nothing is moved or written.

    The caller makes sure no task of the run is training (the CLI reads the task ledger: ledger.running)."""
    checkpoints = Path(exp.paths.checkpoints)
    try:
        layout.latest_tag(checkpoints)  # a `latest` that is a link, a FIFO or garbage is refused, never written over
    except layout.CheckpointError as exc:
        raise RollbackError(f"{exc}; the next training task repairs it (it resumes from the newest verified "
                            "checkpoint), or remove it, then roll back") from None
    latest = layout.resume_step(checkpoints)  # `latest` when it names a complete checkpoint, else the newest
    if latest is None:
        raise RollbackError(f"{checkpoints} has no complete checkpoint: there is nothing to roll back")
    complete = {c.step: c for c in layout.complete_checkpoints(checkpoints)}
    target = next((c for c in layout.list_checkpoints(checkpoints) if c.step == to_step), None)
    refusal = target.refusal() if target is not None else None
    if refusal is not None:  # a global_stepN that is a link is never a rollback's target
        raise RollbackError(f"--step {to_step}: refused: {refusal}")
    if to_step not in complete:
        raise RollbackError(f"--step {to_step}: not a complete checkpoint of {checkpoints}; the complete ones up to "
                            f"latest (global_step{latest}) are {sorted(complete) or 'none'}")
    if skip is not None:
        _check_skip(skip, to_step, run_schedule(exp).train_iters)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    later = [c for c in layout.list_checkpoints(checkpoints) if c.step > to_step]
    aside = checkpoints / f"{SET_ASIDE_PREFIX}{stamp}"
    if dry_run:
        return Done(rollbacks.Rollback(time.time() if now is None else now, latest, to_step, skip,
                                       str(aside) if later else ""), [c.tag for c in later])
    moved = []
    for ckpt in later:
        aside.mkdir(exist_ok=True)
        os.replace(ckpt.path, aside / ckpt.tag)
        universal_copy = ckpt.path.with_name(ckpt.tag + layout.UNIVERSAL_SUFFIX)
        if universal_copy.is_dir():
            os.replace(universal_copy, aside / universal_copy.name)
        moved.append(ckpt.tag)
    layout.write_latest(checkpoints, f"global_step{to_step}")
    record = rollbacks.Rollback(time.time() if now is None else now, latest, to_step, skip,
                                str(aside) if moved else "")
    rollbacks.append(Path(exp.paths.output), record)
    return Done(record, moved)


def _check_skip(skip: str, to_step: int, train_iters: int) -> None:
    try:
        [(start, end)] = parse_skip_ranges([skip])
    except ValueError as exc:
        raise RollbackError(f"--skip {skip!r}: {exc}") from None
    if start <= to_step or end > train_iters:
        raise RollbackError(f"--skip {skip!r}: the skipped iterations must come after --step {to_step} (the run trains "
                            f"them again from there) and end by the last step, {train_iters}")

