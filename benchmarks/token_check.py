"""Benchmark: what the trainer's token check (every fed id against the vocabulary) costs a training step.

The feed (bigscience_ops/trainer/data.py, MicroBatchFeed) checks each micro-batch on the host before it goes to
the model: `bad_token`, one min/max over its ids. This prints, for each shape side by side, the check's time per
micro-batch against the forward and backward of one transformer block of that shape scaled by the number of
layers (the same micro-batch), and their ratio. The scaled block leaves out the embedding, the head, the loss,
the optimizer and every collective, so it is less than a real step's time and the ratio is an upper bound of the
check's share. Both are timed in alternating rounds in one process; each figure is the median of the rounds.

Shapes: tiny (trainings/tiny.yaml) and 760m (trainings/gpt-760M.yaml: 24 layers x 1536, 16 heads, seq 1024,
vocab 8192, micro batch 4), fp32 on the CPU; on CUDA the block runs on the GPU in bf16 and the check stays on the
host, where the feed does it.

    python benchmarks/token_check.py                       # tiny and 760m
    python benchmarks/token_check.py --shapes tiny --rounds 5
    python benchmarks/token_check.py --micro-batch-size 1  # the 760m block at micro batch 1 (faster on 2 cores)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXPERIMENTS = {"tiny": "tiny", "760m": "gpt-760M"}
LIMIT = 0.01  # the check may cost at most 1% of a step


@dataclasses.dataclass(frozen=True)
class Figures:
    shape: str
    micro_batch: tuple[int, int]  # (micro batch size, sequence length)
    check_us: float  # the check, per micro-batch
    block_ms: float  # one block's forward and backward, per micro-batch
    layers: int

    @property
    def step_ms(self) -> float:
        return self.block_ms * self.layers

    @property
    def ratio(self) -> float:
        return self.check_us / 1000 / self.step_ms


def _time_check(batch, limit: int, calls: int) -> float:
    """Microseconds per call of the feed's check, over `calls` calls."""
    from bigscience_ops.trainer.data import bad_token

    start = time.perf_counter()
    for _ in range(calls):
        assert bad_token(batch, limit) is None
    return (time.perf_counter() - start) / calls * 1e6


def _time_block(block, x, device) -> float:
    """Milliseconds of one forward and backward of `block` on `x`."""
    import torch

    start = time.perf_counter()
    out = block(x)
    out.float().sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def measure(shape_name: str, rounds: int, mbs: int | None, device_kind: str) -> Figures:
    import numpy as np
    import torch

    from bigscience_ops.config.loading import load_experiment
    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer.data import collate
    from bigscience_ops.trainer.model import TransformerBlock

    exp = load_experiment(EXPERIMENTS[shape_name], REPO / "trainings")
    shape = GPTShape.from_experiment(exp)
    mbs = mbs or exp.batch.micro_batch_size
    seq, limit = shape.seq_length, shape.padded_vocab_size
    rng = np.random.default_rng(0)
    batch = collate([rng.integers(0, exp.model.vocab_size, seq + 1) for _ in range(mbs)])  # as the loader makes it
    device = torch.device(device_kind)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    block = TransformerBlock(dataclasses.replace(shape, hidden_dropout=0.0, attention_dropout=0.0), exp.train.seed, 1,
                             kernels="torch").to(device=device, dtype=dtype)
    x = torch.randn(mbs, seq, shape.hidden_size, device=device, dtype=dtype, requires_grad=True)
    _time_block(block, x, device)  # warm-up: allocator, threads
    calls = 2000
    checks, blocks = [], []
    for _ in range(rounds):
        checks.append(_time_check(batch, limit, calls))
        blocks.append(_time_block(block, x, device))
    return Figures(shape_name, (mbs, seq), statistics.median(checks), statistics.median(blocks), shape.num_layers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,760m", help=f"comma-separated, of {', '.join(EXPERIMENTS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=None, help="default: each experiment's")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args()

    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, {args.rounds} rounds (medians)")
    print(f"{'shape':<6} {'micro-batch':>12} {'check (us)':>11} {'block fwd+bwd (ms)':>19} {'x layers (ms)':>14} "
          f"{'check / step':>13}")
    worst = 0.0
    for name in args.shapes.split(","):
        f = measure(name.strip(), args.rounds, args.micro_batch_size, device)
        worst = max(worst, f.ratio)
        print(f"{f.shape:<6} {f'{f.micro_batch[0]} x {f.micro_batch[1]}':>12} {f.check_us:>11.1f} {f.block_ms:>19.1f} "
              f"{f'{f.step_ms:.1f} (x{f.layers})':>14} {f.ratio * 100:>12.5f}%")
    print(f"largest share {worst * 100:.5f}%: {'within' if worst <= LIMIT else 'ABOVE'} the {LIMIT:.0%} allowed")
    return 0 if worst <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
