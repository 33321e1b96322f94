"""fp16 x ZeRO-0/1 x PP=2, TP=2, DP=2, PP=1 on CPU (DeepSpeed's fp16 check lifted, fixtures_matrix.FP16_ON_CPU):
each resumes from a save with the uninterrupted run's iteration lines; the loss scale
logged is the wrapper's own (4096 after initial_scale_power 12, at both stages: ZeRO-0's FP16_UnfusedOptimizer
keeps it where a getattr fell back to a silent 1.0); forced overflows show as skipped steps and a falling scale
in the trainer's own output, and the watchdog alerts on that output."""

from __future__ import annotations

import shutil

from datetime import datetime, timedelta

import pytest

from bigscience_ops.schema import HealthConfig
from tests.fixtures_matrix import iteration_lines, matrix_experiment, matrix_tests, reshape_tests, train
from tests.fixtures_trainer import append_main_log, concurrently, scalars

pytestmark = pytest.mark.slow

INITIAL_SCALE = 2.0**12  # render.deepspeed_config: initial_scale_power 12
OVERFLOWS = range(5, 11)  # after the watchdog's initial search (3 lines) and one settled line

cells, test_every_layout_and_zero_stage_resumes_with_the_uninterrupted_lines, \
    test_every_checkpoint_is_the_size_the_plan_computes = matrix_tests("fp16")
reshaped, test_reshape_and_warm_start_at_each_stage = reshape_tests("fp16", tolerance=1e-2)


@pytest.fixture(scope="module")
def overflowed(tmp_path_factory):
    """PP=1 at each ZeRO stage, 14 steps, the gradients of OVERFLOWS multiplied by inf (faults.py): stage -> (experiment,
    run folder, stdout)."""
    def run(zero: int):
        out = tmp_path_factory.mktemp(f"fp16z{zero}overflow")
        exp = matrix_experiment(out, "fp16", zero, "pp1", train=dict(samples=4 * 14),
                                checkpoint=dict(save_interval=100))
        proc = train(out, exp, 1, env={"BSOPS_SCALE_GRAD_AT": f"{OVERFLOWS.start}-{OVERFLOWS.stop - 1}:inf"})
        append_main_log(exp, proc)
        return exp, out, proc.stdout
    return concurrently({zero: (lambda zero=zero: run(zero)) for zero in (0, 1)})


def test_the_loss_scale_logged_is_the_optimizers_at_both_stages(cells):
    for (zero, layout), cell in cells.items():
        lines = iteration_lines(cell.whole_out)
        assert {line["loss_scale"] for line in lines.values()} == {INITIAL_SCALE}, (zero, layout)
        assert set(scalars(cell.whole / "tensorboard", "loss-scale").values()) == {INITIAL_SCALE}, (zero, layout)


def test_a_forced_overflow_is_a_skipped_step_and_a_lower_scale(overflowed):
    """Each overflowing step is skipped (counted, no grad norm) and its line already shows the scale lowered for the
    next step; ZeRO's scaler waits out its hysteresis of 2 before it halves, FP16_UnfusedOptimizer halves at once."""
    for zero, (_, _, stdout) in overflowed.items():
        lines = iteration_lines(stdout)
        for it in OVERFLOWS:
            assert lines[it]["skipped"] == 1 and lines[it]["grad_norm"] is None, (zero, it, lines[it])
        assert all(lines[it]["skipped"] == 0 for it in lines if it not in OVERFLOWS), zero
        scales = [lines[it]["loss_scale"] for it in sorted(lines)]
        assert scales[: OVERFLOWS.start - 1] == [INITIAL_SCALE] * (OVERFLOWS.start - 1), (zero, scales)
        halvings = len(OVERFLOWS) - (1 if zero else 0)
        assert lines[OVERFLOWS.stop - 1]["loss_scale"] == INITIAL_SCALE / 2**halvings, (zero, scales)
        assert scales == sorted(scales, reverse=True), (zero, scales)


def test_the_watchdog_alerts_the_collapse_from_the_trainers_own_lines(overflowed, plain_server):
    from bigscience_ops.ops.watch import lifecycle, watchdog
    from tests.fixtures_smtp import plain_outbox
    from tests.fixtures_status import seed_job

    inbox, port = plain_server
    now = datetime(2026, 11, 28, 12, 0, 0)
    for zero, (exp, out, _) in overflowed.items():
        # Watched as a Slurm launch (its record under launches/, the queue's job running), not as a local one.
        (out / "launches" / "20261128-110000").mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "experiment.json", out / "launches" / "20261128-110000" / "experiment.json")
        running = seed_job(name=exp.slurm.job_name, start_time=now - timedelta(hours=1), elapsed_s=3600)
        settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=out / "logs" / "main_log.txt",
                                          outbox=plain_outbox(port), experiment=exp.name, state_path=out / "alerts.json",
                                          health=HealthConfig(recent=30, scale_collapse=16))
        result = watchdog.watch(settings, query=lambda **_: [running], now=now, run=lifecycle.run_state(exp))
        conditions = {alert.condition for alert in result.report.alerts}
        assert "health-loss-scale" in conditions and "health-skipped" in conditions, (zero, conditions)
    assert sum("loss scale" in m.get_content() for m in inbox.messages) == 2, [m["Subject"] for m in inbox.messages]
