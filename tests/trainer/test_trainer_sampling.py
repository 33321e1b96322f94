"""trainer/sampling.py: the arithmetic the trainer's feed and `bsops samples` share, and the task's start line."""

from __future__ import annotations

from bigscience_ops.trainer.sampling import (
    TaskLayout, micro_batch_indices, micro_batch_positions, parse_layout_line, sample_indices,
)


def test_micro_batches_interleave_ranks_and_wrap_around_the_dataset():
    # step after 10 samples, DP 2, micro-batches of 3: rank 1's second micro-batch starts at 10 + (1 * 2 + 1) * 3
    assert list(micro_batch_positions(10, 1, 3, 1, 2)) == [19, 20, 21]
    assert micro_batch_indices(10, 1, 3, 1, 2, num_samples=20) == [19, 0, 1]
    per_rank = [sample_indices(10, 2, 3, r, 2) for r in range(2)]
    assert sorted(per_rank[0] + per_rank[1]) == list(range(10, 22))  # a step of 12 reads each sample once


def test_the_start_line_reads_back_after_an_srun_label():
    for synthetic in (False, True):
        layout = TaskLayout("tr8-104B", 104_000_000_000, 4, 12, 8, 1, synthetic, 115_311, 300)
        assert parse_layout_line(layout.line()) == layout
        assert parse_layout_line("  12: " + layout.line()) == layout
    assert parse_layout_line(" iteration 10/ 221 | lm loss: 8.6 |") is None
