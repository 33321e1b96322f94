"""fp32 x ZeRO-0/1 x PP=2, TP=2, DP=2, PP=1: each resumes from a save in the next launch with the
uninterrupted run's iteration lines; each checkpoint is the size the plan computes (fixtures_matrix.py)."""

from __future__ import annotations

import pytest

from tests.fixtures_matrix import matrix_tests

pytestmark = pytest.mark.slow

cells, test_every_layout_and_zero_stage_resumes_with_the_uninterrupted_lines, \
    test_every_checkpoint_is_the_size_the_plan_computes = matrix_tests("fp32")
