"""What the trainer prints and records: Megatron's log lines and TensorBoard scalars.

The line formats are Megatron-DeepSpeed's (seeds 002 and 003), so existing log parsers and the
status watchdog read them unchanged. TensorBoard tags are Megatron's; "X vs samples" is X against
consumed samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class IterationStats:
    iteration: int
    train_iters: int
    consumed_samples: int
    consumed_tokens: int
    elapsed_ms: float  # per iteration, averaged over the log interval
    learning_rate: float
    global_batch_size: int
    lm_loss: float | None  # averaged over the interval's applied steps
    loss_scale: float
    grad_norm: float | None
    params_norm: float | None
    skipped: int
    nan: int
    samples_per_second: float
    tflops: float


def iteration_line(s: IterationStats) -> str:
    line = f" iteration {s.iteration:8d}/{s.train_iters:8d} |"
    line += f" consumed samples: {s.consumed_samples:12d} |"
    line += f" consumed tokens: {s.consumed_tokens:12d} |"
    line += f" elapsed time per iteration (ms): {s.elapsed_ms:.1f} |"
    line += f" learning rate: {s.learning_rate:.3E} |"
    line += f" global batch size: {s.global_batch_size:5d} |"
    if s.lm_loss is not None:
        line += f" lm loss: {s.lm_loss:.6E} |"
    line += f" loss scale: {s.loss_scale:.1f} |"
    if s.grad_norm is not None:
        line += f" grad norm: {s.grad_norm:.3f} |"
    if s.params_norm is not None:
        line += f" params norm: {s.params_norm:.3f} |"
    line += f" number of skipped iterations: {s.skipped:3d} |"
    line += f" number of nan iterations: {s.nan:3d} |"
    line += f" samples per second: {s.samples_per_second:.3f} |"
    line += f" TFLOPs: {s.tflops:.2f} |"
    return line


def validation_lines(iteration: int, loss: float) -> list[str]:
    text = f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} | lm loss PPL: {perplexity(loss):.6E} | "
    bar = "-" * (len(text) + 1)
    return [bar, text, bar]


def perplexity(loss: float) -> float:
    return math.exp(min(20.0, loss))


class Board:
    """TensorBoard scalars, each also against consumed samples; a no-op when disabled."""

    def __init__(self, log_dir: str | None, queue_size: int = 5) -> None:
        self.writer = None
        if log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=log_dir, max_queue=queue_size)

    def scalar(self, tag: str, value: float, iteration: int, consumed_samples: int | None = None) -> None:
        if self.writer is None or value is None:
            return
        self.writer.add_scalar(tag, value, iteration)
        if consumed_samples is not None:
            self.writer.add_scalar(f"{tag} vs samples", value, consumed_samples)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
