"""A run's rollbacks: what `bsops rollback` did, recorded in <run>/rollbacks.jsonl, and the data they skip.

A rollback moves `latest` back to an earlier checkpoint, sets the later ones aside and may skip the
iterations whose data caused the trouble. The skipped ranges are part of the run from then on:
the launch plan adds them to train.skip_iterations (run_records.py reads them, launch_plan.apply_overrides
applies them), so the plan shows them, render writes them into experiment.json and the trainer steps over them (their data consumed, no update), as Megatron's
--skip-train-iteration-range does. Pure Python, nothing heavy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from bigscience_ops.errors import BsopsError

RECORD = "rollbacks.jsonl"


class RollbackRecordError(BsopsError):
    """The run's rollbacks.jsonl cannot be read: names the file, the line and what it holds."""


@dataclass(frozen=True)
class Rollback:
    time: float  # epoch seconds
    from_step: int  # what `latest` named before
    to_step: int
    skip: str | None  # "A-B": iterations stepped over when the run trains them again
    set_aside: str  # the folder the later checkpoints were moved into ("" when there were none)


def read(output: Path) -> list[Rollback]:
    path = Path(output) / RECORD
    if not path.is_file():
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            out.append(Rollback(**json.loads(line)))
        except (ValueError, TypeError) as exc:
            raise RollbackRecordError(f"{path}:{number}: unreadable record {line[:200]!r} ({exc}); it is written "
                                      "by bsops rollback only") from None
    return out


def append(output: Path, record: Rollback) -> None:
    Path(output).mkdir(parents=True, exist_ok=True)
    with open(Path(output) / RECORD, "a", encoding="utf-8") as handle:  # one short append: atomic on POSIX
        handle.write(json.dumps(asdict(record)) + "\n")
