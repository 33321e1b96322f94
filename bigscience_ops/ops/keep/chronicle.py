"""The run's chronicle: its timeline as Markdown, from what the run already records.

The BigScience runs kept this document by hand (launches, restarts, node counts, spikes, rollbacks).
Here it is read back from the run folder: the task ledger (launches, array tasks with nodes, start and
end iterations, exits and times, node-phase resizes, failure-budget stops), main_log.txt (per task:
the saves, the stop reason, and the training-health findings of ops/watch/health.py, checked over the whole
log so a task is judged against the ones before it), rollbacks.jsonl (where `latest` went back to, the
iterations skipped, where the later checkpoints were set aside), the backup store's manifests (each
verified copy, grouped by backup run) and the watchdog's watchdog.log (the alert, recovery and finish
emails, with their times). Events with a time are in time order under a heading per day; what a task
logged is listed under it. `bsops chronicle` prints it, hub-sync pushes it with the logs
(CHRONICLE.md), and `bsops plot` marks its events on the loss curve (each event's kind and, where the
run records it, its iteration).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from bigscience_ops import ledger, rollbacks, runlog
from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import BsopsError
from bigscience_ops.iteration_log import parse_iteration_line
from bigscience_ops.ops.keep import backup
from bigscience_ops.ops.watch import health
from bigscience_ops.schema import Experiment

WATCHDOG_LOG = "watchdog.log"
FILE_NAME = "CHRONICLE.md"
"""The chronicle's name in the Hub logs repo."""
BACKUP_RUN_S = 600
"""Copies verified within this many seconds of the previous one belong to one backup run: one event."""
# "[2026-11-24 03:00:00] alert email sent to a@b <id>: subject" (ops/watch/watchdog.py)
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
    kind: str = ""  # launch, task, resize, stop, rollback, backup, alert, recovery, finished
    iteration: int | None = None  # where in the training it happened, where the run records it


@dataclass
class _TaskLog:
    saves: list[int] = field(default_factory=list)
    stop: str | None = None
    health: list[str] = field(default_factory=list)


def _safe(text: str) -> str:
    """One line of untrusted text (a job name, a log line) as plain Markdown text."""
    return _MARKDOWN.sub(r"\\\1", " ".join(text.split()))


def _task_logs(log: Path) -> dict[str, _TaskLog]:
    """What each task logged, by task id, from main_log.txt (split on newlines only); the health findings
    come from one check over the whole log, each given to the task whose line it is."""
    out: dict[str, _TaskLog] = {}
    current: _TaskLog | None = None
    lines: list[str] = []
    owners: list[_TaskLog] = []  # the task of each iteration line of `lines`, in order
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
            lines.append(line)
            if parse_iteration_line(line) is not None:
                owners.append(current)
            saved = _SAVED.search(line)
            if saved:
                current.saves.append(int(saved.group(1)))
            elif _STOPPED.fullmatch(line):
                current.stop = line[2:]
    for finding in health.check(health.entries(lines), every=True):
        owners[finding.entry].health.append(f"health: iteration {finding.iteration}: {_safe(finding.message)}")
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
            out.append(Event(rec.time, f"launched: job array {_safe(rec.job_id)} submitted", kind="launch"))
        elif rec.event == "begin":
            end = ends.get(rec.job_id)
            through = f"{rec.iteration} → {end.iteration}" if end else f"{rec.iteration} → (running or killed)"
            took = f", {(end.time - rec.time) / 60:.1f} min" if end else ""
            exit_code = f", exit {end.exit_code}" if end else ""
            event = Event(rec.time, f"task {_safe(rec.job_id)} on {_safe(rec.nodes) or '?'}: iterations "
                                    f"{through}{exit_code}{took}", kind="task", iteration=rec.iteration)
            logged = tasks.get(rec.job_id)
            if logged is not None:
                event.details += _task_details(logged)
            out.append(event)
        elif rec.event == "resize":
            out.append(Event(rec.time, f"node phase: array {_safe(rec.job_id)} handed the run to job "
                                       f"{_safe(rec.next_job or '?')} at {_safe(rec.nodes)} nodes, iteration "
                                       f"{rec.iteration}", kind="resize", iteration=rec.iteration))
        elif rec.event == "stop":
            out.append(Event(rec.time, f"the failure budget stopped array task {_safe(rec.job_id)}'s array "
                                       "(tasks that made no progress)", kind="stop"))
    out += _rollbacks(out_dir) + _backups(exp) + _emails(log_path.parent / WATCHDOG_LOG)
    return sorted(out, key=lambda e: e.when)


def _task_details(logged: _TaskLog) -> list[str]:
    details = []
    if logged.saves:
        details.append(f"checkpoints saved at iterations {', '.join(map(str, logged.saves))}")
    details += logged.health
    if logged.stop:
        details.append(f"stopped: {_safe(logged.stop)}")
    return details


def _rollbacks(output: Path) -> list[Event]:
    out = []
    for r in rollbacks.read(output):
        skip = f"; iterations {_safe(r.skip)} skipped (their data consumed, no update)" if r.skip else ""
        aside = (f"; the later checkpoints were set aside in `{_safe(r.set_aside)}` (nothing deleted)" if r.set_aside
                 else "; no later checkpoint to set aside")
        out.append(Event(r.time, f"rollback: latest moved from global\\_step{r.from_step} back to global\\_step"
                                 f"{r.to_step}{skip}{aside}", kind="rollback", iteration=r.to_step))
    return out


def _backups(exp: Experiment) -> list[Event]:
    """One event per backup run: the checkpoints whose verified copies it made (the store's manifests)."""
    if not exp.backup.dest:
        return []
    try:
        run_id = layout.run_id(Path(exp.paths.checkpoints))
        store = backup.run_store(Path(exp.backup.dest), exp.name, run_id) if run_id else None
    except BsopsError:
        return []
    copies = []
    for entry in backup.entries(store) if store is not None else []:
        manifest = backup.read_manifest(store, entry)
        try:
            when = datetime.fromisoformat(manifest["verified_at"]).timestamp()
            copies.append((when, int(manifest["step"]), f"global\\_step{int(manifest['step'])} {manifest['kind']}"))
        except (TypeError, KeyError, ValueError):
            continue  # not a manifest this backup wrote
    runs: list[list[tuple[float, int, str]]] = []
    for copy in sorted(copies):
        if runs and copy[0] - runs[-1][-1][0] <= BACKUP_RUN_S:
            runs[-1].append(copy)
        else:
            runs.append([copy])
    return [Event(run[0][0], f"backup: {len(run)} checkpoint(s) copied and verified in `{_safe(str(store))}`",
                  [", ".join(what for _, _, what in run)], "backup", run[-1][1]) for run in runs]


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
                out.append(Event(when, f"{kind} email: {_safe(subject)}", kind=kind))
    return out


def markdown(exp: Experiment, now: float | None = None, *, writer: str = "`bsops chronicle`",
             stamped: bool = True) -> str:
    """The chronicle of `exp`'s run, as written by `writer` at `now`; unstamped, it leaves out when (hub-sync's
    copy then changes only when the run does)."""
    when = f" {time.strftime('%Y-%m-%d %H:%M', time.localtime(time.time() if now is None else now))}" if stamped else ""
    lines = [f"# {_safe(exp.name)}: run chronicle", "",
             f"Run folder `{exp.paths.output}`; written{when} by {writer} from the task ledger, main_log.txt, "
             "watchdog.log, rollbacks.jsonl and the backup manifests.", ""]
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
