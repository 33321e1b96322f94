"""What a run's folder recorded that the next launch and each array task obey.

Three facts, read here and nowhere else on the launch side: the latest checkpoint's iteration
(`checkpoints/latest`), whether the run's kill switch file exists, and the skip ranges its
rollbacks recorded (rollbacks.jsonl). Loading a config never opens a run folder (config.py);
the launch plan (launch_plan.py) reads these records and applies them to the experiment in its
one override step, and the job script's task hooks read them at each task's start and end.

`EXIT_NOT_TRAINING` is the job script's contract with `bsops task begin`: the task has nothing to
train (the training is finished, the kill switch exists, or the allocation is another node
phase's), so the script ends at once without counting a failure. render.py writes the same
number into the script.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.schema import Experiment

EXIT_NOT_TRAINING = 3


@dataclass(frozen=True)
class RunRecords:
    """A run's records at one moment. `skips` is read when first asked for: the task hooks never need it."""

    output: Path
    iteration: int
    """The latest checkpoint's iteration (0 before the first save)."""
    kill_switch: str | None
    """The kill switch's path while the file exists (the run is stopped on purpose), else None."""

    @cached_property
    def skips(self) -> tuple[str, ...]:
        """The skip ranges (`A-B`) the run's rollbacks recorded, in order, each once."""
        return tuple(dict.fromkeys(r.skip for r in rollbacks.read(self.output) if r.skip))


def read_records(exp: Experiment) -> RunRecords:
    """The records of `exp`'s run folder (paths.output, paths.checkpoints, checkpoint.kill_switch_path)."""
    switch = exp.checkpoint.kill_switch_path
    return RunRecords(Path(exp.paths.output), ledger.latest_iteration(Path(exp.paths.checkpoints)),
                      str(switch) if ledger.kill_switch_on(exp) else None)
