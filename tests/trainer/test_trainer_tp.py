"""Megatron-style tensor parallelism: TP=2 (2 processes) and TP=2 x PP=2 (4 processes) on CPU/gloo.

TP=2 starts from the same full weights as TP=1 and sees the same samples, so its losses equal the
TP=1 golden run's up to summation order; parameter counts per (tensor, pipeline) rank equal the
plan's; checkpoints are written per TP rank (a TP=2 run's exact resume: the configurations matrix).
"""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
from pathlib import Path

import pytest
import torch

from bigscience_ops import sizing
from bigscience_ops.checkpoints import layout
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer import checkpointing as ckpt
from bigscience_ops.trainer.model import EmbeddingPipe, TransformerBlock
from bigscience_ops.trainer.tensor_parallel import TensorParallel
from tests.fixtures_trainer import concurrently, run_ok, scalars, small_experiment, write_run
from tests.fixtures_runs import commit_checkpoint

STEPS = 10
PARAM_LINE = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank \((\d+), (\d+)\): (\d+)")


def _train(out: Path, tensor: int, pipeline: int, exit_interval: int, data: int = 1) -> subprocess.CompletedProcess:
    """DP=2 runs ZeRO-1 with micro-batches of 1: the same samples per step as DP=1 with micro-batches of 2."""
    exp = small_experiment(out, parallel=dict(tensor=tensor, pipeline=pipeline, zero_stage=1 if data > 1 else 0),
                           batch=dict(micro_batch_size=2 // data),
                           checkpoint=dict(save_interval=100, exit_interval=exit_interval))
    write_run(exp, out)
    return run_ok(out, tensor * pipeline * data)


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory) -> dict[str, tuple[Path, list[subprocess.CompletedProcess]]]:
    """TP=2 for 10 steps; TP=2 x PP=2 and TP=2 x DP=2 for 10 steps; TP=1 on one process (its grad norm is over the
    whole model, as TP=2's must be). Launched side by side. (A TP=2 run's exact resume, at each precision and ZeRO
    stage: tests/trainer/test_trainer_matrix_*.py.)"""
    runs = {  # name: [(tensor, pipeline, exit_interval, data) of each launch]; the 4-process runs first
        "tp2pp2": [(2, 2, STEPS, 1)],
        "tp2dp2_zero1": [(2, 1, STEPS, 2)],
        "tp2": [(2, 1, STEPS, 1)],
        "tp1": [(1, 1, STEPS, 1)],
    }
    folders = {name: tmp_path_factory.mktemp(name.removesuffix("_zero1")) for name in runs}

    def chain(name: str) -> tuple[Path, list[subprocess.CompletedProcess]]:
        return folders[name], [_train(folders[name], *launch) for launch in runs[name]]

    return concurrently({name: lambda name=name: chain(name) for name in runs})


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tp2", "tp2pp2", "tp2dp2_zero1"])
def test_tp_losses_equal_tp1(tp_runs, golden_run, name):
    _, gout, _ = golden_run
    golden = scalars(gout / "tensorboard", "lm loss")
    out, _ = tp_runs[name]
    losses = scalars(out / "tensorboard", "lm loss")
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, value in losses.items():
        assert math.isclose(value, golden[step], rel_tol=1e-3), (name, step, value, golden[step])
    assert losses[1] == pytest.approx(golden[1], rel=1e-6)  # the same initial model


@pytest.mark.slow
@pytest.mark.parametrize("name, pipeline", [("tp2", 1), ("tp2pp2", 2)])
def test_parameters_per_rank_equal_the_plan(tp_runs, golden_run, name, pipeline):
    exp, _, _ = golden_run
    out, procs = tp_runs[name]
    counts = {(int(t), int(p)): int(n) for t, p, n in PARAM_LINE.findall(procs[0].stdout)}
    per_stage = sizing.count_parameters(exp.model, 2, pipeline).per_stage
    assert counts == {(t, p): per_stage[p] for t in range(2) for p in range(pipeline)}


@pytest.mark.slow
def test_tp_grad_norm_counts_each_parameter_once(tp_runs):
    """DeepSpeed's norm over the grid (the mpu): TP shards on every rank, replicated parameters on TP rank 0."""
    norms = {name: scalars(tp_runs[name][0] / "tensorboard", "grad-norm") for name in ("tp1", "tp2", "tp2dp2_zero1")}
    assert sorted(norms["tp1"]) == list(range(1, STEPS + 1))
    for step, value in norms["tp1"].items():
        for name in ("tp2", "tp2dp2_zero1"):
            assert math.isclose(norms[name][step], value, rel_tol=1e-4), (name, step, norms[name][step], value)


@pytest.mark.slow
def test_checkpoint_per_tp_rank_with_identical_replicated_parameters(tp_runs):
    out, _ = tp_runs["tp2pp2"]
    folder = out / "checkpoints" / f"global_step{STEPS}"
    assert {p.name for p in folder.glob("mp_rank_*_model_states.pt")} == {f"mp_rank_{r:02d}_model_states.pt"
                                                                          for r in range(4)}
    for layer in range(4):  # embedding, 2 blocks, final norm
        shards = [torch.load(folder / f"layer_{layer:02d}-model_{t:02d}-model_states.pt", weights_only=True)
                  for t in range(2)]
        assert shards[0].keys() == shards[1].keys()
        for key in shards[0]:
            sharded = key.endswith(("word_embeddings.weight", "query_key_value.weight", "query_key_value.bias",
                                    "dense.weight", "dense_h_to_4h.weight", "bias_h_to_4h", "dense_4h_to_h.weight"))
            if sharded:
                assert not torch.equal(shards[0][key], shards[1][key]) or key.endswith("bias"), key
            else:  # LayerNorms, row-parallel biases, position embeddings: the same on both TP ranks
                assert torch.equal(shards[0][key], shards[1][key]), key


def test_tp_shards_are_cut_from_the_tp1_weights(tmp_path):
    shape = GPTShape.from_experiment(small_experiment(tmp_path, parallel=dict(tensor=2)))
    full = TransformerBlock(shape, 7, 1)
    ranks = [TransformerBlock(shape, 7, 1, tp=TensorParallel(rank=r, size=2)) for r in range(2)]
    for name, param in full.named_parameters():
        parts = [dict(block.named_parameters())[name] for block in ranks]
        if getattr(parts[0], "tensor_model_parallel", False):
            dim = 1 if name.endswith(("dense.weight", "dense_4h_to_h.weight")) else 0
            assert torch.equal(torch.cat(parts, dim=dim), param), name
        else:
            assert all(torch.equal(p, param) for p in parts), name
    words = [EmbeddingPipe(shape, 7, tp=TensorParallel(rank=r, size=2)).word_embeddings.weight for r in range(2)]
    assert torch.equal(torch.cat(words), EmbeddingPipe(shape, 7).word_embeddings.weight)
    assert words[0].shape == (shape.padded_vocab_size // 2, shape.hidden_size)


def test_resume_with_another_tp_is_rejected(tmp_path):
    exp = small_experiment(tmp_path)
    shape = GPTShape.from_experiment(exp)
    path = tmp_path / "global_step4"
    layout.write_meta(path, {"model": dataclasses.asdict(shape), "parallel": {"tensor": 2, "pipeline": 1}})
    commit_checkpoint(path)
    (tmp_path / "latest").write_text("global_step4")
    with pytest.raises(CheckpointError, match="parallel.tensor: checkpoint 2, config 1"):
        ckpt.check_compatible(ckpt.find_resume(tmp_path), dataclasses.asdict(shape), 1, 1)
