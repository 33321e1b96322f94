"""`model.kernels: auto` chooses per op by measurement (kernels/choice.py, kernels/measure.py): the choice is a pure
function of the timings, recorded and read back; on CPU auto is the torch references, unmeasured; the
measurement runs every candidate at the run's shape without moving the training's RNG; and a model
built with any per-op choice computes what the all-torch model computes, forward and gradients.

The CUDA timer itself (CUDA events) needs a GPU; here a timer is fed in that runs each candidate once. Candidates
and models run on CPU tensors under Triton's interpreter, on CUDA with BSOPS_KERNEL_DEVICE=cuda (gpu_acceptance.py).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace

import pytest
import torch

from bigscience_ops.kernels import choice as kc
from bigscience_ops.kernels.choice import OPS, KernelChoice, KernelChoiceError, choose, from_timings, resolve, uniform
from bigscience_ops.kernels.measure import OpShapes, measure, op_shapes, select_kernels
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer.model import TransformerBlock, build_sequential, lm_loss
from tests.fixtures_kernels import DEVICE, _close

# As RESULTS.md measured them on an H200 at GPT-2's shape (bf16, graph ms): attention SDPA 0.200 vs Triton 0.448,
# LayerNorm 0.067 vs 0.091, bias-GeLU 0.177 vs 0.151, cross-entropy 5.359 vs 0.942.
H200_GPT2 = {"attention": {"torch": 0.200, "triton": 0.448}, "layer_norm": {"torch": 0.067, "triton": 0.091},
             "bias_gelu": {"torch": 0.177, "triton": 0.151}, "cross_entropy": {"torch": 5.359, "triton": 0.942},
             "residual_layer_norm": {"torch": 0.300, "triton": 0.290}}


def test_choose_keeps_triton_only_where_it_is_faster_by_the_margin():
    assert choose(H200_GPT2) == {"attention": "torch", "layer_norm": "torch", "bias_gelu": "triton",
                                 "cross_entropy": "triton", "residual_layer_norm": "torch"}  # 0.290 > 0.95 x 0.300
    assert choose(H200_GPT2, margin=0.0)["residual_layer_norm"] == "triton"
    assert choose(H200_GPT2, margin=0.2)["bias_gelu"] == "torch"  # 0.151 > 0.8 x 0.177
    edge = {"bias_gelu": {"torch": 1.0, "triton": 0.95}}
    assert choose(edge) == {"bias_gelu": "torch"}  # exactly at the margin: not shown to be faster


def test_choose_is_a_pure_function_of_the_timings():
    shuffled = {op: dict(reversed(list(times.items()))) for op, times in reversed(list(H200_GPT2.items()))}
    first = choose(H200_GPT2)
    assert choose(shuffled) == first and choose(json.loads(json.dumps(H200_GPT2))) == first
    assert from_timings("auto", H200_GPT2, "here") == from_timings("auto", shuffled, "there").__class__(
        **first, requested="auto", measured_at="here")


@pytest.mark.parametrize("times,expected", [
    ({"torch": None, "triton": 2.0}, "triton"),  # torch failed to run
    ({"torch": 2.0, "triton": None}, "torch"),  # Triton failed (no compiler, a shape it refuses)
    ({"torch": None, "triton": None}, "torch"),
    ({"torch": 2.0}, "torch"),  # Triton not measured
])
def test_a_failed_or_missing_candidate_is_not_chosen(times, expected):
    assert choose({"attention": times}) == {"attention": expected}


@pytest.mark.parametrize("timings", [
    {"attention": {"torch": -1.0, "triton": 1.0}}, {"attention": {"torch": math.nan, "triton": 1.0}},
    {"attention": {"torch": math.inf}}, {"attention": {"torch": 0.0}}, {"softmax": {"torch": 1.0}},
    {"attention": {"flash": 1.0}}, {"attention": {"torch": "1.0"}},
])
def test_unusable_timings_are_refused(timings):
    with pytest.raises(KernelChoiceError):
        choose(timings)


def test_unknown_choices_are_refused():
    with pytest.raises(KernelChoiceError):
        uniform("fast")
    with pytest.raises(KernelChoiceError):
        KernelChoice(attention="flash")
    with pytest.raises(KernelChoiceError):
        choose({}, margin=1.0)


def test_unmeasured_ops_take_the_reference_and_the_record_reads_back():
    made = from_timings("auto", {"cross_entropy": {"torch": 3.0, "triton": 1.0}}, "8 x 16 tokens")
    assert made.ops() == {op: ("triton" if op == "cross_entropy" else "torch") for op in OPS}
    record = json.loads(json.dumps(made.record()))
    assert record["ops"] == made.ops() and record["timings_ms"] == {"cross_entropy": {"torch": 3.0, "triton": 1.0}}
    assert record["requested"] == "auto" and record["measured_at"] == "8 x 16 tokens"
    back = KernelChoice.from_record(record)
    assert back == made and back.timings == made.timings
    with pytest.raises(KernelChoiceError):
        KernelChoice.from_record({"ops": {"attention": "torch"}})


def test_resolve_measures_only_auto_on_cuda():
    calls = []

    def measured():
        calls.append(1)
        return H200_GPT2

    def never():
        raise AssertionError("measured where it should not")

    def here():
        return "16 x 1024 tokens"

    on_cpu = resolve("auto", "cpu", never, here)
    assert on_cpu.ops() == {op: "torch" for op in OPS} and on_cpu.requested == "auto" and not on_cpu.timings
    for fixed in ("torch", "triton"):
        assert resolve(fixed, "cuda", never, here) == uniform(fixed)
    on_gpu = resolve("auto", "cuda", measured, here)
    assert calls == [1] and on_gpu.ops() == {op: choose(H200_GPT2)[op] for op in OPS}
    assert on_gpu.record()["timings_ms"] == H200_GPT2 and on_gpu.measured_at == "16 x 1024 tokens"


def test_a_resumed_run_keeps_the_choice_measured_at_its_shape():
    """The checkpoint's record is reused where it was measured at the same shape and device (a resumed run runs the
    same kernels, bitwise the same steps); measured again where anything differs."""
    recorded = KernelChoice.from_record(json.loads(json.dumps(
        from_timings("auto", {"attention": {"torch": 1.0, "triton": 0.5}}, "16 x 1024 tokens").record())))
    other = {"attention": {"torch": 0.5, "triton": 1.0}}
    kept = resolve("auto", "cuda", lambda: other, lambda: "16 x 1024 tokens", recorded)
    assert kept == recorded and kept.attention == "triton"
    remeasured = resolve("auto", "cuda", lambda: other, lambda: "8 x 1024 tokens", recorded)
    assert remeasured.attention == "torch" and remeasured.measured_at == "8 x 1024 tokens"
    unmeasured = replace(uniform("torch"), requested="auto")  # a CPU run's record, resumed on a GPU: measure
    assert resolve("auto", "cuda", lambda: other, lambda: "", unmeasured).timings == other


SHAPE = GPTShape(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, seq_length=16,
                 max_position_embeddings=16, padded_vocab_size=96, embed_layernorm=False, init_method_std=0.02,
                 hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-5, position_embedding="alibi")


def test_op_shapes_are_one_tensor_parallel_ranks():
    s = op_shapes(SHAPE, micro_batch_size=3, tensor_parallel=2, precision="bf16")
    assert (s.tokens, s.hidden, s.heads, s.head_size, s.ffn, s.vocab) == (48, 32, 2, 8, 32, 48)
    assert s.dtype == torch.bfloat16 and s.alibi


def test_measure_runs_every_candidate_with_equal_numbers_and_leaves_the_rng_alone():
    """A timer that runs each candidate once (forward + backward) and answers from a table: the timings are the
    table's, every candidate's output and gradients equal the torch reference's, no generator moved."""
    s = op_shapes(SHAPE, micro_batch_size=2, tensor_parallel=1, precision="fp32")
    table = {op: {"torch": 1.0 + i, "triton": 0.5 + i} for i, op in enumerate(OPS)}
    ran: dict[tuple[str, str], tuple] = {}

    def timer(fn, inputs, iters, warmup):
        out = fn(*inputs)
        out.backward(torch.ones_like(out))
        op = next(op for op in OPS if (op, "torch") not in ran or (op, "triton") not in ran)
        impl = "torch" if (op, "torch") not in ran else "triton"
        leaves = {id(t): t for t in (x if x._base is None else x._base for x in inputs)}  # q, k, v: views of qkv
        ran[(op, impl)] = (out.detach(), [t.grad for t in leaves.values() if t.grad is not None])
        return table[op][impl]

    def states():
        return [torch.get_rng_state()] + ([torch.cuda.get_rng_state(DEVICE)] if DEVICE.type == "cuda" else [])

    before = states()
    timings = measure(s, DEVICE, timer=timer)
    assert all(torch.equal(a, b) for a, b in zip(states(), before))
    assert timings == table
    for op in OPS:
        (ref, ref_grads), (out, grads) = ran[(op, "torch")], ran[(op, "triton")]
        _close(out, ref, torch.float32, op)
        assert len(grads) == len(ref_grads) > 0, op
        for a, b in zip(grads, ref_grads):
            _close(a, b, torch.float32, f"{op} grad")


def test_a_candidate_that_raises_is_recorded_as_failed():
    s = OpShapes(batch=1, seq=4, hidden=8, heads=2, head_size=4, ffn=16, vocab=32, hidden_dropout=0.0,
                 attention_dropout=0.0, alibi=False, eps=1e-5, dtype=torch.float32)
    calls = iter(range(100))

    def timer(fn, inputs, iters, warmup):
        if next(calls) % 2:  # every Triton candidate
            raise RuntimeError("0 active drivers")
        return 1.0

    timings = measure(s, torch.device("cpu"), timer=timer)
    assert timings == {op: {"torch": 1.0, "triton": None} for op in OPS}
    assert set(from_timings("auto", timings, "").ops().values()) == {"torch"}


def test_select_kernels_on_cpu_is_the_references_unmeasured():
    chosen = select_kernels("auto", SHAPE, 2, 1, "fp32", torch.device("cpu"))
    assert chosen.ops() == {op: "torch" for op in OPS} and chosen.requested == "auto" and not chosen.timings
    # a checkpoint's record this version cannot read (damaged, or from another version) is measured again, not fatal
    for bad in ({"attention": "cuda-magic"}, {"requested": 3}, {"timings": "x"}):
        again = select_kernels("auto", SHAPE, 2, 1, "fp32", torch.device("cpu"), recorded=bad)
        assert again.ops() == chosen.ops(), bad


@functools.cache
def _block_step(kernels) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = build_sequential(SHAPE, 5, kernels).to(DEVICE)
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    loss = lm_loss(model(tokens), (tokens.roll(-1, 1), torch.ones(2, 16, device=DEVICE)), kernels)
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("op", OPS)
def test_each_ops_triton_choice_in_the_model_equals_the_references(op):
    """The whole tiny model (ALiBi) with one op on its Triton kernel: the loss and every parameter's gradient
    equal the all-torch model's."""
    ref_loss, ref_grads = _block_step("torch")
    loss, grads = _block_step(KernelChoice(**{o: ("triton" if o == op else "torch") for o in OPS}))
    _close(loss, ref_loss, torch.float32, "loss")
    for a, b in zip(grads, ref_grads):
        _close(a, b, torch.float32, f"grad with {op} on Triton")


def test_the_model_routes_each_op_to_its_choice():
    block = TransformerBlock(SHAPE, 5, 1, kernels=KernelChoice(layer_norm="triton", residual_layer_norm="torch",
                                                               bias_gelu="triton", attention="torch",
                                                               cross_entropy="triton"))
    assert (block.input_layernorm.kernels, block.post_attention_layernorm.kernels, block.mlp.kernels,
            block.self_attention.kernels) == ("triton", "torch", "triton", "torch")
    compiled = TransformerBlock(SHAPE, 5, 1, kernels="triton", compile=True)  # compiled: the references inside
    assert (compiled.input_layernorm.kernels, compiled.mlp.kernels, compiled.self_attention.kernels) == ("torch",) * 3
    assert kc.as_choice("triton") == uniform("triton")
