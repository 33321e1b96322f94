"""Node schedules: the phases of a run that each train on their own number of nodes.

`slurm.node_schedule` lists the phases in order, `{nodes: 16}` first, then for example
`{nodes: 64, from_samples: 5_000_528}` and `{nodes: 128, from_iteration: 150_000}`. A phase starts
at the first step boundary where the consumed samples reach its start (an iteration converts to
samples through the batch-size rampup), so every step belongs to exactly one phase. The trainer
saves and exits at that boundary; the next array task runs at the new size. Without a schedule the
run is one phase of `slurm.nodes`.

Pure Python (no torch): the run schedule (schedule/run.py) computes the phases once; the plan, the
launch, the task hooks and the trainer read them there.
"""

from __future__ import annotations

from dataclasses import dataclass

from bigscience_ops.schedule.batch_lr import BatchSchedule
from bigscience_ops.schema import SlurmConfig


@dataclass(frozen=True)
class Phase:
    index: int  # 0-based position in slurm.node_schedule (0 without a schedule)
    nodes: int
    first_step: int  # 1-based: the first step trained at this size
    start_samples: int  # consumed samples when the phase starts (a step boundary)
    field: str  # the config field path of this phase's node count, for messages

    def describe(self) -> str:
        return f"phase {self.index} ({self.nodes} nodes from step {self.first_step}, consumed samples {self.start_samples})"


class NodeScheduleError(ValueError):
    """The node schedule's phases do not start in order: names the phase, its start and the previous one's."""


def node_phases(slurm: SlurmConfig, schedule: BatchSchedule) -> list[Phase]:
    """The run's phases in order; raises NodeScheduleError when a phase does not start after the previous one."""
    if not slurm.node_schedule:
        return [Phase(0, slurm.nodes, 1, 0, "slurm.nodes")]
    phases: list[Phase] = []
    for i, entry in enumerate(slurm.node_schedule):
        where = f"slurm.node_schedule[{i}]"
        if i == 0:
            phases.append(Phase(0, entry.nodes, 1, 0, f"{where}.nodes"))
            continue
        if entry.from_samples is not None:
            steps = schedule.steps_to_consume(entry.from_samples)
            given = f"{where}.from_samples = {entry.from_samples}"
        else:
            steps = entry.from_iteration
            given = f"{where}.from_iteration = {entry.from_iteration}"
        start = schedule.consumed_after(steps)
        previous = phases[-1]
        if steps + 1 <= previous.first_step:
            raise NodeScheduleError(f"{given} starts at step {steps + 1}, not after the previous phase's first step "
                                f"{previous.first_step}: phases must start in order")
        phases.append(Phase(i, entry.nodes, steps + 1, start, f"{where}.nodes"))
    return phases


def phase_at(phases: list[Phase], consumed_samples: int) -> Phase:
    """The phase a run that has consumed this many samples trains in."""
    return [p for p in phases if p.start_samples <= consumed_samples][-1]


def next_boundary(phases: list[Phase], consumed_samples: int) -> Phase | None:
    """The next phase after the one of `consumed_samples`, or None in the last phase."""
    later = [p for p in phases if p.start_samples > consumed_samples]
    return later[0] if later else None
