"""Bias + GeLU (tanh approximation), as Megatron's fused bias_gelu: Triton kernels and the torch reference.

Forward: y = gelu_tanh(x + bias), computed in fp32, stored in x's dtype. Like Megatron, only x and
the bias are saved; the backward recomputes x + bias and applies the derivative
    gelu'(u) = 0.5 (1 + t) + 0.5 u (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 u^2),  t = tanh(...)
The bias gradient (a sum over every row) is reduced per program in fp32 and summed on the host
in fp32, then cast once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bigscience_ops.kernels._launch import row_launch

MAX_BLOCK_F = 1024  # columns per tile; wider MLPs get a second grid axis


def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(x + bias). x: (..., f), bias: (f,)."""
    return F.gelu(x + bias, approximate="tanh")


@triton.jit
def _tanh(u):
    # 1 - 2 / (exp(2u) + 1); tanh(+-15) is +-1 in fp32, and the clamp keeps exp finite
    u = tl.minimum(tl.maximum(u, -15.0), 15.0)
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _bias_gelu_fwd(X, B, Y, stride_x, stride_y, M, F, rows_per_program, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    col_ok = cols < F
    b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for start in range(row_start, row_end, BLOCK_M):
        rows = (start + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask = (rows < row_end)[:, None] & col_ok[None, :]
        u = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32) + b[None, :]
        t = _tanh(0.7978845608028654 * (u + 0.044715 * u * u * u))
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], (0.5 * u * (1.0 + t)).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bias_gelu_bwd(X, B, DY, DX, DB, stride_x, stride_dy, stride_dx, M, F, rows_per_program,
                   BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    col_ok = cols < F
    b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
    db = tl.zeros((BLOCK_F,), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for start in range(row_start, row_end, BLOCK_M):
        rows = (start + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask = (rows < row_end)[:, None] & col_ok[None, :]
        u = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32) + b[None, :]
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        t = _tanh(0.7978845608028654 * (u + 0.044715 * u * u * u))
        grad = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * u * u)
        dx = tl.where(mask, dy * grad, 0.0)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        db += tl.sum(dx, axis=0)
    tl.store(DB + pid * F + cols, db, mask=col_ok)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


class BiasGeluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x2 = _as_rows(x)
        M, F = x2.shape
        y = torch.empty_like(x2)
        launch = row_launch(M, F, x.device, max_block_n=MAX_BLOCK_F)
        grid = (launch.programs, triton.cdiv(F, launch.block_n))
        _bias_gelu_fwd[grid](x2, bias, y, x2.stride(0), y.stride(0), M, F, launch.rows_per_program,
                             BLOCK_M=launch.block_m, BLOCK_F=launch.block_n, num_warps=launch.num_warps)
        ctx.save_for_backward(x2, bias)
        ctx.launch = launch
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, bias = ctx.saved_tensors
        launch = ctx.launch
        M, F = x2.shape
        dy2 = _as_rows(dy)
        dx = torch.empty_like(x2)
        db = torch.empty((launch.programs, F), dtype=torch.float32, device=x2.device)
        grid = (launch.programs, triton.cdiv(F, launch.block_n))
        _bias_gelu_bwd[grid](x2, bias, dy2, dx, db, x2.stride(0), dy2.stride(0), dx.stride(0), M, F,
                             launch.rows_per_program, BLOCK_M=launch.block_m, BLOCK_F=launch.block_n,
                             num_warps=launch.num_warps)
        return dx.view(dy.shape), db.sum(0).to(bias.dtype)


def bias_gelu_triton(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(x + bias) with the Triton kernels. x: (..., f), bias: (f,)."""
    assert bias.shape == (x.shape[-1],), f"bias {tuple(bias.shape)} does not match x {tuple(x.shape)}"
    return BiasGeluFunction.apply(x, bias.contiguous())
