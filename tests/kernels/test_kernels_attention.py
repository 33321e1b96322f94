"""kernels/attention.py: the Triton causal flash attention against the explicit reference (output and the
gradient of the fused QKV, with and without dropout), its dropout seed and keep mask, and its output layout.

Runs on CPU tensors under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), and on CUDA
tensors unchanged when a GPU is present (BSOPS_KERNEL_DEVICE=cuda). ALiBi has its own file,
test_kernels_alibi.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from bigscience_ops.kernels.attention import causal_attention_triton, draw_seed, dropout_keep_mask
from bigscience_ops.kernels.softmax import causal_attention_reference, scaled_causal_softmax
from tests.fixtures_kernels import DEVICE, DTYPES, _close, _qkv_views, _randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,T,D", [(2, 3, 37, 20), (1, 2, 64, 16), (1, 1, 70, 8)])
def test_causal_attention_matches_reference(B, H, T, D, dtype):
    qkv, (q, k, v) = _qkv_views(B, T, H, D, dtype, seed=8)
    out = causal_attention_triton(q, k, v)
    ref_qkv = qkv.detach().float().requires_grad_()
    rq, rk, rv = ref_qkv.transpose(1, 2).split(D, dim=-1)
    expected = causal_attention_reference(rq, rk, rv)
    _close(out, expected, dtype, "output")
    grad = _randn(*out.shape, seed=9)
    out.backward(grad.to(dtype))
    expected.backward(grad.to(dtype).float())
    _close(qkv.grad, ref_qkv.grad, dtype, "grad qkv")


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_dropout_regenerates_its_mask_in_backward(dtype):
    B, H, T, D, p = 2, 2, 40, 16, 0.3
    qkv, (q, k, v) = _qkv_views(B, T, H, D, dtype, seed=10)
    torch.manual_seed(123)
    seed = int(draw_seed(DEVICE).item())  # the draw the forward makes, from the device's own generator
    torch.manual_seed(123)
    out = causal_attention_triton(q, k, v, p)
    keep = dropout_keep_mask(seed, B * H, T, p, DEVICE).view(B, H, T, T)
    visible = torch.ones(T, T, dtype=torch.bool, device=DEVICE).tril()
    kept = keep[:, :, visible].float().mean().item()
    assert abs(kept - (1 - p)) < 0.03, kept  # about 3300 draws: 3 sigma is 0.024

    ref_qkv = qkv.detach().float().requires_grad_()
    rq, rk, rv = ref_qkv.transpose(1, 2).split(D, dim=-1)
    probs = scaled_causal_softmax(rq @ rk.transpose(-2, -1), 1.0 / math.sqrt(D))
    expected = (probs * keep / (1 - p)) @ rv
    _close(out, expected, dtype, "output")
    grad = _randn(*out.shape, seed=11)
    out.backward(grad.to(dtype))
    expected.backward(grad.to(dtype).float())
    _close(qkv.grad, ref_qkv.grad, dtype, "grad qkv")

    torch.manual_seed(124)
    other = causal_attention_triton(q, k, v, p)
    assert not torch.equal(other, out), "another seed must draw another mask"


def test_contiguous_inputs_give_a_head_major_view_of_token_major_memory():
    """Separate contiguous q, k, v work as well as views of the fused QKV; the output is (B, nh, T, hs) over
    (B, T, nh, hs) memory, so the model's transpose back to (B, T, h) is free."""
    B, H, T, D = 2, 3, 21, 16
    q, k, v = (_randn(B, H, T, D, seed=seed).requires_grad_() for seed in (50, 51, 52))
    rq, rk, rv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = causal_attention_triton(q, k, v)
    assert out.shape == (B, H, T, D) and out.transpose(1, 2).is_contiguous()
    expected = causal_attention_reference(rq, rk, rv)
    _close(out, expected, torch.float32, "output")
    grad = _randn(B, H, T, D, seed=53)
    out.backward(grad)
    expected.backward(grad)
    for name, a, e in (("q", q, rq), ("k", k, rk), ("v", v, rv)):
        _close(a.grad, e.grad, torch.float32, f"grad {name}")


def test_a_single_token_attends_to_itself_only():
    """T = 1: the one probability is 1, so the output is v, v's gradient is the upstream one, q's and k's are 0."""
    qkv, (q, k, v) = _qkv_views(2, 1, 2, 16, torch.float32, seed=54)
    out = causal_attention_triton(q, k, v)
    _close(out, v, torch.float32, "output")
    grad = _randn(*out.shape, seed=55)
    out.backward(grad)
    dq, dk, dv = qkv.grad.transpose(1, 2).split(16, dim=-1)
    _close(dv, grad, torch.float32, "grad v")
    for name, g in (("q", dq), ("k", dk)):  # p (dp - rowsum(dO O)) with p = 1 and O = v: zero up to rounding
        torch.testing.assert_close(g, torch.zeros_like(g), rtol=0.0, atol=1e-5, msg=lambda m: f"grad {name}: {m}")


def test_backward_is_deterministic_and_reuses_the_forward_mask():
    """Two backward passes over one forward give identical gradients (no atomics; the same seed, the same mask)."""
    qkv, (q, k, v) = _qkv_views(1, 33, 2, 16, torch.float32, seed=56)
    torch.manual_seed(7)
    out = causal_attention_triton(q, k, v, 0.2)
    grad = _randn(*out.shape, seed=57)
    first = torch.autograd.grad(out, qkv, grad, retain_graph=True)[0]
    torch.manual_seed(8)  # the generator moves on; the backward must not draw from it
    second = torch.autograd.grad(out, qkv, grad)[0]
    assert torch.equal(first, second)


def test_draw_seed_is_one_int64_from_the_device_generator():
    torch.manual_seed(3)
    seed = draw_seed(DEVICE)
    assert seed.shape == (1,) and seed.dtype == torch.int64 and seed.device.type == DEVICE.type
    assert 0 <= int(seed.item()) < 2**31 - 1
    torch.manual_seed(3)
    assert torch.equal(draw_seed(DEVICE), seed)
    assert not torch.equal(draw_seed(DEVICE), seed)  # the generator moved on: another draw


def test_keep_mask_is_a_function_of_seed_and_batch_head():
    """The mask the kernels draw: the same for a seed, another for another seed and for each batch-head;
    nothing dropped at p = 0; about 1 - p kept otherwise."""
    T, p = 48, 0.4
    mask = dropout_keep_mask(11, 3, T, p, DEVICE)
    assert mask.shape == (3, T, T) and mask.dtype == torch.bool
    assert torch.equal(mask, dropout_keep_mask(11, 3, T, p, DEVICE))
    assert not torch.equal(mask, dropout_keep_mask(12, 3, T, p, DEVICE))
    assert not torch.equal(mask[0], mask[1]) and not torch.equal(mask[1], mask[2])
    assert abs(mask.float().mean().item() - (1 - p)) < 0.03  # 6912 draws: 3 sigma is 0.018
    assert dropout_keep_mask(11, 3, T, 0.0, DEVICE).all()
