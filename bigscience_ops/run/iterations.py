"""Megatron's per-iteration log line: the trainer writes it (`iteration_line`), and the watchdog's health
check, `bsops info` and the chronicle read it back (`parse_iteration_line`), so both sides live here.

The format is Megatron-DeepSpeed's (seeds 002 and 003): `iteration N/ M | consumed samples: ... |`,
so existing log parsers read this trainer's lines and this reader reads Megatron's. Pure Python.
"""

from __future__ import annotations

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


MAX_LINE_CHARS = 16 << 10
"""A longer line is no iteration line (they are under 1 KiB, srun's label included): a log's line of megabytes
(a crashed node's NUL bytes, a dump without line breaks) is passed over without being split or matched."""


def parse_iteration_line(line: str) -> IterationStats | None:
    """The stats of an iteration line (this trainer's or Megatron-DeepSpeed's), or None for any other line.

    Fields Megatron adds and this trainer does not (or the reverse) are ignored or left at their
    defaults; a field whose value does not parse (a truncated line, a number of thousands of digits)
    leaves the line unread, and a line longer than MAX_LINE_CHARS is none.
    """
    if len(line) > MAX_LINE_CHARS:
        return None
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
