"""Cross-entropy over (vocab-parallel) logits in chunks: Triton kernels, autograd, torch reference.

The logits (N tokens, V_shard) stay in their own dtype (bf16 on a GPU run): the kernels read them
BLOCK_V columns at a time and keep only per-row fp32 scalars, so the (N, V) fp32 copy that
`F.cross_entropy(logits.float(), ...)` makes is never materialised.

Forward, per row and for this shard's vocabulary slice [vocab_start, vocab_start + V_shard):
    max      m = max_j z_j
    sum-exp  s = sum_j exp(z_j - m)            (online: rescaled whenever m grows)
    target   t = z_target if the target id is in this slice, else 0
With the vocabulary split over TP ranks the caller's `combine` all-reduces these partials:
    M = max_r m_r,  S = sum_r s_r exp(m_r - M),  T = sum_r t_r
(`combine_partials` does the same for partials held in one process). Then
    loss = log S + M - T   (per token, fp32).
Backward, per row: dz_j = (exp(z_j - lse) - [j == target]) * dloss, with lse = M + log S the global
log-sum-exp; every TP rank writes the gradient of its own slice. Megatron's loss mask is the
caller's: sum(loss * mask) / sum(mask) gives masked rows dloss = 0, hence zero gradients.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bigscience_ops.kernels._launch import row_launch

MAX_BLOCK_V = 4096  # vocabulary columns per chunk on a GPU
Partials = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def cross_entropy_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token CE in fp32 over the whole vocabulary: logits (N, V), targets (N,) -> (N,)."""
    return F.cross_entropy(logits.float(), targets, reduction="none")


def combine_partials(parts: list[Partials]) -> Partials:
    """The global (max, sum-exp, target logit) from per-shard partials: what the TP all-reduces compute."""
    m = torch.stack([p[0] for p in parts]).amax(0)
    s = sum(p[1] * torch.exp(p[0] - m) for p in parts)
    t = sum(p[2] for p in parts)
    return m, s, t


@triton.jit
def _ce_partials(Z, TGT, MAX, SUMEXP, TLOGIT, stride_z, N, V, vocab_start, rows_per_program,
                 BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, N)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        rows64 = rows.to(tl.int64)
        target = tl.load(TGT + rows, mask=row_ok, other=-1).to(tl.int64) - vocab_start
        m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        s = tl.zeros((BLOCK_M,), dtype=tl.float32)
        t = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = row_ok[:, None] & (cols < V)[None, :]
            z = tl.load(Z + rows64[:, None] * stride_z + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(z, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows past the end: all -inf
            s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(z - m_safe[:, None]), axis=1)
            t += tl.sum(tl.where(mask & (cols[None, :] == target[:, None]), z, 0.0), axis=1)
            m = m_new
        tl.store(MAX + rows, m, mask=row_ok)
        tl.store(SUMEXP + rows, s, mask=row_ok)
        tl.store(TLOGIT + rows, t, mask=row_ok)


@triton.jit
def _ce_grad(Z, TGT, LSE, DLOSS, DZ, stride_z, stride_dz, N, V, vocab_start, rows_per_program,
             BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, N)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        rows64 = rows.to(tl.int64)
        target = tl.load(TGT + rows, mask=row_ok, other=-1).to(tl.int64) - vocab_start
        lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
        dloss = tl.load(DLOSS + rows, mask=row_ok, other=0.0)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = row_ok[:, None] & (cols < V)[None, :]
            z = tl.load(Z + rows64[:, None] * stride_z + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            grad = tl.exp(z - lse[:, None]) - tl.where(cols[None, :] == target[:, None], 1.0, 0.0)
            tl.store(DZ + rows64[:, None] * stride_dz + cols[None, :], (grad * dloss[:, None]).to(DZ.dtype.element_ty),
                     mask=mask)


def ce_partials(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0) -> Partials:
    """This shard's per-row (max, sum of exp(z - max), target logit or 0), each (N,) fp32 on the logits' device."""
    N, V = logits.shape
    m, s, t = (torch.empty(N, dtype=torch.float32, device=logits.device) for _ in range(3))
    launch = row_launch(N, V, logits.device, max_block_n=_max_block_v(logits))
    _ce_partials[(launch.programs,)](logits, targets, m, s, t, logits.stride(0), N, V, vocab_start,
                                     launch.rows_per_program, BLOCK_M=launch.block_m, BLOCK_V=launch.block_n,
                                     num_warps=launch.num_warps)
    return m, s, t


def ce_grad(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
            vocab_start: int = 0) -> torch.Tensor:
    """d(loss)/d(logits) of this shard, in the logits' dtype: (softmax - onehot) * dloss per row."""
    N, V = logits.shape
    dz = torch.empty_like(logits)
    launch = row_launch(N, V, logits.device, max_block_n=_max_block_v(logits))
    _ce_grad[(launch.programs,)](logits, targets, lse, dloss, dz, logits.stride(0), dz.stride(0), N, V, vocab_start,
                                 launch.rows_per_program, BLOCK_M=launch.block_m, BLOCK_V=launch.block_n,
                                 num_warps=launch.num_warps)
    return dz


def _max_block_v(logits: torch.Tensor) -> int | None:
    return MAX_BLOCK_V if logits.is_cuda else None  # interpreted: one chunk per row block is fastest


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, vocab_start: int,
                combine: Callable[[Partials], Partials] | None) -> torch.Tensor:
        m, s, t = ce_partials(logits, targets, vocab_start)
        if combine is not None:
            m, s, t = combine((m, s, t))
        lse = m + torch.log(s)
        ctx.save_for_backward(logits, targets, lse)
        ctx.vocab_start = vocab_start
        return lse - t

    @staticmethod
    def backward(ctx, dloss: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        dz = ce_grad(logits, targets, lse, dloss.float().contiguous(), ctx.vocab_start)
        return dz, None, None, None


def cross_entropy_triton(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0,
                         combine: Callable[[Partials], Partials] | None = None) -> torch.Tensor:
    """Per-token CE in fp32: logits (N, V_shard) for ids [vocab_start, vocab_start + V_shard), targets (N,)."""
    assert logits.dim() == 2 and targets.shape == logits.shape[:1], \
        f"logits must be (N, V) and targets (N,), got {tuple(logits.shape)} and {tuple(targets.shape)}"
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    return CrossEntropyFunction.apply(logits, targets.contiguous(), vocab_start, combine)
