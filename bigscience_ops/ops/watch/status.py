"""The status watchdog: is a training running, scheduled, stuck or gone? Decisions over parsed jobs.

`evaluate()` is pure (jobs, log progress, the run folder's state and the clock in, a report out);
`check()` adds the one Slurm query and turns a failing query into an alert instead of dying
silently. The watchdog never writes into the main_log.txt it measures: its own lines go to
watchdog.log beside it (`watchdog_log()`), so the log's time is the trainer's last write and a
hang is measured from the last iteration line itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from typing import TYPE_CHECKING

from bigscience_ops import slurm
from bigscience_ops.launch.jobs import SlurmJob
from bigscience_ops.run import log as runlog
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.alerts import (  # noqa: F401 - Alert, StatusReport and the exit codes: importable from here too
    DEFAULT_CONTACT, EXIT_ALERT, EXIT_ERROR, EXIT_HEALTHY, STAMP_FORMAT, Alert, StatusReport, raise_alert,
)
from bigscience_ops.ops.tell.quoting import quote_untrusted
from bigscience_ops.slurm import ACTIVE_STATES, NEVER_STARTS, WAITING_STATES, Job, blocked, format_duration
from bigscience_ops.schema import AlertsConfig

if TYPE_CHECKING:
    from bigscience_ops.ops.watch.lifecycle import RunState

# Megatron's per-iteration line: ` iteration      100/  311541 | consumed samples: ...`
ITERATION_LINE = re.compile(r"\biteration\s+\d+\s*/\s*\d+")
# A wall-clock stamp near the start of a line: `[2021-08-16 22:08:01]`, `[2021-08-16 22:08:01,123]`.
STAMPED_LINE = re.compile(r"^.{0,40}?\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")


@dataclass(frozen=True)
class LogProgress:
    """What main_log.txt says about training progress."""

    exists: bool
    last_iteration: str | None = None
    """The last `iteration N/ M` line, stripped; None when there is none."""
    seen_after: datetime | None = None
    """The earliest time known to be after that line: a stamped line below it or the file's mtime."""
    searched: int | None = None
    """Bytes searched from the end when the log is larger than that (no iteration line was in them); None: all."""
    problem: str | None = None
    """Why the log could not be read (a FIFO or a folder in its place, an I/O error); None when it was."""


def safe_id(job_id: str) -> str:
    """A Slurm job id fit for a subject and a command line: its digits and underscores only."""
    return "".join(c for c in job_id if c.isdigit() or c == "_")


@dataclass(frozen=True)
class _Verdict:
    kind: str  # active, waiting, never, other
    text: str


def describe_job(job: Job, now: datetime, blocked_since: datetime | None = None) -> _Verdict:
    """One job's status sentence (without name prefix and timestamp) and how it counts. `blocked_since`: since when
    it has waited on nodes only an administrator brings back (evaluate's `blocked_since`), said when given."""
    where = f"{job.job_id} on '{job.partition}' partition"
    if job.state in ACTIVE_STATES:
        since = f"{job.start_time:%Y-%m-%dT%H:%M:%S}" if job.start_time else "an unknown time"
        verb = "is running" if job.state == "RUNNING" else f"is {job.state.lower()}"
        return _Verdict("active", f"{verb} for {format_duration(job.elapsed_s)} since {since} "
                                  f"({where} ({job.nodes or 'no nodes listed'}))")
    if job.state in WAITING_STATES:
        reason = job.reason
        if reason in ("JobHeldAdmin", "JobHeldUser"):
            who = "an administrator" if reason == "JobHeldAdmin" else "a user"
            return _Verdict("never", f"is held by {who} ({reason}) and will not start on its own; "
                                     f"release it with `scontrol release {job.array_job_id}` ({where})")
        if reason in NEVER_STARTS:
            what = f" {job.dependency}" if job.dependency and "Dependency" in reason else ""
            return _Verdict("never", f"will never start on its own ({reason}{what}); cancel it with "
                                     f"`scancel {job.array_job_id}` and launch again ({where})")
        if reason == "JobArrayTaskLimit":
            return _Verdict("waiting", f"is waiting for the previous job array task to finish ({where})")
        if reason == "Dependency":
            return _Verdict("waiting", f"is waiting for its dependency to finish "
                                       f"({job.dependency or 'unknown'}) ({where})")
        if blocked_since is not None:
            waited = format_duration((now - blocked_since).total_seconds())
            return _Verdict("waiting", f"is waiting on nodes that only an administrator brings back, for {waited} "
                                       f"(reason: {quote_untrusted(reason, 300, mark=False)}) ({where})")
        if job.start_time is not None:
            wait = format_duration((job.start_time - now).total_seconds())
            return _Verdict("waiting", f"is scheduled to start in {wait} (at {job.start_time:%Y-%m-%dT%H:%M:%S}; "
                                       f"reason: {reason}) ({where})")
        return _Verdict("waiting", f"is waiting to be scheduled (reason: {reason}) ({where})")
    return _Verdict("other", f"is in state {job.state} (reason: {job.reason}), neither running nor "
                             f"scheduled ({where})")


PROGRESS_BYTES = 64 << 20
"""Bytes read_progress searches from the end of a log for its last iteration line: the watchdog's time is bounded
whatever the log ends with (a traceback of every rank, a crashed node's NUL bytes, a line without end)."""


def read_progress(log_path: str | os.PathLike[str], max_bytes: int = PROGRESS_BYTES) -> LogProgress:
    """Find the last iteration line of a log, reading backwards over at most `max_bytes` from its end (runlog's
    bounded reader: linear, one cut line at a time), so months of log, or gigabytes without a line break, cost
    the same. A path that is not a log file (a link, a FIFO, a folder) is a LogProgress with its `problem`."""
    path = Path(log_path)
    try:
        st = path.lstat()  # a link is a problem of its own (runlog reads no log through a link)
    except FileNotFoundError:
        return LogProgress(exists=False)
    except OSError as exc:
        return LogProgress(True, problem=f"cannot read it: {exc.strerror}")
    mtime = datetime.fromtimestamp(st.st_mtime)
    stamps_after: list[datetime] = []
    try:
        for line in runlog.reverse_lines(path, max_bytes, partial=True):
            if ITERATION_LINE.search(line):
                return LogProgress(True, line.strip(), min([mtime, *stamps_after]))
            stamp = _stamp(line)
            if stamp is not None:
                stamps_after.append(stamp)
    except runlog.LogError as exc:
        return LogProgress(True, problem=str(exc))
    return LogProgress(True, None, None, searched=max_bytes if st.st_size > max_bytes else None)


def _stamp(line: str) -> datetime | None:
    """The wall-clock stamp near the start of a line; None without one, or where it is no date (2021-13-45)."""
    found = STAMPED_LINE.match(line)
    if found is None:
        return None
    try:
        return datetime.strptime(found.group(1).replace("T", " "), STAMP_FORMAT)
    except ValueError:
        return None


def evaluate(job_name: str, jobs: Sequence[Job], *, now: datetime, progress: LogProgress | None = None,
             log_path: str | os.PathLike[str] | None = None, stall_minutes: float | None = None,
             contact: str = DEFAULT_CONTACT, run: RunState | None = None,
             job_ids: Collection[str] | None = None, blocked_minutes: float | None = None) -> StatusReport:
    """Decide from squeue's jobs (the log's progress, and the run folder's state) whether `job_name`
    needs a person. With `run`, nothing queued and the final iteration saved is a finished training,
    a run never launched (no task ledger; no checkpoint, or only a warm start's step 0) is not
    launched yet, and one whose kill switch exists was stopped on purpose: info lines, no alert.

    With `job_ids`, the array ids the run submitted (recorded_job_ids), a job of the name whose array the
    run never submitted is a look-alike: a line says it is a job of another run with this name, and it
    counts for nothing (the run is not running because of it). None: every job of the name is the run's.

    A job pending on nodes that only an administrator brings back (slurm.output.BLOCKED_REASONS: down, drained,
    reserved, not available) is scheduled, but one that has waited so for over `blocked_minutes` (since its
    submission, or the end of the run's last task when later: `blocked_since`) is an alert naming the reason.

    Alerts come in the order of what to do first: a job that will never start (release or cancel it:
    launching again beside it would queue a second array, so "not scheduled" is left out then),
    two trainings at once, a stall, a task blocked on nodes, nothing queued."""
    stamp = f"[{now:{STAMP_FORMAT}}]"
    named = SlurmJob(job_name).named(jobs)  # its handle: by name, as the launch check and eval scheduler
    ours = None if job_ids is None else {array_id(i) for i in job_ids}
    matching = [j for j in named if ours is None or array_id(j.array_job_id) in ours]
    verdicts = [(job, describe_job(job, now, blocked_since(job, run))) for job in matching]
    order = {"active": 0, "waiting": 1, "never": 2, "other": 3}
    verdicts.sort(key=lambda jv: order[jv[1].kind])  # stable: running first, then squeue's order
    lines = [f"{stamp} {job_name} {v.text}" for _, v in verdicts]
    lines += [f"{stamp} {job_name}: {_look_alike(job, ours or set())}" for job in named if job not in matching]
    alerts: list[Alert] = []

    def alert(kind: str, headline: str = "", advice: str = "", **facts: object) -> None:
        alerts.append(raise_alert(kind, contact=contact, headline=headline, advice=advice, job=job_name, **facts))

    active = [job for job, v in verdicts if v.kind == "active"]
    waiting = [job for job, v in verdicts if v.kind == "waiting"]
    never = [job for job, v in verdicts if v.kind == "never"]
    finished_at = None
    if never:
        ids = ", ".join(f"{j.job_id} ({j.reason})" for j in never)
        alert("never-starts", *_never_starts_words(never, queued=bool(active or waiting)), ids=ids)
    running = [job for job in active if job.state == "RUNNING"]
    if len(running) > 1:
        newest = max(running, key=lambda j: (j.start_time or datetime.min, j.job_id))
        alert("overlap", f"cancel the newer job (scancel {safe_id(newest.job_id)}): {len(running)} trainings at once",
              count=len(running), ids=", ".join(j.job_id for j in running))
    if running and stall_minutes is not None and (progress is not None or log_path is not None):
        progress = progress if progress is not None else read_progress(log_path)  # type: ignore[arg-type]
        started = max((j.start_time for j in running if j.start_time), default=None)
        stalled = stall_facts(progress, log_path, started, now, stall_minutes)
        if stalled is not None:
            alert("stalled", **stalled)
    if blocked_minutes is not None and not running:
        stuck = [(j, now - since) for j in waiting if (since := blocked_since(j, run)) is not None
                 and now - since > timedelta(minutes=blocked_minutes)]
        if stuck:
            span = format_duration(min(waited for _, waited in stuck).total_seconds())
            alert("pending-blocked", f"ask the admins for nodes: array {safe_id(stuck[0][0].array_job_id)} has waited "
                  f"{span} on down or drained nodes",
                  span=span, limit=blocked_minutes,
                  jobs="; ".join(f"{j.job_id} ({quote_untrusted(j.reason, 300, mark=False)})" for j, _ in stuck))
    if not active and not waiting and not never:
        finished_at = not_running(job_name, run, stamp, lines, alert)
    return StatusReport(job_name, now, tuple(lines), finished_at=finished_at).adding(alerts)


def stall_facts(progress: LogProgress, log_path: str | os.PathLike[str] | None, started: datetime | None, now: datetime,
                stall_minutes: float) -> dict[str, object] | None:
    """The `stalled` alert's headline and facts when the log has had no new iteration line for over `stall_minutes`
    since the later of `started` (the task's start) and the last line (`_stalled_for`); None while it has."""
    stalled = _stalled_for(progress, started, now)
    if stalled is None or stalled <= timedelta(minutes=stall_minutes):
        return None
    where = str(log_path) if log_path is not None else "the log"
    if not progress.exists:
        what = f"{where} does not exist"
    elif progress.problem is not None:
        what = f"{where} cannot be read ({quote_untrusted(progress.problem, 400, mark=False)})"
    elif progress.last_iteration is None and progress.searched is not None:
        what = f"{where} has no iteration line in its last {progress.searched >> 20} MiB"
    elif progress.last_iteration is None:
        what = f"{where} has no iteration line"
    else:
        what = f"{where} has no new iteration line (last: {quote_untrusted(progress.last_iteration, 100)})"
    span = format_duration(stalled.total_seconds())
    return {"headline": f"read the log, scancel a hung task: no new iteration for {span}", "what": what,
            "span": span, "limit": stall_minutes}


def not_running(job_name: str, run: RunState | None, stamp: str, lines: list[str],
                alert: Callable[..., None]) -> int | None:
    """Nothing of the training runs or waits: a line for a finished training (its final iteration is returned), a
    run not launched yet or stopped by its kill switch, else an alert that it stopped (and how its last task
    ended): `not-scheduled`, or for a run launched here (`run.local`) `local-stopped`."""
    if run is not None and run.finished:
        lines.append(f"{stamp} {job_name} training finished at iteration {run.iteration}")
        return run.iteration
    if run is not None and not run.launched and run.iteration == 0:
        start = "from its warm start (global_step0)" if run.warm_start else "from scratch"
        lines.append(f"{stamp} {job_name} has not been launched yet: it starts {start} with `bsops launch`")
    elif run is not None and run.kill_switch is not None:
        name = f" {run.experiment.name}" if run.experiment is not None else ""
        lines.append(f"{stamp} {job_name} was stopped on purpose at iteration {run.iteration} of {run.train_iters}: "
                     f"its kill switch {run.kill_switch} exists (remove it, then `bsops launch{name}` to go on)")
    elif run is not None:
        launch = f"bsops launch {run.experiment.name}" if run.experiment is not None else "bsops launch"
        launch += " --local" if run.local else ""
        ended = quote_untrusted(run.ended, 1000, mark=False) if run.ended else "no array task has run yet"
        stopped = f": it stopped at iteration {run.iteration} of {run.train_iters}; {ended}"
        if run.local:
            alert("local-stopped", f"launch it again ({launch}): stopped at iteration {run.iteration}, nothing "
                                   "running here", stopped=stopped)
        else:
            alert("not-scheduled", f"launch it again ({launch}): stopped at iteration {run.iteration}, nothing "
                                   "queued", stopped=stopped)
    else:
        alert("not-scheduled", stopped="")
    return None


def blocked_since(job: Job, run: RunState | None) -> datetime | None:
    """Since when a pending job has certainly waited on nodes only an administrator brings back (its reason is
    one of slurm.output.BLOCKED_REASONS): its submission, or the end of the run's last task when that is later
    (the next task of an array waits only from there). Errs towards no alarm. None for any other job."""
    if job.state not in WAITING_STATES or not blocked(job.reason) or job.submit_time is None:
        return None
    marks = [job.submit_time]
    last = run.last_task if run is not None else None
    if last is not None:
        when = last.ended or last.started
        if when is not None:
            marks.append(datetime.fromtimestamp(when))
    return max(marks)


def array_id(job_id: str) -> str:
    """The whole array's id of a job id as squeue, sbatch or a task ledger writes it: `711114_4` -> `711114`,
    `682842_[2-5%1]` -> `682842`, `5+1` (a heterogeneous job's component) -> `5`."""
    return job_id.split("_", 1)[0].split("+", 1)[0].strip()


def _look_alike(job: Job, ours: Collection[str]) -> str:
    submitted = ", ".join(sorted(ours, key=lambda i: (len(i), i))[-3:]) or "none"
    return (f"job {safe_id(job.job_id)} of user {job.user} ({job.state.lower()}) is a job of another run with this "
            f"name: this run never submitted array {safe_id(job.array_job_id)} (its recorded arrays: {submitted}); "
            "it is not counted as this run")


def _never_starts_words(never: Sequence[Job], queued: bool) -> tuple[str, str]:
    """(headline, advice) for jobs that will never start: release a held array, else cancel it (and launch
    again, unless another job of the training is running or queued)."""
    first = never[0]
    array = safe_id(first.array_job_id)
    more = f" (+{len(never) - 1} more)" if len(never) > 1 else ""
    if first.reason in ("JobHeldAdmin", "JobHeldUser"):
        who = "an administrator" if first.reason == "JobHeldAdmin" else "a user"
        return (f"release held array {array} (scontrol release {array}){more}",
                f"Array {array} is held by {who} ({first.reason}): release it (`scontrol release {array}`); do not "
                "launch again, or a second array of the training is queued beside it.")
    again = "" if queued else " and launch again"
    return (f"cancel array {array}{again} (scancel {array}): it can never start{more}",
            f"Array {array} can never start ({first.reason}): cancel it (`scancel {array}`)"
            + (", the training's other job goes on." if queued else ", then launch again (`bsops launch EXP`)."))


def _stalled_for(progress: LogProgress, started: datetime | None, now: datetime) -> timedelta | None:
    """How long there has certainly been no progress: since the later of the job's start and the
    earliest moment known to follow the last iteration line. Errs towards no alarm."""
    marks = [m for m in (started, progress.seen_after if progress.last_iteration else None) if m]
    return now - max(marks) if marks else None


def check(job_name: str, *, users: Sequence[str] = (), group: str | None = None,
          log_path: str | os.PathLike[str] | None = None, stall_minutes: float | None = None,
          now: datetime | None = None, contact: str = DEFAULT_CONTACT, timeout: float = slurm.DEFAULT_TIMEOUT_S,
          query: Callable[..., list[Job]] = slurm.query_jobs, run: RunState | None = None) -> StatusReport:
    """Query Slurm once (jobs of `users`, or of every user in `group`) and evaluate `job_name`.

    The run's own jobs are told from look-alikes (jobs of another run with the same name) by the array ids the
    run submitted, read from `run`'s folder (recorded_job_ids; `evaluate` takes them from a caller). A task blocked
    on nodes is alerted on past `alerts.blocked_minutes` of the run's experiment (the default without one).

    A failing query, or an answer that does not parse, is itself an alert (exit code EXIT_ERROR): the on-call
    person must hear about a watchdog that cannot see the queue, not find a silent log or a wrong verdict.
    """
    now = now or datetime.now().replace(microsecond=0)
    job_ids = None
    if run is not None and run.experiment is not None and run.experiment.paths.output:
        job_ids = recorded_job_ids(Path(run.experiment.paths.output))
    try:
        who = list(users) + (slurm.group_users(group) if group else [])
        jobs = query(users=sorted(set(who)), timeout=timeout)
    except slurm.SlurmError as exc:
        detail = quote_untrusted(" ".join(str(exc).split()), 1000, mark=False)  # squeue's own words
        alert = raise_alert("slurm-error", contact=contact, job=job_name, detail=detail)
        return dataclasses.replace(StatusReport(job_name, now, ()).adding([alert]), exit_code=EXIT_ERROR)
    alerts = run.experiment.alerts if run is not None and run.experiment is not None else AlertsConfig()
    report = evaluate(job_name, jobs, now=now, log_path=log_path, stall_minutes=stall_minutes, contact=contact,
                      run=run, job_ids=job_ids, blocked_minutes=alerts.blocked_minutes)
    note = slurm.unparsed_note(jobs)
    if note is None:
        return report
    return dataclasses.replace(report, lines=(*report.lines, f"[{now:{STAMP_FORMAT}}] {note}"))


SBATCH_RECORD_BYTES = 1 << 20
"""The most of a launch's sbatch.json read (a few hundred bytes when bsops writes it)."""


def recorded_job_ids(output: Path) -> frozenset[str] | None:
    """The Slurm array ids the run in `output` submitted, as its folder recorded them: the task ledger's launch
    and resize records and its tasks' own ids, and each launches/<time>/sbatch.json. None when it recorded none
    (a run launched before these were recorded, or only locally), or when its ledger cannot be read at all: the
    watchdog then goes by the job name alone, as before."""
    from bigscience_ops.run import ledger

    ids: set[str] = set()
    try:  # the lines that are records (a torn line is the watchdog's alert of its own, lifecycle's)
        for record in ledger.read_checked(Path(output) / ledger.LEDGER_NAME).records:
            ids.update(i for i in (record.job_id, record.next_job) if isinstance(i, str) and i)
    except (OSError, BsopsError, UnicodeError):
        return None
    for record in sorted(Path(output).glob("launches/*/sbatch.json")):
        job_id = _small_json(record).get("job_id")
        if isinstance(job_id, (str, int)) and not isinstance(job_id, bool):
            ids.add(str(job_id))
    arrays = frozenset(a for a in map(array_id, ids) if a.isdigit())
    return arrays or None


def _small_json(path: Path) -> dict:
    """A small JSON object of a regular file ({} for anything else: a FIFO, a folder, a huge or broken file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = os.pread(fd, SBATCH_RECORD_BYTES + 1, 0)
        value = json.loads(data) if len(data) <= SBATCH_RECORD_BYTES else {}
    except (OSError, ValueError, RecursionError):
        return {}
    finally:
        os.close(fd)
    return value if isinstance(value, dict) else {}


def watchdog_log(log_path: str | os.PathLike[str]) -> Path:
    """Where the watchdog writes its lines: watchdog.log beside the main_log.txt it measures."""
    return Path(log_path).with_name("watchdog.log")


def append_to_log(log_path: str | os.PathLike[str], lines: Sequence[str]) -> None:
    """Append lines to a log (created with its folder if missing): runlog.append_lines, which writes only a regular
    file (a FIFO in its place is refused, never waited on) and raises runlog.LogError naming what it found."""
    runlog.append_lines(log_path, list(lines))
