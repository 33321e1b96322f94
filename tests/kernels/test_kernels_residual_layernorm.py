"""Dropout + residual add + LayerNorm in one kernel (kernels/residual_layernorm.py) against eager torch: both
outputs and the gradient of every input (residual, branch, weight, bias), odd shapes, fp32 and bf16, with
the kernel's own dropout mask, several tiles per program, and a residual stream in another dtype.

Triton runs on CPU tensors under the interpreter (conftest.py sets TRITON_INTERPRET=1), on CUDA with
BSOPS_KERNEL_DEVICE=cuda.
"""

from __future__ import annotations

import pytest
import torch

from bigscience_ops import kernels
from bigscience_ops.kernels import residual_layernorm
from bigscience_ops.kernels.attention import draw_seed
from bigscience_ops.kernels.residual_layernorm import (dropout_keep_mask, residual_layer_norm_masked,
                                                       residual_layer_norm_reference, residual_layer_norm_triton)
from tests.fixtures_kernels import DEVICE, DTYPES, _close, _leaves, _randn, _uneven_launch

EPS = 1e-5


def _inputs(shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    h = shape[-1]
    return [_randn(*shape, seed=seed), _randn(*shape, seed=seed + 1), 1.0 + 0.1 * _randn(h, seed=seed + 2),
            _randn(h, seed=seed + 3)]


def _compare(kernel, reference, inputs: list[torch.Tensor], dtypes: list[torch.dtype], out_dtype: torch.dtype,
             use_sum: bool = True) -> tuple[torch.Tensor, ...]:
    """Both outputs and every input's gradient, the kernel on inputs of `dtypes` against the reference on the same
    values in fp32. The loss weights s and y with fixed random tensors (s unused when not `use_sum`)."""
    ours = _leaves(*(t.to(d) for t, d in zip(inputs, dtypes)))
    ref = _leaves(*(t.to(d).float() for t, d in zip(inputs, dtypes)))
    s, y = kernel(*ours)
    rs, ry = reference(*ref)
    assert s.dtype == y.dtype == out_dtype and s.shape == y.shape == inputs[0].shape
    _close(s, rs, out_dtype, "sum")
    _close(y, ry, out_dtype, "normed")
    gs, gy = _randn(*s.shape, seed=90), _randn(*s.shape, seed=91)
    loss = (y * gy.to(out_dtype)).float().sum()
    expected = (ry * gy.to(out_dtype).float()).sum()
    if use_sum:
        loss = loss + (s * gs.to(out_dtype)).float().sum()
        expected = expected + (rs * gs.to(out_dtype).float()).sum()
    loss.backward()
    expected.backward()
    for name, a, b, d in zip(("x", "branch", "weight", "bias"), ours, ref, dtypes):
        assert a.grad is not None and a.grad.dtype == d, name
        coarser = torch.bfloat16 if torch.bfloat16 in (d, out_dtype if name in ("x", "branch") else d) else d
        _close(a.grad, b.grad, coarser, f"grad {name}")
    return ours


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 64), (1, 1, 200), (7, 3)])
def test_matches_eager_without_dropout(shape, dtype):
    inputs = _inputs(shape, seed=40)
    _compare(lambda x, a, w, b: residual_layer_norm_triton(x, a, w, b, EPS),
             lambda x, a, w, b: residual_layer_norm_reference(x, a, w, b, EPS), inputs, [dtype] * 4, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_uses_the_kernels_mask_in_forward_and_backward(dtype):
    """The forward's mask is the Philox draw of a seed from the device generator; the backward regenerates the
    same one (the branch's gradient is zero exactly where the forward dropped)."""
    p, shape = 0.3, (2, 9, 48)
    inputs = _inputs(shape, seed=50)
    torch.manual_seed(11)
    seed = draw_seed(DEVICE)  # the draw the forward makes
    keep = dropout_keep_mask(seed, 18, 48, p).view(shape)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.08, keep.float().mean()

    def kernel(x, a, w, b):
        torch.manual_seed(11)
        return residual_layer_norm_triton(x, a, w, b, EPS, p)

    ours = _compare(kernel, lambda x, a, w, b: residual_layer_norm_masked(x, a, w, b, EPS, keep, p), inputs,
                    [dtype] * 4, dtype)
    assert torch.equal(ours[1].grad != 0, keep)


def test_another_seed_draws_another_mask():
    x, a, w, b = _inputs((4, 64), seed=55)
    torch.manual_seed(1)
    first = residual_layer_norm_triton(x, a, w, b, EPS, 0.5)[0]
    torch.manual_seed(1)
    again = residual_layer_norm_triton(x, a, w, b, EPS, 0.5)[0]
    other = residual_layer_norm_triton(x, a, w, b, EPS, 0.5)[0]
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("dtype", DTYPES)
def test_over_several_tiles_per_program(monkeypatch, dtype):
    made = _uneven_launch(monkeypatch, residual_layernorm, programs=3, block_m=4)
    inputs = _inputs((5, 7, 33), seed=60)  # 35 rows: 3 programs of 12 rows, 4-row tiles, the last partial
    _compare(lambda x, a, w, b: residual_layer_norm_triton(x, a, w, b, EPS),
             lambda x, a, w, b: residual_layer_norm_reference(x, a, w, b, EPS), inputs, [dtype] * 4, dtype)
    assert made and all(launch.programs == 3 and launch.block_m == 4 for launch in made)


def test_only_the_normed_output_used_and_strided_inputs():
    """s unused (its gradient None): the inputs' gradients are LayerNorm's alone; x and the branch are
    transposed views, read through their strides."""
    x, a, w, b = _inputs((6, 40), seed=70)
    x, a = x.t().contiguous().t(), a.t().contiguous().t()
    assert x.stride(-1) != 1
    _compare(lambda x, a, w, b: residual_layer_norm_triton(x, a, w, b, EPS),
             lambda x, a, w, b: residual_layer_norm_reference(x, a, w, b, EPS), [x, a, w, b], [torch.float32] * 4,
             torch.float32, use_sum=False)


def test_an_fp32_residual_stream_with_a_bf16_branch():
    """Under autocast the residual stream is fp32 and the branch bf16: the sum and the normed output are fp32 (as
    x + a and LayerNorm under autocast), each gradient in its input's dtype."""
    inputs = _inputs((3, 50), seed=75)
    _compare(lambda x, a, w, b: residual_layer_norm_triton(x, a, w, b, EPS),
             lambda x, a, w, b: residual_layer_norm_reference(x, a, w, b, EPS), inputs,
             [torch.float32, torch.bfloat16, torch.float32, torch.float32], torch.float32)


def test_dispatch_runs_the_reference_or_the_kernel():
    x, a, w, b = _inputs((4, 24), seed=80)
    expected = residual_layer_norm_reference(x, a, w, b, EPS)
    for got, want in zip(kernels.residual_layer_norm(x, a, w, b, EPS, 0.0, "torch"), expected):
        assert torch.equal(got, want)
    for got, want in zip(kernels.residual_layer_norm(x, a, w, b, EPS, 0.0, "triton"), expected):
        _close(got, want, torch.float32, "triton")
