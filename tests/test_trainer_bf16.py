"""bf16 with ZeRO-1 and activation checkpointing trains, saves and resumes (PP=2 on two CPU processes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bigscience_ops import sizing
from tests.fixtures_trainer import checkpoint_steps, run_ok, scalars, small_experiment, write_run

pytestmark = pytest.mark.slow


def test_bf16_zero1_checkpointed_trains_and_resumes(tmp_path: Path, golden_run) -> None:
    out = tmp_path / "bf16"
    exp = small_experiment(out, train=dict(precision="bf16", samples=80),
                           parallel=dict(zero_stage=1, activation_checkpointing=True),
                           checkpoint=dict(save_interval=100, exit_interval=6),
                           estimate=dict(peak_tflops=0.25))
    write_run(exp, out)
    first = run_ok(out, 2)
    assert "exit interval 6 reached" in first.stdout
    assert checkpoint_steps(out) == [6]
    second = run_ok(out, 2)
    assert "resumed from" in second.stdout and "global_step6" in second.stdout
    losses = scalars(out / "tensorboard", "lm loss")
    total = max(losses)
    assert sorted(losses) == list(range(1, total + 1)) and checkpoint_steps(out) == [6, total]
    # bf16 with ZeRO-1: bf16 layer files, fp32 master weights and Adam moments in bf16_zero_pp_rank_* partitions
    params = sizing.count_parameters(exp.model, 1, 2)
    expected = sizing.checkpoint_size(exp, params, 1)
    for step in (6, total):
        folder = out / "checkpoints" / f"global_step{step}"
        assert len(list(folder.iterdir())) == expected.files
        assert sum(f.stat().st_size for f in folder.iterdir()) == pytest.approx(expected.total, rel=0.02)
    assert all(math.isfinite(v) for v in losses.values())
    # bf16 follows the fp32 golden run closely on the same samples, and both learn.
    _, gout, _ = golden_run
    golden = scalars(gout / "tensorboard", "lm loss")
    for step in range(1, total + 1):
        assert math.isclose(losses[step], golden[step], rel_tol=0.05), (step, losses[step], golden[step])
    assert losses[total] < losses[1]
    # MFU beside TFLOPs, against estimate.peak_tflops (the override; a CPU has no table entry)
    tflops, mfu = scalars(out / "tensorboard", "TFLOPs per GPU"), scalars(out / "tensorboard", "MFU")
    assert sorted(mfu) == sorted(tflops) == list(range(1, total + 1))
    for step in mfu:
        assert math.isclose(mfu[step], tflops[step] / 0.25, rel_tol=1e-5), (step, mfu[step], tflops[step])
    assert " MFU: " in first.stdout
