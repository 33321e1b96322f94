"""The run's chronicle: its timeline as Markdown, from what the run already records.

The BigScience runs kept this document by hand (launches, restarts, node counts, spikes, rollbacks).
Here it is read back from the run folder: the task ledger (launches, array tasks with nodes, start and
end iterations, exits and times, node-phase resizes, failure-budget stops), main_log.txt (per task:
the saves, the stop reason, and the training-health findings of ops/health.py, checked over the whole
log so a task is judged against the ones before it), rollbacks.jsonl (where `latest` went back to, the
iterations skipped, where the later checkpoints were set aside), the backup store's manifests (each
verified copy, grouped by backup run) and the watchdog's watchdog.log (the alert, recovery and finish
emails, with their times). Events with a time are in time order under a heading per day; what a task
logged is listed under it. The evaluation results of the run's checkpoints (eval/global_stepN.json,
ops/evaluate/results.py; those of a branch a rollback abandoned left out, and those of a step the run has no
checkpoint of: ops/keep/evaluated.py) follow as a table of metrics by step, the experiment's eval.references
beside. The backup store and the references are the experiment file's (`bsops chronicle` and hub-sync pass the
run with its file's backup and eval sections), never a launch record's. `bsops chronicle` prints it, hub-sync
pushes it with the logs (CHRONICLE.md), and `bsops plot` marks its events on the loss curve (each event's kind and, where the
run records it, its iteration).

The page is read on the Hub, so everything it shows from a record, a log, a node or a job name is
untrusted and written as plain text (`plain`): Markdown's control characters escaped, `<`, `>` and `&`
as entities, no line break, nothing a renderer would make a link, an image or HTML of; paths go in
code spans (`code`). A record line that cannot be read (ledger.read_checked, rollbacks.read_checked,
store.manifests) is skipped and listed at the end, the rest of the timeline still shown.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.run import log as runlog
from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import BsopsError
from bigscience_ops.run.iterations import parse_iteration_line
from bigscience_ops.ops.evaluate import results as eval_results
from bigscience_ops.ops.keep import store as backup_store
from bigscience_ops.ops.keep import evaluated as evaluated_steps
from bigscience_ops.ops import health
from bigscience_ops.untrusted import Problem, RecordFileError, open_plain
from bigscience_ops.schema import Experiment

WATCHDOG_LOG = "watchdog.log"
FILE_NAME = "CHRONICLE.md"
"""The chronicle's name in the Hub logs repo."""
BACKUP_RUN_S = 600
"""Copies verified within this many seconds of the previous one belong to one backup run: one event."""
# "[2026-11-24 03:00:00] alert email sent to a@b <id>: subject" (ops/watch/watchdog.py)
_EMAIL = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (alert|recovery|finished) email sent to [^:]*: (.*)")
_TASK = re.compile(r"task (\S+) begins at iteration (\d{1,18})")
_SAVED = re.compile(r"successfully saved checkpoint at iteration\s+(\d{1,18})")
_STOPPED = re.compile(r"> (.+) at iteration \d+")  # the trainer's last line: why it stopped (trainer/train.py)
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+!|~$])")
"""ASCII punctuation a Markdown renderer acts on mid-line: each shown as itself with a backslash before it."""
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
"""Written as entities: a backslash does not stop raw HTML in every renderer (Python-Markdown passes `\\<b>`)."""
_AUTOLINK = re.compile(r"(?i):(?=/)|(?<=www)\.|@")
"""What GFM and linkify make a link of in plain text (`https://`, `www.`, an address): its colon, dot or at sign
is escaped, which splits the text a link would be found in."""
MAX_SHOWN = 300
"""Characters of one untrusted value shown; the rest is cut (a 10 MB job name is named, not printed)."""
MAX_LOG_LINE = 64 * 1024
"""The longest main_log.txt or watchdog.log line read; longer ones are skipped unread."""
SHOWN_PROBLEMS = 20
"""Unreadable record lines listed at the end of the chronicle; the rest are counted."""
EVAL_STEPS = 12
"""Evaluated steps shown in the evaluation table, the newest; the earlier ones are counted."""


@dataclass
class Event:
    when: float  # epoch seconds
    text: str
    details: list[str] = field(default_factory=list)
    kind: str = ""  # launch, task, resize, stop, rollback, backup, alert, recovery, finished
    iteration: int | None = None  # where in the training it happened, where the run records it


@dataclass(frozen=True)
class Chronicle:
    """The run's events in time order, and what of its records could not be read (skipped)."""

    events: list[Event]
    problems: list[Problem]
    evaluations: list[eval_results.Result] = field(default_factory=list)
    """The live branch's evaluation results, by step."""


@dataclass
class _TaskLog:
    saves: list[int] = field(default_factory=list)
    stop: str | None = None
    health: list[str] = field(default_factory=list)


def plain(text: object) -> str:
    """Untrusted text (a job or node name, a log line, a record's field) as one line of plain Markdown text: no
    control or format character (bidi overrides, zero-width), no line break, no Markdown, HTML or link."""
    text = str(text)
    if len(text) > MAX_SHOWN:
        text = f"{text[:MAX_SHOWN]}... ({len(text)} characters)"
    text = " ".join("".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in text).split())
    text = _MARKDOWN.sub(r"\\\1", text)
    text = "".join(_ENTITIES.get(c, c) for c in text)
    return _AUTOLINK.sub(lambda m: "\\" + m.group(0), text)


_safe = plain


def code(text: object) -> str:
    """A path (or another untrusted value shown exactly) as an inline code span, in which a renderer acts on
    nothing; as plain text when it holds a backtick or a character a code span cannot show."""
    text = str(text)
    if (not text.strip() or len(text) > MAX_SHOWN or "`" in text
            or any(unicodedata.category(c)[0] in "CZ" and c != " " for c in text)):
        return plain(text)
    return f"`{text}`"


def _lines(path: Path) -> Iterator[str]:
    """The lines of a log that is a plain file (never through a link, never a FIFO), split on newlines only;
    a line longer than MAX_LOG_LINE is skipped unread. Nothing when the file is not there or not plain."""
    try:
        handle = open_plain(path)
    except RecordFileError:
        return
    if handle is None:
        return
    with handle:
        while raw := handle.readline(MAX_LOG_LINE + 1):
            if len(raw) > MAX_LOG_LINE and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):
                    raw = handle.readline(1 << 20)
                continue
            yield raw.decode("utf-8", errors="replace").rstrip("\n")


def _task_logs(log: Path) -> dict[str, _TaskLog]:
    """What each task logged, by task id, from main_log.txt (split on newlines only); the health findings
    come from one check over the whole log, each given to the task whose line it is."""
    out: dict[str, _TaskLog] = {}
    current: _TaskLog | None = None
    lines: list[str] = []
    owners: list[_TaskLog] = []  # the task of each iteration line of `lines`, in order
    for line in _lines(log):
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
        owners[finding.entry].health.append(f"health: iteration {finding.iteration}: {plain(finding.message)}")
    return out


def read(exp: Experiment) -> Chronicle:
    """The run's events in time order, and a problem for each record line (or file) that could not be read."""
    out_dir = Path(exp.paths.output)
    log_path = runlog.main_log(exp.paths.logs)
    ledger_read = ledger.read_checked(out_dir / ledger.LEDGER_NAME)
    rollbacks_read = rollbacks.read_checked(out_dir)
    backups, backup_problems = _backups(exp)
    out = _ledger_events(ledger_read.records, _task_logs(log_path))
    out += _rollbacks(rollbacks_read.records) + backups + _emails(log_path.parent / WATCHDOG_LOG)
    evaluated, eval_problems = eval_results.read_all(out_dir)
    evaluated, uncounted = evaluated_steps.counted(eval_results.live(evaluated, rollbacks_read.records), exp)
    problems = [*ledger_read.problems, *rollbacks_read.problems, *backup_problems, *eval_problems, *uncounted]
    return Chronicle(sorted(out, key=lambda e: e.when), problems, evaluated)


def events(exp: Experiment) -> list[Event]:
    """The run's events in time order (the record lines that cannot be read are left out: `read` names them)."""
    return read(exp).events


def _ledger_events(records: list[ledger.TaskRecord], tasks: dict[str, _TaskLog]) -> list[Event]:
    ends = {r.job_id: r for r in records if r.event == "end"}
    out: list[Event] = []
    for rec in records:
        if rec.event == "launch":
            out.append(Event(rec.time, f"launched: job array {plain(rec.job_id)} submitted", kind="launch"))
        elif rec.event == "begin":
            end = ends.get(rec.job_id)
            through = f"{rec.iteration} → {end.iteration}" if end else f"{rec.iteration} → (running or killed)"
            took = f", {(end.time - rec.time) / 60:.1f} min" if end else ""
            exit_code = f", exit {end.exit_code}" if end else ""
            event = Event(rec.time, f"task {plain(rec.job_id)} on {plain(rec.nodes) or '?'}: iterations "
                                    f"{through}{exit_code}{took}", kind="task", iteration=rec.iteration)
            logged = tasks.get(rec.job_id)
            if logged is not None:
                event.details += _task_details(logged)
            out.append(event)
        elif rec.event == "resize":
            out.append(Event(rec.time, f"node phase: array {plain(rec.job_id)} handed the run to job "
                                       f"{plain(rec.next_job or '?')} at {plain(rec.nodes)} nodes, iteration "
                                       f"{rec.iteration}", kind="resize", iteration=rec.iteration))
        elif rec.event == "stop":
            out.append(Event(rec.time, f"the failure budget stopped array task {plain(rec.job_id)}'s array "
                                       "(tasks that made no progress)", kind="stop"))
    return out


def _task_details(logged: _TaskLog) -> list[str]:
    details = []
    if logged.saves:
        details.append(f"checkpoints saved at iterations {', '.join(map(str, logged.saves))}")
    details += logged.health
    if logged.stop:
        details.append(f"stopped: {plain(logged.stop)}")
    return details


def _rollbacks(records: list[rollbacks.Rollback]) -> list[Event]:
    out = []
    for r in records:
        skip = f"; iterations {plain(r.skip)} skipped (their data consumed, no update)" if r.skip else ""
        aside = (f"; the later checkpoints were set aside in {code(r.set_aside)} (nothing deleted)" if r.set_aside
                 else "; no later checkpoint to set aside")
        out.append(Event(r.time, f"rollback: latest moved from global\\_step{r.from_step} back to global\\_step"
                                 f"{r.to_step}{skip}{aside}", kind="rollback", iteration=r.to_step))
    return out


def _backups(exp: Experiment) -> tuple[list[Event], list[Problem]]:
    """One event per backup run: the checkpoints whose verified copies it made (the store's manifests), and the
    manifests that are not this backup's."""
    if not exp.backup.dest:
        return [], []
    try:
        run_id = layout.run_id(Path(exp.paths.checkpoints))
        store = backup_store.run_store(Path(exp.backup.dest), exp.name, run_id) if run_id else None
    except BsopsError:
        return [], []
    if store is None:
        return [], []
    found = backup_store.manifests(store)
    copies = []
    for _, manifest in found.records:  # every field checked by store.manifests
        when = datetime.fromisoformat(manifest["verified_at"]).timestamp()
        copies.append((when, manifest["step"], f"global\\_step{manifest['step']} {plain(manifest['kind'])}"))
    runs: list[list[tuple[float, int, str]]] = []
    for copy in sorted(copies):
        if runs and copy[0] - runs[-1][-1][0] <= BACKUP_RUN_S:
            runs[-1].append(copy)
        else:
            runs.append([copy])
    return [Event(run[0][0], f"backup: {len(run)} checkpoint(s) copied and verified in {code(store)}",
                  [", ".join(what for _, _, what in run)], "backup", run[-1][1]) for run in runs], found.problems


def _emails(watchdog_log: Path) -> list[Event]:
    out = []
    for line in _lines(watchdog_log):
        sent = _EMAIL.match(line)
        if sent:
            stamp, kind, subject = sent.groups()
            try:
                when = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
            except (ValueError, OverflowError):
                continue  # "[2026-13-45 ...]": not a line the watchdog wrote
            out.append(Event(when, f"{kind} email: {plain(subject)}", kind=kind))
    return out


def markdown(exp: Experiment, now: float | None = None, *, writer: str = "`bsops chronicle`",
             stamped: bool = True) -> str:
    """The chronicle of `exp`'s run, as written by `writer` (bsops' own words) at `now`; unstamped, it leaves out
    when (hub-sync's copy then changes only when the run does). Record lines that cannot be read are skipped and
    listed at the end."""
    when = f" {time.strftime('%Y-%m-%d %H:%M', time.localtime(time.time() if now is None else now))}" if stamped else ""
    lines = [f"# {plain(exp.name)}: run chronicle", "",
             f"Run folder {code(exp.paths.output)}; written{when} by {writer} from the task ledger, main_log.txt, "
             "watchdog.log, rollbacks.jsonl, the backup manifests and the evaluation results.", ""]
    day = None
    found = read(exp)
    if not found.events:
        lines.append("Nothing recorded yet: the run has not started from this folder.")
    for event in found.events:
        this_day = time.strftime("%Y-%m-%d", time.localtime(event.when))
        if this_day != day:
            lines += [f"## {this_day}", ""] if day is None else ["", f"## {this_day}", ""]
            day = this_day
        lines.append(f"- {time.strftime('%H:%M', time.localtime(event.when))} {event.text}")
        lines += [f"  - {detail}" for detail in event.details]
    if found.evaluations:
        lines += ["", *evaluation_table(found.evaluations, exp.eval.references)]
    if found.problems:
        lines += ["", "## Records not read", "",
                  f"{len(found.problems)} record line(s) or file(s) could not be read and are left out above:", ""]
        lines += [f"- {_problem(p, exp)}" for p in found.problems[:SHOWN_PROBLEMS]]
        if len(found.problems) > SHOWN_PROBLEMS:
            lines.append(f"- and {len(found.problems) - SHOWN_PROBLEMS} more")
    return "\n".join(lines) + "\n"


def evaluation_table(evaluated: list[eval_results.Result], references: dict[str, dict[str, float]]) -> list[str]:
    """The "Evaluation" section: a Markdown table of the metrics by evaluated step (the newest EVAL_STEPS), the
    references beside; every name from a result file or the experiment written as plain text."""
    table = eval_results.table(evaluated, references, max_steps=EVAL_STEPS)
    earlier = f" ({table.left_out} earlier evaluated step(s) left out)" if table.left_out else ""
    lines = ["## Evaluation", "",
             f"`bsops eval` results by checkpoint step{earlier}" + (", references beside" if table.references else "")
             + "; a metric marked (lower) is better when lower.", "",
             "| metric | " + " | ".join(plain(c) for c in table.columns) + " |",
             "| --- |" + " ---: |" * len(table.columns)]
    for row in table.rows:
        name = plain(row.metric) + ("" if row.higher_is_better else " (lower)")
        lines.append(f"| {name} | " + " | ".join(plain(eval_results.shown(v)) for v in row.values) + " |")
    if table.missing:  # a configured task or source that did not run is said, never left out in silence
        lines += ["", *(f"- missing at step {step}: {plain(name)}: {plain(why)}" for step, name, why in table.missing)]
    return lines


def _problem(problem: Problem, exp: Experiment) -> str:
    """A problem for the page: the file (relative to the run folder where it lies inside it), the line and what was
    wrong, without what the line held (the page is public; the alert and `bsops info` show that)."""
    path = Path(problem.file)
    try:
        shown = path.relative_to(exp.paths.output).as_posix()
    except ValueError:
        shown = path.name
    where = f"{code(shown)} line {problem.line}" if problem.line else code(shown)
    return f"{where}: {plain(problem.what)}"
