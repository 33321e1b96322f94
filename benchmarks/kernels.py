"""The fused kernels (bigscience_ops/kernels/) against torch eager, torch.compile and Liger-Kernel, forward + backward.

Shapes: GPT-2 124M (micro-batch 8 x 1024 tokens, h 768, 12 heads, vocab 50304) and one TP rank of
a 13B model at TP=4 (1 x 2048 tokens, h 5120, 40/4 heads of 128, ffn 20480/4, vocab 51200/4).
For each op and implementation it prints the time of forward + backward (ms), the effective
bandwidth over the op's minimum memory traffic (GB/s), the peak memory above the inputs (MiB) and
the speed-up against eager measured in the same run (eager ms / ms: above 1 is faster).

    pip install -e '.[bench]'          # liger-kernel, the Triton baseline
    python benchmarks/kernels.py [--shapes gpt2,13b-tp4]
                                 [--ops layernorm,residual_layernorm,bias_gelu,attention,cross_entropy]
                                 [--dtype bf16] [--reps 50] [--no-compile]

Needs a CUDA GPU: on a machine without one it says so and exits 0. Liger has no bias-GeLU and no
attention; those rows are left out. For attention, `sdpa` is torch's scaled_dot_product_attention
(FlashAttention/cuDNN inside), and eager the explicit softmax(q k^T) v with the T x T matrix.
`residual_layernorm` is the block's dropout(0.1) + residual add + LayerNorm: eager runs it as torch ops,
ours as one kernel each way (kernels/residual_layernorm.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    seq: int
    hidden: int
    heads: int  # on this rank
    head_size: int
    ffn: int  # on this rank
    vocab: int  # on this rank

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


OPS = ("layernorm", "residual_layernorm", "bias_gelu", "attention", "cross_entropy")
SHAPES = {
    "gpt2": Shape("gpt2-124M", batch=8, seq=1024, hidden=768, heads=12, head_size=64, ffn=3072,
                  vocab=50304),
    "13b-tp4": Shape("13B per TP rank (TP=4)", batch=1, seq=2048, hidden=5120, heads=10, head_size=128,
                     ffn=5120, vocab=12800),
}


def _cases(op: str, shape: Shape, dtype, device) -> tuple[Callable[[], tuple], dict[str, Callable], int]:
    """(make inputs, {implementation: fn(*inputs) -> output}, minimum bytes moved by forward + backward)."""
    import torch

    from bigscience_ops import kernels
    from bigscience_ops.kernels.crossentropy import cross_entropy_reference
    from bigscience_ops.kernels.gelu import bias_gelu_reference
    from bigscience_ops.kernels.layernorm import layer_norm_reference
    from bigscience_ops.kernels.residual_layernorm import residual_layer_norm_reference
    from bigscience_ops.kernels.softmax import causal_attention_reference

    size = torch.tensor([], dtype=dtype).element_size()
    liger = _liger()

    # Inputs come from the CPU generator: a failed CUDA-graph capture (an op that syncs the host) leaves the
    # device generator unusable outside a capture.
    def leaf(*dims, scale=1.0):
        return (torch.randn(dims, dtype=torch.float32) * scale).to(device=device, dtype=dtype).requires_grad_()

    if op == "layernorm":
        h = shape.hidden
        impls = {"eager": lambda x, w, b: layer_norm_reference(x, w, b, 1e-5),
                 "triton (ours)": lambda x, w, b: kernels.layer_norm(x, w, b, 1e-5, "triton")}
        if liger:
            impls["liger"] = lambda x, w, b: liger.LigerLayerNormFunction.apply(x, w, b, 1e-5)
        return (lambda: (leaf(shape.tokens, h), leaf(h), leaf(h))), impls, 5 * shape.tokens * h * size
    if op == "residual_layernorm":
        h, p = shape.hidden, 0.1
        impls = {"eager": lambda x, a, w, b: sum(residual_layer_norm_reference(x, a, w, b, 1e-5, p)),
                 "triton (ours)": lambda x, a, w, b: sum(kernels.residual_layer_norm(x, a, w, b, 1e-5, p, "triton"))}
        # forward reads x, a and writes s, y; backward reads s and both gradients, writes dx, da
        return (lambda: (leaf(shape.tokens, h), leaf(shape.tokens, h), leaf(h), leaf(h))), impls, \
            9 * shape.tokens * h * size
    if op == "bias_gelu":
        f = shape.ffn
        impls = {"eager": bias_gelu_reference, "triton (ours)": lambda x, b: kernels.bias_gelu(x, b, "triton")}
        return (lambda: (leaf(shape.tokens, f), leaf(f))), impls, 5 * shape.tokens * f * size
    if op == "attention":
        d = shape.head_size
        impls = {"eager": causal_attention_reference,
                 "sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                 "triton (ours)": lambda q, k, v: kernels.causal_attention(q, k, v, 0.0, "triton")}
        dims = (shape.batch, shape.heads, shape.seq, d)
        return (lambda: (leaf(*dims), leaf(*dims), leaf(*dims))), impls, 12 * shape.tokens * shape.heads * d * size
    if op == "cross_entropy":
        impls = {"eager": cross_entropy_reference,
                 "triton (ours)": lambda z, t: kernels.cross_entropy(z, t, "triton")}
        if liger:
            # liger 0.8 returns (loss, z_loss, token_accuracy, predicted_tokens)
            impls["liger"] = lambda z, t: _first(liger.LigerCrossEntropyFunction.apply(z, t, None, -100, 0.0, 0.0,
                                                                                       "none"))

        def inputs():
            targets = torch.randint(0, shape.vocab, (shape.tokens,)).to(device)
            return leaf(shape.tokens, shape.vocab, scale=3.0), targets
        return inputs, impls, 3 * shape.tokens * shape.vocab * size
    raise SystemExit(f"unknown op {op!r}; allowed: {', '.join(OPS)}")


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _liger():
    """Liger-Kernel's autograd Functions, or None when the bench extra is not installed."""
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except ImportError:
        return None
    return argparse.Namespace(LigerCrossEntropyFunction=LigerCrossEntropyFunction,
                              LigerLayerNormFunction=LigerLayerNormFunction)


@dataclass(frozen=True)
class Timing:
    ms: float
    """Stream time per forward + backward, launched from Python as a training step launches it."""
    host_ms: float
    """Python's time to launch one forward + backward: when it is close to `ms`, the op is launch-bound."""
    graph_ms: float | None
    """The same step replayed from a CUDA graph: the GPU's own time (None when the op cannot be captured)."""
    peak_mib: float
    """Peak memory allocated above the inputs."""


def _measure(fn: Callable, inputs: tuple, reps: int) -> Timing:
    import time

    import torch

    def step():
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.grad = None
        out = fn(*inputs)
        out.backward(torch.ones_like(out))

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    host = time.perf_counter()
    for _ in range(reps):
        step()
    host = time.perf_counter() - host
    end.record()
    torch.cuda.synchronize()
    return Timing(start.elapsed_time(end) / reps, 1e3 * host / reps, _graph_ms(step, reps), peak)


def _graph_ms(step: Callable, reps: int) -> float | None:
    """ms per replay of `step` captured in a CUDA graph, or None when it cannot be captured."""
    import torch

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a host sync or an uncapturable launch: the row says so
        torch.cuda.synchronize()
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="gpt2,13b-tp4", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated: {', '.join(OPS)}")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--reps", type=int, default=50, help="timed repetitions per implementation")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU (Triton kernels, CUDA timers and memory stats); "
              "none is visible here, so nothing was measured. The kernels' correctness on CPU is tested "
              "by tests/kernels/test_kernels_*.py under TRITON_INTERPRET=1.")
        return 0
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; allowed: {', '.join(SHAPES)}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  dtype {args.dtype}  "
          f"liger: {'yes' if _liger() else 'not installed (pip install liger-kernel)'}")
    print("ms: stream time per forward + backward launched from Python; host ms: Python's launch time alone (near ms:\n"
          "launch-bound); graph ms: replayed from a CUDA graph, the GPU's own time, and GB/s and 'graph vs eager' from it")
    print(f"{'shape':<24} {'op':<14} {'implementation':<16} {'ms':>8} {'host ms':>8} {'graph ms':>9} {'GB/s':>7} "
          f"{'peak MiB':>9} {'vs eager':>9} {'graph vs eager':>15}")
    for shape_key in args.shapes.split(","):
        shape = SHAPES[shape_key]
        for op in args.ops.split(","):
            make_inputs, impls, traffic = _cases(op, shape, dtype, device)
            if not args.no_compile:
                impls = {**impls, "torch.compile": torch.compile(impls["eager"])}
            eager: Timing | None = None
            for name, fn in impls.items():
                inputs = make_inputs()
                try:
                    t = _measure(fn, inputs, args.reps)
                except Exception as exc:  # one failing baseline must not hide the other rows
                    print(f"{shape.name:<24} {op:<14} {name:<16} failed: {type(exc).__name__}: {exc}"[:200])
                    continue
                finally:
                    del inputs
                    torch.cuda.empty_cache()
                eager = t if name == "eager" else eager
                ratio = f"{eager.ms / t.ms:8.2f}x" if eager else "-"
                graph = f"{t.graph_ms:9.3f}" if t.graph_ms else f"{'-':>9}"
                gpu_ms = t.graph_ms or t.ms
                graph_ratio = (f"{eager.graph_ms / t.graph_ms:8.2f}x" if eager and eager.graph_ms and t.graph_ms
                               else "-")
                print(f"{shape.name:<24} {op:<14} {name:<16} {t.ms:8.3f} {t.host_ms:8.3f} {graph} "
                      f"{traffic / gpu_ms / 1e6:7.0f} {t.peak_mib:9.1f} {ratio:>9} {graph_ratio:>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
