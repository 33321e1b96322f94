"""`model.compile: true` (trainer/compiled.py): the blocks compiled in place by torch.compile train to the losses of
eager blocks, keep their parameter names, and their compilations are counted and bounded.

In-process, a tiny model for a few AdamW steps (no dropout: inductor draws its own dropout masks). The fast tests
hand the graphs to torch's aot_eager backend (dynamo and AOTAutograd as with inductor, no code generation); the
slow one to inductor itself, which generates and builds C++ for this CPU (about a minute on 2 cores when its
cache is cold).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from bigscience_ops.kernels.choice import OPS, KernelChoice
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer import compiled
from bigscience_ops.trainer.model import TransformerBlock, build_sequential, lm_loss

SHAPE = GPTShape(num_layers=3, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, seq_length=16,
                 max_position_embeddings=16, padded_vocab_size=128, embed_layernorm=False, init_method_std=0.02,
                 hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-5)


def _train(compile: bool, steps: int, shape: GPTShape = SHAPE) -> list[float]:
    torch.manual_seed(0)
    model = build_sequential(shape, 7, "torch", compile=compile)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, shape.padded_vocab_size, (2, shape.seq_length + 1), generator=gen)
        loss = lm_loss(model(tokens[:, :-1]), (tokens[:, 1:], torch.ones(2, shape.seq_length)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture
def fresh_dynamo(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    yield
    torch._dynamo.reset()


def _same_losses_and_one_graph() -> None:
    eager = _train(False, 3)
    before = compiled.compiled_graphs()
    compiled_losses = _train(True, 3)
    graphs = compiled.compiled_graphs() - before
    assert eager[-1] < eager[0]  # it trains
    for step, (a, b) in enumerate(zip(eager, compiled_losses)):
        assert abs(a - b) <= 1e-4 * abs(a), (step, a, b)
    # three blocks, three steps: the parameters are graph inputs, so one graph serves every block and step
    assert graphs == 1, graphs


def test_compiled_blocks_train_the_eager_losses_with_one_graph_for_all_blocks(fresh_dynamo):
    _same_losses_and_one_graph()


@pytest.mark.slow
def test_inductor_compiled_blocks_train_the_eager_losses(fresh_dynamo, monkeypatch):
    monkeypatch.setattr(compiled, "BACKEND", "inductor")
    _same_losses_and_one_graph()


def test_a_compiled_block_keeps_its_parameter_names_and_values(fresh_dynamo):
    eager, block = TransformerBlock(SHAPE, 7, 1), TransformerBlock(SHAPE, 7, 1, compile=True)
    assert list(block.state_dict()) == list(eager.state_dict())
    block.load_state_dict(eager.state_dict())  # an eager checkpoint loads into a compiled block, and back
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(block(x), eager(x), rtol=1e-5, atol=1e-6)


def test_recompilations_are_bounded(fresh_dynamo, monkeypatch):
    """Every new sequence length is a new input shape: compilations stop growing at the limit, and the block runs
    eagerly (the same output) from there on."""
    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 2)
    monkeypatch.setattr(torch._dynamo.config, "automatic_dynamic_shapes", False)  # one graph per shape
    block = TransformerBlock(SHAPE, 7, 1, compile=True).eval()
    eager = TransformerBlock(SHAPE, 7, 1).eval()
    before = compiled.compiled_graphs()
    for T in (4, 5, 6, 7, 8):
        x = torch.randn(1, T, 32, generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            torch.testing.assert_close(block(x), eager(x), rtol=1e-5, atol=1e-6)
    assert compiled.compiled_graphs() - before == 2


@pytest.mark.slow
def test_the_trainer_compiles_its_blocks_and_records_its_kernels(tmp_path):
    """Through the real trainer (DeepSpeed's pipeline engine, one rank): model.compile true trains the losses of
    false, and each checkpoint's bsops.json records the kernel choice (auto on CPU: the references, unmeasured).
    The compiled run hands its graphs to aot_eager (BSOPS_COMPILE_BACKEND): inductor's cold compile of the trainer's
    graphs costs a minute here, and the in-process test above runs inductor itself."""
    from tests.fixtures_trainer import concurrently, run_ok, scalars, small_experiment, write_run

    def train(compile: bool) -> tuple[dict[int, float], dict]:
        out = tmp_path / f"compile-{compile}"
        exp = small_experiment(out, model=dict(compile=compile, hidden_dropout=0.0, attention_dropout=0.0),
                               parallel=dict(pipeline=1), checkpoint=dict(save_interval=100, exit_interval=2))
        write_run(exp, out)
        run_ok(out, 1, env={"BSOPS_COMPILE_BACKEND": "aot_eager"})
        meta = json.loads((out / "checkpoints" / "global_step2" / "bsops.json").read_text())
        return scalars(out / "tensorboard", "lm loss"), meta

    done = concurrently({compile: lambda compile=compile: train(compile) for compile in (True, False)})
    (eager, meta), (compiled_losses, compiled_meta) = done[False], done[True]
    assert sorted(eager) == sorted(compiled_losses) == [1, 2]
    for step, value in eager.items():
        assert abs(value - compiled_losses[step]) <= 1e-5 * abs(value), (step, value, compiled_losses[step])
    for record in (meta["kernels"], compiled_meta["kernels"]):
        assert KernelChoice.from_record(record).ops() == {op: "torch" for op in OPS}
        assert record["requested"] == "auto" and record["timings_ms"] == {}
    assert compiled_meta["experiment"]["model"]["compile"] is True


def test_with_dropout_and_the_trainers_rng_a_block_is_one_graph(fresh_dynamo):
    """Dropout on, the TP-region generator seeded as the trainer seeds it: with TP=1 the compiled block does not
    fork that generator (dynamo cannot trace the fork: it would split every block into several graphs), so a
    training step compiles one graph for all blocks; eager blocks still draw attention dropout from it."""
    from dataclasses import replace

    from bigscience_ops.trainer import tensor_parallel
    from bigscience_ops.trainer.tensor_parallel import SINGLE

    tensor_parallel.seed_model_parallel_rng(1234, SINGLE)
    try:
        shape = replace(SHAPE, hidden_dropout=0.1, attention_dropout=0.1)
        before = compiled.compiled_graphs()
        losses = _train(True, 2, shape)
        assert compiled.compiled_graphs() - before == 1
        assert all(math.isfinite(loss) for loss in losses)
        eager = TransformerBlock(shape, 7, 1).train()
        x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(3))
        state = tensor_parallel.rng_tracker_states()
        eager(x)
        assert not torch.equal(tensor_parallel.rng_tracker_states()["model-parallel-rng"], state["model-parallel-rng"])
    finally:
        tensor_parallel._rng_tracker().reset()


@pytest.mark.slow
def test_inductor_redraws_the_same_dropout_masks_from_the_same_generator_state(fresh_dynamo, monkeypatch):
    """Activation checkpointing runs a block's forward without gradients, then again with them from the restored
    generator state: compiled, those are two graphs, and their dropout masks must be the same (else the backward
    would be taken through other masks than the loss saw); and the next draw gives other masks."""
    from dataclasses import replace

    monkeypatch.setattr(compiled, "BACKEND", "inductor")
    block = TransformerBlock(replace(SHAPE, hidden_dropout=0.3, attention_dropout=0.3), 7, 1, compile=True).train()
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4))
    state = torch.get_rng_state()
    with torch.no_grad():
        first = block(x)
    torch.set_rng_state(state)
    again = block(x.clone().requires_grad_())
    assert torch.equal(first, again.detach())
    assert not torch.equal(first, block(x.clone().requires_grad_()).detach())
