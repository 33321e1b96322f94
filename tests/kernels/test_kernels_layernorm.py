"""kernels/layernorm.py: the Triton LayerNorm against F.layer_norm, output and every gradient, fp32 and bf16.

Runs on CPU tensors under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), and on CUDA
tensors unchanged when a GPU is present (BSOPS_KERNEL_DEVICE=cuda). Shapes are small and mostly
not powers of two; bf16 results are compared with the fp32 reference computed from the same
bf16 inputs, within bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch

from bigscience_ops.kernels import layernorm
from bigscience_ops.kernels.layernorm import layer_norm_reference, layer_norm_triton
from tests.fixtures_kernels import DEVICE, DTYPES, _check, _close, _randn, _uneven_launch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 37, 100), (5, 64), (1, 7, 129)])
def test_layer_norm_matches_reference(shape, dtype):
    h = shape[-1]
    x = _randn(*shape, seed=1, scale=3.0) + 2.0  # a mean far from 0 checks the two-pass variance
    _check(layer_norm_triton, layer_norm_reference, [x, _randn(h, seed=2), _randn(h, seed=3)], dtype,
           ["x", "weight", "bias"], eps=1e-5)


def test_layer_norm_statistics_in_fp32():
    # rows whose mean is large against their spread: bf16 statistics would lose the spread entirely
    x = (torch.full((8, 96), 200.0) + _randn(8, 96, seed=4).cpu()).to(DEVICE).bfloat16()
    w, b = torch.ones(96, device=DEVICE, dtype=torch.bfloat16), torch.zeros(96, device=DEVICE, dtype=torch.bfloat16)
    expected = layer_norm_reference(x.float(), w.float(), b.float(), 1e-5)
    _close(layer_norm_triton(x, w, b, 1e-5), expected, torch.bfloat16, "output")


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_over_several_tiles_per_program(monkeypatch, dtype):
    """37 rows on 3 programs of 4-row tiles: 13, 13 and 11 rows each, the last tile of each partial.
    The weight and bias gradients are summed over the programs' partial sums."""
    launches = _uneven_launch(monkeypatch, layernorm)
    _check(layer_norm_triton, layer_norm_reference, [_randn(37, 50, seed=30, scale=2.0), _randn(50, seed=31),
                                                     _randn(50, seed=32)], dtype, ["x", "weight", "bias"], eps=1e-5)
    assert [(launch.programs, launch.rows_per_program, launch.block_m) for launch in launches] == [(3, 13, 4)]


def test_layer_norm_reads_strided_rows_and_a_transposed_input():
    """A column slice (rows further apart than h) is read in place; a transposed input and a transposed
    upstream gradient (last stride not 1) are copied; either way the values and gradients are the reference's."""
    h = 40
    for shape, view in (((6, h + 9), lambda t: t[:, :h]), ((h, 6), lambda t: t.t())):
        base = _randn(*shape, seed=33)
        ours, ref = base.clone().requires_grad_(), base.clone().requires_grad_()
        w, b = _randn(h, seed=34).requires_grad_(), _randn(h, seed=35).requires_grad_()
        rw, rb = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        out = layer_norm_triton(view(ours), w, b, 1e-5)
        expected = layer_norm_reference(view(ref), rw, rb, 1e-5)
        _close(out, expected, torch.float32, "output")
        grad = _randn(h, out.shape[0], seed=36).t()  # (rows, h) with strides (1, rows)
        out.backward(grad)
        expected.backward(grad)
        for name, a, e in (("x", ours, ref), ("weight", w, rw), ("bias", b, rb)):
            _close(a.grad, e.grad, torch.float32, f"grad {name}")
