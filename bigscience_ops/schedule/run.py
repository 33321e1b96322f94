"""What a run IS, computed once from the experiment: the frozen `RunSchedule`.

The batch-size rampup, the iterations and samples, the LR schedule in samples, the curriculum,
the skip ranges (and what each consumes), the save steps and the node phases all follow from the
experiment alone. They are computed here, once, and the result is handed to everything above: the plan shows it,
render/submit/launch pick the phase from it, the trainer runs it, the lifecycle, backup and
retention read its final step. Nothing re-derives them, so the plan equals the run by construction.

Pure Python (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from bigscience_ops.schedule.nodes import Phase, NodeScheduleError, next_boundary, node_phases, phase_at
from bigscience_ops.schedule.batch_lr import (
    BatchSchedule, Curriculum, CurriculumTokens, Increment, LRSchedule, SaveSchedule, parse_skip_ranges,
)
from bigscience_ops.schema import Experiment


@dataclass(frozen=True)
class PhaseSpan:
    """The steps a node phase trains: what it consumes and which batch sizes its steps use."""

    phase: Phase
    last_step: int  # phase.first_step - 1 when the training ends before the phase starts
    samples: int
    tokens: int  # each step's samples at its curriculum length, or at model.seq_length without a curriculum
    batch_sizes: tuple[int, ...]  # every global batch size of the phase's steps


@dataclass(frozen=True)
class SkipSpan:
    """A range of train.skip_iterations (a rollback's skip included): the trainer consumes its data and makes
    no update, as Megatron's --skip-train-iteration-range does."""

    first: int
    last: int  # inclusive, as written
    samples: int  # consumed without training (the iterations up to the last one of the run)
    tokens: int

    @property
    def iterations(self) -> int:
        return self.last - self.first + 1


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
    seq_length: int = 0  # model.seq_length: tokens per sample without a curriculum

    # Derived from the fields above, each computed once when first read (the plan reads them all;
    # the trainer none).

    @cached_property
    def increments(self) -> tuple[Increment, ...]:
        """The batch-size rampup, one row per batch size."""
        return tuple(self.batch.increments())

    @cached_property
    def rampup_consumed(self) -> int:
        """Samples consumed by the end of the rampup."""
        return self.batch.consumed_after(self.batch.rampup_steps)

    @cached_property
    def save_steps(self) -> tuple[int, ...]:
        """Every step the save schedule saves at, the last step included."""
        return tuple(self.saves.steps(self.train_iters))

    @cached_property
    def tokens_trained(self) -> int:
        """Tokens of the whole run."""
        return self.tokens_through(self.train_iters, self.seq_length)

    @cached_property
    def spans(self) -> tuple[PhaseSpan, ...]:
        """Each node phase's steps: a phase ends where the next begins, or at the last step."""
        phases, out = list(self.node_phases), []
        for phase, following in zip(phases, phases[1:] + [None]):
            last = min(self.train_iters, following.first_step - 1 if following else self.train_iters)
            samples = max(0, self.batch.consumed_after(max(last, phase.first_step - 1)) - phase.start_samples)
            tokens = samples * self.seq_length
            if self.tokens is not None:
                tokens = max(0, self.tokens.through(last) - self.tokens.through(phase.first_step - 1))
            out.append(PhaseSpan(phase, last, samples, tokens, self.batch.sizes_of_steps(phase.first_step, last)))
        return tuple(out)

    @cached_property
    def skip_spans(self) -> tuple[SkipSpan, ...]:
        """Each skip range with the samples and tokens its iterations consume without training."""
        out = []
        for first, last in self.skip_ranges:
            end = min(last, self.train_iters)
            start = min(first - 1, end)
            out.append(SkipSpan(first, last, self.batch.consumed_after(end) - self.batch.consumed_after(start),
                                self.tokens_through(end, self.seq_length) - self.tokens_through(start, self.seq_length)))
        return tuple(out)

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
        """The node phases; raises NodeScheduleError when slurm.node_schedule's phases do not start in order."""
        if self.node_schedule_error is not None:
            raise NodeScheduleError(self.node_schedule_error)
        return self.node_phases

    def phase_of_iteration(self, iteration: int) -> Phase:
        """The phase of a run whose latest checkpoint is at `iteration`."""
        return phase_at(list(self.phases()), self.batch.consumed_after(iteration))

    def next_phase(self, iteration: int) -> Phase | None:
        """The phase after the one of `iteration`, or None in the last phase."""
        return next_boundary(list(self.phases()), self.batch.consumed_after(iteration))

    def finished(self, iteration: int) -> bool:
        return iteration >= self.train_iters


def run_schedule(exp: Experiment) -> RunSchedule:
    """The run's schedules, computed once from the experiment."""
    r = exp.batch.rampup
    batch = (BatchSchedule(exp.batch.global_batch_size) if r is None
             else BatchSchedule(exp.batch.global_batch_size, r.start, r.increment, r.samples))
    error = None
    try:
        phases = tuple(node_phases(exp.slurm, batch))
    except NodeScheduleError as exc:
        error = str(exc)
        phases = (Phase(0, exp.slurm.nodes, 1, 0, "slurm.nodes"),)
    iters = exp.train.iters if exp.train.iters is not None else batch.train_iters(exp.train.samples)
    samples = batch.consumed_after(iters)
    # The LR warmup and decay lengths in samples, from whichever unit the experiment gives them in.
    settings, lengths = exp.lr_schedule, {}
    for kind, default in (("warmup", 0), ("decay", exp.train.samples if exp.train.samples is not None else samples)):
        in_samples, in_tokens, in_iters = (getattr(settings, f"{kind}_{unit}") for unit in ("samples", "tokens", "iters"))
        if in_samples is not None:
            lengths[kind] = in_samples
        elif in_tokens is not None:
            lengths[kind] = in_tokens // exp.model.seq_length
        elif in_iters is not None:
            lengths[kind] = batch.consumed_after(in_iters)
        else:
            lengths[kind] = default
    warmup, decay = lengths["warmup"], lengths["decay"]
    lr = LRSchedule(exp.optimizer.lr, exp.optimizer.min_lr, warmup, decay, settings.style)
    curriculum = tokens = None
    c = exp.curriculum
    if c is not None:  # token-based LR settings count the tokens really trained on
        curriculum = Curriculum(c.min_difficulty, exp.model.seq_length, c.difficulty_step, c.total_curriculum_step)
        tokens = curriculum.token_counter(batch)
        given = {kind: getattr(settings, f"{kind}_tokens") for kind in ("warmup", "decay")}
        if given["warmup"] is not None:
            warmup = batch.consumed_after(tokens.steps_to_reach(given["warmup"]))
        if given["decay"] is not None:
            decay = batch.consumed_after(tokens.steps_to_reach(given["decay"]))
        lr = dataclasses.replace(lr, warmup_tokens=given["warmup"], decay_tokens=given["decay"])
    ck = exp.checkpoint
    saves = SaveSchedule(tuple((rng.until, rng.interval) for rng in ck.save_schedule), ck.save_interval)
    return RunSchedule(batch, iters, samples, lr, warmup, decay, curriculum, tokens, saves,
                       tuple(parse_skip_ranges(exp.train.skip_iterations)), phases, error, exp.model.seq_length)
