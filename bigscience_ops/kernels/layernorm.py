"""LayerNorm over the last dimension: a Triton kernel with autograd, and the plain-torch reference.

Statistics (mean, 1/std) are computed and kept in fp32 whatever the input dtype; the output is
written in the input dtype. The backward computes dx row by row and, per program, partial sums of
dweight and dbias over its rows in fp32 (a (programs, h) buffer); the host sums those partials in
fp32 and casts once to the parameter dtype, so bf16/fp16 runs lose no precision in the reduction
(Apex's and Megatron's fused LayerNorm do the same).

Each row is held whole in one tile (BLOCK_N = next power of two >= h), which covers every hidden
size up to a few tens of thousands.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bigscience_ops.kernels._launch import as_rows, row_launch


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension, computed in the input dtype. x: (..., h)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@triton.jit
def _layer_norm_fwd(X, W, B, Y, Mean, Rstd, stride_x, stride_y, M, N, eps, rows_per_program,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
        y = xc * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        tl.store(Mean + rows, mean, mask=row_ok)
        tl.store(Rstd + rows, rstd, mask=row_ok)


@triton.jit
def _layer_norm_bwd(X, W, DY, DX, Mean, Rstd, DW, DB, stride_x, stride_dy, stride_dx, M, N, rows_per_program,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy
        c1 = tl.sum(xhat * wdy, axis=1) / N
        c2 = tl.sum(wdy, axis=1) / N
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
    tl.store(DW + pid * N + cols, dw, mask=col_ok)
    tl.store(DB + pid * N + cols, db, mask=col_ok)


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        shape = x.shape
        x2 = as_rows(x)
        M, N = x2.shape
        y = torch.empty_like(x2)
        mean = torch.empty(M, dtype=torch.float32, device=x.device)
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        launch = row_launch(M, N, x.device)
        _layer_norm_fwd[(launch.programs,)](x2, weight, bias, y, mean, rstd, x2.stride(0), y.stride(0), M, N, eps,
                                            launch.rows_per_program, BLOCK_M=launch.block_m,
                                            BLOCK_N=launch.block_n, num_warps=launch.num_warps)
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.launch = launch
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, mean, rstd = ctx.saved_tensors
        launch = ctx.launch
        M, N = x2.shape
        dy2 = as_rows(dy)
        dx = torch.empty_like(x2)
        dw = torch.empty((launch.programs, N), dtype=torch.float32, device=x2.device)
        db = torch.empty((launch.programs, N), dtype=torch.float32, device=x2.device)
        _layer_norm_bwd[(launch.programs,)](x2, weight, dy2, dx, mean, rstd, dw, db, x2.stride(0), dy2.stride(0),
                                            dx.stride(0), M, N, launch.rows_per_program, BLOCK_M=launch.block_m,
                                            BLOCK_N=launch.block_n, num_warps=launch.num_warps)
        return dx.view(dy.shape), dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype), None


def layer_norm_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension with the Triton kernels. x: (..., h); weight, bias: (h,)."""
    assert weight.shape == bias.shape == (x.shape[-1],), f"weight {tuple(weight.shape)}, bias " \
                                                        f"{tuple(bias.shape)}, x {tuple(x.shape)}"
    return LayerNormFunction.apply(x, weight.contiguous(), bias.contiguous(), eps)

