"""`model.kernels: auto` on CUDA: time each op's candidates at the run's shape, then choose (choice.py).

For every op in choice.OPS both implementations run forward + backward on inputs of this rank's
micro-batch shape (micro_batch_size x seq_length tokens; the heads, the MLP width and the vocabulary
of one tensor-parallel rank) in the run's dtype, with the run's dropout and ALiBi: a few warm-up
iterations (Triton compiles there), then `iters` timed ones, each between CUDA events; the median
is the op's time. A candidate that raises is recorded as failed (None) and not chosen. The inputs come
from a forked RNG state, so measuring changes no generator the training draws from.

Every rank measures on its own GPU; with a process group the choice of rank 0 is broadcast, so all
ranks run the same kernels. `select_kernels` is what the trainer calls.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from bigscience_ops.kernels.choice import IMPLEMENTATIONS, OPS, KernelChoice, KernelChoiceError, Timings, resolve

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ModelShape(Protocol):
    """What the measurement reads of the model's shape (the trainer's GPTShape; the kernels sit below sizing)."""

    seq_length: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    padded_vocab_size: int
    hidden_dropout: float
    attention_dropout: float
    position_embedding: str
    layernorm_epsilon: float


@dataclass(frozen=True)
class OpShapes:
    """The sizes one rank's ops see in one micro-batch."""

    batch: int
    seq: int
    hidden: int
    heads: int  # on this rank
    head_size: int
    ffn: int  # on this rank
    vocab: int  # on this rank
    hidden_dropout: float
    attention_dropout: float
    alibi: bool
    eps: float
    dtype: torch.dtype

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def describe(self, device: torch.device) -> str:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        return (f"{self.batch} x {self.seq} tokens, h {self.hidden}, {self.heads} heads of {self.head_size}, ffn "
                f"{self.ffn}, vocab {self.vocab}, {str(self.dtype).removeprefix('torch.')}, {name}")


def op_shapes(shape: ModelShape, micro_batch_size: int, tensor_parallel: int, precision: str) -> OpShapes:
    return OpShapes(batch=micro_batch_size, seq=shape.seq_length, hidden=shape.hidden_size,
                    heads=shape.num_attention_heads // tensor_parallel,
                    head_size=shape.hidden_size // shape.num_attention_heads,
                    ffn=shape.ffn_hidden_size // tensor_parallel, vocab=shape.padded_vocab_size // tensor_parallel,
                    hidden_dropout=shape.hidden_dropout, attention_dropout=shape.attention_dropout,
                    alibi=shape.position_embedding == "alibi", eps=shape.layernorm_epsilon, dtype=DTYPES[precision])


def candidates(op: str, s: OpShapes, device: torch.device) -> tuple[Callable[[], tuple], dict[str, Callable]]:
    """(make inputs, {implementation: fn(*inputs) -> a tensor to backward from}) for one op at shape `s`."""
    from bigscience_ops import kernels
    from bigscience_ops.kernels.softmax import alibi_slopes

    def leaf(*dims, scale=1.0):
        return (torch.randn(dims, device=device, dtype=torch.float32) * scale).to(s.dtype).requires_grad_()

    def each(fn: Callable[[str], Callable]) -> dict[str, Callable]:
        return {impl: fn(impl) for impl in IMPLEMENTATIONS}

    h, t = s.hidden, s.tokens
    if op == "layer_norm":
        return (lambda: (leaf(t, h), leaf(h), leaf(h))), each(
            lambda impl: lambda x, w, b: kernels.layer_norm(x, w, b, s.eps, impl))
    if op == "residual_layer_norm":
        return (lambda: (leaf(t, h), leaf(t, h), leaf(h), leaf(h))), each(
            lambda impl: lambda x, a, w, b: sum(kernels.residual_layer_norm(x, a, w, b, s.eps, s.hidden_dropout, impl)))
    if op == "bias_gelu":
        return (lambda: (leaf(t, s.ffn), leaf(s.ffn))), each(lambda impl: lambda x, b: kernels.bias_gelu(x, b, impl))
    if op == "attention":
        slopes = (torch.tensor(alibi_slopes(s.heads), device=device) if s.alibi else None)  # any heads' slopes

        def inputs():
            qkv = leaf(s.batch, s.seq, s.heads, 3 * s.head_size)  # as the model splits its fused projection
            return tuple(qkv.transpose(1, 2).split(s.head_size, dim=-1))
        return inputs, each(lambda impl: lambda q, k, v: kernels.causal_attention(q, k, v, s.attention_dropout, impl,
                                                                                  slopes))
    if op == "cross_entropy":
        def inputs():
            return leaf(t, s.vocab, scale=3.0), torch.randint(0, s.vocab, (t,), device=device)
        return inputs, each(lambda impl: lambda z, y: kernels.cross_entropy(z, y, impl))
    raise ValueError(f"unknown op {op!r}; allowed: {', '.join(OPS)}")


def time_ms(fn: Callable, inputs: tuple, iters: int, warmup: int) -> float:
    """Median ms of one forward + backward of `fn(*inputs)` on the current CUDA stream."""
    leaves = {id(t): t for t in (x if x._base is None else x._base for x in inputs if isinstance(x, torch.Tensor))}

    def step():
        for x in leaves.values():
            x.grad = None
        out = fn(*inputs)
        out.backward(torch.ones_like(out))

    for _ in range(warmup):
        step()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def measure(s: OpShapes, device: torch.device, iters: int = 5, warmup: int = 2,
            timer: Callable[[Callable, tuple, int, int], float] = time_ms) -> Timings:
    """op -> implementation -> median ms (None where it raised), measured without touching the training's RNG."""
    timings: dict[str, dict[str, float | None]] = {}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for op in OPS:
            make_inputs, impls = candidates(op, s, device)
            timings[op] = {}
            for impl, fn in impls.items():
                torch.manual_seed(0)  # the same input values for each candidate
                try:
                    timings[op][impl] = timer(fn, make_inputs(), iters, warmup)
                except Exception:  # noqa: BLE001 - a candidate that cannot run here is not chosen
                    timings[op][impl] = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return timings


def select_kernels(requested: str, shape: ModelShape, micro_batch_size: int, tensor_parallel: int, precision: str,
                   device: torch.device, iters: int = 5, recorded: Mapping | None = None) -> KernelChoice:
    """The run's KernelChoice (choice.resolve): measured here on CUDA for `auto`, unless `recorded` (the `kernels`
    record of the checkpoint the run resumes from) was measured at this very shape and device; with a process group
    of more than one rank, rank 0's choice for every rank."""
    s = op_shapes(shape, micro_batch_size, tensor_parallel, precision)
    try:
        previous = KernelChoice.from_record(recorded) if recorded else None
    except KernelChoiceError:  # a record this version cannot read (or a damaged one): measured again
        previous = None
    choice = resolve(requested, device.type, lambda: measure(s, device, iters), lambda: s.describe(device), previous)
    import torch.distributed as dist

    if choice.timings and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        shared = [choice]
        dist.broadcast_object_list(shared, src=0)
        choice = shared[0]
    return choice
