"""`bsops chronicle`: the run's timeline as Markdown, from what the run already records.

The BigScience runs kept this document by hand (launches, restarts, node counts, spikes, rollbacks).
Here it is read back from the run folder: the task ledger (launches, array tasks with nodes, start and
end iterations, exits and times, node-phase resizes, failure-budget stops), main_log.txt (per task:
the saves, the stop reason, and the training-health findings of ops/health.py) and the watchdog's
watchdog.log (the alert, recovery and finish emails, with their times). Events with a time are in time
order under a heading per day; what a task logged is listed under it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops import ledger, runlog
from bigscience_ops.ops import health
from bigscience_ops.schema import Experiment

WATCHDOG_LOG = "watchdog.log"
# "[2026-11-24 03:00:00] alert email sent to a@b <id>: subject" (ops/watchdog.py)
_EMAIL = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (alert|recovery|finished) email sent to [^:]*: (.*)")
_TASK = re.compile(r"task (\S+) begins at iteration (\d+)")
_SAVED = re.compile(r"successfully saved checkpoint at iteration\s+(\d+)")
_STOPPED = re.compile(r"> (.+) at iteration \d+")  # the trainer's last line: why it stopped (trainer/train.py)
_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()#+!|])")


@dataclass
class Event:
    when: float  # epoch seconds
    text: str
    details: list[str] = field(default_factory=list)


@dataclass
class _TaskLog:
    saves: list[int] = field(default_factory=list)
    stop: str | None = None
    lines: list[str] = field(default_factory=list)


def _safe(text: str) -> str:
    """One line of untrusted text (a job name, a log line) as plain Markdown text."""
    return _MARKDOWN.sub(r"\\\1", " ".join(text.split()))


def _task_logs(log: Path) -> dict[str, _TaskLog]:
    """What each task logged, by task id, from main_log.txt (split on newlines only)."""
    out: dict[str, _TaskLog] = {}
    current: _TaskLog | None = None
    if not log.is_file():
        return out
    with open(log, encoding="utf-8", errors="replace", newline="\n") as handle:
        for line in handle:
            line = line.rstrip("\n")
            begun = _TASK.search(line)
            if begun:
                current = out.setdefault(begun.group(1), _TaskLog())
            if current is None:
                continue
            current.lines.append(line)
            saved = _SAVED.search(line)
            if saved:
                current.saves.append(int(saved.group(1)))
            elif _STOPPED.fullmatch(line):
                current.stop = line[2:]
    return out


def events(exp: Experiment) -> list[Event]:
    """The run's events in time order."""
    out_dir = Path(exp.paths.output)
    log_path = Path(exp.paths.logs) / runlog.LOG_NAME
    records = ledger.read(out_dir / ledger.LEDGER_NAME)
    tasks = _task_logs(log_path)
    ends = {r.job_id: r for r in records if r.event == "end"}
    out: list[Event] = []
    for rec in records:
        if rec.event == "launch":
            out.append(Event(rec.time, f"launched: job array {_safe(rec.job_id)} submitted"))
        elif rec.event == "begin":
            end = ends.get(rec.job_id)
            through = f"{rec.iteration} → {end.iteration}" if end else f"{rec.iteration} → (running or killed)"
            took = f", {(end.time - rec.time) / 60:.1f} min" if end else ""
            exit_code = f", exit {end.exit_code}" if end else ""
            event = Event(rec.time, f"task {_safe(rec.job_id)} on {_safe(rec.nodes) or '?'}: iterations "
                                    f"{through}{exit_code}{took}")
            logged = tasks.get(rec.job_id)
            if logged is not None:
                event.details += _task_details(logged)
            out.append(event)
        elif rec.event == "resize":
            out.append(Event(rec.time, f"node phase: array {_safe(rec.job_id)} handed the run to job "
                                       f"{_safe(rec.next_job or '?')} at {_safe(rec.nodes)} nodes, iteration {rec.iteration}"))
        elif rec.event == "stop":
            out.append(Event(rec.time, f"the failure budget stopped array task {_safe(rec.job_id)}'s array "
                                       "(tasks that made no progress)"))
    out += _emails(log_path.parent / WATCHDOG_LOG)
    return sorted(out, key=lambda e: e.when)


def _task_details(logged: _TaskLog) -> list[str]:
    details = []
    if logged.saves:
        details.append(f"checkpoints saved at iterations {', '.join(map(str, logged.saves))}")
    for finding in health.check(health.entries(logged.lines), every=True):
        details.append(f"health: {_safe(str(finding))}")
    if logged.stop:
        details.append(f"stopped: {_safe(logged.stop)}")
    return details


def _emails(watchdog_log: Path) -> list[Event]:
    out = []
    if not watchdog_log.is_file():
        return out
    with open(watchdog_log, encoding="utf-8", errors="replace", newline="\n") as handle:
        for line in handle:
            sent = _EMAIL.match(line.rstrip("\n"))
            if sent:
                stamp, kind, subject = sent.groups()
                when = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
                out.append(Event(when, f"{kind} email: {_safe(subject)}"))
    return out


def markdown(exp: Experiment, now: float | None = None) -> str:
    """The chronicle of `exp`'s run."""
    now = time.time() if now is None else now
    lines = [f"# {_safe(exp.name)}: run chronicle", "",
             f"Run folder `{exp.paths.output}`; written {time.strftime('%Y-%m-%d %H:%M', time.localtime(now))} "
             "by `bsops chronicle` from the task ledger, main_log.txt and watchdog.log.", ""]
    day = None
    found = events(exp)
    if not found:
        lines.append("Nothing recorded yet: the run has not started from this folder.")
    for event in found:
        this_day = time.strftime("%Y-%m-%d", time.localtime(event.when))
        if this_day != day:
            lines += [f"## {this_day}", ""] if day is None else ["", f"## {this_day}", ""]
            day = this_day
        lines.append(f"- {time.strftime('%H:%M', time.localtime(event.when))} {event.text}")
        lines += [f"  - {detail}" for detail in event.details]
    return "\n".join(lines) + "\n"
