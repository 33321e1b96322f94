"""The trainer's TFLOPs per GPU as benchmarks/RESULTS.md records them for a GPU, for `bsops plan` to show beside its
estimate.

RESULTS.md's GPU sections are headed `### NVIDIA <GPU> (<YYYY-MM-DD>)`, and the trainer's throughput lines
there read `bsops trainer   <N> tokens/s   <T> TFLOPs  MFU <M>%` (benchmarks/train_throughput.py's output).
The measurement of a GPU is its latest section's best trainer line. The file comes with a source
checkout, not with an installed package: without it there is no measurement (None), and the plan
shows its estimate.tflops_per_gpu alone. No torch: the plan runs on login nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "RESULTS.md"
MAX_BYTES = 1 << 20  # RESULTS.md is tens of KB; a larger file is not read whole

_SECTION = re.compile(r"^###\s+NVIDIA\s+(?P<gpu>[^\n(]*?)\s*\((?P<date>\d{4}-\d{2}-\d{2})\)\s*$", re.MULTILINE)
_HEADING = re.compile(r"^#{1,3}\s", re.MULTILINE)
_TRAINER = re.compile(r"bsops trainer\s+\d+ tokens/s\s+(?P<tflops>\d+(?:\.\d+)?) TFLOPs")


@dataclass(frozen=True)
class Measured:
    gpu: str
    """As the section heading names it (H200, A100-SXM4-80GB, ...)."""
    date: str
    tflops: float
    """The best trainer TFLOPs per GPU of that section."""
    model: str
    """The model line's first words before the TFLOPs lines (what was trained), or '' when the section has none."""


def _model_family(name: str) -> str:
    """h200 from 'H200', 'h200', 'h100-94g' or 'A100-SXM4-80GB' -> a100: letters then digits, lower case."""
    found = re.match(r"[a-z]+\d+", name.strip().lower().removeprefix("nvidia "))
    return found.group(0) if found else ""


def measured_tflops(gpu: str, text: str) -> Measured | None:
    """The trainer's measured TFLOPs on `gpu` (a Slurm constraint feature such as h200 or a100-80g, or a device
    name) in RESULTS.md's `text`: the latest section of that GPU family with a trainer line, or None."""
    family = _model_family(gpu)
    if not family:
        return None
    found: list[Measured] = []
    for section in _SECTION.finditer(text):
        if _model_family(section.group("gpu")) != family:
            continue
        following = _HEADING.search(text, section.end())
        body = text[section.end():following.start() if following else len(text)]
        rates = [float(m.group("tflops")) for m in _TRAINER.finditer(body)]
        if rates:
            model = re.search(r"train_throughput\.py[^,\n]*,\s*([^,\n]+)", body)
            found.append(Measured(section.group("gpu"), section.group("date"), max(rates),
                                  model.group(1).strip() if model else ""))
    return max(found, key=lambda m: m.date) if found else None


def read_results(path: Path | None = None) -> str | None:
    """RESULTS.md's text (`path`, default RESULTS), or None when the file is not there (an installed package) or not
    readable."""
    try:
        with open(path or RESULTS, encoding="utf-8", errors="replace") as f:
            return f.read(MAX_BYTES)
    except OSError:
        return None
