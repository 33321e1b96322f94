"""Node schedules: the phases of a run that each train on their own number of nodes.

`slurm.node_schedule` lists the phases in order, `{nodes: 16}` first, then for example
`{nodes: 64, from_samples: 5_000_528}` and `{nodes: 128, from_iteration: 150_000}`. A phase starts
at the first step boundary where the consumed samples reach its start (an iteration converts to
samples through the batch-size rampup), so every step belongs to exactly one phase. The trainer
saves and exits at that boundary; the next array task runs at the new size. Without a schedule the
run is one phase of `slurm.nodes`.

Pure Python (no torch): the plan, the launch, the task hooks and the trainer share these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bigscience_ops.schedules import BatchSchedule

if TYPE_CHECKING:
    from bigscience_ops.schema import Experiment, SlurmConfig


@dataclass(frozen=True)
class Phase:
    index: int  # 0-based position in slurm.node_schedule (0 without a schedule)
    nodes: int
    first_step: int  # 1-based: the first step trained at this size
    start_samples: int  # consumed samples when the phase starts (a step boundary)
    field: str  # the config field path of this phase's node count, for messages

    def describe(self) -> str:
        return f"phase {self.index} ({self.nodes} nodes from step {self.first_step}, consumed samples {self.start_samples})"


class ScheduleError(ValueError):
    """The node schedule's phases do not start in order: names the phase, its start and the previous one's."""


def node_phases(slurm: SlurmConfig, schedule: BatchSchedule) -> list[Phase]:
    """The run's phases in order; raises ScheduleError when a phase does not start after the previous one."""
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
            raise ScheduleError(f"{given} starts at step {steps + 1}, not after the previous phase's first step "
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


def for_phase(exp: Experiment, phase: Phase) -> Experiment:
    """The experiment as an array of this phase runs it: slurm.nodes is the phase's node count."""
    return dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, nodes=phase.nodes))


def experiment_phases(exp: Experiment) -> list[Phase]:
    from bigscience_ops.plan import batch_schedule

    return node_phases(exp.slurm, batch_schedule(exp))


def phase_of_iteration(exp: Experiment, iteration: int) -> Phase:
    """The phase of a run whose latest checkpoint is at `iteration` (consumed samples follow from the steps)."""
    from bigscience_ops.plan import batch_schedule

    schedule = batch_schedule(exp)
    return phase_at(node_phases(exp.slurm, schedule), schedule.consumed_after(iteration))


@dataclass(frozen=True)
class PhasePlan:
    """One phase as the plan shows it: its steps, the batch sizes they use, tokens and days."""

    phase: Phase
    world_size: int
    dp: float
    first_step: int
    last_step: int  # first_step - 1 when the training ends before the phase starts
    samples: int
    tokens: int
    days: float
    days_seed_rounded: float
    batch_sizes: tuple[int, ...]  # every global batch size of the phase's steps

    @property
    def steps(self) -> int:
        return max(0, self.last_step - self.first_step + 1)


def batch_sizes_of_steps(schedule: BatchSchedule, first: int, last: int) -> tuple[int, ...]:
    """The distinct global batch sizes of steps first..last (1-based, inclusive)."""
    sizes = {inc.global_batch_size for inc in schedule.increments()
             if inc.first_step <= last and inc.first_step + inc.steps - 1 >= first}
    if last > schedule.rampup_steps and last >= first:
        sizes.add(schedule.global_batch_size)
    return tuple(sorted(sizes))


def plan_phases(exp: Experiment, schedule: BatchSchedule, train_iters: int, params: int, seed_rounded_params: int,
                model_parallel: int, tokens_through: Callable[[int], int] | None = None) -> list[PhasePlan]:
    """Steps, tokens and days of each phase (days at estimate.tflops_per_gpu on the phase's GPUs).

    `tokens_through(step)`: tokens trained in steps 1..step when samples are not all full length
    (curriculum learning); by default every sample has model.seq_length tokens.
    """
    from bigscience_ops.sizing import estimate_days

    phases = node_phases(exp.slurm, schedule)
    out = []
    for phase, following in zip(phases, phases[1:] + [None]):
        last = min(train_iters, following.first_step - 1 if following else train_iters)
        samples = max(0, schedule.consumed_after(max(last, phase.first_step - 1)) - phase.start_samples)
        tokens = samples * exp.model.seq_length
        if tokens_through is not None:
            tokens = max(0, tokens_through(last) - tokens_through(phase.first_step - 1))
        world = phase.nodes * exp.slurm.gpus_per_node
        tflops = exp.estimate.tflops_per_gpu
        out.append(PhasePlan(phase, world, world / model_parallel, phase.first_step, last, samples, tokens,
                             estimate_days(tokens, params, world, tflops),
                             estimate_days(tokens, seed_rounded_params, world, tflops),
                             batch_sizes_of_steps(schedule, phase.first_step, last)))
    return out
