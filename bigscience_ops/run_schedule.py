"""What a run IS, computed once from the experiment: the frozen `RunSchedule`.

The batch-size rampup, the iterations and samples, the LR schedule in samples, the curriculum,
the skip ranges, the save steps and the node phases all follow from the experiment alone. They
are computed here, once, and the result is handed to everything above: the plan shows it,
render/submit/launch pick the phase from it, the trainer runs it, the lifecycle, backup and
retention read its final step. Nothing re-derives them, so the plan equals the run by construction.

Pure Python (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bigscience_ops.node_schedule import Phase, ScheduleError, next_boundary, node_phases, phase_at
from bigscience_ops.schedules import (
    BatchSchedule, Curriculum, CurriculumTokens, LRSchedule, SaveSchedule, parse_skip_ranges,
)
from bigscience_ops.schema import Experiment


@dataclass(frozen=True)
class RunSchedule:
    batch: BatchSchedule
    train_iters: int
    train_samples: int  # samples the run consumes: train.samples less the partial last batch Megatron drops
    lr: LRSchedule  # as the trainer applies it; under a curriculum, token settings stay in tokens
    warmup_samples: int  # the LR warmup in samples (token settings converted through the curriculum)
    decay_samples: int  # the LR decay length in samples, likewise
    curriculum: Curriculum | None
    tokens: CurriculumTokens | None  # tokens trained through each step under the curriculum; None without one
    saves: SaveSchedule
    skip_ranges: tuple[tuple[int, int], ...]
    node_phases: tuple[Phase, ...]  # one phase of slurm.nodes without a node schedule (or with an invalid one)
    node_schedule_error: str | None = None  # why slurm.node_schedule is invalid (the plan reports it)

    @property
    def warmup_steps(self) -> int:
        return self.batch.steps_to_consume(self.warmup_samples)

    @property
    def decay_steps(self) -> int:
        return self.batch.steps_to_consume(self.decay_samples)

    def tokens_through(self, step: int, seq_length: int) -> int:
        """Tokens trained in steps 1..step: each step's samples at the curriculum's length, or at full length."""
        if self.tokens is not None:
            return self.tokens.through(step)
        return self.batch.consumed_after(step) * seq_length

    def phases(self) -> tuple[Phase, ...]:
        """The node phases; raises ScheduleError when slurm.node_schedule's phases do not start in order."""
        if self.node_schedule_error is not None:
            raise ScheduleError(self.node_schedule_error)
        return self.node_phases

    def phase_of_iteration(self, iteration: int) -> Phase:
        """The phase of a run whose latest checkpoint is at `iteration`."""
        return phase_at(list(self.phases()), self.batch.consumed_after(iteration))

    def next_phase(self, iteration: int) -> Phase | None:
        """The phase after the one of `iteration`, or None in the last phase."""
        return next_boundary(list(self.phases()), self.batch.consumed_after(iteration))

    def finished(self, iteration: int) -> bool:
        return iteration >= self.train_iters


def _to_samples(exp: Experiment, batch: BatchSchedule, kind: str, default: int) -> int:
    lr = exp.lr_schedule
    samples, tokens, iters = (getattr(lr, f"{kind}_{u}") for u in ("samples", "tokens", "iters"))
    if samples is not None:
        return samples
    if tokens is not None:
        return tokens // exp.model.seq_length
    if iters is not None:
        return batch.consumed_after(iters)
    return default


def run_schedule(exp: Experiment) -> RunSchedule:
    """The run's schedules, computed once from the experiment."""
    r = exp.batch.rampup
    batch = (BatchSchedule(exp.batch.global_batch_size) if r is None
             else BatchSchedule(exp.batch.global_batch_size, r.start, r.increment, r.samples))
    iters = exp.train.iters if exp.train.iters is not None else batch.train_iters(exp.train.samples)
    samples = batch.consumed_after(iters)
    warmup = _to_samples(exp, batch, "warmup", 0)
    decay = _to_samples(exp, batch, "decay", exp.train.samples if exp.train.samples is not None else samples)
    lr = LRSchedule(exp.optimizer.lr, exp.optimizer.min_lr, warmup, decay, exp.lr_schedule.style)
    curriculum = tokens = None
    c = exp.curriculum
    if c is not None:  # token-based LR settings count the tokens really trained on
        curriculum = Curriculum(c.min_difficulty, exp.model.seq_length, c.difficulty_step, c.total_curriculum_step)
        tokens = curriculum.token_counter(batch)
        given = {kind: getattr(exp.lr_schedule, f"{kind}_tokens") for kind in ("warmup", "decay")}
        if given["warmup"] is not None:
            warmup = batch.consumed_after(tokens.steps_to_reach(given["warmup"]))
        if given["decay"] is not None:
            decay = batch.consumed_after(tokens.steps_to_reach(given["decay"]))
        lr = dataclasses.replace(lr, warmup_tokens=given["warmup"], decay_tokens=given["decay"])
    ck = exp.checkpoint
    saves = SaveSchedule(tuple((rng.until, rng.interval) for rng in ck.save_schedule), ck.save_interval)
    error = None
    try:
        phases = tuple(node_phases(exp.slurm, batch))
    except ScheduleError as exc:
        error = str(exc)
        phases = (Phase(0, exp.slurm.nodes, 1, 0, "slurm.nodes"),)
    return RunSchedule(batch, iters, samples, lr, warmup, decay, curriculum, tokens, saves,
                       tuple(parse_skip_ranges(exp.train.skip_iterations)), phases, error)
