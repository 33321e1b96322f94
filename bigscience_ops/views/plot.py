"""The training curves as one PNG: loss, validation loss, learning rate, batch size, grad norm vs tokens.

Read from the run's TensorBoard event files with TensorBoard's own reader (EventAccumulator),
using the trainer's "<tag> vs samples" scalars (step = consumed samples; x = samples x seq_length
tokens). A resumed run writes a new event file and logs again the steps after its checkpoint:
files are read oldest first and a later value for the same x wins, so the curve shows what the
run that continued recorded. Drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.errors import BsopsError

# (panel title, TensorBoard tag against consumed samples, y-axis label)
PANELS = (
    ("training loss", "lm loss vs samples", "loss (nats per token)"),
    ("validation loss", "lm loss validation vs samples", "loss (nats per token)"),
    ("learning rate", "learning-rate vs samples", "learning rate"),
    ("batch size", "batch-size vs samples", "global batch size (samples)"),
    ("grad norm", "grad-norm vs samples", "gradient L2 norm (before clipping)"),
)


class PlotError(BsopsError):
    """Nothing to plot, or the PNG cannot be written: names the folder or file."""


@dataclass(frozen=True)
class Series:
    """One drawn curve: x in consumed tokens, y as logged."""

    name: str
    tag: str
    tokens: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Plot:
    out: Path
    series: dict[str, Series]
    event_files: list[Path]


def event_files(tensorboard_dir: Path) -> list[Path]:
    """The folder's event files (sub-folders included), oldest first."""
    files = glob.glob(str(Path(tensorboard_dir) / "**" / "events.out.tfevents.*"), recursive=True)
    return [Path(p) for p in sorted(files, key=lambda p: (os.path.getmtime(p), p))]


def read_series(tensorboard_dir: Path, seq_length: int) -> tuple[dict[str, Series], list[Path]]:
    """Every panel's series from the event files under `tensorboard_dir`, x converted to tokens."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = event_files(tensorboard_dir)
    if not files:
        raise PlotError(f"no TensorBoard event files (events.out.tfevents.*) under {tensorboard_dir}; "
                        "has the run logged its first iteration (logging.tensorboard true)?")
    points: dict[str, dict[int, float]] = {tag: {} for _, tag, _ in PANELS}
    for path in files:
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        available = set(acc.Tags().get("scalars", []))
        for tag, values in points.items():
            if tag in available:
                values.update({e.step: e.value for e in acc.Scalars(tag)})
    series = {}
    for name, tag, _ in PANELS:
        steps = sorted(points[tag])
        series[name] = Series(name, tag, [s * seq_length for s in steps], [points[tag][s] for s in steps])
    return series, files


def draw(series: dict[str, Series], out: Path, title: str) -> None:
    """One panel per series on a 3 x 2 grid; the sixth cell sums up the latest values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    fig, axes = plt.subplots(3, 2, figsize=(13, 11), constrained_layout=True)
    fig.suptitle(title, fontsize=15)
    cells = list(axes.flat)
    right = max((s.tokens[-1] for s in series.values() if s.tokens), default=1.0)
    for ax, (name, _, ylabel) in zip(cells, PANELS):
        s = series[name]
        ax.set_title(name, fontsize=13)
        ax.set_xlabel("consumed tokens")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.set_xlim(0, right * 1.02)  # one x range for every panel, so they line up
        ax.grid(True, alpha=0.3)
        if not s.values:
            ax.text(0.5, 0.5, "no data yet", transform=ax.transAxes, ha="center", va="center", color="gray")
            continue
        marker = "o" if len(s.values) < 30 else None
        steps = "steps-post" if name == "batch size" else "default"  # the rampup changes it in steps
        ax.plot(s.tokens, s.values, marker=marker, markersize=4, linewidth=1.4, drawstyle=steps)
        if name == "batch size":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if name == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    summary = cells[5]
    summary.axis("off")
    lines = ["latest values"]
    for name, s in series.items():
        if s.values:
            lines.append(f"{name}: {s.values[-1]:.4g} at {EngFormatter(sep='')(s.tokens[-1])} tokens")
        else:
            lines.append(f"{name}: none yet")
    summary.text(0.02, 0.95, "\n".join(lines), va="top", family="monospace", fontsize=11)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110, format="png")
    except OSError as exc:
        raise PlotError(f"cannot write {out}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def plot(exp, out: Path, tensorboard_dir: Path | None = None) -> Plot:
    """Read `exp`'s TensorBoard events (paths.tensorboard, or `tensorboard_dir`) and write the PNG `out`."""
    directory = Path(tensorboard_dir or exp.paths.tensorboard)
    series, files = read_series(directory, exp.model.seq_length)
    draw(series, out, f"{exp.name}: training curves")
    return Plot(Path(out), series, files)
