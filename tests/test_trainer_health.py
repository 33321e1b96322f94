"""The watchdog's training-health checks on real (CPU) trainer runs: a clean run raises nothing, and a
batch of random labels (BSOPS_CORRUPT_AT, the trainer's debug switch) is found at its iteration."""

from __future__ import annotations

import pytest

from bigscience_ops.ops import health
from tests.fixtures_trainer import SPIKE_AT

pytestmark = pytest.mark.slow


def test_a_clean_run_raises_nothing(golden_run):
    _, _, proc = golden_run
    log = health.entries(proc.stdout.split("\n"))
    assert len(log) >= 10 and health.check(log, every=True) == []


def test_a_corrupted_batch_is_a_loss_spike_at_its_iteration(spiked_run):
    _, _, proc = spiked_run
    log = health.entries(proc.stdout.split("\n"))
    assert max(e.stats.iteration for e in log) >= 60
    found = health.check(log, every=True)
    assert {(f.kind, f.iteration) for f in found} >= {("loss-spike", SPIKE_AT)}, found
    assert all(f.iteration == SPIKE_AT for f in found), found  # the run trains on: nothing after it
    spike = next(f for f in found if f.kind == "loss-spike")
    assert "bsops rollback" in spike.next_step
