"""What a run's folder recorded that the next launch and each array task obey.

Three facts, read here and nowhere else on the launch side: the latest checkpoint's iteration
(`checkpoints/latest`), whether the run's kill switch file exists, and the skip ranges its
rollbacks recorded (rollbacks.jsonl). Loading a config never opens a run folder (config/loading.py);
the launch plan (launch/launch_plan.py) reads these records once (`read_when_free`) and applies them to the
experiment through config.apply_overrides, the one step where a launch changes an experiment, and the
job script's task hooks read them at each task's start and end.

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
from bigscience_ops.run import lock as run_lock
from bigscience_ops.run import rollbacks
from bigscience_ops.config.loading import Overrides, apply_overrides
from bigscience_ops.schema import Experiment

EXIT_NOT_TRAINING = 3

EXPERIMENT_JSON = "experiment.json"
"""The experiment as a launch ran it, written into the run folder (local) or its launches/<time>/ record."""


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


def read_when_free(exp: Experiment, shared_with: str | None = None) -> RunRecords:
    """The records of `exp`'s run, read only while no other process holds its folder (run/lock.py): a launch never
    plans on records another launch, a rollback or a trainer may be writing. Raises run_lock.RunInUse naming the
    holder. `shared_with`: a holder whose description starts so is let through (a Slurm launch leaves the run's
    queued and running tasks to its queue check)."""
    output = Path(exp.paths.output)
    in_use = run_lock.holder(output)
    if in_use is not None and not (shared_with and in_use.startswith(shared_with)):
        raise run_lock.RunInUse(f"the run folder {output} is in use by {in_use}; wait for it to end (or stop it) "
                                "and launch again")
    return read_records(exp)


def as_recorded(exp: Experiment) -> Experiment:
    """`exp` with the skips its run recorded: what `plan` and `samples` show of a run that was rolled back."""
    return apply_overrides(exp, Overrides(skips=read_records(exp).skips))
