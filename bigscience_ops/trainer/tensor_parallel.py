"""Megatron-style tensor parallelism (TP): the process layout, the f/g communication operators, the
vocab-parallel cross entropy, and how a full initial weight is cut into this rank's shard.

Layout: DeepSpeed's PipeModelDataParallelTopology (axes pipe, data, model; model varies fastest,
so the TP ranks of one stage are neighbours, as Megatron places them on one node). PipelineModule
builds its grid (the `mpu` DeepSpeed's engine uses for grad norm, ZeRO and checkpoint names) from
the same topology; `TensorParallel` holds this rank's TP coordinate and group, built from it before
the layers are, because the layers need their shard at construction.

Operators (Megatron's mappings): `copy_to_tp` enters a TP region (forward identity, backward
all-reduce), `reduce_from_tp` leaves it (forward all-reduce, backward identity). With TP=1 both
are the identity and no process group is needed (plain PyTorch, unit tests).

Dropout RNG (Megatron's model-parallel RNG tracker): inside a TP region each rank holds other heads,
so it must draw its own masks; in replicated regions (embedding dropout, hidden dropout after the
row-parallel all-reduce) every TP rank must draw the same ones, or the replicas drift apart. The
default generator (seeded with train.seed on every rank) serves the replicated regions; attention
dropout runs inside `tp_region_rng(tp)`, a fork of the device's generator seeded with
seed + 2718 + tp_rank. The forked state lives in DeepSpeed's tracker (`get_cuda_rng_tracker`,
device-generic through DeepSpeed's accelerator: the CUDA generator on GPUs, the CPU one on CPUs),
because DeepSpeed's activation checkpointing saves and restores exactly that tracker around the
recomputed forward. Its state is saved with each checkpoint, per rank (`rng_tracker_states`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager

import torch
import torch.distributed as dist

from bigscience_ops import kernels as fused


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its TP group: rank in [0, size), and the group (None when size is 1)."""

    rank: int = 0
    size: int = 1
    group: Any = None

    def shard(self, full: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's contiguous slice of `full` along `dim` (a copy: the full tensor can be freed)."""
        if self.size == 1:
            return full
        return full.chunk(self.size, dim=dim)[self.rank].clone()


SINGLE = TensorParallel()


def topology(pipeline: int, tensor: int, data: int):
    """The (pipe, data, model) process grid PipelineModule is built on."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    return PipeModelDataParallelTopology(num_pp=pipeline, num_mp=tensor, num_dp=data)


def from_topology(topo) -> TensorParallel:
    """This rank's TP group; every rank creates every group, in the same order, as torch requires."""
    size = topo.get_dim("model")
    if size == 1:
        return SINGLE
    rank = dist.get_rank()
    mine = None
    for ranks in topo.get_axis_comm_lists("model"):
        group = dist.new_group(ranks=ranks)
        if rank in ranks:
            mine = group
    return TensorParallel(rank=topo.get_coord(rank).model, size=size, group=mine)


RNG_TRACKER_NAME = "model-parallel-rng"  # Megatron's and DeepSpeed's name for the TP region's generator
MODEL_PARALLEL_SEED_OFFSET = 2718  # Megatron's: the TP region's seed is seed + 2718 + tp_rank


def _rng_tracker():
    from deepspeed.runtime.activation_checkpointing.checkpointing import get_cuda_rng_tracker

    return get_cuda_rng_tracker()


def seed_model_parallel_rng(seed: int, tp: TensorParallel) -> None:
    """Seed this rank's TP-region generator with seed + 2718 + tp_rank (the default generator is untouched)."""
    tracker = _rng_tracker()
    tracker.reset()
    tracker.add(RNG_TRACKER_NAME, seed + MODEL_PARALLEL_SEED_OFFSET + tp.rank)


def tp_region_rng(tp: TensorParallel) -> ContextManager:
    """Run a TP region's random draws (attention dropout) on this rank's own generator.

    Unseeded (a model used outside the trainer, TP=1) it draws from the default generator; with TP > 1
    that would give every rank the same masks, so it is an error.
    """
    tracker = _rng_tracker()
    if RNG_TRACKER_NAME in tracker.get_states():
        return tracker.fork(RNG_TRACKER_NAME)
    if tp.size > 1:
        raise RuntimeError(f"tensor parallel size {tp.size}: the TP-region generator is not seeded; call "
                           "seed_model_parallel_rng(seed, tp) before the first forward")
    return contextlib.nullcontext()


def rng_tracker_states() -> dict[str, torch.Tensor]:
    """The tracker's generator states (name -> state tensor), copied: saved with this rank's checkpoint."""
    return {name: state.clone() for name, state in _rng_tracker().get_states().items()}


def set_rng_tracker_states(states: dict[str, torch.Tensor]) -> None:
    """Restore what `rng_tracker_states` returned."""
    _rng_tracker().set_states({name: state.clone() for name, state in states.items()})


def mark_tensor_parallel(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """Flag a sharded parameter: DeepSpeed's grad norm counts it on every TP rank, replicated ones once."""
    param.tensor_model_parallel = True
    return param


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return x if tp.size == 1 else _CopyToTP.apply(x, tp.group)


def reduce_from_tp(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp.group)


def all_reduce_ce_partials(partials: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                           group: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton cross-entropy's per-shard (max, sum-exp, target logit) -> global ones, over the TP group.

    Two collectives on the logits' device: MAX of the maxima, then one SUM of the rescaled sum-exp
    and the target logits stacked together (the target is in exactly one shard, 0 elsewhere).
    """
    m, s, t = partials
    global_max = m.clone()
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    sums = torch.stack([s * torch.exp(m - global_max), t])
    dist.all_reduce(sums, group=group)
    return global_max, sums[0], sums[1]


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, tp: TensorParallel,
                                 kernels: str = "auto") -> torch.Tensor:
    """Per-token CE of logits split over TP along the vocabulary: (N, V/tp) shards, targets (N,) global ids.

    loss = log(sum over all shards of exp(z - max)) - (z_target - max). The sums over shards use
    `reduce_from_tp`: its backward is the identity, which is exact because every TP rank computes
    the same loss from the reduced values; each rank's logits then get softmax - onehot for its slice.
    With the Triton kernel (`kernels`, see bigscience_ops/kernels/__init__.py) the logits are read in chunks in
    their own dtype and only per-token partials meet the collectives (`all_reduce_ce_partials`).
    """
    if fused.use_triton(kernels, logits):
        group = tp.group
        combine = None if tp.size == 1 else (lambda partials: all_reduce_ce_partials(partials, group))
        return fused.cross_entropy(logits, targets, kernels, vocab_start=tp.rank * logits.size(-1), combine=combine)
    logits = logits.float()
    with torch.no_grad():
        max_logit = logits.max(dim=-1).values
        if tp.size > 1:
            dist.all_reduce(max_logit, op=dist.ReduceOp.MAX, group=tp.group)
    shifted = logits - max_logit.unsqueeze(-1)
    per_shard = logits.size(-1)
    start = tp.rank * per_shard
    local = targets - start
    in_shard = (local >= 0) & (local < per_shard)
    picked = shifted.gather(-1, local.clamp(0, per_shard - 1).unsqueeze(-1)).squeeze(-1) * in_shard
    target_logit = reduce_from_tp(picked, tp)
    sum_exp = reduce_from_tp(shifted.exp().sum(dim=-1), tp)
    return sum_exp.log() - target_logit
