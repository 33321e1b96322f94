"""What a run's folder recorded that the next launch and each array task obey.

Three facts, read here and nowhere else on the launch side: the latest checkpoint's iteration
(`checkpoints/latest`), whether the run's kill switch file exists, and the skip ranges its
rollbacks recorded (rollbacks.jsonl). Loading a config never opens a run folder (config.py);
the launch plan (launch/plan.py) reads these records and applies them to the experiment through
`apply_overrides`, the one step where a launch changes an experiment (below), and the job script's
task hooks read them at each task's start and end.

`EXIT_NOT_TRAINING` is the job script's contract with `bsops task begin`: the task has nothing to
train (the training is finished, the kill switch exists, or the allocation is another node
phase's), so the script ends at once without counting a failure. render.py writes the same
number into the script.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
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


# ----------------------------------------------------------------------------- the one override step

@dataclass(frozen=True)
class Overrides:
    """What a launch changes in the experiment; None (or no skips) leaves the field as the config says."""

    out: Path | None = None
    """The run folder (`launch --local --out`): paths.* and the kill switch move under it."""
    skips: tuple[str, ...] = ()
    """Skip ranges the run's rollbacks recorded, added to train.skip_iterations."""
    nodes: int | None = None
    """slurm.nodes: the node count of the phase the run is in (a node schedule)."""
    array: int | None = None
    """slurm.array: the tasks left to a node schedule's resubmitted array."""
    master_port: int | None = None
    """slurm.master_port: a local launch's free rendezvous port."""
    nodes_all_along: int | None = None
    """`plan --nodes N`: N nodes for the whole run, slurm.node_schedule set aside."""
    command_line: tuple[str, ...] | None = None
    """The command line's SECTION.KEY=VALUE assignments a command records (`bsops eval`'s, in its results)."""


def apply_overrides(exp: Experiment, overrides: Overrides) -> Experiment:
    """`exp` as a launch (or a view of the run as launched) runs it; the only place a launch changes an experiment."""
    o = overrides
    if o.out is not None:
        out = Path(o.out).resolve()
        paths = dataclasses.replace(exp.paths, output=str(out), checkpoints=str(out / "checkpoints"),
                                    tensorboard=str(out / "tensorboard"), logs=str(out / "logs"),
                                    codecarbon=str(out / "codecarbon"))
        checkpoint = dataclasses.replace(exp.checkpoint, kill_switch_path=str(out / "kill-switch"))
        exp = dataclasses.replace(exp, paths=paths, checkpoint=checkpoint)
    added = [skip for skip in o.skips if skip not in exp.train.skip_iterations]
    if added:
        exp = dataclasses.replace(exp, train=dataclasses.replace(
            exp.train, skip_iterations=[*exp.train.skip_iterations, *dict.fromkeys(added)]))
    slurm: dict = {k: v for k, v in (("nodes", o.nodes), ("array", o.array), ("master_port", o.master_port))
                   if v is not None}
    if o.nodes_all_along is not None:
        slurm.update(nodes=o.nodes_all_along, node_schedule=[])
    if o.command_line is not None:
        exp = dataclasses.replace(exp, overrides=list(o.command_line))
    return dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, **slurm)) if slurm else exp


def as_recorded(exp: Experiment) -> Experiment:
    """`exp` with the skips its run recorded: what `plan` and `samples` show of a run that was rolled back."""
    return apply_overrides(exp, Overrides(skips=read_records(exp).skips))
