"""Shared pytest set-up. Area-specific fixtures live in tests/fixtures_<area>.py and are listed here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Triton kernels run interpreted on CPU; the variable is read when @triton.jit decorates.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

REPO = Path(__file__).resolve().parents[1]

pytest_plugins: list[str] = [
    "tests.fixtures_data",
    "tests.fixtures_trainer",
    "tests.fixtures_slurm",
]


@pytest.fixture
def repo_root() -> Path:
    return REPO
