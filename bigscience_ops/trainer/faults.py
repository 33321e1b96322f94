"""The trainer's debug switches, for tests and fire drills that need a run to fail, spike or slow down where
they choose, or to show what it read. Unset, they cost nothing (the loss function is not even wrapped).

- BSOPS_FAIL_AT="RANK:ITERATION": that rank raises before that iteration (a node failing mid-job);
- BSOPS_KILL_IN_SAVE="RANK:ITERATION": that rank kills itself (SIGKILL) in the middle of the save of that
  iteration, right after DeepSpeed wrote its first file (a node dying mid-save: the save never commits);
- BSOPS_CORRUPT_AT="N[,M...]": iterations N, M... train on random labels (a really bad text input: the
  loss and grad norm spike there);
- BSOPS_NAN_AT="N[,M...]": the loss of those iterations is NaN, and so are their gradients (the trainer
  counts a NaN iteration and skips its update);
- BSOPS_SCALE_GRAD_AT="N[-M]:FACTOR[,...]": the gradients of those iterations are multiplied by FACTOR
  while the loss logged is not (1e4: a grad-norm explosion, clipped as usual; inf: an overflow, a
  skipped update like fp16's);
- BSOPS_SLOW_AT="N[-M]:SECONDS[,...]": the last rank sleeps that long before each of those steps (a slow
  node: every rank waits for it in the step's collectives);
- BSOPS_RECORD_TOKENS_AT="N[-M][,...]": the token ids each data-parallel rank fed the model at those
  iterations, written to <run>/debug/tokens-iter<N>-dp<R>-mb<K>.npz (arrays `tokens` and `labels`, after
  curriculum truncation, before BSOPS_CORRUPT_AT's labels); `bsops samples` must reproduce them.

Iteration lists take single iterations and inclusive ranges ("5,12-14").
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from bigscience_ops.errors import BsopsError


class FaultSwitchError(BsopsError):
    """A debug switch's value cannot be read: names the variable, the value and the form it takes."""


class InjectedFault(RuntimeError):
    """The failure BSOPS_FAIL_AT asked for."""


FAIL_AT_ENV = "BSOPS_FAIL_AT"
KILL_IN_SAVE_ENV = "BSOPS_KILL_IN_SAVE"
CORRUPT_AT_ENV = "BSOPS_CORRUPT_AT"
NAN_AT_ENV = "BSOPS_NAN_AT"
SCALE_GRAD_AT_ENV = "BSOPS_SCALE_GRAD_AT"
SLOW_AT_ENV = "BSOPS_SLOW_AT"
RECORD_TOKENS_AT_ENV = "BSOPS_RECORD_TOKENS_AT"


def _value(env: Mapping[str, str] | None, name: str) -> str:
    return (os.environ if env is None else env).get(name, "").strip()


def fail_at(env: Mapping[str, str] | None = None, name: str = FAIL_AT_ENV) -> tuple[int, int] | None:
    """(rank, iteration) from BSOPS_FAIL_AT="RANK:ITERATION" (or another switch of that form), None when unset."""
    value = _value(env, name)
    if not value:
        return None
    parts = value.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or int(parts[1]) < 1:
        raise FaultSwitchError(f"{name}: got {value!r}; expected RANK:ITERATION such as '1:5' "
                               "(a global rank and a training iteration >= 1)")
    return int(parts[0]), int(parts[1])


def _iterations(text: str) -> list[int] | None:
    """"N" or "N-M" (inclusive, N <= M, N >= 1) as the iterations it names; None when it is neither."""
    first, dash, last = text.strip().partition("-")
    if not first.strip().isdecimal() or (dash and not last.strip().isdecimal()):
        return None
    lo, hi = int(first), int(last) if dash else int(first)
    return list(range(lo, hi + 1)) if 1 <= lo <= hi else None


def iterations_at(name: str, env: Mapping[str, str] | None = None) -> frozenset[int]:
    """The iterations a switch of the form "N[-M][,...]" names; empty when unset."""
    value = _value(env, name)
    if not value:
        return frozenset()
    found = [_iterations(p) for p in value.split(",")]
    if any(f is None for f in found):
        raise FaultSwitchError(f"{name}: got {value!r}; expected training iterations >= 1 or ranges N-M separated "
                               "by commas, such as '40' or '40,90-92'")
    return frozenset(i for f in found for i in f)


def values_at(name: str, unit: str, env: Mapping[str, str] | None = None) -> dict[int, float]:
    """iteration -> value of a switch of the form "N[-M]:VALUE[,...]"; empty when unset."""
    value = _value(env, name)
    if not value:
        return {}
    out: dict[int, float] = {}
    for part in value.split(","):
        where, colon, number = part.partition(":")
        iterations = _iterations(where)
        try:
            amount = float(number)
        except ValueError:
            amount = math.nan
        if not colon or iterations is None or math.isnan(amount) or amount < 0:
            raise FaultSwitchError(f"{name}: got {value!r}; expected ITERATION[-LAST]:{unit} separated by commas, "
                                   f"such as '40:2' or '40-42:2' ({unit} a number >= 0)")
        out.update(dict.fromkeys(iterations, amount))
    return out


def corrupt_at(env: Mapping[str, str] | None = None) -> frozenset[int]:
    """Iterations whose batches BSOPS_CORRUPT_AT="N[,M...]" gives random labels: a debug switch that makes the
    loss spike at N, as a really bad text input would (the watchdog's training-health checks are tested with it)."""
    return iterations_at(CORRUPT_AT_ENV, env)


@dataclass(frozen=True)
class Faults:
    """Every switch, read once when the trainer starts."""

    fail: tuple[int, int] | None = None
    corrupt: frozenset[int] = frozenset()
    nan: frozenset[int] = frozenset()
    scale_grad: dict[int, float] = field(default_factory=dict)
    slow: dict[int, float] = field(default_factory=dict)
    record_tokens: frozenset[int] = frozenset()
    kill_in_save: tuple[int, int] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Faults:
        return cls(fail_at(env), corrupt_at(env), iterations_at(NAN_AT_ENV, env),
                   values_at(SCALE_GRAD_AT_ENV, "FACTOR", env), values_at(SLOW_AT_ENV, "SECONDS", env),
                   iterations_at(RECORD_TOKENS_AT_ENV, env), fail_at(env, KILL_IN_SAVE_ENV))

    def killer(self, iteration: int) -> Callable[[Path], None] | None:
        """BSOPS_KILL_IN_SAVE: for the save of `iteration` on its rank, what to call after each file DeepSpeed wrote
        (the first call kills this process with SIGKILL); None otherwise."""
        if self.kill_in_save is None or self.kill_in_save != (dist.get_rank(), iteration):
            return None
        return lambda written: os.kill(os.getpid(), signal.SIGKILL)


def corrupted(batches: Iterator, vocab_size: int, iteration: int) -> Iterator:
    """`batches` with every label replaced by a random token id (the same on every rank)."""
    generator = torch.Generator().manual_seed(iteration)
    for tokens, (labels, mask) in batches:
        noise = torch.randint(0, vocab_size, labels.shape, generator=generator).to(labels.device)
        yield tokens, (noise, mask)


def raise_if_injected(fault: tuple[int, int] | None, iteration: int) -> None:
    """The failure BSOPS_FAIL_AT asked for, on its rank, before its iteration."""
    if fault is not None and fault == (dist.get_rank(), iteration):
        raise InjectedFault(f"{FAIL_AT_ENV}={fault[0]}:{fault[1]}: rank {fault[0]} fails before iteration {fault[1]}")


def slow_down(faults: Faults, iteration: int) -> None:
    """BSOPS_SLOW_AT: the last rank sleeps before this iteration's step when it is one of the switch's."""
    seconds = faults.slow.get(iteration)
    if seconds and dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(seconds)


class _ScaleGrad(torch.autograd.Function):
    """The identity forward; the gradient multiplied by `factor` backward."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


class FaultyLoss:
    """The pipeline's loss with BSOPS_NAN_AT and BSOPS_SCALE_GRAD_AT applied; the trainer sets `iteration` to the
    step being trained (and back to 0 after it, so validation is never touched)."""

    def __init__(self, loss, faults: Faults) -> None:
        self.loss, self.faults, self.iteration = loss, faults, 0

    def __call__(self, logits: torch.Tensor, labels) -> torch.Tensor:
        value = self.loss(logits, labels)
        if self.iteration in self.faults.nan:
            value = value * math.nan
        factor = self.faults.scale_grad.get(self.iteration)
        return value if factor is None else _ScaleGrad.apply(value, factor)


def with_faults(loss, faults: Faults):
    """`loss` wrapped in a FaultyLoss when a switch acts on it, else `loss` itself."""
    return FaultyLoss(loss, faults) if faults.nan or faults.scale_grad else loss


def token_record_path(folder: Path, iteration: int, dp_rank: int, micro_batch: int) -> Path:
    """Where BSOPS_RECORD_TOKENS_AT writes one micro-batch of one data-parallel rank."""
    return Path(folder) / f"tokens-iter{iteration}-dp{dp_rank}-mb{micro_batch}.npz"


def recorded(batches: Iterator, folder: Path, iteration: int, dp_rank: int) -> Iterator:
    """`batches`, each written first to token_record_path (tokens and labels as int64 arrays)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    for k, batch in enumerate(batches):
        tokens, (labels, _) = batch
        np.savez(token_record_path(folder, iteration, dp_rank, k), tokens=tokens.cpu().numpy(),
                 labels=labels.cpu().numpy())
        yield batch
