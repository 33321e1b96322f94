"""Helpers shared by the kernel tests: the device they run on, the dtypes, tolerances, seeded inputs, the
comparison of a kernel with its reference, and a launch geometry that walks several tiles per program.

CPU tensors under Triton's interpreter by default (conftest.py sets TRITON_INTERPRET=1); CUDA tensors
with BSOPS_KERNEL_DEVICE=cuda. Nothing here is a pytest fixture: benchmarks/gpu.sh runs the kernel tests
with --noconftest.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from bigscience_ops.kernels._launch import RowLaunch, row_launch

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


def _leaves(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Same values twice: leaves in their dtype for the kernel, fp32 leaves for the reference."""
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


def _check(kernel, reference, inputs: list[torch.Tensor], dtype: torch.dtype, names: list[str], **kwargs) -> None:
    """The kernel's output and every input's gradient against the reference's, on the same values in fp32."""
    ours = _leaves(*(t.to(dtype) for t in inputs))
    ref = _leaves(*(t.to(dtype).float() for t in inputs))
    out = kernel(*ours, **kwargs)
    expected = reference(*ref, **kwargs)
    assert out.dtype == dtype and out.shape == expected.shape
    _close(out, expected, dtype, "output")
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    out.backward(grad.to(dtype))
    expected.backward(grad.to(dtype).float())
    for name, a, b in zip(names, ours, ref):
        assert a.grad is not None and a.grad.dtype == dtype, name
        _close(a.grad, b.grad, dtype, f"grad {name}")


def _uneven_launch(monkeypatch, module, programs: int = 3, block_m: int = 4) -> list[RowLaunch]:
    """Make `module`'s kernels walk several row tiles per program, the last one partial, on any device.

    row_launch gives each interpreted program a single tile (and a GPU program one until there are
    thousands of rows), so the tile loop and the per-program partial sums would go untested: here
    `module.row_launch` keeps its column tiling but spreads the rows over `programs` programs of
    `block_m`-row tiles. Returns the launches made, for the test to check that they were used.
    """
    made: list[RowLaunch] = []

    def launch(rows: int, cols: int, device: torch.device, max_block_n: int | None = None) -> RowLaunch:
        made.append(replace(row_launch(rows, cols, device, max_block_n), programs=programs,
                            rows_per_program=-(-rows // programs), block_m=block_m))
        return made[-1]

    monkeypatch.setattr(module, "row_launch", launch)
    return made
