"""The training curves as one PNG: loss, validation loss, learning rate, batch size, grad norm vs tokens.

Read from the run's TensorBoard event files with TensorBoard's own reader (EventAccumulator),
using the trainer's "<tag> vs samples" scalars (step = consumed samples; x = samples x seq_length
tokens). A resumed run writes a new event file and logs again the steps after its checkpoint:
files are read oldest first and a later value for the same x wins, so the curve shows what the
run that continued recorded. The run chronicle's events (ops/keep/chronicle.py: task starts, node-phase
resizes, rollbacks, alerts) are vertical lines on the training-loss panel: at their iteration's
consumed tokens where the run records the iteration, else (an alert) at the last point TensorBoard
logged before it. After a rollback (rollbacks.jsonl) the curves are the live branch's: a point past the
rollback's target logged before the rollback is the abandoned branch's (views/branch.py), drawn apart in
grey as "rolled back" and never the curve's, even where the relaunch has not logged that point again.
Where the run's checkpoints were evaluated (eval/global_stepN.json, ops/evaluate/results.py), two more panels
show the results over the checkpoints' iterations, one line per metric: the metrics better when higher
(accuracies) and those better when lower (perplexities, bits per byte; a log scale), each
eval.references value a dotted level in its metric's colour. A result file that cannot be read is left out
and named in the result (`Plot.problems`). Drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops import rollbacks
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.evaluate import results as eval_results
from bigscience_ops.ops.keep import chronicle
from bigscience_ops.run_schedule import run_schedule
from bigscience_ops.runfiles import Problem
from bigscience_ops.views import branch

# (panel title, TensorBoard tag against consumed samples, y-axis label)
PANELS = (
    ("training loss", "lm loss vs samples", "loss (nats per token)"),
    ("validation loss", "lm loss validation vs samples", "loss (nats per token)"),
    ("learning rate", "learning-rate vs samples", "learning rate"),
    ("batch size", "batch-size vs samples", "global batch size (samples)"),
    ("grad norm", "grad-norm vs samples", "gradient L2 norm (before clipping)"),
)


# chronicle event kind -> (legend label, colour) of its vertical line
MARKED = {"task": ("task start", "0.6"), "resize": ("node phase", "tab:purple"), "rollback": ("rollback", "tab:red"),
          "alert": ("alert", "tab:orange")}
EVAL_PANELS = (("evaluation: higher is better", True), ("evaluation: lower is better", False))
"""The eval panels' titles and which metrics each draws (their higher_is_better)."""
EVAL_LINES = 10
"""Metrics drawn per eval panel, by name; the others are counted in its title (`bsops info` tables them all)."""
LABEL_CHARS = 60
"""Characters of a metric or reference name shown in a legend."""


class PlotError(BsopsError):
    """Nothing to plot, or the PNG cannot be written: names the folder or file."""


@dataclass(frozen=True)
class Series:
    """One drawn curve: x in consumed tokens, y as logged."""

    name: str
    tag: str
    tokens: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each value was logged (epoch seconds)
    abandoned_tokens: list[float] = field(default_factory=list)  # the points a rollback abandoned, x in tokens
    abandoned_values: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Marker:
    """One chronicle event drawn as a vertical line: its kind (task, resize, rollback, alert) and x in tokens."""

    kind: str
    tokens: float


@dataclass(frozen=True)
class Plot:
    out: Path
    series: dict[str, Series]
    event_files: list[Path]
    markers: list[Marker] = field(default_factory=list)
    """The markers drawn, read back from the loss panel's lines."""
    evaluation: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Each metric drawn on an eval panel: its (iteration, value) points, read back from the panel's lines."""
    problems: list[Problem] = field(default_factory=list)
    """The result files that could not be read (left out of the eval panels)."""


def event_files(tensorboard_dir: Path) -> list[Path]:
    """The folder's event files (sub-folders included), oldest first."""
    files = glob.glob(str(Path(tensorboard_dir) / "**" / "events.out.tfevents.*"), recursive=True)
    return [Path(p) for p in sorted(files, key=lambda p: (os.path.getmtime(p), p))]


def read_series(tensorboard_dir: Path, seq_length: int,
                cutoffs: list[tuple[float, int]] = ()) -> tuple[dict[str, Series], list[Path]]:
    """Every panel's series from the event files under `tensorboard_dir`, x converted to tokens. `cutoffs` (each
    rollback's time and its target's consumed samples) set the abandoned branches' points apart."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = event_files(tensorboard_dir)
    if not files:
        raise PlotError(f"no TensorBoard event files (events.out.tfevents.*) under {tensorboard_dir}; "
                        "has the run logged its first iteration (logging.tensorboard true)?")
    points: dict[str, dict[int, tuple[float, float]]] = {tag: {} for _, tag, _ in PANELS}
    gone: dict[str, dict[int, float]] = {tag: {} for _, tag, _ in PANELS}
    for path in files:
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        available = set(acc.Tags().get("scalars", []))
        for tag, values in points.items():
            if tag in available:
                for e in acc.Scalars(tag):
                    if branch.abandoned(e.step, e.wall_time, cutoffs):
                        gone[tag][e.step] = e.value
                    else:
                        values[e.step] = (e.value, e.wall_time)
    series = {}
    for name, tag, _ in PANELS:
        steps, left = sorted(points[tag]), sorted(gone[tag])
        series[name] = Series(name, tag, [s * seq_length for s in steps], [points[tag][s][0] for s in steps],
                              [points[tag][s][1] for s in steps], [s * seq_length for s in left],
                              [gone[tag][s] for s in left])
    return series, files


def rollback_cutoffs(exp) -> list[tuple[float, int]]:
    """(time, consumed samples after its target) of each rollback the run folder records; none where they cannot be
    read (`bsops info` names a bad line)."""
    batch = run_schedule(exp).batch
    return [(r.time, batch.consumed_after(r.to_step)) for r in rollbacks.read_checked(exp.paths.output).records]


def markers(exp, loss: Series) -> list[Marker]:
    """Where the chronicle's task starts, resizes, rollbacks and alerts go on the loss curve (in tokens)."""
    batch = run_schedule(exp).batch
    out = []
    for event in chronicle.events(exp):
        if event.kind not in MARKED:
            continue
        if event.iteration is not None:
            out.append(Marker(event.kind, batch.consumed_after(event.iteration) * exp.model.seq_length))
            continue
        logged = [x for x, when in zip(loss.tokens, loss.times) if when <= event.when]
        if logged:
            out.append(Marker(event.kind, logged[-1]))
    return out


def draw(series: dict[str, Series], out: Path, title: str, marks: list[Marker] = (),
         evaluations: list[eval_results.Result] = (), references: dict[str, dict[str, float]] | None = None,
         drawn_eval: dict[str, list[tuple[float, float]]] | None = None) -> list[Marker]:
    """One panel per series on a 3 x 2 grid, `marks` as vertical lines on the training loss; the sixth
    cell sums up the latest values. With `evaluations`, a fourth row of eval panels (`draw_evaluation`), whose
    points as drawn go into `drawn_eval`. Returns the markers as drawn (read back from the panel's lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    rows = 4 if evaluations else 3
    fig, axes = plt.subplots(rows, 2, figsize=(13, 11 * rows / 3), constrained_layout=True)
    fig.suptitle(title, fontsize=15)
    cells = list(axes.flat)
    right = max((max(s.tokens[-1:] + s.abandoned_tokens[-1:]) for s in series.values()
                 if s.tokens or s.abandoned_tokens), default=1.0)
    for ax, (name, _, ylabel) in zip(cells, PANELS):
        s = series[name]
        ax.set_title(name, fontsize=13)
        ax.set_xlabel("consumed tokens")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.set_xlim(0, right * 1.02)  # one x range for every panel, so they line up
        ax.grid(True, alpha=0.3)
        if not s.values and not s.abandoned_values:
            ax.text(0.5, 0.5, "no data yet", transform=ax.transAxes, ha="center", va="center", color="gray")
            continue
        marker = "o" if len(s.values) < 30 else None
        steps = "steps-post" if name == "batch size" else "default"  # the rampup changes it in steps
        if s.abandoned_values:  # drawn first, under the live curve
            ax.plot(s.abandoned_tokens, s.abandoned_values, color="0.65", linestyle=":", linewidth=1.2,
                    marker="x" if len(s.abandoned_values) < 30 else None, markersize=4, drawstyle=steps,
                    label="rolled back", gid="rolled-back")
        ax.plot(s.tokens, s.values, marker=marker, markersize=4, linewidth=1.4, drawstyle=steps, gid="live")
        if name == "training loss":
            _draw_markers(ax, marks)
        if s.abandoned_values or (name == "training loss" and marks):
            ax.legend(loc="upper right", fontsize=9)
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
    if evaluations:
        for ax, (name, higher) in zip(cells[6:], EVAL_PANELS):
            points = draw_evaluation(ax, name, evaluations, references or {}, higher)
            if drawn_eval is not None:
                drawn_eval.update(points)
    drawn = [Marker(line.get_gid().split(":", 1)[1], float(line.get_xdata()[0])) for line in cells[0].get_lines()
             if (line.get_gid() or "").startswith("event:")]
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110, format="png")
    except OSError as exc:
        raise PlotError(f"cannot write {out}: {exc.strerror}") from None
    finally:
        plt.close(fig)
    return drawn


def _label(text: str) -> str:
    """An untrusted name as a legend label: capped, one line, `$` shown as itself (never mathtext), never hidden
    (matplotlib leaves out a label that starts with `_`)."""
    text = " ".join(text.split())
    text = text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 3] + "..."
    return ("\u200a" if text.startswith("_") else "") + text.replace("$", r"\$")


def draw_evaluation(ax, title: str, evaluations: list[eval_results.Result], references: dict[str, dict[str, float]],
                    higher: bool) -> dict[str, list[tuple[float, float]]]:
    """One line per metric whose direction is `higher` over the results' iterations (the first EVAL_LINES by name),
    each reference's value a dotted level in the metric's colour. Returns each metric's points as drawn."""
    ordered = sorted(evaluations, key=lambda r: r.iteration)
    names = sorted({m for r in ordered for m, h in r.higher_is_better.items() if h is higher})
    more = len(names) - EVAL_LINES
    ax.set_title(title + (f" ({more} more metrics: bsops info)" if more > 0 else ""), fontsize=13)
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("iteration")
    ax.set_ylabel("metric value")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    if not names:
        ax.text(0.5, 0.5, "no such metric evaluated", transform=ax.transAxes, ha="center", va="center", color="gray")
        return {}
    drawn: dict[str, list[tuple[float, float]]] = {}
    for metric in names[:EVAL_LINES]:
        points = [(r.iteration, r.metrics[metric]) for r in ordered if metric in r.metrics]
        (line,) = ax.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=4, linewidth=1.4,
                          label=_label(metric))
        drawn[metric] = [(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata())]
        for name, values in references.items():
            value = values.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                ax.axhline(value, color=line.get_color(), linestyle=":", linewidth=1.0, alpha=0.8)
    if not higher and all(y > 0 for points in drawn.values() for _, y in points if y == y):
        ax.set_yscale("log")  # perplexities of tens of thousands beside bits per byte near 1
    ax.legend(loc="best", fontsize=8, title="dotted: references" if references else None, title_fontsize=8)
    return drawn


def _draw_markers(ax, marks: list[Marker]) -> None:
    """A dashed vertical line per marker, one legend entry per kind."""
    labelled = set()
    for mark in marks:
        label, colour = MARKED[mark.kind]
        ax.axvline(mark.tokens, color=colour, linestyle="--", linewidth=0.9, alpha=0.8, gid=f"event:{mark.kind}",
                   label=label if mark.kind not in labelled else None)
        labelled.add(mark.kind)


def plot(exp, out: Path, tensorboard_dir: Path | None = None) -> Plot:
    """Read `exp`'s TensorBoard events (paths.tensorboard, or `tensorboard_dir`) and write the PNG `out`, the
    run chronicle's events marked on the loss curve (none when the run folder's records cannot be read), the
    points its rollbacks abandoned drawn apart."""
    directory = Path(tensorboard_dir or exp.paths.tensorboard)
    try:
        cutoffs = rollback_cutoffs(exp)
    except (BsopsError, OSError):
        cutoffs = []
    series, files = read_series(directory, exp.model.seq_length, cutoffs)
    try:
        marks = markers(exp, series["training loss"])
    except (BsopsError, OSError):
        marks = []
    evaluated, problems = eval_results.read_all(exp.paths.output)
    try:
        evaluated = eval_results.live(evaluated, rollbacks.read_checked(exp.paths.output).records)
    except (BsopsError, OSError):
        pass
    points: dict[str, list[tuple[float, float]]] = {}
    drawn = draw(series, out, f"{exp.name}: training curves", marks, evaluated, exp.eval.references, points)
    return Plot(Path(out), series, files, drawn, points, problems)
