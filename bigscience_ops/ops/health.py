"""Training health: whether the run trains, not only whether it runs, read from its main_log.txt.

The watchdog reads the last iteration lines of the log (iteration_log.parse_iteration_line reads
this trainer's and Megatron's) and looks for what the BigScience runs watched by hand:

- a NaN or inf loss, or iterations the trainer counted as NaN;
- skipped iterations that go on after fp16's initial loss-scale search (a few in the first
  iterations, or an isolated overflow later, are normal);
- fp16's loss scale collapsing: halved again and again well below where it settled;
- a loss spike: the loss well above the median of the last few lines, both as a ratio and as a robust
  score against the noise of the step-to-step changes over a trailing window, so noise never alerts;
- a grad-norm explosion against the window's median;
- throughput falling well below the run's own median for several lines in a row (a slow or bad node),
  lines with a save or an evaluation in them excepted.

What a normal run does is not an alarm: the windows restart where the batch size changes (rampup,
node phases), where the curriculum's sequence length changes and where a task begins (a resume
logs again from its checkpoint, on other nodes), and the loss checks only look up, so LR warmup's
fast fall is quiet. Each finding names the iteration, the values and the next step; the watchdog
turns them into alerts with the usual cooldown and recovery mail. The thresholds are the
experiment's `alerts.health` (schema.HealthConfig).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bigscience_ops.iteration_log import IterationStats, parse_iteration_line
from bigscience_ops.schema import HealthConfig

# Lines of the trainer's log that mark what happened between two iteration lines (Megatron's wording).
TASK_BEGINS = "begins at iteration"  # "task 1234_5 begins at iteration 300" (ledger.begin)
SAVED = "successfully saved checkpoint at iteration"
EVALUATED = "validation loss at iteration"


@dataclass(frozen=True)
class Entry:
    """One iteration line and what the log says happened since the previous one."""

    stats: IterationStats
    task_start: bool = False  # the first line of a task (after "begins at iteration")
    busy: bool = False  # a save or an evaluation happened since the previous iteration line


@dataclass(frozen=True)
class Finding:
    kind: str  # "nan", "skipped", "loss-scale", "loss-spike", "grad-norm", "slow"
    iteration: int
    message: str  # what was seen, with the values
    next_step: str  # what the on-call person does about it

    def __str__(self) -> str:
        return f"iteration {self.iteration}: {self.message}; {self.next_step}"


def entries(lines: Iterable[str]) -> list[Entry]:
    """The iteration lines of `lines` (the log, oldest first) with what happened between them."""
    out: list[Entry] = []
    task_start = busy = False
    for line in lines:
        stats = parse_iteration_line(line)
        if stats is not None:
            out.append(Entry(stats, task_start, busy))
            task_start = busy = False
        elif TASK_BEGINS in line:
            task_start = True
        elif SAVED in line or EVALUATED in line:
            busy = True
    return out


def _segments(log: Sequence[Entry]) -> list[tuple[int, list[Entry]]]:
    """(index of the first line, lines) of each run of lines one window may span: a task, one batch
    size, one curriculum length, rising iterations."""
    out: list[tuple[int, list[Entry]]] = []
    for index, entry in enumerate(log):
        s = entry.stats
        last = out[-1][1][-1].stats if out else None
        if (last is None or entry.task_start or s.iteration <= last.iteration
                or s.global_batch_size != last.global_batch_size or s.curriculum_seqlen != last.curriculum_seqlen):
            out.append((index, []))
        out[-1][1].append(entry)
    return out


def _robust_score(value: float, window: Sequence[float], recent: int) -> tuple[float, float]:
    """(level, score) of `value` against `window` (oldest first): the level is the median of its last
    `recent` values, the spread the noise of step-to-step changes (1.4826 x MAD of the differences / sqrt 2),
    so a falling loss (warmup, early training) does not widen it."""
    level = statistics.median(window[-recent:])
    steps = [abs(b - a) for a, b in zip(window, window[1:])]
    noise = statistics.median(steps) * 1.4826 / math.sqrt(2) if steps else 0.0
    spread = max(noise, 1e-3 * abs(level), 1e-12)
    return level, (value - level) / spread


def check(log: Sequence[Entry], settings: HealthConfig = HealthConfig(), recent: int | None = None,
          every: bool = False) -> list[Finding]:
    """The findings among the last `recent` lines of `log` (all lines when None), the newest of each
    kind (each one with `every`), by iteration. The lines before them serve as the windows' history.
    """
    first = 0 if recent is None else max(0, len(log) - recent)
    found: list[Finding] = []
    for offset, segment in _segments(log):
        _check_segment(segment, settings, found, first_index=first, offset=offset)
    if not every:
        found = list({f.kind: f for f in found}.values())
    return sorted(found, key=lambda f: f.iteration)


def _check_segment(segment: list[Entry], settings: HealthConfig, found: list[Finding],
                   first_index: int, offset: int) -> None:
    settled_scale: float | None = None
    skipped_run = slow_run = 0
    for i, entry in enumerate(segment):
        s, report = entry.stats, offset + i >= first_index
        history = [e.stats for e in segment[max(0, i - settings.window):i]]

        def note(kind: str, message: str, next_step: str) -> None:
            if report:
                found.append(Finding(kind, s.iteration, message, next_step))

        if (s.lm_loss is not None and not math.isfinite(s.lm_loss)) or s.nan > 0:
            note("nan", f"lm loss {s.lm_loss}, {s.nan} NaN iteration(s) in the last log interval",
                 "roll back to the last good checkpoint and skip the data since (bsops rollback EXP --to STEP --skip A-B)")
        after_search = i >= settings.initial_search
        skipped_run = skipped_run + 1 if s.skipped > 0 and after_search else 0
        if skipped_run >= settings.skipped_lines:
            note("skipped", f"{s.skipped} skipped iteration(s) in each of the last {skipped_run} log lines "
                            f"(loss scale {s.loss_scale:g})",
                 "overflowing steps train nothing: look for a loss or grad-norm spike, and roll back if it goes on")
        if s.loss_scale > 1.0 and after_search and s.skipped == 0:
            settled_scale = s.loss_scale if settled_scale is None else settled_scale
        if settled_scale is not None and 0 < s.loss_scale <= settled_scale / settings.scale_collapse:
            note("loss-scale", f"fp16 loss scale {s.loss_scale:g}, {settled_scale / s.loss_scale:g}x below the "
                               f"{settled_scale:g} it settled at",
                 "the gradients overflow again and again: roll back to a checkpoint before the collapse, or "
                 "train in bf16")
        if len(history) < settings.min_window:
            continue
        losses = [h.lm_loss for h in history if h.lm_loss is not None and math.isfinite(h.lm_loss)]
        if s.lm_loss is not None and math.isfinite(s.lm_loss) and len(losses) >= settings.min_window:
            level, score = _robust_score(s.lm_loss, losses, settings.min_window)
            if score >= settings.spike_score and s.lm_loss >= settings.spike_ratio * level:
                note("loss-spike", f"lm loss {s.lm_loss:.4f} against {level:.4f}, the median of the last "
                                   f"{settings.min_window} lines (robust score {score:.1f} over {len(losses)} lines)",
                     f"if the loss does not come back within a few lines, roll back before iteration {s.iteration} "
                     f"and skip its data (bsops rollback EXP --to STEP --skip A-B)")
        norms = [h.grad_norm for h in history if h.grad_norm is not None and math.isfinite(h.grad_norm)]
        if s.grad_norm is not None and len(norms) >= settings.min_window:
            median = statistics.median(norms)
            if median > 0 and (not math.isfinite(s.grad_norm) or s.grad_norm >= settings.grad_norm_ratio * median):
                note("grad-norm", f"grad norm {s.grad_norm:g}, {s.grad_norm / median:.0f}x the median of "
                                  f"{median:g} over the last {len(norms)} lines",
                     "a loss spike usually follows: watch the next lines, roll back if the loss jumps")
        speeds = [h.samples_per_second for h, e in zip(history, segment[max(0, i - settings.window):i])
                  if h.samples_per_second > 0 and not e.busy]
        slow = (not entry.busy and s.samples_per_second > 0 and len(speeds) >= settings.min_window
                and s.samples_per_second < settings.slow_ratio * statistics.median(speeds))
        slow_run = slow_run + 1 if slow else (slow_run if entry.busy else 0)
        if slow_run >= settings.slow_lines:
            note("slow", f"{s.samples_per_second:g} samples/s for {slow_run} log lines, below "
                         f"{settings.slow_ratio:.0%} of this task's median {statistics.median(speeds):g}",
                 "a slow or bad node: look for the outlier with the job's per-node timings, exclude it "
                 "(slurm.exclude) and requeue")
