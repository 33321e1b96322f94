"""The hourly eval job's decision: which checkpoint to evaluate next, and the ledger of the eval jobs it submitted.

`bsops eval next EXP` runs this every hour (`bsops cron add EXP --jobs eval`). It evaluates:
- only complete checkpoints: with bsops.json and never newer than the one `latest` names (a newer folder is a save
  in progress; layout.complete_checkpoints);
- every `eval.every_saves`-th step of the run's save schedule and its final step (`chooser`: a rule of the schedule,
  so that deleting old checkpoints never changes which ones are chosen; with 1, every saved checkpoint, those an
  exit or a time limit saved included);
- newest first among those without a result file (<output>/eval/<tag>.json; with eval.limit, a limited one in
  eval/limited/ also does) of the run (a file made for another run id is not its) and of the live branch (a
  result written before a rollback to an earlier step is the abandoned branch's): the newest model is the one
  people ask about, and the backlog follows hour after hour;
- one job at a time: none while a job named `bsops.<training job name>.eval` of the run's users is queued or
  running (its handle, launch/jobs.SlurmJob, finds it by name, so a job whose submission was never recorded still
  counts);
- never a checkpoint whose eval failed MAX_FAILURES times: it is skipped, and said so every run.

`<output>/eval/jobs.jsonl` records each submission (job id, tag, time, log file) and, once the job has left the queue,
its outcome: done when its result file is there, else failed (the hourly job then alerts, naming the step and the
log). The ledger is the run's own file, so untrusted input: each line is checked, and a bad one is reported and
passed over. `decide` is pure apart from reading the checkpoint folder and whether result files exist; `run_next`
adds the lock, the queue query, the sbatch and the ledger lines. Both take the run as an `EvalRun`: what they need of
it (its folders, its eval job, the steps to evaluate), taken from the experiment by the caller.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigscience_ops import slurm
from bigscience_ops.launch import jobs
from bigscience_ops.run import rollbacks
from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import BsopsError, ConfigError
from bigscience_ops.ops.evaluate import results
from bigscience_ops.ops.tell.quoting import quote_untrusted
from bigscience_ops.untrusted import (
    Checked, Problem, append_line, build, check_int, check_str, check_time, checked_jsonl,
)
from bigscience_ops.schema import Experiment

LEDGER_NAME = "jobs.jsonl"
LOCK_NAME = ".schedule.lock"
SUFFIX = "eval"
"""The last part of the eval job's name: bsops.<training job name>.eval (slurm.hourly_job_name)."""
EVENTS = ("submitted", "done", "failed")
MAX_FAILURES = 2
"""A checkpoint whose eval job failed this many times is skipped (a retry would fail the same way every hour)."""


class EvalScheduleError(BsopsError):
    """The hourly eval job cannot decide or submit (an unreadable `latest`, a job that cannot be rendered), or an eval
    job it submitted failed: names the step, the job and its log."""


@dataclass(frozen=True)
class JobRecord:
    """One line of jobs.jsonl."""

    event: str
    """submitted (sbatch answered), done (it left the queue with its result file), failed (without it)."""
    job_id: str
    tag: str
    step: int
    time: float
    log: str | None = None
    """The job's Slurm output file."""
    overrides: list[str] = dataclasses.field(default_factory=list)
    """The SECTION.KEY=VALUE overrides of the `bsops eval next` that submitted it (what the job evaluates with)."""


def _overrides_rule(value: Any) -> str | None:
    if isinstance(value, list) and len(value) <= 100 and all(check_str(v, 1000) is None for v in value):
        return None
    return "expected a list of at most 100 SECTION.KEY=VALUE texts (one line each)"


_RULES: dict[str, Callable[[Any], str | None]] = {
    "event": lambda v: check_str(v, 16, choices=EVENTS),
    "job_id": lambda v: check_str(v, 256),
    "tag": lambda v: None if isinstance(v, str) and layout.step_of(v) is not None
    else f"got {v!r:.60}; expected global_stepN",
    "step": check_int,
    "time": check_time,
    "log": lambda v: check_str(v, 4096, optional=True),
    "overrides": _overrides_rule,
}


def _record(data: dict) -> tuple[JobRecord | None, str | None]:
    record, why = build(JobRecord, data, _RULES, optional=("log", "overrides"))
    if record is not None and layout.step_of(record.tag) != record.step:
        return None, f"field step: {record.step} is not the step of {record.tag}"
    return record, why


@dataclass(frozen=True)
class EvalRun:
    """What the scheduler needs of a run."""

    name: str
    """The experiment's name (in the lines that say how to see a failure by hand)."""
    output: Path
    """paths.output: the result files, the ledger and the eval jobs are under <output>/eval/."""
    checkpoints: Path
    """paths.checkpoints: the checkpoints to choose from."""
    job: jobs.SlurmJob
    """The run's eval job, by its name (job_name) among the watched users' jobs."""
    keep: Callable[[int], bool]
    """Whether a step is evaluated (chooser)."""
    limited: bool = False
    """eval.limit is set: a limited result of a step (eval/limited/) is its result too."""
    overrides: tuple[str, ...] = ()
    """The command line's SECTION.KEY=VALUE overrides, recorded with each job submitted."""

    @property
    def folder(self) -> Path:
        """<paths.output>/eval/: the result files, the ledger, the eval jobs' scripts and logs."""
        return self.output / results.FOLDER

    @property
    def ledger(self) -> Path:
        return self.folder / LEDGER_NAME


Cuts = Sequence[tuple[float, int]]
"""(time, to_step) of each rollback of the run (rollbacks.jsonl)."""


def rollback_cuts(output: Path) -> list[tuple[float, int]]:
    """The rollbacks of the run whose paths.output is `output`, as (time, to_step); a line that is not a record is
    passed over (info and the watchdog report it)."""
    return [(r.time, r.to_step) for r in rollbacks.read_checked(output).records]


def has_result(output: Path, tag: str, cuts: Cuts = (), run_id: str | None = None, limited: bool = False) -> bool:
    """Whether checkpoint `tag` of the run whose paths.output is `output` has a result file (a full one; with
    `limited`, a limited one also does) of the run's live branch, made for run `run_id` (a file that names another
    run is not this run's; whatever else it holds, reading it is the table's business). A result written before a
    rollback to an earlier step is of the abandoned branch, whose checkpoint was set aside (results.live): the step
    saved again is evaluated again."""
    return any(_result_of_run(results.result_path(output, tag, kind), layout.step_of(tag), cuts, run_id)
               for kind in ((False, True) if limited else (False,)))


def _result_of_run(path: Path, step: int | None, cuts: Cuts, run_id: str | None) -> bool:
    try:
        written = os.lstat(path).st_mtime
    except FileNotFoundError:
        return False
    if any(step is not None and step > to_step and written < when for when, to_step in cuts):
        return False
    if run_id is None:
        return True
    try:
        found = results.read(path)
    except results.ResultError:
        return True  # there, unreadable: the table and the watchdog say so; evaluating it again every hour would not
    return found is None or found.run_id in (None, run_id)


def read_ledger(path: Path) -> Checked[JobRecord]:
    """jobs.jsonl's records in order, and a problem for each line that is not one (or for a file that is not plain)."""
    return checked_jsonl(path, _record)


def append(path: Path, record: JobRecord) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    append_line(path, json.dumps(dataclasses.asdict(record), allow_nan=False))


def job_name(exp: Experiment) -> str:
    """The eval job's Slurm name: `bsops.<training job name>.eval`, the hourly jobs' reserved form."""
    training = exp.slurm.job_name
    try:
        return slurm.hourly_job_name(training, SUFFIX)
    except ValueError as exc:
        raise ConfigError(f"experiment {exp.name}", "slurm.job_name", training, f"the eval job: {exc}") from None


def chooser(exp: Experiment) -> Callable[[int], bool]:
    """Whether the hourly job evaluates the checkpoint of a step: with eval.every_saves N, the N-th, 2N-th, ... step
    of the run's save schedule (run_schedule's save_steps: checkpoint.save_interval or save_schedule), and its final
    step; with 1 (or a schedule that cannot be made), every saved checkpoint, those an exit saved included. A rule of
    the schedule alone: deleting old checkpoint folders never changes which ones are chosen."""
    from bigscience_ops.schedule.run import run_schedule

    every = exp.eval.every_saves
    if every <= 1:
        return lambda step: True
    try:
        schedule = run_schedule(exp)
        saves, final = schedule.save_steps, schedule.train_iters
    except (BsopsError, ValueError, ArithmeticError):
        return lambda step: True
    kept = frozenset(step for i, step in enumerate(saves, 1) if i % every == 0) | {final}
    return kept.__contains__


@dataclass(frozen=True)
class Decision:
    """What one pass found and decided."""

    submit: layout.Checkpoint | None
    """The checkpoint to evaluate now; None: nothing (see `reason`)."""
    reason: str
    """One line: why this one, or why none."""
    outcomes: tuple[JobRecord, ...] = ()
    """Submitted jobs found to have left the queue since the last pass: done or failed (to append to the ledger)."""
    queued: tuple[slurm.Job, ...] = ()
    """Eval jobs of this run in the queue."""
    skipped: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(tag, the logs of its failed jobs) of each chosen checkpoint left out after MAX_FAILURES failures."""
    left: int = 0
    """Chosen checkpoints still without a result after this submission (the backlog)."""


def decide(run: EvalRun, records: Sequence[JobRecord], queue: Sequence[slurm.Job], *, now: float) -> Decision:
    """The pass's decision over the ledger's `records`, the queue's jobs (any names: those of the run's eval job are
    picked here), the steps to evaluate (run.keep) and the run's checkpoint folder. Raises layout's CheckpointError
    when `latest` cannot be read, results.ResultError when the run's id cannot be."""
    queued = tuple(run.job.records(queue))
    cuts = rollback_cuts(run.output)
    run_id = results.run_id_of(run.output, run.checkpoints)

    in_queue = {i for j in queued for i in (j.job_id, j.array_job_id)}
    open_jobs: dict[str, JobRecord] = {}  # submissions without an outcome recorded after them (ids may recur)
    for record in records:
        if record.event == "submitted":
            open_jobs[record.job_id] = record
        else:
            open_jobs.pop(record.job_id, None)
    def done(tag: str) -> bool:
        return has_result(run.output, tag, cuts, run_id, run.limited)

    outcomes = [dataclasses.replace(record, event="done" if done(record.tag) else "failed", time=now)
                for job_id, record in open_jobs.items() if job_id not in in_queue]
    failed: dict[str, list[str]] = {}
    for record in (*records, *outcomes):
        if record.event == "failed":
            failed.setdefault(record.tag, []).append(record.log or f"job {record.job_id}")
    if queued:
        shown = ", ".join(f"{j.job_id} ({j.state.lower()})" for j in queued)
        return Decision(None, f"eval job {shown} of this run is in the queue: one at a time, nothing submitted",
                        tuple(outcomes), queued)
    complete = layout.complete_checkpoints(run.checkpoints)
    todo = [c for c in complete if run.keep(c.step) and not done(c.tag)]
    skipped = tuple((c.tag, tuple(failed[c.tag])) for c in todo if len(failed.get(c.tag, ())) >= MAX_FAILURES)
    eligible = [c for c in todo if len(failed.get(c.tag, ())) < MAX_FAILURES]
    if not eligible:
        if not complete:
            reason = f"no complete checkpoint in {run.checkpoints} yet (`latest` names none)"
        else:
            reason = (f"nothing to evaluate: each chosen checkpoint of the {len(complete)} complete has its result"
                      + (f" or failed {MAX_FAILURES} times" if skipped else ""))
        return Decision(None, reason, tuple(outcomes), (), skipped)
    pick = eligible[-1]
    retry = f" (again: its last eval job failed, log {failed[pick.tag][-1]})" if pick.tag in failed else ""
    return Decision(pick, f"{pick.tag}: the newest complete checkpoint without a result{retry}", tuple(outcomes), (),
                    skipped, len(eligible) - 1)


# ----------------------------------------------------------------------------- one pass of the hourly job

@dataclass(frozen=True)
class NextReport:
    lines: tuple[str, ...]
    """What the pass found and did, one line each."""
    failures: tuple[JobRecord, ...] = ()
    """Eval jobs found failed in this pass."""
    submitted: JobRecord | None = None
    problems: tuple[Problem, ...] = ()
    """Lines of jobs.jsonl that are not records (passed over)."""
    retrying: tuple[tuple[JobRecord, JobRecord], ...] = ()
    """(the last failed job, its retry without an outcome yet) of each checkpoint being tried again."""

    def failure_text(self) -> str | None:
        """The alert's text (None: nothing failed): each job found failed in this pass, its step and its log, and each
        failure whose retry has no outcome yet, so that the alert lasts (repeated at most once per cooldown) until the
        retry has its result, and the email saying it works again means that."""
        q = quote_untrusted  # a job id and a log path are jobs.jsonl's words: printable, bounded, never a link
        parts = [f"the eval job {q(r.job_id)} of {r.tag} (step {r.step}) left the queue without its result file; its "
                 f"log: {q(r.log) if r.log else 'not recorded'}" for r in self.failures]
        found = {r.job_id for r in self.failures}
        parts += [f"the eval job {q(r.job_id)} of {r.tag} (step {r.step}) failed (log: {q(r.log or 'not recorded')}); "
                  f"its retry, job {q(retry.job_id)}, has no result yet" for r, retry in self.retrying
                  if r.job_id not in found]
        return "; ".join(parts) or None


Submitter = Callable[[layout.Checkpoint, Path], tuple[str, Path]]
"""(checkpoint, the eval folder) -> (the new job's id, its log file): renders and sbatches the job."""
Previewer = Callable[[layout.Checkpoint, Path], Sequence[str]]
"""(checkpoint, the eval folder) -> lines saying what would be submitted (a dry run: renders, writes nothing)."""


def run_next(run: EvalRun, submit: Submitter, *, query: Callable[..., list[slurm.Job]] | None = None,
             now: Callable[[], float] = time.time, preview: Previewer | None = None) -> NextReport:
    """One pass: under the run's schedule lock, read the ledger, ask the queue, decide, record the outcomes found, and
    submit the chosen checkpoint's job with `submit`. Raises slurm.SlurmError when the queue cannot be asked (the
    state is unknown: nothing is decided) and EvalScheduleError when the run's eval folder cannot be used.

    With `preview`, a dry run: the same reading, asking and deciding, but no lock, no folder, no ledger line and no
    submission; the outcomes it would record are said as such, and `preview` says what would be submitted."""
    if preview is not None:
        return _pass(run, submit, query, now, preview)
    folder = run.folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise EvalScheduleError(f"{folder}: cannot be used for the eval jobs' records ({exc.strerror or exc}); allowed: "
                            "a folder of plain files this user can write") from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return NextReport((f"another `bsops eval next` of this run is deciding now ({folder / LOCK_NAME}): "
                               "nothing done",))
        return _pass(run, submit, query, now)
    finally:
        os.close(lock)


def _pass(run: EvalRun, submit: Submitter, query: Callable[..., list[slurm.Job]] | None, now: Callable[[], float],
          preview: Previewer | None = None) -> NextReport:
    path = run.ledger
    checked = read_ledger(path)
    queue = run.job.ask(query)  # before the result files are looked at: see decide
    try:
        decision = decide(run, checked.records, queue, now=now())
    except (layout.CheckpointError, results.ResultError) as exc:
        raise EvalScheduleError(f"cannot choose a checkpoint to evaluate: {exc}") from None
    lines = [f"{path}: {problem} (line passed over)" for problem in checked.problems]
    would = "(dry run: not recorded) " if preview is not None else ""
    for record in decision.outcomes:
        if preview is None:
            append(path, record)
        if record.event == "done":
            done = results.result_path(run.output, record.tag, run.limited)
            lines.append(f"{would}eval job {record.job_id} of {record.tag} done: {done}")
        else:
            again = ("skipped from now on" if sum(r.tag == record.tag and r.event == "failed"
                                                  for r in (*checked.records, *decision.outcomes)) >= MAX_FAILURES
                     else "tried once more")
            lines.append(f"{would}eval job {record.job_id} of {record.tag} left the queue without its result: failed "
                         f"({again}); log: {record.log or 'not recorded'}")
    for tag, logs in decision.skipped:
        lines.append(f"skipped {tag}: its eval failed {len(logs)} times (logs: {', '.join(logs)}); run "
                     f"`bsops eval run {run.name} --step {layout.step_of(tag)}` to see why")
    failures = tuple(r for r in decision.outcomes if r.event == "failed")
    record = None
    if decision.submit is None:
        lines.append(decision.reason)
    elif preview is not None:
        backlog = f"; {decision.left} more chosen checkpoint(s) wait" if decision.left else ""
        lines.append(f"dry run: would submit an eval job for {decision.reason}{backlog}; nothing submitted")
        lines += preview(decision.submit, run.folder)
    else:
        ckpt = decision.submit
        job_id, log = submit(ckpt, run.folder)
        record = JobRecord("submitted", job_id, ckpt.tag, ckpt.step, now(), str(log), list(run.overrides))
        append(path, record)
        backlog = f"; {decision.left} more chosen checkpoint(s) wait" if decision.left else ""
        lines.append(f"submitted eval job {job_id} for {decision.reason}; log: {log}{backlog}")
    every = [*checked.records, *decision.outcomes, *([record] if record else [])]
    return NextReport(tuple(lines), failures, record, tuple(checked.problems), retries(every))


def retries(records: Sequence[JobRecord]) -> tuple[tuple[JobRecord, JobRecord], ...]:
    """(the last failed job, the submission after it) of each checkpoint whose latest record is a submission without
    an outcome made after a failure: a retry in flight."""
    last: dict[str, JobRecord] = {}
    failed: dict[str, JobRecord] = {}
    for record in records:
        last[record.tag] = record
        if record.event == "failed":
            failed[record.tag] = record
    return tuple((failed[tag], record) for tag, record in last.items()
                 if record.event == "submitted" and tag in failed)

