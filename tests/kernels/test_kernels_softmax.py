"""kernels/softmax.py: the plain-torch references, the causal softmax and the torch attention path (the CPU
fallback and what `model.kernels: torch` runs), checked against explicit formulas.

Torch only: runs on CPU tensors, or on CUDA with BSOPS_KERNEL_DEVICE=cuda. ALiBi's slopes and the
ALiBi torch path are in test_kernels_alibi.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from bigscience_ops.kernels.softmax import (
    alibi_bias, causal_attention_reference, causal_attention_torch, scaled_causal_softmax,
)
from tests.fixtures_kernels import DEVICE, DTYPES, _close, _qkv_views, _randn


def _explicit_causal_softmax(scores: torch.Tensor, scale: float, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Row i: a softmax over keys 0..i alone, the later keys 0; in fp32, one row at a time."""
    T = scores.shape[-1]
    z = scores.float() * scale + (0.0 if bias is None else bias)
    rows = [torch.cat([torch.softmax(z[..., i, :i + 1], dim=-1), torch.zeros_like(z[..., i, i + 1:])], dim=-1)
            for i in range(T)]
    return torch.stack(rows, dim=-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_causal_softmax_is_a_distribution_over_the_visible_keys(dtype):
    scores = _randn(2, 3, 9, 9, seed=70, scale=4.0).to(dtype)
    probs = scaled_causal_softmax(scores, 0.7)
    assert probs.dtype == dtype and probs.shape == scores.shape
    assert not probs.float().triu(1).any(), "no weight on a later key"
    _close(probs.float().sum(-1), torch.ones(2, 3, 9, device=DEVICE), dtype, "row sums")
    _close(probs, _explicit_causal_softmax(scores, 0.7), dtype, "probabilities")


def test_scaled_causal_softmax_adds_the_bias_to_the_scaled_scores():
    scores = _randn(3, 7, 7, seed=71)
    bias = _randn(3, 1, 7, seed=72, scale=2.0)  # per head and key, as alibi_bias
    probs = scaled_causal_softmax(scores, 0.5, bias)
    _close(probs, _explicit_causal_softmax(scores, 0.5, bias), torch.float32, "probabilities")


def test_alibi_bias_is_slope_times_key_position():
    slopes = torch.tensor([0.5, 0.25], device=DEVICE)
    bias = alibi_bias(slopes, 4)
    assert bias.dtype == torch.float32 and bias.shape == (2, 1, 4)
    assert bias.cpu().tolist() == [[[0.0, 0.5, 1.0, 1.5]], [[0.0, 0.25, 0.5, 0.75]]]


def test_reference_attention_is_the_softmax_of_scaled_scores_times_v():
    B, H, T, D = 1, 2, 6, 4
    q, k, v = (_randn(B, H, T, D, seed=seed) for seed in (73, 74, 75))
    expected = _explicit_causal_softmax(q @ k.transpose(-2, -1), 1.0 / math.sqrt(D)) @ v
    _close(causal_attention_reference(q, k, v), expected, torch.float32, "output")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 29])
def test_torch_path_equals_the_explicit_reference(T, dtype):
    """What `kernels: torch` (and `auto` off CUDA) runs: scaled_dot_product_attention, causal, against the
    explicit softmax in fp32 on the same values; output and the fused QKV's gradient."""
    B, H, D = 2, 3, 8
    qkv, (q, k, v) = _qkv_views(B, T, H, D, dtype, seed=76)
    out = causal_attention_torch(q, k, v)
    ref_qkv = qkv.detach().float().requires_grad_()
    rq, rk, rv = ref_qkv.transpose(1, 2).split(D, dim=-1)
    expected = causal_attention_reference(rq, rk, rv)
    assert out.dtype == dtype
    _close(out, expected, dtype, "output")
    grad = _randn(*out.shape, seed=77)
    out.backward(grad.to(dtype))
    expected.backward(grad.to(dtype).float())
    _close(qkv.grad, ref_qkv.grad, dtype, "grad qkv")
