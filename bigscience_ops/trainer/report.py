"""What the trainer prints and records besides the iteration line (iteration_log.py): validation lines,
throughput against the GPU's peak, and TensorBoard scalars.

The line formats are Megatron-DeepSpeed's (seeds 002 and 003), so existing log parsers and the
status watchdog read them unchanged. TensorBoard tags are Megatron's; "X vs samples" is X against
consumed samples.
"""

from __future__ import annotations

import math

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
