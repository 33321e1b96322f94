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
Where the run's checkpoints were evaluated (eval/global_stepN.json, ops/evaluate/results.py), more panels
show the results against the checkpoints' consumed tokens (the x of every other panel), one panel per kind of
metric, each on an axis of its own: accuracies and other scores better when higher, perplexities (a log
scale: tens of thousands early in a run), bits per byte, and any other metric better when lower; one line per
metric, each eval.references value a dotted level in its metric's colour. A limited result (eval.limit examples per
task, eval/limited/) of a step with no full one is a hollow point of its metric's colour, labelled "(limited)" and
never joined to the line. A result file that cannot be read, or made for another run, is left out and named in the
result (`Plot.problems`). Drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.run import rollbacks
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.evaluate import results as eval_results
from bigscience_ops.ops.keep import chronicle
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.untrusted import Problem
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
EVAL_PANELS = (("accuracy", "evaluation: accuracies and scores (higher is better)", "score"),
               ("perplexity", "evaluation: perplexities (lower is better)", "perplexity (log scale)"),
               ("bits_per_byte", "evaluation: bits per byte (lower is better)", "bits per byte"),
               ("lower", "evaluation: other metrics (lower is better)", "metric value"))
"""The eval panels in order, one per kind of metric (`metric_kind`): (kind, title, y-axis label)."""
EVAL_LINES = 10
"""Metrics drawn per eval panel, by name; the others are counted in its title (`bsops info` tables them all)."""
LABEL_CHARS = 60
LIMITED_MARK = "(limited)"
"""What a limited result's points are drawn and returned under: "<metric> (limited)"."""
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
    """Each metric drawn on an eval panel: its (consumed tokens, value) points, read back from the panel's lines (a
    limited result's under "<metric> (limited)", LIMITED_MARK)."""
    problems: list[Problem] = field(default_factory=list)
    """The result files that could not be read (left out of the eval panels)."""
    eval_panels: dict[str, list[str]] = field(default_factory=dict)
    """Each eval panel's kind (EVAL_PANELS) and the metrics it draws."""


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


def metric_kind(metric: str, higher: bool) -> str:
    """The eval panel a "task/metric" goes on: perplexity, bits_per_byte, accuracy (any other metric better when
    higher) or lower (any other better when lower)."""
    name = metric.rpartition("/")[2].partition(",")[0]
    if "perplexity" in name or name == "ppl":
        return "perplexity"
    if name in ("bits_per_byte", "bpb"):
        return "bits_per_byte"
    return "accuracy" if higher else "lower"


def eval_kinds(evaluations: list[eval_results.Result]) -> dict[str, list[str]]:
    """kind -> its metrics (by name), for the kinds the results hold, in EVAL_PANELS' order."""
    found: dict[str, set[str]] = {}
    for result in evaluations:
        for metric, higher in result.higher_is_better.items():
            found.setdefault(metric_kind(metric, higher), set()).add(metric)
    return {kind: sorted(found[kind]) for kind, _, _ in EVAL_PANELS if kind in found}


def draw(series: dict[str, Series], out: Path, title: str, marks: list[Marker] = (),
         evaluations: list[eval_results.Result] = (), references: dict[str, dict[str, float]] | None = None,
         drawn_eval: dict[str, list[tuple[float, float]]] | None = None,
         tokens_of: Callable[[eval_results.Result], float | None] = lambda r: r.consumed_tokens,
         panels: dict[str, list[str]] | None = None) -> list[Marker]:
    """One panel per series on a 3 x 2 grid, `marks` as vertical lines on the training loss; the sixth
    cell sums up the latest values. With `evaluations`, a row of eval panels for each two kinds of metric
    (`draw_evaluation`, x `tokens_of` each result), whose points as drawn go into `drawn_eval` and metrics into
    `panels`. Returns the markers as drawn (read back from the panel's lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    kinds = (eval_kinds(evaluations) or {"accuracy": []}) if evaluations else {}
    rows = 3 + -(-len(kinds) // 2)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 11 * rows / 3), constrained_layout=True)
    fig.suptitle(title, fontsize=15)
    cells = list(axes.flat)
    right = max((max(s.tokens[-1:] + s.abandoned_tokens[-1:]) for s in series.values()
                 if s.tokens or s.abandoned_tokens), default=1.0)
    right = max([right, *(x for r in evaluations if (x := tokens_of(r)) is not None)])  # evaluated beyond the logs
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
    titles = {kind: (title, label) for kind, title, label in EVAL_PANELS}
    for ax, (kind, metrics) in zip(cells[6:], kinds.items()):
        points = draw_evaluation(ax, *titles[kind], kind, metrics, evaluations, references or {}, tokens_of,
                                 right * 1.02)
        if drawn_eval is not None:
            drawn_eval.update(points)
        if panels is not None:
            panels[kind] = sorted(points)
    for ax in cells[6 + len(kinds):]:
        ax.axis("off")
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


def draw_evaluation(ax, title: str, ylabel: str, kind: str, names: list[str], evaluations: list[eval_results.Result],
                    references: dict[str, dict[str, float]], tokens_of: Callable[[eval_results.Result], float | None],
                    right: float) -> dict[str, list[tuple[float, float]]]:
    """One line per metric of `names` (the first EVAL_LINES) against the results' consumed tokens (a result whose
    tokens are unknown is left out), each reference's value a dotted level in the metric's colour, x from 0 to
    `right` as the other panels. Returns each metric's points as drawn."""
    from matplotlib.ticker import EngFormatter

    shown = eval_results.per_step(evaluations)  # a step's full result over its limited one
    ordered = sorted((r for r in shown if not r.limited), key=lambda r: r.iteration)
    limited = sorted((r for r in shown if r.limited), key=lambda r: r.iteration)
    more = len(names) - EVAL_LINES
    ax.set_title(title + (f" ({more} more metrics: bsops info)" if more > 0 else ""), fontsize=13)
    ax.set_xlabel("consumed tokens")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlim(0, right)
    ax.grid(True, alpha=0.3)
    if not names:
        ax.text(0.5, 0.5, "no metric evaluated", transform=ax.transAxes, ha="center", va="center", color="gray")
        return {}
    drawn: dict[str, list[tuple[float, float]]] = {}
    for metric in names[:EVAL_LINES]:
        points = [(x, r.metrics[metric]) for r in ordered if metric in r.metrics and (x := tokens_of(r)) is not None]
        (line,) = ax.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=4, linewidth=1.4,
                          label=_label(metric))
        drawn[metric] = [(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata())]
        few = [(x, r.metrics[metric]) for r in limited if metric in r.metrics and (x := tokens_of(r)) is not None]
        if few:  # limited results (eval.limit): hollow points of the metric's colour, never joined to its line
            (marks,) = ax.plot([x for x, _ in few], [y for _, y in few], linestyle="none", marker="o", markersize=6,
                               markerfacecolor="none", color=line.get_color(), label=_label(f"{metric} (limited)"))
            drawn[f"{metric} {LIMITED_MARK}"] = [(float(x), float(y)) for x, y in zip(marks.get_xdata(),
                                                                                      marks.get_ydata())]
        for name, values in references.items():
            value = values.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                ax.axhline(value, color=line.get_color(), linestyle=":", linewidth=1.0, alpha=0.8)
    if kind == "perplexity" and all(y > 0 for points in drawn.values() for _, y in points if y == y):
        ax.set_yscale("log")  # perplexities of tens of thousands early in a run, tens later
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


def plot(exp, out: Path, tensorboard_dir: Path | None = None, dry_run: bool = False) -> Plot:
    """Read `exp`'s TensorBoard events (paths.tensorboard, or `tensorboard_dir`) and write the PNG `out`, the
    run chronicle's events marked on the loss curve (none when the run folder's records cannot be read), the
    points its rollbacks abandoned drawn apart. With `dry_run`, the curves are read and nothing is drawn or
    written."""
    directory = Path(tensorboard_dir or exp.paths.tensorboard)
    try:
        cutoffs = rollback_cutoffs(exp)
    except (BsopsError, OSError):
        cutoffs = []
    series, files = read_series(directory, exp.model.seq_length, cutoffs)
    if dry_run:
        return Plot(Path(out), series, files)
    try:
        marks = markers(exp, series["training loss"])
    except (BsopsError, OSError):
        marks = []
    evaluated, problems = eval_results.read_live(exp.paths.output, exp.paths.checkpoints, limited=True)
    points: dict[str, list[tuple[float, float]]] = {}
    panels: dict[str, list[str]] = {}
    drawn = draw(series, out, f"{exp.name}: training curves", marks, evaluated, exp.eval.references, points,
                 _tokens_of(exp), panels)
    return Plot(Path(out), series, files, drawn, points, problems, panels)


def _tokens_of(exp) -> Callable[[eval_results.Result], float | None]:
    """A result's consumed tokens: as its file records them, else from the run's batch schedule at its iteration."""
    try:
        batch = run_schedule(exp).batch
    except (BsopsError, ValueError):
        batch = None

    def tokens(result: eval_results.Result) -> float | None:
        if result.consumed_tokens is not None:
            return float(result.consumed_tokens)
        if batch is None:
            return None
        return float(batch.consumed_after(result.iteration) * exp.model.seq_length)

    return tokens
