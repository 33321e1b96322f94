"""bf16 x ZeRO-0/1 x PP=2, TP=2, DP=2, PP=1: each resumes from a save in the next launch with the
uninterrupted run's iteration lines; each checkpoint is the size the plan computes (fixtures_matrix.py)."""

from __future__ import annotations

import pytest

from tests.fixtures_matrix import matrix_tests, reshape_tests

pytestmark = pytest.mark.slow

cells, test_every_layout_and_zero_stage_resumes_with_the_uninterrupted_lines, \
    test_every_checkpoint_is_the_size_the_plan_computes = matrix_tests("bf16")
reshaped, test_reshape_and_warm_start_at_each_stage = reshape_tests("bf16", tolerance=1e-2)


def test_every_cell_learns_the_same_losses_and_reports_mfu(cells):
    """Every layout and stage sees the same samples a step: bf16's losses agree across them to bf16's rounding, and
    fall; MFU is TFLOPs over estimate.peak_tflops (0.25: a CPU has no entry in the peaks table)."""
    import math

    from tests.fixtures_trainer import scalars

    reference = scalars(cells[(0, "pp1")].whole / "tensorboard", "lm loss")
    for (zero, layout), cell in cells.items():
        board = cell.whole / "tensorboard"
        losses = scalars(board, "lm loss")
        assert sorted(losses) == sorted(reference), (zero, layout)
        for step, value in losses.items():
            assert math.isclose(value, reference[step], rel_tol=5e-3), (zero, layout, step, value, reference[step])
        assert losses[max(losses)] < losses[1], (zero, layout)
        tflops, mfu = scalars(board, "TFLOPs per GPU"), scalars(board, "MFU")
        assert sorted(mfu) == sorted(tflops) == sorted(losses), (zero, layout)
        for step in mfu:
            assert math.isclose(mfu[step], tflops[step] / 0.25, rel_tol=1e-5), (zero, layout, step)
