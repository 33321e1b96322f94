"""What `bsops launch --local` tells on the console: each array task's end in one line, what a stop saved, and the
training's progress (iteration, rate, ETA) from the trainers' iteration lines as they come.

- `task_end`: finished (iteration N/M), trained and stopped (the trainer's reason), not training and why (the line
  `bsops task begin` wrote), or failed: the exit code, the last error line of the task's output and the file to
  read. The output is the run's own file: only its tail is read (runlog.read_tail, bounded).
- `stop_line`: what a stopped task left, from `latest` before and after it (checkpoints/layout.py).
- `Console`: the lines a launch passes on; iteration lines become one progress bar rewritten in place on a terminal,
  and a plain progress line at most every `interval_s` seconds in a log (stdout not a terminal).

Pure: it formats and reads; launch.py runs the tasks, cli/experiments.py prints.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.run.iterations import IterationStats, parse_iteration_line
from bigscience_ops.run.log import LogError, read_tail

TAIL_LINES = 200
"""The last lines of a task's output read for its end: the trainer's traceback, torchrun's summary and the job
script's last lines fit."""
TAIL_BYTES = 1 << 20
"""At most this much of a task's output is read for its end, whatever it ends with."""
FINISHED = "training finished"
"""The trainer's reason at the end of training (trainer/stopping.py's FINISHED; not imported: it imports torch)."""

# The trainer's last line: "> REASON at iteration N" (trainer/train.py).
_TRAINER_END = re.compile(r"> (.+) at iteration ([0-9]{1,18})")
# srun --label's "1: " or torch's "[rank0]: " before a process's line, where there is one.
_LABEL = re.compile(r"^(?:\[rank[0-9]+\]: ?|[0-9]+: ?)")
# An exception line whose traceback header is not in the window: a name ending in Error or Exception.
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception)(?::.*)?")
# torchrun's and the launcher's own exceptions around the trainer's: never the cause.
_WRAPPERS = ("ChildFailedError", "SignalException", "CalledProcessError")


@dataclass(frozen=True)
class TaskEnd:
    kind: str
    """"finished", "stopped" (the trainers saved and exited before the end: exit interval, node phase, kill switch,
    signal, exit duration), "not training" (`task begin` ended the task at once) or "failed" (exit code not 0)."""
    line: str


def duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `2 h 07 min`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def output_tail(output: Path) -> tuple[list[str], str | None]:
    """The last lines of a task's output (at most TAIL_BYTES read) and, where it cannot be read, why."""
    try:
        return read_tail(output, TAIL_LINES, TAIL_BYTES).lines, None
    except LogError as exc:
        return [], str(exc)


def error_line(lines: list[str]) -> str | None:
    """The line that says why a task failed, from its output's last lines: the first exception a traceback ends with
    (the first failure; the other ranks' errors follow it) that is not torchrun's own wrapper, else the first line
    that looks like one, else bsops' last `error:` line, else srun's, else the job script's `not training:` (the run
    folder in use), else None. Each process's lines are told apart by their label (srun's, torch's) where they
    have one."""
    raised: list[str] = []
    in_traceback: dict[str, bool] = {}
    for line in lines:
        label = _LABEL.match(line)
        key, text = (label.group(0).strip(), line[label.end():]) if label else ("", line)
        if text.startswith("Traceback (most recent call last):"):
            in_traceback[key] = True
        elif in_traceback.get(key) and (text[:1] in (" ", "\t") or not text.strip()):
            continue  # a frame of the traceback
        elif in_traceback.pop(key, False):
            raised.append(text.strip())
    raised = [line for line in raised if not any(w in line.split(":", 1)[0] for w in _WRAPPERS)]
    if raised:
        return raised[0]
    stripped = [_LABEL.sub("", line.strip(), count=1).strip() for line in lines]
    looks = [line for line in stripped if _EXCEPTION.fullmatch(line)
             and not any(w in line.split(":", 1)[0] for w in _WRAPPERS)]
    if looks:
        return looks[0]
    for prefix in ("error:", "srun: error:", "not training:"):
        found = next((line for line in reversed(stripped) if line.startswith(prefix)), None)
        if found is not None:
            return found
    return None


def task_end(label: str, code: int, seconds: float, output: Path, before: int, after: int,
             train_iters: int) -> TaskEnd:
    """One array task's end in one line. `before`/`after`: the iteration `latest` named at its start and end."""
    lines, unreadable = output_tail(output)
    took = duration(seconds)
    if code != 0:
        cause = error_line(lines) or (f"its output cannot be read: {unreadable}" if unreadable
                                      else "no error line in the last lines of its output")
        return TaskEnd("failed", f"{label}: failed with exit code {code} after {took}: {cause}; read {output}")
    not_training = next((line.strip() for line in reversed(lines) if line.strip().startswith("not training:")), None)
    if not_training is not None and after == before:
        return TaskEnd("not training", f"{label}: {not_training} (exit 0 in {took})")
    trainer = next((m for m in map(_TRAINER_END.fullmatch, (line.strip() for line in reversed(lines))) if m), None)
    trained = f"iterations {before} → {after} of {train_iters} in {took}"
    if after >= train_iters or trainer is not None and trainer.group(1) == FINISHED:
        return TaskEnd("finished", f"{label}: finished: iteration {after}/{train_iters} ({trained})")
    if trainer is not None:
        return TaskEnd("stopped", f"{label}: {trained}: {trainer.group(1)}")
    return TaskEnd("stopped", f"{label}: {trained}, exit 0 (the trainer's last line is not in {output})")


def stop_line(label: str, cause: str, before: int, after: int, save_asked: bool, save_cut: bool,
              output: Path) -> str:
    """What a task stopped by `cause` (Ctrl-C, SIGTERM) left: `before`/`after` are the iterations `latest` named at
    its start and once none of its processes was left; `save_asked`: bsops asked the trainers to save (they
    trained); `save_cut`: a second stop, or the wait's end, cut that wait short."""
    again = "run the same command again to resume"
    if after > before:
        return f"{label}: stopped by {cause}: the trainers saved iteration {after}; {again} from it (see {output})"
    where = (f"the next launch resumes from iteration {before}" if before > 0
             else "the next launch starts from the beginning")
    if save_asked and save_cut:
        return (f"{label}: stopped by {cause} before the trainers' save: what they trained since "
                f"{'iteration ' + str(before) if before > 0 else 'the start'} is lost; {where} (see {output})")
    if before == 0:
        return f"{label}: stopped by {cause} before the first save: nothing saved; {where} (see {output})"
    return f"{label}: stopped by {cause}: nothing saved after iteration {before}; {where} (see {output})"


# ----------------------------------------------------------------------------- progress

def progress_text(stats: IterationStats) -> str:
    """`iteration 120/221 (54%) | lm loss 5.93 | 1.9 it/s, 3.9k tokens/s | ETA 53 s`, from one iteration line: the
    rate is the trainer's own (elapsed time per iteration over its last log interval), the ETA the iterations left
    at that rate (saves and evaluations not counted)."""
    total = max(stats.train_iters, 1)
    parts = [f"iteration {stats.iteration}/{stats.train_iters} ({100 * stats.iteration // total}%)"]
    if stats.lm_loss is not None:
        parts.append(f"lm loss {stats.lm_loss:.4g}")
    if stats.elapsed_ms > 0:
        rate = 1000 / stats.elapsed_ms
        speed = f"{rate:.3g} it/s" if rate >= 1 else f"{stats.elapsed_ms / 1000:.3g} s/it"
        if stats.consumed_samples > 0 and stats.samples_per_second > 0:
            tokens = stats.samples_per_second * stats.consumed_tokens / stats.consumed_samples
            speed += f", {_si(tokens)} tokens/s"
        parts.append(speed)
        left = max(0, stats.train_iters - stats.iteration)
        parts.append(f"ETA {duration(left * stats.elapsed_ms / 1000)}")
    return " | ".join(parts)


def _si(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def bar(stats: IterationStats, width: int) -> str:
    """The progress bar line for a terminal `width` columns wide: `[#####-----] ` then progress_text, cut to fit."""
    cells = 20
    done = min(cells, cells * stats.iteration // max(stats.train_iters, 1))
    line = f"[{'#' * done}{'-' * (cells - done)}] {progress_text(stats)}"
    return line[:max(10, width - 1)]


CLEAR = "\r\x1b[K"
"""Back to the line's start and clear it (the bar is rewritten in place)."""


class Console:
    """The lines a local launch passes on (launch.py's `progress`): iteration lines become progress, the others are
    printed as they come.

    On a terminal (`tty`) the progress is one bar line rewritten in place, below the other lines; in a log it is a
    plain line for a task's first iteration line, then at most one every `interval_s` seconds, and the task's last
    one before its end line.
    `echo(text, newline)` writes; `clock` and `width` are the time and the terminal's width.
    """

    def __init__(self, echo: Callable[[str, bool], None], tty: bool, interval_s: float = 30,
                 clock: Callable[[], float] = time.monotonic, width: Callable[[], int] = lambda: 80) -> None:
        self.echo, self.tty, self.interval_s, self.clock, self.width = echo, tty, interval_s, clock, width
        self.shown: str | None = None  # the bar on screen (tty)
        self.last: IterationStats | None = None
        self.printed_at: float | None = None  # when the last plain progress line was printed (log)
        self.pending: IterationStats | None = None  # the last progress not printed yet (log)

    def feed(self, line: str) -> None:
        stats = parse_iteration_line(line)
        if stats is None:
            self.message(line)
        else:
            self.progress(stats)

    def message(self, line: str) -> None:
        """A line that is not progress (a task's start and end, validation, the trainers' decisions)."""
        if line.startswith("array task ") and not self.tty and self.pending is not None:
            self.echo(progress_text(self.pending), True)  # where the task got to, before its end line
            self.pending = None
        if line.startswith("array task ") and ": started" in line:
            self.printed_at = None  # each task's first progress line is printed
        if self.tty and self.shown is not None:
            self.echo(CLEAR, False)
            self.echo(line, True)
            self.echo(self.shown, False)
        else:
            self.echo(line, True)

    def progress(self, stats: IterationStats) -> None:
        self.last = stats
        if self.tty:
            self.shown = bar(stats, self.width())
            self.echo(CLEAR + self.shown, False)
            return
        now = self.clock()
        due = self.printed_at is None or now - self.printed_at >= self.interval_s
        if due or stats.iteration >= stats.train_iters:
            self.printed_at, self.pending = now, None
            self.echo(progress_text(stats), True)
        else:
            self.pending = stats

    def close(self) -> None:
        """Ends the bar's line (a terminal), so that what is printed next starts on a line of its own."""
        if self.tty and self.shown is not None:
            self.echo("", True)
            self.shown = None
