"""Batch-size rampup and learning-rate schedules in samples, exactly as Megatron computes them.

Pure Python (no torch): `bsops plan` and the trainer share these, so what the plan promises is
what the run does.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Increment:
    """One constant-batch-size stretch of the rampup."""

    global_batch_size: int
    nominal_samples: float  # rampup samples / number of increments (the tr1-13B notes' 79365)
    naive_steps: int  # int(nominal_samples) // GBS: the seed's hand estimate
    steps: int  # steps Megatron's scheduler really runs at this size
    samples: int  # samples those steps consume
    first_step: int  # 1-based


@dataclass(frozen=True)
class BatchSchedule:
    """Megatron's RampupBatchsizeNumMicroBatches, or a constant global batch size."""

    global_batch_size: int
    rampup_start: int | None = None
    rampup_increment: int | None = None
    rampup_samples: int | None = None

    @property
    def has_rampup(self) -> bool:
        return self.rampup_start is not None

    @property
    def num_increments(self) -> int:
        return (self.global_batch_size - self.rampup_start) // self.rampup_increment if self.has_rampup else 0

    @property
    def samples_per_increment(self) -> float:
        return self.rampup_samples / self.num_increments

    def batch_size_at(self, consumed_samples: int) -> int:
        """Global batch size of the step that starts after `consumed_samples` (Megatron's update())."""
        if not self.has_rampup or consumed_samples > self.rampup_samples:
            return self.global_batch_size
        steps = int(consumed_samples / self.samples_per_increment)
        return min(self.rampup_start + steps * self.rampup_increment, self.global_batch_size)

    @cached_property
    def _rampup_consumed(self) -> list[int]:
        """Consumed samples after each rampup step: Megatron's loop `while consumed <= rampup_samples`."""
        consumed, out = 0, []
        if self.has_rampup:
            while consumed <= self.rampup_samples:
                consumed += self.batch_size_at(consumed)
                out.append(consumed)
        return out

    @property
    def rampup_steps(self) -> int:
        return len(self._rampup_consumed)

    def consumed_after(self, steps: int) -> int:
        """Samples consumed after `steps` optimizer steps."""
        ramp = self._rampup_consumed
        if steps <= len(ramp):
            return ramp[steps - 1] if steps > 0 else 0
        base = ramp[-1] if ramp else 0
        return base + (steps - len(ramp)) * self.global_batch_size

    def steps_to_consume(self, samples: int) -> int:
        """The first step after which at least `samples` samples are consumed."""
        ramp = self._rampup_consumed
        if ramp and samples <= ramp[-1]:
            return bisect.bisect_left(ramp, samples) + 1
        base = ramp[-1] if ramp else 0
        return len(ramp) + max(0, math.ceil((samples - base) / self.global_batch_size))

    def train_iters(self, train_samples: int) -> int:
        """Megatron's update_train_iters: rampup steps, then whole batches; a partial batch is dropped."""
        if not self.has_rampup:
            return train_samples // self.global_batch_size
        return self.rampup_steps + (train_samples - self.consumed_after(self.rampup_steps)) // self.global_batch_size

    def batch_size_of_step(self, step: int) -> int:
        """Global batch size of 1-based step `step`."""
        return self.batch_size_at(self.consumed_after(step - 1))

    def sizes_of_steps(self, first: int, last: int) -> tuple[int, ...]:
        """The distinct global batch sizes of steps first..last (1-based, inclusive)."""
        sizes = {inc.global_batch_size for inc in self._increments
                 if inc.first_step <= last and inc.first_step + inc.steps - 1 >= first}
        if last > self.rampup_steps and last >= first:
            sizes.add(self.global_batch_size)
        return tuple(sorted(sizes))

    def increments(self) -> list[Increment]:
        """The rampup, one row per batch size (empty without a rampup)."""
        return list(self._increments)

    @cached_property
    def _increments(self) -> tuple[Increment, ...]:
        """`increments`, built once per schedule: the walk over every rampup step (23k for tr1-13B) is most
        of the plan's time, and each node phase asks for the batch sizes it spans."""
        if not self.has_rampup:
            return ()
        rows: list[list[int]] = []  # [batch size, steps, samples, first step]
        previous = 0
        for step, consumed in enumerate(self._rampup_consumed, start=1):
            gbs, previous = consumed - previous, consumed
            if rows and rows[-1][0] == gbs:
                rows[-1][1] += 1
                rows[-1][2] += gbs
            else:
                rows.append([gbs, 1, gbs, step])
        nominal = self.samples_per_increment
        return tuple(Increment(gbs, nominal, int(nominal) // gbs, steps, samples, first)
                     for gbs, steps, samples, first in rows)


@dataclass(frozen=True)
class LRSchedule:
    """Megatron's AnnealingLR with warmup and decay measured in consumed samples, or in tokens.

    With `decay_tokens` set (Megatron-DeepSpeed's --lr-decay-tokens, used with curriculum learning,
    where a sample's length varies) the decay follows the tokens of the applied steps instead of their
    samples: ratio = (tokens - warmup end) / (decay_tokens - warmup end). The warmup end is
    `warmup_tokens` when set (--lr-warmup-tokens: the warmup itself then runs on tokens), else the
    tokens consumed when the sample warmup ended (`warmup_end_tokens`, kept by the trainer).
    Megatron records that count only when its sample counter lands exactly on the warmup length;
    here it is the first step at or past it, so a warmup that ends inside a step does not restart
    the decay from 0 tokens. Megatron also passes the tokens of the steps before the current one
    while its sample counter includes it; here both include the current step.
    """

    max_lr: float
    min_lr: float
    warmup_samples: int
    decay_samples: int
    style: str = "cosine"
    warmup_tokens: int | None = None
    decay_tokens: int | None = None

    @property
    def in_tokens(self) -> bool:
        return self.decay_tokens is not None or self.warmup_tokens is not None

    def lr_at(self, consumed_samples: int, consumed_tokens: int | None = None, warmup_end_tokens: int = 0) -> float:
        if self.warmup_tokens is not None:
            if self.warmup_tokens > 0 and consumed_tokens <= self.warmup_tokens:
                return self.max_lr * consumed_tokens / self.warmup_tokens
        elif self.warmup_samples > 0 and consumed_samples <= self.warmup_samples:
            return self.max_lr * consumed_samples / self.warmup_samples
        if self.style == "constant":
            return self.max_lr
        if self.decay_tokens is not None:
            start = self.warmup_tokens if self.warmup_tokens is not None else warmup_end_tokens
            done, end = consumed_tokens, self.decay_tokens
        else:
            start, done, end = self.warmup_samples, consumed_samples, self.decay_samples
        if done > end:
            return self.min_lr
        span = end - start
        ratio = (done - start) / span if span > 0 else 1.0
        if self.style == "linear":
            coeff = 1.0 - ratio
        else:
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)


@dataclass(frozen=True)
class Curriculum:
    """Curriculum learning by sequence length: DeepSpeed's `fixed_linear` seqlen schedule.

    Step s (1-based, Megatron asks for `iteration + 1`) trains on samples truncated to
    floor(min + (max - min) * s / total_steps), rounded down to a multiple of `difficulty_step`,
    never below min nor above max (the model's seq_length). The schedule only grows, so this
    stateless form equals DeepSpeed's stateful CurriculumScheduler, and a resumed run continues it.
    """

    min_difficulty: int
    max_difficulty: int
    difficulty_step: int
    total_steps: int

    def seqlen_at(self, step: int) -> int:
        value = math.floor(step / self.total_steps * (self.max_difficulty - self.min_difficulty) + self.min_difficulty)
        value -= value % self.difficulty_step
        floor = -(-self.min_difficulty // self.difficulty_step) * self.difficulty_step
        return min(max(value, floor), self.max_difficulty)

    def _lengths(self, last_step: int) -> list[int]:
        """seqlen_at(1..last_step) (last_step <= total_steps), the same formula without a call per step."""
        total, low, span, step = self.total_steps, self.min_difficulty, self.max_difficulty - self.min_difficulty, \
            self.difficulty_step
        floor = -(-low // step) * step
        return [min(max(value - value % step, floor), self.max_difficulty)
                for value in map(math.floor, (s / total * span + low for s in range(1, last_step + 1)))]

    def token_counter(self, batch: BatchSchedule) -> CurriculumTokens:
        return CurriculumTokens(self, batch)

    def stretches(self, last_step: int) -> list[tuple[int, int, int]]:
        """(seqlen, first step, last step) of each run of steps 1..last_step at one length, in order.

        seqlen_at only grows, so each stretch ends where the first longer step starts, found from the
        linear formula and checked against seqlen_at itself: as many stretches as distinct lengths
        (at most (max - min) / difficulty_step + 1), however many steps the curriculum lasts."""
        out: list[tuple[int, int, int]] = []
        if (self.max_difficulty - self.min_difficulty) // self.difficulty_step >= self.total_steps // 4:
            # About one length per step: computing each step's length is quicker than searching for each change.
            lengths = self._lengths(min(last_step, self.total_steps))
            for step, seqlen in enumerate(lengths, start=1):
                if step == 1 or seqlen != lengths[step - 2]:
                    out.append((seqlen, step, step))
            out = [(seqlen, first, nxt - 1) for (seqlen, first, _), (_, nxt, _) in
                   zip(out, [*out[1:], (0, len(lengths) + 1, 0)])]
            if last_step > len(lengths):  # past the ramp: full length
                seqlen, first, _ = out[-1]
                out[-1:] = [(seqlen, first, last_step)] if seqlen == self.max_difficulty else \
                    [out[-1], (self.max_difficulty, len(lengths) + 1, last_step)]
            return out
        step = 1
        while step <= last_step:
            seqlen = self.seqlen_at(step)
            end = last_step if seqlen >= self.max_difficulty else min(last_step, self._first_longer(seqlen, step) - 1)
            out.append((seqlen, step, end))
            step = end + 1
        return out

    def _first_longer(self, seqlen: int, after: int) -> int:
        """The first step past `after` whose length exceeds `seqlen` (< max_difficulty, so one exists)."""
        target = min(seqlen - seqlen % self.difficulty_step + self.difficulty_step, self.max_difficulty)
        span = self.max_difficulty - self.min_difficulty  # > 0: below max, the ramp has a length to climb
        guess = max(after + 1, -(-(target - self.min_difficulty) * self.total_steps // span))
        # The float formula can land one step off the exact one: bracket the boundary, then bisect.
        lo, width = guess, 1
        while lo > after + 1 and self.seqlen_at(lo - 1) > seqlen:
            lo, width = max(after + 1, lo - width), width * 2
        hi, width = guess, 1
        while self.seqlen_at(hi) <= seqlen:
            hi, width = hi + width, width * 2
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if self.seqlen_at(mid) <= seqlen else (lo, mid)
        return lo

    def phases(self, batch: BatchSchedule, train_iters: int) -> list[tuple[int, int, int, int]]:
        """(seqlen, first step, last step, tokens) of each stretch at one length, over the whole run."""
        out = [list(stretch) for stretch in self.stretches(min(train_iters, self.total_steps))]
        if train_iters > self.total_steps:  # the rest is at full length
            if out[-1][0] == self.max_difficulty:
                out[-1][2] = train_iters
            else:
                out.append([self.max_difficulty, self.total_steps + 1, train_iters])
        return [(seqlen, first, last, (batch.consumed_after(last) - batch.consumed_after(first - 1)) * seqlen)
                for seqlen, first, last in out]


@dataclass(frozen=True)
class SaveSchedule:
    """Which steps save a checkpoint: `checkpoint.save_schedule` ranges, then `save_interval`.

    Each range covers the steps after the previous range's `until` up to its own `until`, and saves at
    previous_until + k * interval (the tr1-13B notes' 10 to 100, then 18 to 1000 lands on 1000). After the
    last range `save_interval` applies the same way, counted from that range's end; with no ranges it is
    Megatron's `step % save_interval == 0`. `due` answers step by step (the trainer), `steps` lists them
    by ranges (the plan, over hundreds of thousands of steps); a test holds the two equal.
    """

    ranges: tuple[tuple[int, int], ...] = ()  # (until, interval), in increasing `until`
    interval: int | None = None

    def due(self, step: int) -> bool:
        """Whether step `step` (1-based) is saved."""
        start = 0
        for until, interval in self.ranges:
            if step <= until:
                return (step - start) % interval == 0
            start = until
        return self.interval is not None and (step - start) % self.interval == 0

    def steps(self, last_step: int) -> list[int]:
        """Every step saved up to `last_step`, plus `last_step` itself (the final save)."""
        steps: list[int] = []
        start = 0
        for until, interval in self.ranges:
            steps.extend(range(start + interval, min(until, last_step) + 1, interval))
            start = until
        if self.interval is not None and start < last_step:
            steps.extend(range(start + self.interval, last_step + 1, self.interval))
        return steps if steps and steps[-1] == last_step else steps + [last_step]


def parse_skip_ranges(values: list[str]) -> list[tuple[int, int]]:
    """Megatron's --skip-train-iteration-range: "START-END" (or "N") strings, 1-based and inclusive,
    sorted and merged where they overlap or touch. Raises ValueError naming the bad value."""
    ranges = []
    for value in values:
        parts = str(value).replace(" ", "").split("-")
        if len(parts) > 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"{value!r}: expected START-END such as '100-120' (iterations, inclusive), or one iteration")
        start, end = int(parts[0]), int(parts[-1])
        if start < 1 or end < start:
            raise ValueError(f"{value!r}: iterations count from 1 and END must not be below START")
        ranges.append((start, end))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def in_skip_range(iteration: int, ranges: list[tuple[int, int]]) -> bool:
    return any(start <= iteration <= end for start, end in ranges)


class CurriculumTokens:
    """Tokens trained through each step under a curriculum: the ramp stretch by stretch (one per length,
    `Curriculum.stretches`), then full length. Built in time proportional to the number of lengths."""

    def __init__(self, curriculum: Curriculum, batch: BatchSchedule) -> None:
        self.curriculum = curriculum
        self.batch = batch
        self._stretches = curriculum.stretches(curriculum.total_steps)
        self._firsts = [first for _, first, _ in self._stretches]
        self._through: list[int] = []  # tokens trained through each stretch's last step
        total = before = 0
        for seqlen, _, last in self._stretches:
            after = batch.consumed_after(last)
            total, before = total + (after - before) * seqlen, after
            self._through.append(total)

    @property
    def ramp_steps(self) -> int:
        return self.curriculum.total_steps

    def through(self, step: int) -> int:
        """Tokens trained in steps 1..step."""
        if step <= 0:
            return 0
        ramp = self.curriculum.total_steps
        if step > ramp:
            full = self.batch.consumed_after(step) - self.batch.consumed_after(ramp)
            return self._through[-1] + full * self.curriculum.max_difficulty
        i = bisect.bisect_right(self._firsts, step) - 1
        seqlen, first, _ = self._stretches[i]
        before = self._through[i - 1] if i else 0
        return before + (self.batch.consumed_after(step) - self.batch.consumed_after(first - 1)) * seqlen

    def steps_to_reach(self, tokens: int) -> int:
        """The first step after which at least `tokens` tokens are trained."""
        if tokens <= 0:
            return 0
        if tokens <= self._through[-1]:
            i = bisect.bisect_left(self._through, tokens)
            seqlen, first, _ = self._stretches[i]
            before = self._through[i - 1] if i else 0
            samples = -(-(tokens - before) // seqlen)
            return self.batch.steps_to_consume(self.batch.consumed_after(first - 1) + samples)
        ramp = self.curriculum.total_steps
        samples = -(-(tokens - self._through[-1]) // self.curriculum.max_difficulty)
        return self.batch.steps_to_consume(self.batch.consumed_after(ramp) + samples)
