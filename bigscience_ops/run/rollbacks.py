"""A run's rollbacks: what `bsops rollback` did, recorded in <run>/rollbacks.jsonl, and the data they skip.

A rollback moves `latest` back to an earlier checkpoint, sets the later ones aside and may skip the
iterations whose data caused the trouble. The skipped ranges are part of the run from then on:
the launch plan adds them to train.skip_iterations (run_records.py reads them, launch_plan.apply_overrides
applies them), so the plan shows them, render writes them into experiment.json and the trainer steps over
them (their data consumed, no update), as Megatron's --skip-train-iteration-range does. The file is read
as every run file is (runfiles.py). Pure Python, nothing heavy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import Checked, append_line, build, check_int, check_str, check_time, checked_jsonl, excerpt
from bigscience_ops.schedule.batch_lr import parse_skip_ranges

RECORD = "rollbacks.jsonl"


class RollbackRecordError(BsopsError):
    """The run's rollbacks.jsonl cannot be read: names the file, the line and what is wrong with it."""


@dataclass(frozen=True)
class Rollback:
    time: float  # epoch seconds
    from_step: int  # what `latest` named before
    to_step: int
    skip: str | None  # "A-B": iterations stepped over when the run trains them again
    set_aside: str  # the folder the later checkpoints were moved into ("" when there were none)


# ----------------------------------------------------------------------------- the rollbacks record

_RULES: dict[str, Callable[[Any], str | None]] = {
    "time": check_time,
    "from_step": check_int,
    "to_step": check_int,
    "skip": lambda v: check_str(v, 64, optional=True) or _check_skip(v),
    "set_aside": lambda v: check_str(v, 4096),
}


def _check_skip(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parse_skip_ranges([value])
    except ValueError:
        return f"got {excerpt(value)}; expected a range 'A-B' of iterations"
    return None


def _rollback(data: dict) -> tuple[Rollback | None, str | None]:
    return build(Rollback, data, _RULES)


def read_checked(output: str | os.PathLike[str]) -> Checked[Rollback]:
    """The run's rollbacks, in order, and a problem for each line (or the file) that is not one: for the
    commands that report (the watchdog, info, the chronicle) and go on."""
    return checked_jsonl(Path(output) / RECORD, _rollback)


def read(output: str | os.PathLike[str]) -> list[Rollback]:
    """The run's rollbacks, in order; any line that is not one (or a file that is not plain) is a
    RollbackRecordError naming the file, the line and what was wrong: a launch obeys these skips, so it
    never goes on without one it cannot read."""
    checked = read_checked(output)
    if checked.problems:
        more = f" (and {len(checked.problems) - 1} more)" if len(checked.problems) > 1 else ""
        raise RollbackRecordError(f"{checked.problems[0]}{more}; rollbacks.jsonl is written by bsops rollback only: "
                                  "repair or remove the line")
    return checked.records


def append(output: str | os.PathLike[str], record: Rollback) -> None:
    Path(output).mkdir(parents=True, exist_ok=True)
    append_line(Path(output) / RECORD, json.dumps(asdict(record)))
