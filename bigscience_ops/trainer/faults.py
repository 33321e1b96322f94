"""The trainer's debug switches, for tests that need a run to fail or to spike where they choose.

BSOPS_FAIL_AT="RANK:ITERATION" makes one rank raise before that iteration (a node failing mid-job);
BSOPS_CORRUPT_AT="N[,M...]" trains iterations N, M... on random labels (a really bad text input: the
loss and grad norm spike there). Unset, they cost nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from bigscience_ops.errors import BsopsError


class FaultSwitchError(BsopsError):
    """A debug switch's value cannot be read: names the variable, the value and the form it takes."""


class InjectedFault(RuntimeError):
    """The failure BSOPS_FAIL_AT asked for."""


FAIL_AT_ENV = "BSOPS_FAIL_AT"


def fail_at(env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """(rank, iteration) from BSOPS_FAIL_AT="RANK:ITERATION", or None when unset."""
    value = (os.environ if env is None else env).get(FAIL_AT_ENV, "").strip()
    if not value:
        return None
    parts = value.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or int(parts[1]) < 1:
        raise FaultSwitchError(f"{FAIL_AT_ENV}: got {value!r}; expected RANK:ITERATION such as '1:5' "
                           "(a global rank and a training iteration >= 1)")
    return int(parts[0]), int(parts[1])


CORRUPT_AT_ENV = "BSOPS_CORRUPT_AT"


def corrupt_at(env: dict[str, str] | None = None) -> frozenset[int]:
    """Iterations whose batches BSOPS_CORRUPT_AT="N[,M...]" gives random labels: a debug switch that makes the
    loss spike at N, as a really bad text input would (the watchdog's training-health checks are tested with it)."""
    value = (os.environ if env is None else env).get(CORRUPT_AT_ENV, "").strip()
    if not value:
        return frozenset()
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdecimal() and int(p) >= 1 for p in parts):
        raise FaultSwitchError(f"{CORRUPT_AT_ENV}: got {value!r}; expected training iterations >= 1 separated by "
                           "commas, such as '40' or '40,90'")
    return frozenset(int(p) for p in parts)


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
