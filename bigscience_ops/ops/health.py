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
  lines with a save or an evaluation in them, and the first lines of a task, excepted.

What a normal run does is not an alarm: the loss and grad-norm windows restart where the batch size
changes (rampup, node phases) and where the curriculum's sequence length changes, and the loss checks
only look up, so LR warmup's fast fall is quiet. A resume (a task begins and logs again from its
checkpoint, on other nodes) continues the same training: the lines before its checkpoint at the same
batch size and length stay the window's history, so the checks see from its first line. Throughput is
compared across the whole log with the lines of the same configuration only: the same batch size and
length on as many GPUs (the log's samples/s over TFLOPs per GPU is proportional to the GPU count), so
a task that lands on a bad node is slow against the tasks before it from its first lines, and a node
phase on fewer nodes is not. Each finding names the iteration, the values and the next step; `advise`
makes the step exact (the experiment, the checkpoint to roll back to, the iterations to skip) and the
watchdog turns findings into alerts with the usual cooldown and recovery mail. The thresholds are the
experiment's `alerts.health` (schema.HealthConfig).

The run's downstream evaluation is health too: a metric of the newest evaluated checkpoint worse than the run's
best so far by more than its `eval.alert_drop` margin (ops/evaluate/results.drops) is a finding of its own
(`eval_drop`), with the same advice: the samples trained on since the best checkpoint, and the rollback to it.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.alerts import CONDITIONS
from bigscience_ops.run.iterations import IterationStats, parse_iteration_line
from bigscience_ops.schema import HealthConfig

# Lines of the trainer's log that mark what happened between two iteration lines (Megatron's wording).
TASK_BEGINS = "begins at iteration"  # "task 1234_5 begins at iteration 300" (ledger.begin)
SAVED = "successfully saved checkpoint at iteration"
EVALUATED = "validation loss at iteration"
TASK_WARMUP_LINES = 2
"""Lines at the start of a task whose throughput includes start-up (graph building, first batches): not judged."""
SAME_GPUS = 0.1
"""Two lines run on as many GPUs when their samples/s per TFLOPs differ by less than this share (rounding)."""
MIN_TFLOPS = 0.5
"""TFLOPs per GPU below this are too coarse in the log (two decimals) to tell GPU counts apart."""
ROLLBACK_KINDS = ("nan", "loss-spike", "loss-scale", "skipped", "grad-norm")
"""Findings whose next step is a look at the iteration's samples and, maybe, a rollback over them."""


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
    headline: str = ""  # an alert subject's words: what to do, then what was seen at which iteration
    entry: int = -1  # the index of its line among the entries checked

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


def _carried(before: Sequence[IterationStats], first: Entry, window: int) -> list[IterationStats]:
    """The last `window` lines before `first` that stay its history: on a resume (a new task, or the log
    going back to a checkpoint) at the same batch size and length, those before where it resumes."""
    s = first.stats
    if not before or not (first.task_start or s.iteration <= before[-1].iteration):
        return []
    kept = []
    for h in reversed(before):
        if len(kept) == window:
            break
        if h.iteration < s.iteration and h.global_batch_size == s.global_batch_size \
                and h.curriculum_seqlen == s.curriculum_seqlen:
            kept.append(h)
    return kept[::-1]


def _robust_score(value: float, window: Sequence[float], recent: int) -> tuple[float, float]:
    """(level, score) of `value` against `window` (oldest first): the level is the median of its last
    `recent` values, the spread the noise of step-to-step changes (1.4826 x MAD of the differences / sqrt 2),
    so a falling loss (warmup, early training) does not widen it."""
    level = statistics.median(window[-recent:])
    steps = [abs(b - a) for a, b in zip(window, window[1:])]
    noise = statistics.median(steps) * 1.4826 / math.sqrt(2) if steps else 0.0
    spread = max(noise, 1e-3 * abs(level), 1e-12)
    return level, (value - level) / spread


def _gpus(s: IterationStats) -> float | None:
    """A number proportional to the GPUs the line ran on (samples/s over TFLOPs per GPU), None when unknown."""
    return s.samples_per_second / s.tflops if s.tflops >= MIN_TFLOPS and s.samples_per_second > 0 else None


class _Speeds:
    """The run's normal-speed lines so far, by configuration: batch size, length and GPU count (lines whose
    samples/s per TFLOPs lie within SAME_GPUS of the configuration's first one), the last `window` of each."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.groups: dict[tuple[int, int | None], list[tuple[float | None, deque[float]]]] = {}

    def same(self, s: IterationStats) -> deque[float]:
        """The speeds of the configuration of `s` (a new, empty one when it has none yet)."""
        groups = self.groups.setdefault((s.global_batch_size, s.curriculum_seqlen), [])
        gpus = _gpus(s)
        for first, speeds in groups:
            if first is None or gpus is None:
                if first is gpus:
                    return speeds
            elif abs(first - gpus) <= SAME_GPUS * max(first, gpus):
                return speeds
        groups.append((gpus, deque(maxlen=self.window)))
        return groups[-1][1]


def check(log: Sequence[Entry], settings: HealthConfig = HealthConfig(), recent: int | None = None,
          every: bool = False) -> list[Finding]:
    """The findings among the last `recent` lines of `log` (all lines when None), the newest of each
    kind (each one with `every`), by iteration. The lines before them serve as the windows' history.
    """
    first = 0 if recent is None else max(0, len(log) - recent)
    found: list[Finding] = []
    speeds = _Speeds(settings.window)  # the run's normal-speed lines so far, for the throughput check
    window: list[IterationStats] = []
    for offset, segment in _segments(log):
        window = _carried(window, segment[0], settings.window)
        window = _check_segment(segment, settings, found, first, offset, window, speeds)
    if not every:
        found = list({f.kind: f for f in found}.values())
    return sorted(found, key=lambda f: f.iteration)


def _check_segment(segment: list[Entry], settings: HealthConfig, found: list[Finding], first_index: int,
                   offset: int, carried: list[IterationStats], speeds: _Speeds) -> list[IterationStats]:
    """Check one segment with `carried` as its lines' history; returns that history with its lines added."""
    settled_scale: float | None = None
    skipped_run = slow_run = 0
    lines = list(carried)
    for i, entry in enumerate(segment):
        s, index = entry.stats, offset + i
        history = lines[-settings.window:]
        lines.append(s)

        def note(kind: str, message: str, next_step: str = "", headline: str = "") -> None:
            """A finding of `kind` at this line: the next step and headline given, or its alert kind's
            (ops/alerts.py: `health-<kind>`), the headline then ending `at iteration N`."""
            if index >= first_index:
                known = CONDITIONS[f"health-{kind}"]
                found.append(Finding(kind, s.iteration, message, next_step or known.advice,
                                     headline or f"{known.headline} at iteration {s.iteration}", index))

        if (s.lm_loss is not None and not math.isfinite(s.lm_loss)) or s.nan > 0:
            note("nan", f"lm loss {s.lm_loss}, {s.nan} NaN iteration(s) in the last log interval")
        after_search = i >= settings.initial_search
        skipped_run = skipped_run + 1 if s.skipped > 0 and after_search else 0
        if skipped_run >= settings.skipped_lines:
            note("skipped", f"{s.skipped} skipped iteration(s) in each of the last {skipped_run} log lines "
                            f"(loss scale {s.loss_scale:g})")
        if s.loss_scale > 1.0 and after_search and s.skipped == 0:
            settled_scale = s.loss_scale if settled_scale is None else settled_scale
        if settled_scale is not None and 0 < s.loss_scale <= settled_scale / settings.scale_collapse:
            note("loss-scale", f"fp16 loss scale {s.loss_scale:g}, {settled_scale / s.loss_scale:g}x below the "
                               f"{settled_scale:g} it settled at")
        slow_run = _check_speed(entry, i, speeds, settings, slow_run, note)
        if len(history) < settings.min_window:
            continue
        losses = [h.lm_loss for h in history if h.lm_loss is not None and math.isfinite(h.lm_loss)]
        if s.lm_loss is not None and math.isfinite(s.lm_loss) and len(losses) >= settings.min_window:
            level, score = _robust_score(s.lm_loss, losses, settings.min_window)
            if score >= settings.spike_score and s.lm_loss >= settings.spike_ratio * level:
                note("loss-spike", f"lm loss {s.lm_loss:.4f} against {level:.4f}, the median of the last "
                                   f"{settings.min_window} lines (robust score {score:.1f} over {len(losses)} lines)",
                     f"if the loss does not come back within a few lines, roll back before iteration {s.iteration} "
                     f"and skip its data (bsops rollback EXP --step STEP --skip A-B)")
        norms = [h.grad_norm for h in history if h.grad_norm is not None and math.isfinite(h.grad_norm)]
        if s.grad_norm is not None and len(norms) >= settings.min_window:
            median = statistics.median(norms)
            if median > 0 and (not math.isfinite(s.grad_norm) or s.grad_norm >= settings.grad_norm_ratio * median):
                note("grad-norm", f"grad norm {s.grad_norm:g}, {s.grad_norm / median:.0f}x the median of "
                                  f"{median:g} over the last {len(norms)} lines")
    return lines


def _check_speed(entry: Entry, i: int, speeds: _Speeds, settings: HealthConfig, slow_run: int, note) -> int:
    """Judge one line's throughput against the run's earlier lines of the same configuration (those not
    judged slow); returns the run of slow lines. A line with a save or an evaluation in it, or among a
    task's first lines, is neither judged nor counted."""
    s = entry.stats
    if entry.busy or i < TASK_WARMUP_LINES or s.samples_per_second <= 0:
        return slow_run
    same = speeds.same(s)
    median = statistics.median(same) if len(same) >= settings.min_window else None
    if median is None or s.samples_per_second >= settings.slow_ratio * median:
        same.append(s.samples_per_second)
        return 0
    slow_run += 1
    if slow_run >= settings.slow_lines:
        note("slow", f"{s.samples_per_second:g} samples/s for {slow_run} log lines, below {settings.slow_ratio:.0%} "
                     f"of the run's median {median:g} at this batch size on as many GPUs",
             headline=f"find and exclude the slow node: {s.samples_per_second / median:.0%} of the run's throughput "
             f"at iteration {s.iteration}")
    return slow_run


# ----------------------------------------------------------------------------- what to do, exactly

def rollback_target(checkpoints: Path, iteration: int) -> int | None:
    """The last complete checkpoint before `iteration` (one saved at it already holds its update), or None."""
    try:
        steps = [c.step for c in layout.complete_checkpoints(Path(checkpoints)) if c.step < iteration]
    except (BsopsError, OSError):
        return None
    return max(steps, default=None)


def eval_drop(step: int, iteration: int, metric: str, value: float, best: float, best_step: int, margin: float,
              experiment: str | None, checkpoints: Path | None) -> Finding:
    """An evaluation metric's drop (ops/evaluate/results.Drop's fields) as a finding whose next step reads the
    samples trained on since the best checkpoint and rolls back to the last complete checkpoint at or before it,
    skipping the iterations since (shell-quoted, ready to paste)."""
    by = abs(value - best) if math.isfinite(value) else math.inf
    message = (f"{metric} {value:.4g} at step {step}, worse than the run's best {best:.4g} (step {best_step}) by "
               f"{by:.4g}, more than the alert_drop margin {margin:g}")
    exp = shlex.quote(experiment) if experiment is not None else "EXP"
    first = best_step + 1
    samples = f"`bsops samples {exp} --iteration N` for N from {first} to {iteration}"
    target = rollback_target(checkpoints, first) if checkpoints is not None else None
    if target is None:
        where = f"in {checkpoints}" if checkpoints is not None else "known to the watchdog"
        rollback = f"no complete checkpoint at or before step {best_step} is {where}: roll back by hand"
        headline = f"read the samples since step {best_step}, roll back if it stays: {metric} fell at step {step}"
    else:
        rollback = (f"roll back to the last complete checkpoint at or before the best one and skip the iterations "
                    f"since: `bsops rollback {exp} --step {target} --skip {target + 1}-{step}`")
        headline = (f"read the samples since step {best_step}, roll back to {target} if it stays: {metric} fell at "
                    f"step {step}")
    next_step = (f"read the samples the run trained on since its best checkpoint ({samples}; start where main_log.txt's "
                 f"loss rose); if the next evaluation does not come back, {rollback}")
    return Finding("eval-drop", iteration, message, next_step, headline)


def advise(finding: Finding, experiment: str | None, checkpoints: Path | None) -> Finding:
    """`finding` with its next step and headline made exact for a rollback kind: the commands to see
    the iteration's samples and to roll back to the last complete checkpoint before it, skipping the
    iterations from there through it (shell-quoted, ready to paste)."""
    if finding.kind not in ROLLBACK_KINDS or experiment is None:
        return finding
    n, exp = finding.iteration, shlex.quote(experiment)
    samples = f"`bsops samples {exp} --iteration {n}`"
    step = rollback_target(checkpoints, n) if checkpoints is not None else None
    if step is None:
        where = f"in {checkpoints}" if checkpoints is not None else "known to the watchdog"
        rollback = f"no complete checkpoint before iteration {n} is {where}: roll back by hand, or start again"
        target = "roll back"
    else:
        rollback = (f"roll back to the last complete checkpoint before it and skip the iterations since: "
                    f"`bsops rollback {exp} --step {step} --skip {step + 1}-{n}`")
        target = f"roll back to {step}, skip {step + 1}-{n}"
    what = finding.headline.split(": ", 1)[-1]
    if finding.kind == "nan":
        headline, step_text = f"{target}: {what}", f"see the samples ({samples}), then {rollback}"
    elif finding.kind == "loss-scale":
        headline, step_text = f"{target} or train in bf16: {what}", f"{rollback}; or train in bf16"
    else:
        when = {"loss-spike": "if the loss does not come back within a few lines",
                "grad-norm": "if the loss jumps in the next lines",
                "skipped": "if the skipped steps go on"}[finding.kind]
        headline = f"read iteration {n}'s samples, {target} if it stays: {what.split(' at iteration')[0]}"
        step_text = f"read the samples it trained on ({samples}); {when}, {rollback}"
    return dataclasses.replace(finding, next_step=step_text, headline=headline)
