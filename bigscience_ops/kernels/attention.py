"""Causal self-attention, flash-style, with attention dropout: Triton kernels and autograd.

Design: FlashAttention-2's tiling. The forward walks the key blocks at or below each query block
with an online softmax (running max m and sum l in fp32), so no T x T matrix is ever stored; it
keeps only the output and the log-sum-exp (B, nh, T) for the backward. Scores are scaled by
1/sqrt(hs) and masked causally inside the tile. Dropout is applied to the probabilities inside
the kernel, as FlashAttention does: the keep mask is a Philox draw `tl.rand(seed + b*nh + h, i*T + j)`,
a pure function of (seed, batch-head, query, key), so the backward regenerates exactly the same
mask from the seed instead of storing it. This is why the fused flash design was chosen over a
fused scale-mask-softmax: dropout costs no memory and no extra pass over a T x T matrix.

The seed is drawn at each forward from the default generator of the tensors' device (the CUDA
generator on a GPU, the CPU one under the interpreter) into a one-element tensor on that device
that the kernels load: no host synchronisation, and whatever governs that generator governs the
masks. The model draws it inside the tensor-parallel RNG tracker's fork, so each TP rank draws its
own masks for its own heads; activation checkpointing restores the generator and the tracker before
recomputing, so the recomputed forward redraws the same masks.

ALiBi: with per-head slopes, slope_h * (j - i) is added to the scaled score of query i and key j
inside the tile, in the forward and both backward kernels (the reference, kernels/softmax.py,
adds BLOOM's slope_h * j; the two differ by a per-row constant the softmax ignores).

Backward (two kernels, no atomics, deterministic):
  dK, dV: one program per key block, looping over the query blocks that can see it;
  dQ:     one program per query block, looping over the key blocks it sees.
With P the undropped probabilities, Z the keep mask / (1 - p) and O the (dropped) output:
  dV = (P*Z)^T dO,  dP = (dO V^T) * Z,  dS = P * (dP - rowsum(dO * O)),  dQ = dS K / sqrt(hs),  dK = dS^T Q / sqrt(hs).

Inputs may be strided views (q, k, v split from the fused QKV): every tensor is addressed through
its strides. The output is laid out (B, T, nh, hs) in memory and returned as a (B, nh, T, hs) view,
so the model's transpose back to (B, T, h) costs nothing. Head sizes that are not powers of two are
padded to the next one inside the tile.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _mm(a, b, UPCAST: tl.constexpr):
    """tl.dot. UPCAST: both operands in fp32, for the interpreter (its dot multiplies bf16 bit patterns
    as integers). fp32 operands on a GPU use full precision ("ieee"), not TF32, like torch's matmul."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _head_constants(SEED, SLOPES, h, DROPOUT: tl.constexpr, ALIBI: tl.constexpr):
    """(dropout seed, ALiBi slope) of head h: the seed lives on the device, so no host sync draws it."""
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)
    slope = 0.0
    if ALIBI:
        slope = tl.load(SLOPES + h).to(tl.float32)
    return seed, slope


@triton.jit
def _probs(q, k, lse, rows, cols, row_ok, col_ok, scale, slope, ALIBI: tl.constexpr, UPCAST: tl.constexpr):
    """The backward's attention probabilities of one (BLOCK_M, BLOCK_N) tile, recomputed from the saved
    log-sum-exp: causal, ALiBi-biased when asked, zero outside the sequence."""
    s = _mm(q, tl.trans(k), UPCAST) * scale
    if ALIBI:
        s += slope * (cols[None, :] - rows[:, None]).to(tl.float32)
    visible = (rows[:, None] >= cols[None, :]) & row_ok[:, None] & col_ok[None, :]
    return tl.where(visible, tl.exp(s - lse[:, None]), 0.0)


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, SLOPES, SEED, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
              H, T, D, scale, dropout_p,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DROPOUT: tl.constexpr,
              ALIBI: tl.constexpr, UPCAST: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    seed, slope = _head_constants(SEED, SLOPES, h, DROPOUT, ALIBI)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < T
    dim_ok = dims < D
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    hi = tl.minimum((start_m + 1) * BLOCK_M, T)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < T
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dims[None, :], mask=kv_mask, other=0.0)
        s = _mm(q, tl.trans(k), UPCAST) * scale  # (BLOCK_M, BLOCK_N) fp32
        if ALIBI:
            s += slope * (cols[None, :] - rows[:, None]).to(tl.float32)
        s = tl.where((rows[:, None] >= cols[None, :]) & col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: key 0 is visible to every row
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DROPOUT:
            keep = tl.rand(seed + bh, rows[:, None] * T + cols[None, :]) >= dropout_p
            p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        acc = acc * alpha[:, None] + _mm(p.to(v.dtype), v, UPCAST)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + b * sob + h * soh + rows[:, None] * sot + dims[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(LSE + bh * T + rows, m_i + tl.log(l_i), mask=row_ok)


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, SLOPES, SEED, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                   sdob, sdoh, sdot, sdkb, sdkh, sdkt, sdvb, sdvh, sdvt, H, T, D, scale, dropout_p,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DROPOUT: tl.constexpr,
                   ALIBI: tl.constexpr, UPCAST: tl.constexpr):
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    seed, slope = _head_constants(SEED, SLOPES, h, DROPOUT, ALIBI)
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    col_ok = cols < T
    dim_ok = dims < D
    kv_mask = col_ok[:, None] & dim_ok[None, :]
    k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dims[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    for start_m in range(start_n * BLOCK_N, T, BLOCK_M):  # queries before the block see none of its keys
        rows = start_m + offs_m
        row_ok = rows < T
        q_mask = row_ok[:, None] & dim_ok[None, :]
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdot + dims[None, :], mask=q_mask, other=0.0)
        lse = tl.load(LSE + bh * T + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * T + rows, mask=row_ok, other=0.0)
        p = _probs(q, k, lse, rows, cols, row_ok, col_ok, scale, slope, ALIBI, UPCAST)  # (BLOCK_M, BLOCK_N)
        dp = _mm(do, tl.trans(v), UPCAST)
        if DROPOUT:
            keep = tl.rand(seed + bh, rows[:, None] * T + cols[None, :]) >= dropout_p
            dv += _mm(tl.trans(tl.where(keep, p / (1.0 - dropout_p), 0.0).to(do.dtype)), do, UPCAST)
            dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
        else:
            dv += _mm(tl.trans(p.to(do.dtype)), do, UPCAST)
        ds = p * (dp - delta[:, None])
        dk += _mm(tl.trans(ds.to(q.dtype)), q, UPCAST)
    tl.store(DK + b * sdkb + h * sdkh + cols[:, None] * sdkt + dims[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=kv_mask)
    tl.store(DV + b * sdvb + h * sdvh + cols[:, None] * sdvt + dims[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, SLOPES, SEED, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                 sdob, sdoh, sdot, sdqb, sdqh, sdqt, H, T, D, scale, dropout_p,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DROPOUT: tl.constexpr,
                 ALIBI: tl.constexpr, UPCAST: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    seed, slope = _head_constants(SEED, SLOPES, h, DROPOUT, ALIBI)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < T
    dim_ok = dims < D
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdot + dims[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * T + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * T + rows, mask=row_ok, other=0.0)
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    hi = tl.minimum((start_m + 1) * BLOCK_M, T)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < T
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dims[None, :], mask=kv_mask, other=0.0)
        p = _probs(q, k, lse, rows, cols, row_ok, col_ok, scale, slope, ALIBI, UPCAST)  # (BLOCK_M, BLOCK_N)
        dp = _mm(do, tl.trans(v), UPCAST)
        if DROPOUT:
            keep = tl.rand(seed + bh, rows[:, None] * T + cols[None, :]) >= dropout_p
            dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
        ds = p * (dp - delta[:, None])
        dq += _mm(ds.to(k.dtype), k, UPCAST)
    tl.store(DQ + b * sdqb + h * sdqh + rows[:, None] * sdqt + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=q_mask)


def _blocks(T: int, D: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, num_warps). tl.dot needs every tile side >= 16 on a GPU."""
    block_d = max(16, triton.next_power_of_2(D))
    if device.type == "cuda":
        block = 64 if block_d <= 128 else 32
        return block, block, block_d, 4 if block_d <= 64 else 8
    block = max(16, min(64, triton.next_power_of_2(T)))  # the interpreter: few, large programs
    return block, block, block_d, 1


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    assert t.stride(-1) == 1, f"the head dimension must be contiguous, got strides {t.stride()}"
    return t.stride(0), t.stride(1), t.stride(2)


class CausalAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
                slopes: torch.Tensor | None) -> torch.Tensor:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        B, H, T, D = q.shape
        block_m, block_n, block_d, warps = _blocks(T, D, q.device)
        out = torch.empty((B, T, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)  # (B, nh, T, hs) view
        lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
        seed = draw_seed(q.device) if dropout_p > 0.0 else torch.zeros(1, dtype=torch.int64, device=q.device)
        alibi = slopes is not None
        if alibi:
            assert slopes.shape == (H,), f"alibi slopes {tuple(slopes.shape)} for {H} heads"
            slopes = slopes.to(device=q.device, dtype=torch.float32).contiguous()
        else:
            slopes = lse  # never read
        scale = 1.0 / math.sqrt(D)
        _attn_fwd[(triton.cdiv(T, block_m), B * H)](
            q, k, v, out, lse, slopes, seed, *_strides(q), *_strides(k), *_strides(v), *_strides(out), H, T, D,
            scale, dropout_p, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, DROPOUT=dropout_p > 0.0,
            ALIBI=alibi, UPCAST=not q.is_cuda, num_warps=warps)
        ctx.save_for_backward(q, k, v, out, lse, slopes, seed)
        ctx.dropout_p, ctx.scale, ctx.alibi = dropout_p, scale, alibi
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, out, lse, slopes, seed = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        B, H, T, D = q.shape
        block_m, block_n, block_d, warps = _blocks(T, D, q.device)
        delta = (dout.float() * out.float()).sum(-1)  # (B, nh, T): rowsum(dO * O)
        dq, dk, dv = (torch.empty((B, T, H, D), dtype=t.dtype, device=t.device).transpose(1, 2) for t in (q, k, v))
        common = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, DROPOUT=ctx.dropout_p > 0.0,
                      ALIBI=ctx.alibi, UPCAST=not q.is_cuda, num_warps=warps)
        _attn_bwd_dkdv[(triton.cdiv(T, block_n), B * H)](
            q, k, v, dout, lse, delta, dk, dv, slopes, seed, *_strides(q), *_strides(k), *_strides(v),
            *_strides(dout), *_strides(dk), *_strides(dv), H, T, D, ctx.scale, ctx.dropout_p, **common)
        _attn_bwd_dq[(triton.cdiv(T, block_m), B * H)](
            q, k, v, dout, lse, delta, dq, slopes, seed, *_strides(q), *_strides(k), *_strides(v),
            *_strides(dout), *_strides(dq), H, T, D, ctx.scale, ctx.dropout_p, **common)
        return dq, dk, dv, None, None


def draw_seed(device: torch.device) -> torch.Tensor:
    """The dropout seed of one forward: a one-element int64 tensor drawn from `device`'s default generator."""
    return torch.randint(0, 2**31 - 1, (1,), dtype=torch.int64, device=device)


def causal_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                            alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """(B, nh, T, hs) x3 -> (B, nh, T, hs): softmax(q k^T / sqrt(hs) [+ ALiBi], causal), dropout_p on it, times v.

    alibi_slopes: (nh,) slopes of these heads (see kernels/softmax.py alibi_slopes), or None.
    """
    assert q.shape == k.shape == v.shape, f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    assert 0.0 <= dropout_p < 1.0, f"dropout_p must be in [0, 1), got {dropout_p}"
    return CausalAttentionFunction.apply(q, k, v, dropout_p, alibi_slopes)


def dropout_keep_mask(seed: int, batch_heads: int, T: int, dropout_p: float, device: torch.device) -> torch.Tensor:
    """The kernel's keep mask for a seed, as a (B*nh, T, T) bool tensor: for tests and debugging only."""
    keep = torch.empty((batch_heads, T, T), dtype=torch.int8, device=device)
    block = max(16, min(64, triton.next_power_of_2(T)))
    _dropout_mask[(triton.cdiv(T, block), batch_heads)](keep, T, dropout_p, seed, BLOCK=block)
    return keep.bool()


@triton.jit
def _dropout_mask(KEEP, T, dropout_p, seed, BLOCK: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    for start_n in range(0, T, BLOCK):
        cols = start_n + tl.arange(0, BLOCK)
        keep = tl.rand(seed + bh, rows[:, None] * T + cols[None, :]) >= dropout_p
        tl.store(KEEP + bh * T * T + rows[:, None] * T + cols[None, :], keep.to(tl.int8),
                 mask=(rows < T)[:, None] & (cols < T)[None, :])
