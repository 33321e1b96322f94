"""fp32 x ZeRO-0/1 x PP=2, TP=2, DP=2, PP=1: each trains to an exit interval, saves, and resumes in the next launch
with the uninterrupted run's iteration lines; each checkpoint is the size the plan computes (fixtures_matrix.py)."""

from __future__ import annotations

import pytest

from tests.fixtures_matrix import assert_checkpoint_sizes, assert_resumes_exactly, matrix_runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    return matrix_runs(tmp_path_factory, "fp32")


def test_every_layout_and_zero_stage_resumes_with_the_uninterrupted_lines(cells):
    assert_resumes_exactly(cells)


def test_every_checkpoint_is_the_size_the_plan_computes(cells):
    assert_checkpoint_sizes(cells, "fp32")
