"""Real trainer runs (torchrun, gloo, CPU): goldens, schedules, checkpoints, exits, resume, PP and DP layouts.

Each launch costs several seconds, so every launch is shared by several checks: the golden run (a session
fixture, also read by other modules) and this module's other launches (one fixture, run side by side).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bigscience_ops import sizing
from bigscience_ops.schedule.run import run_schedule
from tests.fixtures_trainer import (checkpoint_steps, concurrently, launch, run_ok, scalars, small_experiment,
                                     write_run)

pytestmark = pytest.mark.slow  # every check reads a real trainer launch

GOLDEN = Path(__file__).parents[1] / "assets" / "losses" / "tiny.txt"
REGENERATE = "python scripts/regenerate_goldens.py losses"
"""The command that rewrites GOLDEN from a fresh golden run (after an intended change to the trainer's numbers)."""


def golden_text(losses: dict[int, float]) -> str:
    """GOLDEN's content for the per-step losses of a golden run (what scripts/regenerate_goldens.py writes)."""
    lines = [f"# per-step lm loss of tests/fixtures_trainer.py's golden_run (PP=2, fp32, CPU). "
             f"Regenerate: {REGENERATE}"]
    return "\n".join(lines + [f"{s} {losses[s]!r}" for s in sorted(losses)]) + "\n"


def _read_golden() -> dict[int, float]:
    rows = [line.split() for line in GOLDEN.read_text().splitlines() if line and not line.startswith("#")]
    return {int(step): float(loss) for step, loss in rows}


def test_golden_losses(golden_run):
    exp, out, _ = golden_run
    losses = scalars(out / "tensorboard", "lm loss")
    assert sorted(losses) == list(range(1, run_schedule(exp).train_iters + 1))
    golden = _read_golden()  # never written by a test: a run compared with itself proves nothing (REGENERATE)
    assert sorted(golden) == sorted(losses), f"regenerate after an intended change: {REGENERATE}"
    for step, value in golden.items():
        assert math.isclose(losses[step], value, rel_tol=2e-4), (step, losses[step], value, REGENERATE)
    assert losses[max(losses)] < losses[1] - 0.5, "the loss must clearly fall"


def test_rampup_batch_sizes_and_lrs_equal_the_plan(golden_run):
    exp, out, _ = golden_run
    schedule, lr = run_schedule(exp).batch, run_schedule(exp).lr
    sizes = scalars(out / "tensorboard", "batch-size")
    lrs = scalars(out / "tensorboard", "learning-rate")
    steps = range(1, run_schedule(exp).train_iters + 1)
    assert [sizes[s] for s in steps] == [schedule.batch_size_of_step(s) for s in steps]
    assert {4, 6, 8} == set(sizes.values())
    # Megatron logs the LR after its scheduler step: the one for consumed_after(step) samples.
    for s in steps:
        assert math.isclose(lrs[s], lr.lr_at(schedule.consumed_after(s)), rel_tol=1e-6, abs_tol=1e-12), s
    by_samples = scalars(out / "tensorboard", "batch-size vs samples")
    assert sorted(by_samples) == [schedule.consumed_after(s) for s in steps]


def test_multi_range_save_schedule_folders(golden_run):
    exp, out, _ = golden_run
    # ranges: every 2 to 6, every 5 to 20 (11, 16), then save_interval 10 from 20 (30 > 28), and the final step
    assert checkpoint_steps(out) == [2, 4, 6, 11, 16, 28]
    assert (out / "checkpoints" / "latest").read_text().strip() == "global_step28"


def test_validation_and_tensorboard_scalars(golden_run):
    exp, out, proc = golden_run
    valid = scalars(out / "tensorboard", "lm loss validation")
    assert sorted(valid) == [10, 20, 28]
    assert valid[28] < valid[10]
    ppl = scalars(out / "tensorboard", "lm loss validation ppl")
    assert math.isclose(ppl[28], math.exp(valid[28]), rel_tol=1e-5)
    for tag in ("grad-norm", "params-norm", "loss-scale", "iteration-time", "samples per second", "TFLOPs per GPU",
                "lm loss vs samples", "learning-rate vs samples", "lm loss validation vs samples"):
        assert scalars(out / "tensorboard", tag), tag
    assert not scalars(out / "tensorboard", "MFU")  # a CPU's peak is unknown: no made-up MFU
    assert " MFU: " not in proc.stdout
    assert proc.stdout.count(" validation loss at iteration ") == 3
    assert proc.stdout.count(" iteration ") >= run_schedule(exp).train_iters // 2


def _interrupted(out: Path, save_schedule) -> tuple[Path, dict, tuple[list[int], list[int], list[int]]]:
    """The golden config, interrupted by exit interval, exit duration and kill switch, then resumed."""
    exp = small_experiment(out, checkpoint=dict(save_schedule=save_schedule, save_interval=10, exit_interval=7))
    write_run(exp, out)
    runs = {"interval": run_ok(out, 2)}
    steps_after_interval = checkpoint_steps(out)
    exp = small_experiment(out, checkpoint=dict(save_schedule=save_schedule, save_interval=10))
    write_run(exp, out)
    started = time.time() - (exp.checkpoint.exit_duration_in_mins * 60 + 5)
    runs["duration"] = run_ok(out, 2, env={"BSOPS_JOB_START_EPOCH": str(int(started))})
    steps_after_duration = checkpoint_steps(out)
    Path(exp.checkpoint.kill_switch_path).touch()
    runs["kill"] = run_ok(out, 2)
    steps_after_kill = checkpoint_steps(out)
    Path(exp.checkpoint.kill_switch_path).unlink()
    runs["rest"] = run_ok(out, 2)
    return out, runs, (steps_after_interval, steps_after_duration, steps_after_kill)


LAYOUTS = {"pp2dp2": (2, 4, 1), "pp1": (1, 1, 0)}  # name: (pipeline, processes, ZeRO stage)


def _layout_run(out: Path, pipeline: int, nproc: int, zero: int) -> Path:
    """10 steps of the golden config with micro-batches of 1 (PP=2 x DP=2 sees the same samples per step)."""
    exp = small_experiment(out, parallel=dict(pipeline=pipeline, zero_stage=zero), batch=dict(micro_batch_size=1),
                           checkpoint=dict(save_interval=100, exit_interval=10))
    write_run(exp, out)
    run_ok(out, nproc)
    return out


def _mismatched_resume(out: Path, golden_out: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The golden checkpoints resumed by a PP=1 model twice as wide: refused."""
    shutil.copytree(golden_out / "checkpoints", out / "checkpoints")
    exp = small_experiment(out, model=dict(hidden_size=128), parallel=dict(pipeline=1))
    write_run(exp, out)
    return out, launch(out, 1)


@pytest.fixture(scope="module")
def module_runs(tmp_path_factory, golden_run) -> dict:
    """This module's launches beside the golden run, side by side: the interrupted-and-resumed golden config,
    the PP=2 x DP=2 and PP=1 layouts, and a resume of the golden checkpoints with another shape."""
    gexp, gout, _ = golden_run
    folders = {name: tmp_path_factory.mktemp(name) for name in ("interrupted", *LAYOUTS, "mismatch")}
    jobs = {"interrupted": lambda: _interrupted(folders["interrupted"], gexp.checkpoint.save_schedule)}
    for name, layout in LAYOUTS.items():
        jobs[name] = lambda name=name, layout=layout: _layout_run(folders[name], *layout)
    jobs["mismatch"] = lambda: _mismatched_resume(folders["mismatch"], gout)
    return concurrently(jobs)


@pytest.fixture(scope="module")
def interrupted_run(module_runs):
    return module_runs["interrupted"]


def test_exit_interval_duration_and_kill_switch(interrupted_run):
    out, runs, (after_interval, after_duration, after_kill) = interrupted_run
    assert after_interval == [2, 4, 6, 7]  # exit interval 7: saved at 7, exited
    assert after_duration == [2, 4, 6, 7, 8]  # job started long ago: one step, saved, exited
    assert after_kill == after_duration  # kill switch at start: nothing trained, nothing saved
    assert " iteration " not in runs["kill"].stdout
    assert checkpoint_steps(out) == [2, 4, 6, 7, 8, 11, 16, 28]


def test_resumed_losses_equal_uninterrupted_bitwise(interrupted_run, golden_run):
    out, _, _ = interrupted_run
    _, gout, _ = golden_run
    assert scalars(out / "tensorboard", "lm loss") == scalars(gout / "tensorboard", "lm loss")
    assert scalars(out / "tensorboard", "learning-rate") == scalars(gout / "tensorboard", "learning-rate")
    assert scalars(out / "tensorboard", "lm loss validation") == scalars(gout / "tensorboard", "lm loss validation")


def test_pp2_dp2_and_pp1_match_pp2(module_runs, golden_run):
    """PP=2 x DP=2 (4 processes, ZeRO-1, MBS 1) and PP=1 see the same samples per step: the same losses up to rounding."""
    _, gout, _ = golden_run
    golden = scalars(gout / "tensorboard", "lm loss")
    for name in LAYOUTS:
        out = module_runs[name]
        losses = scalars(out / "tensorboard", "lm loss")
        assert sorted(losses) == list(range(1, 11))
        for step, value in losses.items():
            assert math.isclose(value, golden[step], rel_tol=1e-3), (name, step, value, golden[step])
        assert checkpoint_steps(out) == [10]


def test_the_layouts_checkpoints_are_the_sizes_computed_from_the_shapes(module_runs):
    """PP=2 x DP=2 with ZeRO-1 (optimizer partitions per DP rank) and PP=1 with ZeRO-0: du of each checkpoint
    is sizing's, within 2% (the 64-wide model's file records weigh most of the difference)."""
    for name, (pipeline, nproc, zero) in LAYOUTS.items():
        out = module_runs[name]
        exp = small_experiment(out, parallel=dict(pipeline=pipeline, zero_stage=zero))  # as _layout_run's
        params = sizing.count_parameters(exp.model, 1, pipeline, exp.parallel.partition_method)
        expected = sizing.checkpoint_size(exp, params, nproc // pipeline)
        folder = out / "checkpoints" / "global_step10"
        assert len(list(folder.iterdir())) == expected.files, name
        assert sum(f.stat().st_size for f in folder.iterdir()) == pytest.approx(expected.total, rel=0.02), name


def test_resume_with_another_shape_or_layout_is_rejected(module_runs):
    out, proc = module_runs["mismatch"]
    assert proc.returncode != 0, proc.stdout[-3000:]  # the trainer exits 2; torchrun reports a failed worker as 1
    assert "hidden_size: checkpoint 64, config 128" in proc.stderr
    assert "TP=1 PP=2 DP=1 ZeRO-0" in proc.stderr and "TP=1 PP=1 DP=1 ZeRO-0" in proc.stderr  # both layouts named
    assert not (out / "tensorboard").exists() or not scalars(out / "tensorboard", "lm loss")
