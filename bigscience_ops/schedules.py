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

    def increments(self) -> list[Increment]:
        if not self.has_rampup:
            return []
        table: list[Increment] = []
        previous = 0
        for step, consumed in enumerate(self._rampup_consumed, start=1):
            gbs = consumed - previous
            if table and table[-1].global_batch_size == gbs:
                last = table[-1]
                table[-1] = Increment(gbs, last.nominal_samples, last.naive_steps, last.steps + 1,
                                      last.samples + gbs, last.first_step)
            else:
                nominal = self.samples_per_increment
                table.append(Increment(gbs, nominal, int(nominal) // gbs, 1, gbs, step))
            previous = consumed
        return table


@dataclass(frozen=True)
class LRSchedule:
    """Megatron's AnnealingLR with warmup and decay measured in consumed samples."""

    max_lr: float
    min_lr: float
    warmup_samples: int
    decay_samples: int
    style: str = "cosine"

    def lr_at(self, consumed_samples: int) -> float:
        if self.warmup_samples > 0 and consumed_samples <= self.warmup_samples:
            return self.max_lr * consumed_samples / self.warmup_samples
        if self.style == "constant":
            return self.max_lr
        if consumed_samples > self.decay_samples:
            return self.min_lr
        span = self.decay_samples - self.warmup_samples
        ratio = (consumed_samples - self.warmup_samples) / span if span > 0 else 1.0
        if self.style == "linear":
            coeff = 1.0 - ratio
        else:
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)
