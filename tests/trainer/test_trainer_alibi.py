"""model.position_embedding: alibi. No position table (the plan's count drops it), each TP rank attends with
its own heads' slopes, the converter refuses it by name, and the real trainer trains and resumes bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bigscience_ops import sizing
from bigscience_ops.checkpoints import convert
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer import checkpointing as ckpt
from bigscience_ops.trainer.model import EmbeddingPipe, FinalNorm, SelfAttention, TransformerBlock
from bigscience_ops.trainer.tensor_parallel import TensorParallel
from bigscience_ops.kernels.softmax import alibi_slopes
from tests.fixtures_trainer import checkpoint_steps, scalars, small_experiment, whole_and_resumed

STEPS = 10


def _alibi(out: Path, **sections):
    model = {"position_embedding": "alibi", **sections.pop("model", {})}
    return small_experiment(out, model=model, **sections)


def test_parameter_count_has_no_position_table(tmp_path):
    exp, learned = _alibi(tmp_path), small_experiment(tmp_path)
    shape = GPTShape.from_experiment(exp)
    layers = [EmbeddingPipe(shape, 7)] + [TransformerBlock(shape, 7, i + 1) for i in range(shape.num_layers)]
    layers.append(FinalNorm(shape))
    count = sum(p.numel() for layer in layers for p in layer.parameters())
    assert not hasattr(layers[0], "position_embeddings")
    assert count == sizing.count_parameters(exp.model).total
    h, positions = exp.model.hidden_size, GPTShape.from_experiment(learned).max_position_embeddings
    assert sizing.count_parameters(learned.model).total - count == positions * h
    for tensor, pipeline in ((2, 1), (1, 2)):  # the plan's per-rank counts lose the table on the first stage only
        with_table = sizing.count_parameters(learned.model, tensor, pipeline).per_stage
        without = sizing.count_parameters(exp.model, tensor, pipeline).per_stage
        assert with_table[0] - without[0] == positions * h and with_table[1:] == without[1:]


def test_each_tp_rank_uses_its_own_heads_slopes(tmp_path):
    exp = _alibi(tmp_path, model=dict(num_attention_heads=8, hidden_size=64), parallel=dict(tensor=2))
    shape = GPTShape.from_experiment(exp)
    gen = torch.Generator().manual_seed(0)
    ranks = [SelfAttention(shape, gen, TensorParallel(rank=r, size=2)).slopes for r in range(2)]
    assert ranks[0] + ranks[1] == alibi_slopes(8)
    assert ranks[0] == [2.0 ** -(i + 1) for i in range(4)]
    assert SelfAttention(GPTShape.from_experiment(small_experiment(tmp_path)), gen).slopes is None


def test_alibi_changes_the_model_and_a_sequence_longer_than_the_table_runs(tmp_path):
    learned, alibi = (GPTShape.from_experiment(e) for e in (small_experiment(tmp_path), _alibi(tmp_path)))
    tokens = torch.randint(0, 256, (2, learned.seq_length), generator=torch.Generator().manual_seed(1))
    x = EmbeddingPipe(alibi, 7).eval()(tokens)
    outs = [TransformerBlock(shape, 7, 1).eval()(x) for shape in (learned, alibi)]
    assert (outs[0] - outs[1]).abs().max() > 1e-3  # the same weights: only the positional bias differs
    longer = torch.randint(0, 256, (1, 2 * alibi.seq_length), generator=torch.Generator().manual_seed(2))
    assert TransformerBlock(alibi, 7, 1).eval()(EmbeddingPipe(alibi, 7).eval()(longer)).shape == (1, 64, 64)


def test_converter_refuses_alibi_by_name(tmp_path):
    shape = GPTShape.from_experiment(_alibi(tmp_path))
    import dataclasses

    model = dataclasses.asdict(shape)
    with pytest.raises(convert.ConvertError) as err:
        convert.gpt2_config(model, 250, 0)
    assert "position_embedding" in str(err.value) and "alibi" in str(err.value)
    assert convert.gpt2_config({**model, "position_embedding": "learned"}, 250, 0)["n_positions"] == 32
    legacy = {k: v for k, v in model.items() if k != "position_embedding"}  # bsops.json written before the option
    assert convert.gpt2_config(legacy, 250, 0)["n_layer"] == 2


@pytest.fixture(scope="module")
def alibi_runs(tmp_path_factory):
    """PP=2 with ALiBi and dropout on: 10 steps uninterrupted, and 6 steps then resumed to 10."""
    return whole_and_resumed(tmp_path_factory, "alibi", lambda out, exit_interval: _alibi(
        out, model=dict(hidden_dropout=0.1, attention_dropout=0.1),
        checkpoint=dict(save_interval=100, exit_interval=exit_interval)), STEPS, 6)


@pytest.mark.slow
def test_alibi_trains_and_resumes_bitwise(alibi_runs):
    whole, _ = alibi_runs["whole"]
    out, procs = alibi_runs["resumed"]
    losses = scalars(whole / "tensorboard", "lm loss")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1] - 0.3, losses
    assert "resumed from" in procs[1].stdout and checkpoint_steps(out) == [6, STEPS]
    assert scalars(out / "tensorboard", "lm loss") == losses
    assert scalars(out / "tensorboard", "lm loss validation") == scalars(whole / "tensorboard", "lm loss validation")
    meta = ckpt.find_resume(out / "checkpoints").meta
    assert meta["model"]["position_embedding"] == "alibi"
    embedding = torch.load(out / "checkpoints" / f"global_step{STEPS}" / "layer_00-model_states.pt", weights_only=True)
    assert set(embedding) == {"word_embeddings.weight"}  # no position table in the checkpoint
