"""The watchdog's training-health checks on real (CPU) trainer runs.

One run (fixtures_trainer.spiked_run) carries every fault the trainer's debug switches inject (faults.py):
a NaN loss, three overflowing steps, a grad-norm explosion, a slow node for three steps and a batch of
random labels. Each is found at its iteration and nothing else is, both over the whole main_log.txt and
as the watchdog saw the log two iterations after the fault; the NaN and overflowing steps are skipped,
not applied. A clean run raises nothing (the rollback test checks another, with a resume, an evaluation
and saves). fp16's loss-scale collapse cannot be produced on this CPU (no fp16): tests/ops/test_ops_health.py
covers it on synthetic logs.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import pytest

from bigscience_ops.run import log as runlog
from bigscience_ops.run.iterations import parse_iteration_line
from bigscience_ops.ops import health
from bigscience_ops.ops.watch import watchdog
from tests.fixtures_status import seed_job
from tests.fixtures_trainer import INJECTED, SPIKE_AT, scalars

pytestmark = pytest.mark.slow


def _log_lines(exp) -> list[str]:
    return (Path(exp.paths.logs) / runlog.LOG_NAME).read_text().split("\n")


def test_a_clean_run_raises_nothing(golden_run):
    _, _, proc = golden_run
    log = health.entries(proc.stdout.split("\n"))
    assert len(log) >= 10 and health.check(log, every=True) == []


def test_each_injected_fault_is_found_at_its_iteration_and_nothing_else(spiked_run):
    exp, _, _ = spiked_run
    log = health.entries(_log_lines(exp))
    assert [e.stats.iteration for e in log] == list(range(1, log[-1].stats.train_iters + 1))
    findings = health.check(log, exp.alerts.health, every=True)
    found = {(f.kind, f.iteration) for f in findings}
    assert set(INJECTED.items()) <= found
    # Nothing else, but for throughput: on this shared 2-core machine other processes can slow a few steps in a row.
    assert {f for f in found if f[0] != "slow"} == {f for f in INJECTED.items() if f[0] != "slow"}, found
    assert "bsops rollback" in next(f for f in findings if f.kind == "loss-spike").next_step


def test_the_watchdog_alerts_each_fault_two_iterations_after_it(spiked_run, tmp_path):
    """The hourly status run over the log as it stood then (its last lines, the experiment's settings)."""
    exp, _, _ = spiked_run
    lines = _log_lines(exp)
    settings = exp.alerts.health
    running = seed_job()
    at = {s.iteration: i for i, s in enumerate(map(parse_iteration_line, lines)) if s is not None}
    for kind, iteration in INJECTED.items():
        last = at[iteration + 2]
        snapshot = tmp_path / kind / runlog.LOG_NAME
        snapshot.parent.mkdir()
        snapshot.write_text("\n".join(lines[:last + 1]) + "\n")
        result = watchdog.watch(watchdog.WatchSettings(running.name, log_path=snapshot, health=settings),
                                query=lambda **_: [running], now=datetime.now())
        assert f"health-{kind}" in {a.condition for a in result.report.alerts}, (kind, result.lines)
        tail, _ = runlog.tail(snapshot, (settings.window + settings.recent) * 4)  # what the watchdog read
        found = [(f.kind, f.iteration) for f in health.check(health.entries(tail), settings, recent=settings.recent,
                                                             every=True)]
        assert (kind, iteration) in found, (kind, found)
        if kind != "slow":  # other processes on this shared machine can slow the steps after the injected ones
            assert max(i for k, i in found if k == kind) == iteration, (kind, found)


def test_nan_and_overflowing_steps_are_skipped_not_applied(spiked_run):
    """The trainer skips the update of a step whose gradients are not finite (fp32 has no loss scaler to do it):
    the weights and the LR schedule stand still, no grad norm is logged, and the loss is finite again after."""
    exp, out, _ = spiked_run
    stats = {s.iteration: s for s in map(parse_iteration_line, _log_lines(exp)) if s is not None}
    nan_at, overflowing = INJECTED["nan"], range(INJECTED["skipped"] - 2, INJECTED["skipped"] + 1)
    for skipped, before in [(nan_at, nan_at - 1), *((i, overflowing[0] - 1) for i in overflowing)]:
        s = stats[skipped]
        assert (s.skipped, s.grad_norm, s.lm_loss is None) == (1, None, True), s
        assert s.params_norm == stats[before].params_norm and s.learning_rate == stats[before].learning_rate, s
    assert stats[nan_at].nan == 1 and all(stats[i].nan == 0 for i in overflowing)
    assert all(s.skipped == 0 and s.lm_loss is not None and math.isfinite(s.lm_loss)
               for i, s in stats.items() if i != nan_at and i not in overflowing)
    losses = scalars(out / "tensorboard", "lm loss")
    assert math.isnan(losses[nan_at]) and all(math.isfinite(losses[i]) for i in overflowing)
    assert losses[SPIKE_AT] > 1.5 * losses[SPIKE_AT - 1]
