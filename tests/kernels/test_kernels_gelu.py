"""kernels/gelu.py: the Triton bias + GeLU (tanh) against the torch reference, output and every gradient.

Runs on CPU tensors under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), and on CUDA
tensors unchanged when a GPU is present (BSOPS_KERNEL_DEVICE=cuda). bf16 results are compared with
the fp32 reference computed from the same bf16 inputs, within bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch

from bigscience_ops.kernels import gelu
from bigscience_ops.kernels.gelu import MAX_BLOCK_F, bias_gelu_reference, bias_gelu_triton
from tests.fixtures_kernels import DEVICE, DTYPES, _check, _close, _randn, _uneven_launch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 9, 300), (4, 1100), (33, 64)])
def test_bias_gelu_matches_reference(shape, dtype):
    _check(bias_gelu_triton, bias_gelu_reference, [_randn(*shape, seed=5, scale=2.5), _randn(shape[-1], seed=6)],
           dtype, ["x", "bias"])


def test_bias_gelu_saturates_without_nan():
    x = torch.tensor([[-1e4, -30.0, 0.0, 30.0, 1e4]], device=DEVICE, requires_grad=True)
    y = bias_gelu_triton(x, torch.zeros(5, device=DEVICE))
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(y.detach(), bias_gelu_reference(x.detach(), torch.zeros(5, device=DEVICE)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_over_several_tiles_per_program_and_column_blocks(monkeypatch, dtype):
    """22 rows on 3 programs of 4-row tiles (8, 8 and 6 rows), and more columns than one block holds:
    the bias gradient is summed over every program's tiles, per column block."""
    f = MAX_BLOCK_F + 77
    launches = _uneven_launch(monkeypatch, gelu)
    _check(bias_gelu_triton, bias_gelu_reference, [_randn(2, 11, f, seed=40, scale=2.5), _randn(f, seed=41)],
           dtype, ["x", "bias"])
    assert [(launch.programs, launch.rows_per_program, launch.block_m, launch.block_n) for launch in launches] \
        == [(3, 8, 4, MAX_BLOCK_F)]


def test_bias_gelu_reads_strided_rows_and_a_transposed_input():
    f = 48
    for shape, view in (((5, f + 13), lambda t: t[:, :f]), ((f, 5), lambda t: t.t())):
        base = _randn(*shape, seed=42, scale=2.0)
        ours, ref = base.clone().requires_grad_(), base.clone().requires_grad_()
        bias = _randn(f, seed=43).requires_grad_()
        ref_bias = bias.detach().clone().requires_grad_()
        out = bias_gelu_triton(view(ours), bias)
        expected = bias_gelu_reference(view(ref), ref_bias)
        _close(out, expected, torch.float32, "output")
        grad = _randn(f, out.shape[0], seed=44).t()  # (rows, f) with strides (1, rows)
        out.backward(grad)
        expected.backward(grad)
        _close(ours.grad, ref.grad, torch.float32, "grad x")
        _close(bias.grad, ref_bias.grad, torch.float32, "grad bias")
