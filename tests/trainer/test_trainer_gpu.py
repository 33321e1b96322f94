"""GPU paths a CPU cannot run: fp16 with DeepSpeed's dynamic loss scale, bf16, NCCL with the cpu:gloo,cuda:nccl
group, fused AdamW and MFU from the GPU's peak. Skipped without CUDA (the CPU suite covers the rest)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bigscience_ops.trainer.report import peak_tflops_of
from tests.fixtures_trainer import checkpoint_steps, run_ok, scalars, small_experiment, write_run

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU: fp16, NCCL and fused AdamW run only there")]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gpu_precision_trains_saves_and_resumes(tmp_path: Path, precision: str) -> None:
    nproc = min(2, torch.cuda.device_count())
    out = tmp_path / precision
    exp = small_experiment(out, train=dict(precision=precision, samples=80), slurm=dict(device="gpu"),
                           parallel=dict(pipeline=nproc, zero_stage=1 if precision == "bf16" else 0),
                           checkpoint=dict(save_interval=100, exit_interval=6))
    write_run(exp, out)
    env = {"DS_ACCELERATOR": "cuda"}
    first = run_ok(out, nproc, env)
    assert "exit interval 6 reached" in first.stdout and checkpoint_steps(out) == [6]
    run_ok(out, nproc, env)
    losses = scalars(out / "tensorboard", "lm loss")
    total = max(losses)
    assert sorted(losses) == list(range(1, total + 1)) and checkpoint_steps(out) == [6, total]
    assert all(math.isfinite(v) for v in losses.values()) and losses[total] < losses[1]
    scales = scalars(out / "tensorboard", "loss-scale")
    if precision == "fp16":  # dynamic: starts at 2**12 (ds_config initial_scale_power), halves on overflow
        assert all(1 <= s <= 2**12 and math.log2(s).is_integer() for s in scales.values()), scales
    else:
        assert set(scales.values()) == {1.0}
    if peak_tflops_of(torch.cuda.get_device_name(0)) is not None:
        assert scalars(out / "tensorboard", "MFU")
