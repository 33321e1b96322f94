"""Dropout with TP > 1 (Megatron's model-parallel RNG tracker), on 2 CPU processes over gloo.

The probe (this file's _probe run as 2 ranks) builds a TP=2 embedding and block seeded as the trainer seeds
them, gives rank 1 the same attention heads as rank 0 (so their attention inputs are identical and
only the dropout masks can tell them apart), runs a training forward and saves what each dropout
produced: attention must differ between the ranks (each draws its own masks), the embedding and the
hidden dropouts must not (replicated activations, the same masks). Then a TP=2 run of the real
trainer with dropout on, interrupted and resumed, continues bitwise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fixtures_trainer import (checkpoint_steps, concurrently, ranks, scalars, small_experiment,
                                     whole_and_resumed)

pytestmark = pytest.mark.slow  # 2-rank probes and trainer launches

STEPS = 10


def _probe(out: Path, kernels: str) -> None:
    import torch.distributed as dist

    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer import model, tensor_parallel
    from bigscience_ops.trainer.model import EmbeddingPipe, TransformerBlock

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tp = tensor_parallel.TensorParallel(rank=rank, size=2, group=dist.new_group([0, 1]))
    shape = GPTShape(num_layers=1, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, seq_length=16,
                     max_position_embeddings=16, padded_vocab_size=128, embed_layernorm=False, init_method_std=0.02,
                     hidden_dropout=0.5, attention_dropout=0.5, layernorm_epsilon=1e-5)
    torch.manual_seed(1234)  # as Trainer._build_engine
    tensor_parallel.seed_model_parallel_rng(1234, tp)
    embedding, block = EmbeddingPipe(shape, 7, tp=tp, kernels=kernels), TransformerBlock(shape, 7, 1, tp=tp,
                                                                                          kernels=kernels)
    qkv = block.self_attention.query_key_value
    with torch.no_grad():  # rank 1 gets rank 0's heads: identical q, k, v on both ranks
        for p in (qkv.weight, qkv.bias):
            dist.broadcast(p.data, src=0, group=tp.group)

    seen: dict[str, list[torch.Tensor]] = {"attention": [], "embedding": [], "hidden": []}
    attention = model.fused.causal_attention

    def recording(*args, **kwargs):
        y = attention(*args, **kwargs)
        seen["attention"].append(y.detach().clone())
        return y

    model.fused.causal_attention = recording
    residual_layer_norm = model.fused.residual_layer_norm

    def recording_residual(x, branch, *args, **kwargs):  # the attention output's dropout, fused with the residual add
        s, normed = residual_layer_norm(x, branch, *args, **kwargs)
        seen["hidden"].append((s - x).detach().clone())  # dropout(branch): exactly 0 where dropped
        return s, normed

    model.fused.residual_layer_norm = recording_residual
    embedding.drop.register_forward_hook(lambda m, i, o: seen["embedding"].append(o.detach().clone()))
    block.drop.register_forward_hook(lambda m, i, o: seen["hidden"].append(o.detach().clone()))
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    for _ in range(2):  # two steps: the tracker advances
        block.train()(embedding.train()(tokens)).sum().backward()
    torch.save(seen, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


KERNELS = ["torch", "triton"]


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """kernels -> (folder, the probe run as 2 ranks) for each kernel choice, side by side. `python -c` (from the
    repository, as ranks() starts it) rather than this file: the ranks are then forks of the rank server, which
    has imported torch already, instead of fresh interpreters."""
    env = {"TRITON_INTERPRET": "1"}
    folders = {kernels: tmp_path_factory.mktemp(f"probe_{kernels}") for kernels in KERNELS}
    code = ("import sys; from pathlib import Path; from tests.trainer.test_trainer_rng import _probe; "
            "_probe(Path(sys.argv[1]), sys.argv[2])")

    def probe(kernels: str) -> tuple[Path, subprocess.CompletedProcess]:
        return folders[kernels], ranks(["-c", code, str(folders[kernels]), kernels], 2, env)

    return concurrently({kernels: lambda kernels=kernels: probe(kernels) for kernels in reversed(KERNELS)})


@pytest.mark.parametrize("kernels", KERNELS)
def test_tp_ranks_draw_own_attention_masks_and_shared_hidden_masks(probes, kernels):
    out, proc = probes[kernels]
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert len(ranks[0]["attention"]) == 2 and len(ranks[0]["hidden"]) == 4 and len(ranks[0]["embedding"]) == 2
    for step in range(2):
        a, b = (r["attention"][step] for r in ranks)
        assert a.shape == b.shape == (2, 2, 16, 8)  # (B, heads on this rank, T, hs)
        assert not torch.equal(a, b), f"step {step}: both TP ranks drew the same attention-dropout masks"
    assert not torch.equal(ranks[0]["attention"][0], ranks[0]["attention"][1]), "the rank's tracker must advance"
    for key in ("embedding", "hidden"):
        for a, b in zip(ranks[0][key], ranks[1][key]):
            assert torch.equal(a, b), f"{key} dropout differs between TP ranks"
            assert (a == 0).float().mean() > 0.3  # dropout 0.5 really dropped


@pytest.fixture(scope="module")
def tp_dropout_runs(tmp_path_factory):
    """TP=2 with hidden and attention dropout: 10 steps uninterrupted, and 6 then resumed to 10."""
    return whole_and_resumed(tmp_path_factory, "tp2_dropout", lambda out, exit_interval: small_experiment(
        out, model=dict(hidden_dropout=0.1, attention_dropout=0.1), parallel=dict(tensor=2, pipeline=1, zero_stage=0),
        checkpoint=dict(save_interval=100, exit_interval=exit_interval)), STEPS, 6)


def test_tp2_dropout_run_resumes_bitwise(tp_dropout_runs):
    whole, _ = tp_dropout_runs["whole"]
    out, procs = tp_dropout_runs["resumed"]
    assert "resumed from" in procs[1].stdout and checkpoint_steps(out) == [6, STEPS]
    losses = scalars(whole / "tensorboard", "lm loss")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert scalars(out / "tensorboard", "lm loss") == losses
    assert scalars(out / "tensorboard", "grad-norm") == scalars(whole / "tensorboard", "grad-norm")
    for rank in range(2):  # each rank's tracker state is in its own RNG file
        state = torch.load(out / "checkpoints" / "global_step6" / f"rng_state_{rank:03d}.pt", weights_only=False)
        assert set(state["tracker"]) == {"model-parallel-rng"}
    states = [torch.load(out / "checkpoints" / "global_step6" / f"rng_state_{r:03d}.pt", weights_only=False)
              for r in range(2)]
    assert not torch.equal(states[0]["tracker"]["model-parallel-rng"], states[1]["tracker"]["model-parallel-rng"])
    assert torch.equal(states[0]["torch"], states[1]["torch"])  # the replicated regions' generator: shared


if __name__ == "__main__":  # the probe, one rank of 2
    _probe(Path(sys.argv[1]), sys.argv[2])
