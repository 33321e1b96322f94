"""Shared pytest set-up. Area-specific fixtures live in tests/fixtures_<area>.py and are listed here."""

from __future__ import annotations

import os
import shutil
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
    "tests.fixtures_smtp",
    "tests.fixtures_git",
]


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def trainings(tmp_path: Path) -> Path:
    """A copy of the bundled experiments, so a test can add its own next to them (`base: tiny`)."""
    directory = tmp_path / "trainings"
    shutil.copytree(REPO / "trainings", directory)
    return directory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With pytest-xdist (-n 2 --dist loadgroup, the README's fast loop) the tests that use the Slurm cluster or
    launch the trainer run on one worker: each worker would start the cluster, and two launches side by side
    (fixtures_trainer.concurrently) already keep 2 cores busy: more oversubscribe them (the whole suite on two
    workers takes longer than on one)."""
    for item in items:
        if item.get_closest_marker("slurm") or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group("cluster-and-launches"))
