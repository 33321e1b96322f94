"""What the trainer prints and records: Megatron's log lines and TensorBoard scalars.

The line formats are Megatron-DeepSpeed's (seeds 002 and 003), so existing log parsers and the
status watchdog read them unchanged. TensorBoard tags are Megatron's; "X vs samples" is X against
consumed samples.
"""

from __future__ import annotations

import math
import re
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
    mfu: float | None = None  # model FLOPs utilisation in [0, 1]; None when the GPU's peak is unknown
    curriculum_seqlen: int | None = None  # the step's sequence length under curriculum learning


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
    if s.curriculum_seqlen is not None:
        line += f" curriculum seqlen: {s.curriculum_seqlen:5d} |"
    line += f" samples per second: {s.samples_per_second:.3f} |"
    line += f" TFLOPs: {s.tflops:.2f} |"
    if s.mfu is not None:
        line += f" MFU: {100 * s.mfu:.1f}% |"
    return line


# " iteration 10/ 221", after srun --label's "   1: " where the log has one.
_ITERATION_HEAD = re.compile(r"[ \t]*(?:[0-9]+:[ \t]*)?iteration[ \t]+([0-9]+)[ \t]*/[ \t]*([0-9]+)[ \t]*")
# The iteration line's fields as parse_iteration_line reads them back: label -> (field, type).
_FIELDS = {
    "consumed samples": ("consumed_samples", int), "consumed tokens": ("consumed_tokens", int),
    "elapsed time per iteration (ms)": ("elapsed_ms", float), "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int), "lm loss": ("lm_loss", float),
    "loss scale": ("loss_scale", float), "grad norm": ("grad_norm", float), "params norm": ("params_norm", float),
    "number of skipped iterations": ("skipped", int), "number of nan iterations": ("nan", int),
    "curriculum seqlen": ("curriculum_seqlen", int), "samples per second": ("samples_per_second", float),
    "TFLOPs": ("tflops", float),
}


def parse_iteration_line(line: str) -> IterationStats | None:
    """The stats of an iteration line (this trainer's or Megatron-DeepSpeed's), or None for any other line.

    Fields Megatron adds and this trainer does not (or the reverse) are ignored or left at their
    defaults; a field whose value does not parse (a truncated line) leaves the line unread.
    """
    head, sep, rest = line.partition("|")
    counts = _ITERATION_HEAD.fullmatch(head)
    if not sep or counts is None:
        return None
    done, total = counts.groups()
    values: dict[str, object] = {}
    try:
        stats = IterationStats(int(done), int(total), 0, 0, 0.0, 0.0, 0, None, 1.0, None, None, 0, 0, 0.0, 0.0)
        for part in rest.split("|"):
            label, colon, value = part.partition(":")
            known = _FIELDS.get(label.strip())
            if colon and known:
                values[known[0]] = known[1](value.strip())
            elif label.strip() == "MFU" and value.strip().endswith("%"):
                values["mfu"] = round(float(value.strip()[:-1]) / 100, 6)
    except ValueError:
        return None
    for name, value in values.items():
        setattr(stats, name, value)
    return stats


# Dense bf16/fp16 tensor-core peaks (TFLOPs, no sparsity) from NVIDIA's data sheets, matched in
# order against torch.cuda.get_device_name(): the more specific names first.
PEAK_TFLOPS: list[tuple[str, float]] = [
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312.0),  # SXM and PCIe
    ("V100S", 130.0),
    ("V100-PCIE", 112.0),
    ("V100", 125.0),  # SXM2; fp16 only
]


def peak_tflops_of(device_name: str) -> float | None:
    """The table's peak for a GPU name, or None for a GPU it does not know."""
    for key, peak in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peak
    return None


def peak_tflops(override: float | None, device) -> float | None:
    """`estimate.peak_tflops` when set, else the table's peak of this CUDA device; None on CPU."""
    if override is not None:
        return override
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    return peak_tflops_of(torch.cuda.get_device_name(device))


def mfu(achieved_tflops: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model TFLOPs per GPU over the peak (None when the peak is unknown)."""
    return None if peak is None else achieved_tflops / peak


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
