"""kernels/crossentropy.py: the chunked, vocab-parallel Triton cross-entropy against F.cross_entropy (losses
and the logits' gradient under Megatron's loss mask), its per-shard partials, their combination and the
gradient kernel on its own.

Runs on CPU tensors under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), and on CUDA
tensors unchanged when a GPU is present (BSOPS_KERNEL_DEVICE=cuda).
"""

from __future__ import annotations

import pytest
import torch

from bigscience_ops.kernels import crossentropy
from bigscience_ops.kernels.crossentropy import (
    ce_grad, ce_partials, combine_partials, cross_entropy_reference, cross_entropy_triton,
)
from tests.fixtures_kernels import DEVICE, DTYPES, _close, _randn, _uneven_launch


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


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_in_vocab_chunks_over_several_tiles_per_program(monkeypatch, dtype):
    """The vocabulary read 64 columns at a time (5 chunks, the last partial) by 3 programs of 4-row tiles.
    Rows whose logits climb across the vocabulary raise the running max at every chunk, so the running
    sum is rescaled each time; rows that fall keep the first chunk's max."""
    N, V = 23, 300
    monkeypatch.setattr(crossentropy, "_max_block_v", lambda logits: 64)
    launches = _uneven_launch(monkeypatch, crossentropy)
    logits, targets, mask = _ce_inputs(N, V, dtype, masked=0.2)
    ramp = torch.linspace(-40.0, 40.0, V, device=DEVICE)
    logits[1], logits[2] = ramp.to(dtype), (-ramp).to(dtype)
    z, zr = logits.clone().requires_grad_(), logits.float().requires_grad_()
    losses = cross_entropy_triton(z, targets)
    expected = cross_entropy_reference(zr, targets)
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-5)
    _masked_mean(losses, mask).backward()
    _masked_mean(expected, mask).backward()
    _close(z.grad, zr.grad, dtype, "grad logits")
    assert [(launch.programs, launch.rows_per_program, launch.block_m, launch.block_n) for launch in launches] \
        == [(3, 8, 4, 64)] * 2  # the partials' forward and the gradient's backward


def test_partials_are_max_sum_of_exp_and_target_logit_of_the_shard():
    """Per row: the shard's max, sum of exp(z - max), and the target's logit where the target id is in
    [vocab_start, vocab_start + V_shard), else 0."""
    N, V, start = 30, 90, 1000
    logits = _randn(N, V, seed=60, scale=4.0)
    targets = torch.randint(start - 50, start + V + 50, (N,), generator=torch.Generator().manual_seed(61)).to(DEVICE)
    m, s, t = ce_partials(logits, targets, start)
    mine = (targets >= start) & (targets < start + V)
    assert 0 < int(mine.sum()) < N  # some targets in the shard, some in others
    assert all(x.dtype == torch.float32 and x.shape == (N,) for x in (m, s, t))
    torch.testing.assert_close(m, logits.amax(1))
    torch.testing.assert_close(s, torch.exp(logits - logits.amax(1, keepdim=True)).sum(1))
    expected_t = torch.where(mine, logits.gather(1, (targets - start).clamp(0, V - 1)[:, None])[:, 0], 0.0)
    torch.testing.assert_close(t, expected_t)


def test_combined_partials_give_the_log_sum_exp_and_target_logit_of_the_whole():
    N, V = 12, 200
    logits = _randn(N, V, seed=62, scale=5.0)
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(63)).to(DEVICE)
    bounds = [0, 37, 150, V]  # three uneven shards
    parts = [ce_partials(logits[:, a:b].contiguous(), targets, a) for a, b in zip(bounds, bounds[1:])]
    m, s, t = combine_partials(parts)
    torch.testing.assert_close(m + torch.log(s), torch.logsumexp(logits, dim=1))
    torch.testing.assert_close(t, logits.gather(1, targets[:, None])[:, 0])
    for one, alone in zip(combine_partials(parts[:1]), parts[0]):
        torch.testing.assert_close(one, alone)


def test_grad_kernel_is_softmax_minus_one_hot_times_dloss():
    N, V, start = 9, 70, 70  # the second shard of a 140-id vocabulary
    logits = _randn(N, V, seed=64, scale=2.0)
    targets = torch.randint(0, 2 * V, (N,), generator=torch.Generator().manual_seed(65)).to(DEVICE)
    lse = _randn(N, seed=66).abs() + torch.logsumexp(logits, dim=1)  # the global lse holds the other shard too
    dloss = _randn(N, seed=67)
    one_hot = torch.zeros(N, V, device=DEVICE)
    mine = (targets >= start) & (targets < start + V)
    one_hot[mine.nonzero()[:, 0], targets[mine] - start] = 1.0
    expected = (torch.exp(logits - lse[:, None]) - one_hot) * dloss[:, None]
    _close(ce_grad(logits, targets, lse, dloss, start), expected, torch.float32, "grad logits")


def test_cross_entropy_reads_strided_and_transposed_logits():
    N, V = 14, 96
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(68)).to(DEVICE)
    for shape, view in (((N, V + 5), lambda t: t[:, :V]), ((V, N), lambda t: t.t())):
        base = _randn(*shape, seed=69, scale=3.0)
        ours, ref = base.clone().requires_grad_(), base.clone().requires_grad_()
        losses = cross_entropy_triton(view(ours), targets)
        expected = cross_entropy_reference(view(ref), targets)
        torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-5)
        losses.sum().backward()
        expected.sum().backward()
        _close(ours.grad, ref.grad, torch.float32, "grad logits")
