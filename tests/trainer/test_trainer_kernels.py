"""`model.kernels`: the tiny model trains to the same losses with the Triton kernels (interpreted on
CPU) as with the torch references, and the vocab-parallel Triton cross-entropy over a real
2-process gloo TP group equals the one-process loss and gradient."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bigscience_ops.config.loading import load_experiment
from bigscience_ops.kernels.choice import OPS
from bigscience_ops.launch.local import free_port
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer.data import step_micro_batches
from bigscience_ops.trainer.sampling import SyntheticDataset
from bigscience_ops.trainer.model import build_sequential, loss_function
from bigscience_ops.trainer.tensor_parallel import TensorParallel, vocab_parallel_cross_entropy
from tests.fixtures_trainer import REPO, small_experiment


def _train(shape: GPTShape, kernels: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = build_sequential(shape, 1234, kernels)
    loss_fn = loss_function(kernels=kernels)
    ds = SyntheticDataset(64, shape.seq_length, 256, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        tokens, (targets, mask) = next(step_micro_batches(ds, step * 4, 1, 4, 0, 1))
        mask = mask.clone()
        mask[0, : shape.seq_length // 2] = 0  # Megatron's loss mask: half a sample does not count
        loss = loss_fn(model(tokens), (targets, mask))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_torch_and_triton_kernels_train_the_same_losses(tmp_path):
    exp = small_experiment(tmp_path, model=dict(hidden_dropout=0.0, attention_dropout=0.0, kernels="triton"))
    shape = GPTShape.from_experiment(exp)
    steps = 6
    reference = _train(shape, "torch", steps)
    fused = _train(shape, exp.model.kernels, steps)
    assert reference[-1] < reference[0] - 0.1, reference  # it trains
    for step, (a, b) in enumerate(zip(reference, fused)):
        assert abs(a - b) <= 1e-4 * abs(a), (step, a, b)


def test_kernels_switch_is_read_from_the_experiment():
    exp = load_experiment("tiny", REPO / "trainings")
    assert exp.model.kernels == "auto"


def _tp_worker(rank: int, port: int, logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
               out: dict) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        tp = TensorParallel(rank=rank, size=2, group=dist.group.WORLD)
        shard = logits.chunk(2, dim=-1)[rank].clone().requires_grad_()
        losses = vocab_parallel_cross_entropy(shard, targets, tp, "triton")
        ((losses * mask).sum() / mask.sum()).backward()
        out[rank] = (losses.detach(), shard.grad)
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_triton_cross_entropy_over_two_gloo_ranks():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(24, 256, generator=generator) * 3
    targets = torch.randint(0, 256, (24,), generator=generator)
    mask = (torch.arange(24) % 5 != 0).float()
    full = logits.clone().requires_grad_()
    expected = torch.nn.functional.cross_entropy(full, targets, reduction="none")
    ((expected * mask).sum() / mask.sum()).backward()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_tp_worker, args=(free_port(), logits, targets, mask, out), nprocs=2, join=True,
                           start_method="fork")
        results = dict(out)
    for rank in (0, 1):
        torch.testing.assert_close(results[rank][0], expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([results[0][1], results[1][1]], dim=-1), full.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("value", ["fast", "cuda"])
def test_unknown_kernels_choice_is_rejected(trainings, value):
    from bigscience_ops.errors import ConfigError

    (trainings / "k.yaml").write_text(f"base: tiny\nmodel:\n  kernels: {value}\n")
    with pytest.raises(ConfigError, match="model.kernels"):
        load_experiment("k", trainings)


@pytest.mark.slow
def test_the_trainer_reads_model_kernels_and_trains_the_same_losses(tmp_path):
    """Through the real trainer (torchrun, DeepSpeed engine): `model.kernels: triton` (interpreted)
    gives the iteration losses of `torch` on the same data, so the switch reaches every call site."""
    from tests.fixtures_trainer import concurrently, launch, run_ok, scalars, write_run

    def train(choice: str) -> dict[int, float]:
        out = tmp_path / choice
        # Two steps: the second's loss follows a backward and an update through the kernels (an interpreted
        # Triton step costs about 2 CPU s).
        exp = small_experiment(out, model=dict(kernels=choice, hidden_dropout=0.0, attention_dropout=0.0),
                               parallel=dict(pipeline=1),
                               checkpoint=dict(save_interval=100, exit_interval=2))
        write_run(exp, out)
        run_ok(out, 1, env={"TRITON_INTERPRET": "1"})
        # the run's record: each op ran what the experiment named (a named choice is never measured)
        record = json.loads((out / "checkpoints" / "global_step2" / "bsops.json").read_text())["kernels"]
        assert record["ops"] == {op: choice for op in OPS} and record["timings_ms"] == {}, record
        return scalars(out / "tensorboard", "lm loss")

    def triton_then_without_the_interpreter() -> tuple[dict[int, float], subprocess.CompletedProcess]:
        losses = train("triton")
        return losses, launch(tmp_path / "triton", 1, env={"TRITON_INTERPRET": "0"})

    done = concurrently({"triton": triton_then_without_the_interpreter, "torch": lambda: train("torch")})
    losses, refused = {"torch": done["torch"], "triton": done["triton"][0]}, done["triton"][1]
    assert sorted(losses["torch"]) == sorted(losses["triton"]) and len(losses["torch"]) >= 2, losses
    for step, value in losses["torch"].items():
        assert abs(value - losses["triton"][step]) <= 1e-4 * abs(value), (step, value, losses["triton"][step])

    # The choice really reaches the engine's layers: without the interpreter, on CPU tensors,
    # 'triton' is refused at the first forward with the field's name (it would pass as torch if ignored).
    assert refused.returncode != 0 and "model.kernels" in refused.stdout + refused.stderr
