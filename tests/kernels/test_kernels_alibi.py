"""ALiBi attention: the slopes against BLOOM's, the torch path and the Triton kernel (forward and every
gradient, with and without dropout) against the explicit reference.

Triton runs on CPU tensors under the interpreter (conftest.py sets TRITON_INTERPRET=1), on CUDA with
BSOPS_KERNEL_DEVICE=cuda.
"""

from __future__ import annotations

import math

import pytest
import torch

from bigscience_ops.kernels.attention import causal_attention_triton, draw_seed, dropout_keep_mask
from bigscience_ops.kernels.softmax import alibi_bias, alibi_slopes, causal_attention_torch, causal_attention_reference, scaled_causal_softmax
from tests.fixtures_kernels import DEVICE, DTYPES, _close, _qkv_views, _randn


@pytest.mark.parametrize("heads", [1, 3, 4, 5, 6, 12, 16, 20, 112])
def test_slopes_equal_blooms_for_any_head_count(heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    bloom = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)  # (heads, 1, 2): slope * j
    torch.testing.assert_close(torch.tensor(alibi_slopes(heads)), bloom[:, 0, 1], rtol=1e-6, atol=0.0)


def test_slopes_of_a_power_of_two_and_the_interleaved_extra():
    assert alibi_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]
    # 6 heads: the 4-head slopes 2^-2 .. 2^-8, then every other 8-head slope: 2^-1, 2^-3
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    with pytest.raises(ValueError):
        alibi_slopes(0)


def _leaf_views(qkv: torch.Tensor, D: int):
    leaf = qkv.detach().float().requires_grad_()
    return leaf, leaf.transpose(1, 2).split(D, dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,T,D", [(2, 3, 37, 20), (1, 5, 64, 16)])
def test_triton_alibi_matches_reference(B, H, T, D, dtype):
    slopes = torch.tensor(alibi_slopes(H), device=DEVICE)
    qkv, (q, k, v) = _qkv_views(B, T, H, D, dtype, seed=20)
    out = causal_attention_triton(q, k, v, 0.0, slopes)
    ref_qkv, (rq, rk, rv) = _leaf_views(qkv, D)
    expected = causal_attention_reference(rq, rk, rv, 0.0, slopes)
    _close(out, expected, dtype, "output")
    grad = _randn(*out.shape, seed=21)
    out.backward(grad.to(dtype))
    expected.backward(grad.to(dtype).float())
    _close(qkv.grad, ref_qkv.grad, dtype, "grad qkv")
    plain = causal_attention_reference(rq, rk, rv)
    assert (plain - expected).abs().max() > 1e-2, "the bias must change the attention"


def test_triton_alibi_with_dropout_matches_the_masked_reference():
    B, H, T, D, p = 2, 3, 40, 16, 0.25
    slopes = torch.tensor(alibi_slopes(H), device=DEVICE)
    qkv, (q, k, v) = _qkv_views(B, T, H, D, torch.float32, seed=22)
    torch.manual_seed(5)
    seed = int(draw_seed(DEVICE).item())  # the draw the forward makes
    torch.manual_seed(5)
    out = causal_attention_triton(q, k, v, p, slopes)
    keep = dropout_keep_mask(seed, B * H, T, p, DEVICE).view(B, H, T, T)
    ref_qkv, (rq, rk, rv) = _leaf_views(qkv, D)
    probs = scaled_causal_softmax(rq @ rk.transpose(-2, -1), 1.0 / math.sqrt(D), alibi_bias(slopes, T))
    expected = (probs * keep / (1 - p)) @ rv
    _close(out, expected, torch.float32, "output")
    grad = _randn(*out.shape, seed=23)
    out.backward(grad)
    expected.backward(grad)
    _close(qkv.grad, ref_qkv.grad, torch.float32, "grad qkv")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 33, 130])
def test_torch_path_alibi_equals_the_explicit_reference(T, dtype):
    """The torch path (what `auto` takes for attention where SDPA is faster): SDPA with ALiBi and the causal mask
    as one additive bias, against the explicit softmax with BLOOM's bias, forward and the fused QKV's gradient."""
    B, H, D = 2, 6, 8
    slopes = torch.tensor(alibi_slopes(H), device=DEVICE)
    qkv, (q, k, v) = _qkv_views(B, T, H, D, dtype, seed=24)
    out = causal_attention_torch(q, k, v, 0.0, slopes)
    assert out.dtype == dtype
    ref_qkv, (rq, rk, rv) = _leaf_views(qkv, D)
    expected = causal_attention_reference(rq, rk, rv, 0.0, slopes)
    _close(out, expected, dtype, "output")
    grad = _randn(*out.shape, seed=25)
    out.backward(grad.to(dtype))
    expected.backward(grad.to(dtype).float())
    _close(qkv.grad, ref_qkv.grad, dtype, "grad qkv")
    if T > 1:
        assert (causal_attention_reference(rq, rk, rv) - expected).abs().max() > 1e-2, "the bias must change it"


def test_dropout_seed_comes_from_the_device_generator():
    """The kernel's seed follows the generator of q's device: the same state, the same masks; another, others."""
    qkv, (q, k, v) = _qkv_views(1, 24, 2, 16, torch.float32, seed=26)
    state = torch.get_rng_state() if DEVICE.type == "cpu" else torch.cuda.get_rng_state(DEVICE)
    set_state = torch.set_rng_state if DEVICE.type == "cpu" else (lambda s: torch.cuda.set_rng_state(s, DEVICE))
    first = causal_attention_triton(q, k, v, 0.5)
    set_state(state)
    again = causal_attention_triton(q, k, v, 0.5)
    other = causal_attention_triton(q, k, v, 0.5)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
