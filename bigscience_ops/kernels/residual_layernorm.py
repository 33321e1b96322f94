"""Dropout + residual add + LayerNorm in one kernel (forward and backward), and the plain-torch reference.

The block's attention output meets the residual stream as

    s = x + dropout(a, p)        the new residual stream (returned: the MLP's output is added to it)
    y = LayerNorm(s)             the MLP's input (post_attention_layernorm)

Eager torch runs that as three or four kernels (dropout, add, LayerNorm, each a pass over memory, each
a launch); here one forward and one backward kernel do it. The keep mask is a Philox draw
`tl.rand(seed, row * N + col) >= p`, a pure function of the seed and the element, so the backward
regenerates it instead of storing it (the seed is drawn, as attention's, from the default generator of
the tensors' device: whatever governs that generator governs the masks). Statistics are fp32, from s as
stored (rounded to its dtype, as the reference computes LayerNorm of the stored sum); dweight and
dbias are reduced per program in fp32 and summed on the host (as layernorm.py).

Backward, with g = dL/ds from the residual path and dy = dL/dy:
    ds_total = g + LayerNorm's input gradient(dy),   dx = ds_total,   da = ds_total * keep / (1 - p).
Mask offsets are 32-bit: a tensor of more than 2^31 elements would repeat the pattern (far beyond
a micro-batch's activations).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bigscience_ops.kernels._launch import as_rows, row_launch
from bigscience_ops.kernels.attention import draw_seed


def residual_layer_norm_reference(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                                  eps: float, dropout_p: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, LayerNorm(s)) with s = x + dropout(a, dropout_p): eager torch, the model's own operations."""
    s = x + F.dropout(a, dropout_p, training=dropout_p > 0.0)
    return s, F.layer_norm(s, (s.shape[-1],), weight, bias, eps)


def residual_layer_norm_masked(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                               eps: float, keep: torch.Tensor, dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference with a given keep mask (bool, a's shape) instead of a draw: for comparing with the kernel."""
    s = x + a * keep / (1.0 - dropout_p)
    return s, F.layer_norm(s, (s.shape[-1],), weight, bias, eps)


@triton.jit
def _res_ln_fwd(X, A, W, B, S, Y, Mean, Rstd, SEED, stride_x, stride_a, M, N, eps, dropout_p, drop_scale,
                rows_per_program, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        a = tl.load(A + rows64[:, None] * stride_a + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if DROPOUT:
            keep = tl.rand(seed, rows[:, None] * N + cols[None, :]) >= dropout_p
            a = tl.where(keep, a * drop_scale, 0.0)
        s = (x + a).to(S.dtype.element_ty)
        tl.store(S + rows64[:, None] * N + cols[None, :], s, mask=mask)
        s = tl.where(mask, s.to(tl.float32), 0.0)
        mean = tl.sum(s, axis=1) / N
        sc = tl.where(mask, s - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(sc * sc, axis=1) / N + eps)
        y = sc * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(Y + rows64[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        tl.store(Mean + rows, mean, mask=row_ok)
        tl.store(Rstd + rows, rstd, mask=row_ok)


@triton.jit
def _res_ln_bwd(S, W, DY, DS, DX, DA, Mean, Rstd, DW, DB, SEED, stride_dy, stride_ds, M, N, dropout_p, drop_scale,
                rows_per_program, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr,
                HAS_DS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        s = tl.load(S + rows64[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy
        c1 = tl.sum(xhat * wdy, axis=1) / N
        c2 = tl.sum(wdy, axis=1) / N
        dsum = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_DS:
            dsum += tl.load(DS + rows64[:, None] * stride_ds + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows64[:, None] * N + cols[None, :], dsum.to(DX.dtype.element_ty), mask=mask)
        da = dsum
        if DROPOUT:
            keep = tl.rand(seed, rows[:, None] * N + cols[None, :]) >= dropout_p
            da = tl.where(keep, dsum * drop_scale, 0.0)
        tl.store(DA + rows64[:, None] * N + cols[None, :], da.to(DA.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
    tl.store(DW + pid * N + cols, dw, mask=col_ok)
    tl.store(DB + pid * N + cols, db, mask=col_ok)


@triton.jit
def _keep_mask(KEEP, SEED, M, N, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    seed = tl.load(SEED)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        keep = tl.rand(seed, rows[:, None] * N + cols[None, :]) >= dropout_p
        tl.store(KEEP + rows.to(tl.int64)[:, None] * N + cols[None, :], keep.to(tl.int8),
                 mask=(rows < M)[:, None] & (cols < N)[None, :])


def _scale(dropout_p: float) -> float:
    return 1.0 / (1.0 - dropout_p) if dropout_p > 0.0 else 1.0


class ResidualLayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                dropout_p: float):
        shape = x.shape
        x2, a2 = as_rows(x), as_rows(a)
        M, N = x2.shape
        dtype = torch.promote_types(x.dtype, a.dtype)  # what x + a gives (fp32 residual + bf16 branch under autocast)
        s = torch.empty((M, N), dtype=dtype, device=x.device)
        y = torch.empty_like(s)
        mean = torch.empty(M, dtype=torch.float32, device=x.device)
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        seed = draw_seed(x.device) if dropout_p > 0.0 else torch.zeros(1, dtype=torch.int64, device=x.device)
        launch = row_launch(M, N, x.device)
        _res_ln_fwd[(launch.programs,)](x2, a2, weight, bias, s, y, mean, rstd, seed, x2.stride(0), a2.stride(0), M,
                                        N, eps, dropout_p, _scale(dropout_p), launch.rows_per_program,
                                        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, DROPOUT=dropout_p > 0.0,
                                        num_warps=launch.num_warps)
        ctx.save_for_backward(s, weight, mean, rstd, seed)
        ctx.set_materialize_grads(False)
        ctx.launch, ctx.dropout_p, ctx.dtypes = launch, dropout_p, (x.dtype, a.dtype)
        return s.view(shape), y.view(shape)

    @staticmethod
    def backward(ctx, ds: torch.Tensor | None, dy: torch.Tensor | None):
        s, weight, mean, rstd, seed = ctx.saved_tensors
        launch, p = ctx.launch, ctx.dropout_p
        M, N = s.shape
        shape = (ds if ds is not None else dy).shape
        dy2 = as_rows(dy) if dy is not None else torch.zeros_like(s)
        ds2 = as_rows(ds) if ds is not None else dy2  # never read without HAS_DS
        dx = torch.empty((M, N), dtype=ctx.dtypes[0], device=s.device)
        da = torch.empty((M, N), dtype=ctx.dtypes[1], device=s.device)
        dw = torch.empty((launch.programs, N), dtype=torch.float32, device=s.device)
        db = torch.empty((launch.programs, N), dtype=torch.float32, device=s.device)
        _res_ln_bwd[(launch.programs,)](s, weight, dy2, ds2, dx, da, mean, rstd, dw, db, seed, dy2.stride(0),
                                        ds2.stride(0), M, N, p, _scale(p), launch.rows_per_program,
                                        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, DROPOUT=p > 0.0,
                                        HAS_DS=ds is not None, num_warps=launch.num_warps)
        return dx.view(shape), da.view(shape), dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype), None, None


def residual_layer_norm_triton(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                               eps: float, dropout_p: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, LayerNorm(s)) with s = x + dropout(a, dropout_p), in one Triton kernel each way. x, a: (..., h)."""
    assert x.shape == a.shape, f"residual {tuple(x.shape)} and branch {tuple(a.shape)} must have one shape"
    assert weight.shape == bias.shape == (x.shape[-1],), f"weight {tuple(weight.shape)}, bias " \
                                                        f"{tuple(bias.shape)}, x {tuple(x.shape)}"
    assert 0.0 <= dropout_p < 1.0, f"dropout_p must be in [0, 1), got {dropout_p}"
    return ResidualLayerNormFunction.apply(x, a, weight.contiguous(), bias.contiguous(), eps, dropout_p)


def dropout_keep_mask(seed: torch.Tensor, rows: int, cols: int, dropout_p: float) -> torch.Tensor:
    """The kernels' keep mask for a one-element seed tensor, as a (rows, cols) bool tensor: for tests only."""
    keep = torch.empty((rows, cols), dtype=torch.int8, device=seed.device)
    block_m, block_n = 16, min(1024, triton.next_power_of_2(max(cols, 1)))
    _keep_mask[(triton.cdiv(rows, block_m),)](keep, seed, rows, cols, dropout_p, BLOCK_M=block_m, BLOCK_N=block_n)
    return keep.bool()
