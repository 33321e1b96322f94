"""The Triton kernels against their torch references: outputs and every gradient, fp32 and bf16.

Runs on CPU tensors under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), and on CUDA
tensors unchanged when a GPU is present (BSOPS_KERNEL_DEVICE=cuda). Shapes are small and mostly
not powers of two; bf16 results are compared with the fp32 reference computed from the same
bf16 inputs, within bf16 rounding.
"""

from __future__ import annotations

import math

import pytest
import torch

from bigscience_ops import kernels
from bigscience_ops.kernels.attention import causal_attention_triton, draw_seed, dropout_keep_mask
from bigscience_ops.kernels.crossentropy import ce_partials, combine_partials, cross_entropy_reference, cross_entropy_triton
from bigscience_ops.kernels.gelu import bias_gelu_reference, bias_gelu_triton
from bigscience_ops.kernels.layernorm import layer_norm_reference, layer_norm_triton
from bigscience_ops.kernels.softmax import causal_attention_reference, scaled_causal_softmax
from tests.fixtures_kernels import DEVICE, DTYPES, _close, _qkv_views, _randn


def _leaves(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Same values twice: leaves in their dtype for the kernel, fp32 leaves for the reference."""
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


def _check(kernel, reference, inputs: list[torch.Tensor], dtype: torch.dtype, names: list[str], **kwargs) -> None:
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


def _ce_inputs(N: int, V: int, dtype: torch.dtype, masked: float):
    logits = _randn(N, V, seed=12, scale=3.0).to(dtype)
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(13)).to(DEVICE)
    mask = (torch.rand(N, generator=torch.Generator().manual_seed(14)) >= masked).float().to(DEVICE)
    mask[0] = 0.0  # at least one masked row
    return logits, targets, mask


def _masked_mean(losses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Megatron's loss: sum(loss * mask) / sum(mask)."""
    return (losses * mask).sum() / mask.sum()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,V", [(75, 300), (16, 1000), (5, 64)])
def test_cross_entropy_matches_reference_with_loss_mask(N, V, dtype):
    logits, targets, mask = _ce_inputs(N, V, dtype, masked=0.3)
    z, zr = logits.clone().requires_grad_(), logits.float().requires_grad_()
    losses = cross_entropy_triton(z, targets)
    expected = cross_entropy_reference(zr, targets)
    assert losses.dtype == torch.float32 and losses.shape == (N,)
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-5)  # fp32 math on the same (bf16) values
    _masked_mean(losses, mask).backward()
    _masked_mean(expected, mask).backward()
    assert z.grad.dtype == dtype
    _close(z.grad, zr.grad, dtype, "grad logits")
    assert not z.grad[mask == 0].any(), "masked rows get no gradient"


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_over_two_vocab_shards_equals_the_whole(dtype):
    """TP=2 in one process: each shard's partials combined as the all-reduces would combine them."""
    N, V, split = 40, 250, 128  # a padded-vocab-like uneven split; some targets in each shard
    logits, targets, mask = _ce_inputs(N, V, dtype, masked=0.25)
    shards = [logits[:, :split].clone().requires_grad_(), logits[:, split:].clone().requires_grad_()]
    starts = [0, split]
    partials = [ce_partials(s.detach(), targets, start) for s, start in zip(shards, starts)]
    zr = logits.float().requires_grad_()
    expected = cross_entropy_reference(zr, targets)
    _masked_mean(expected, mask).backward()
    for rank, (shard, start) in enumerate(zip(shards, starts)):
        others = [p for r, p in enumerate(partials) if r != rank]
        losses = cross_entropy_triton(shard, targets, start, lambda mine: combine_partials([mine, *others]))
        torch.testing.assert_close(losses, expected.detach(), rtol=1e-5, atol=1e-5)
        _masked_mean(losses, mask).backward()
    _close(torch.cat([s.grad for s in shards], dim=1), zr.grad, dtype, "grad logits")


def test_dispatch_follows_the_switch(monkeypatch):
    x = _randn(4, 24, seed=15)
    w, b = _randn(24, seed=16), _randn(24, seed=17)
    reference = layer_norm_reference(x, w, b, 1e-5)
    assert torch.equal(kernels.layer_norm(x, w, b, 1e-5, "torch"), reference)
    assert torch.equal(kernels.layer_norm(x, w, b, 1e-5, "auto"), reference) == (not x.is_cuda)
    _close(kernels.layer_norm(x, w, b, 1e-5, "triton"), reference, torch.float32, "triton")
    with pytest.raises(kernels.KernelUnavailable, match="'fast'"):
        kernels.layer_norm(x, w, b, 1e-5, "fast")
    if not x.is_cuda:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(kernels.KernelUnavailable, match="TRITON_INTERPRET"):
            kernels.bias_gelu(x, b, "triton")
