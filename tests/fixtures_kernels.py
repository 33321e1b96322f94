"""Helpers shared by the kernel tests: the device they run on, the dtypes, tolerances, seeded inputs.

CPU tensors under Triton's interpreter by default (conftest.py sets TRITON_INTERPRET=1); CUDA tensors
with BSOPS_KERNEL_DEVICE=cuda.
"""

from __future__ import annotations

import os

import torch

DEVICE = torch.device(os.environ.get("BSOPS_KERNEL_DEVICE", "cpu"))
DTYPES = [torch.float32, torch.bfloat16]


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """fp32: near-exact. bf16: relative to the tensor's scale (a bf16 ulp is 2^-8 of the value)."""
    actual, expected = actual.float(), expected.float()
    scale = max(expected.abs().max().item(), 1e-6)
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5 * scale, msg=lambda m: f"{what}: {m}")
    else:
        torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2 * scale, msg=lambda m: f"{what}: {m}")


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE)


def _qkv_views(B: int, T: int, H: int, D: int, dtype: torch.dtype, seed: int):
    """q, k, v as the model makes them: strided views of one fused (B, T, nh, 3 hs) projection."""
    qkv = _randn(B, T, H, 3 * D, seed=seed).to(dtype).requires_grad_()
    return qkv, qkv.transpose(1, 2).split(D, dim=-1)
