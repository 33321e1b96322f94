"""The task ledger: one line per array task start and end, and the failure budget it enforces.

A bad node crashes a training again and again when Slurm keeps handing it to the next array
task, burning the whole array in minutes. Each task records where it ran and the checkpoint
iteration it started and ended at; when the last `budget` finished tasks made no progress, the
next task stops at once and the nodes involved are reported. The run's kill switch
(`kill_switch_on`) stops every task too, on purpose, and counts as no failure.

The ledger is the run's own file, so it is untrusted input: `read_checked` returns the records whose every
field passes its check and a problem per other line (the watchdog, info and the chronicle report them and go
on); `read` refuses a ledger with any such line (the task hooks and rollback act on a whole ledger only).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bigscience_ops import slurm
from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import Checked, append_line, build, check_int, check_str, check_time, checked_jsonl
from bigscience_ops.schema import Experiment

LEDGER_NAME = "task-ledger.jsonl"
EVENTS = ("launch", "begin", "end", "stop", "resize")
EXIT_CODES = (-(2**63), 2**63 - 1)
"""The exit codes a record may hold (`task end --exit-code` takes any integer; a shell gives 0-255)."""


class LedgerError(BsopsError):
    """The ledger cannot be read (an unreadable `latest` is layout's CheckpointError)."""


@dataclass(frozen=True)
class TaskRecord:
    event: str  # "launch" (resets the budget), "begin", "end", "stop" (the budget stopped the array), or
    # "resize" (array job_id handed the run to next_job at another node count: a node schedule's next phase)
    job_id: str
    nodes: str
    iteration: int  # the latest checkpoint's iteration at that moment
    time: float
    exit_code: int | None = None
    next_job: str | None = None


@dataclass(frozen=True)
class Attempt:
    """One array task, begin and end joined."""

    job_id: str
    nodes: str
    start_iteration: int
    end_iteration: int | None
    exit_code: int | None
    started: float | None = None  # epoch seconds of the begin record
    ended: float | None = None  # of the end record; None while running or when killed

    @property
    def progressed(self) -> bool:
        return self.end_iteration is not None and self.end_iteration > self.start_iteration


def kill_switch_on(exp: Experiment) -> bool:
    """Whether checkpoint.kill_switch_path exists: the run is stopped on purpose until the file is removed, and
    no task trains (launch refuses, task begin ends the task, the watchdog does not alert)."""
    switch = exp.checkpoint.kill_switch_path
    return bool(switch) and Path(switch).exists()


def latest_iteration(checkpoints: Path) -> int:
    """The iteration the run resumes from (layout.resume_step: `latest` when it names a complete checkpoint, else
    the newest complete one); 0 before the first save."""
    step = layout.resume_step(checkpoints)
    return 0 if step is None else step


def append(ledger: Path, record: TaskRecord) -> None:
    """Append one record in one write (fsynced); a line an interrupted writer left open is ended first."""
    ledger = Path(ledger)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    append_line(ledger, json.dumps(asdict(record), allow_nan=False))


_RULES: dict[str, Callable[[Any], str | None]] = {
    "event": lambda v: check_str(v, 16, choices=EVENTS),
    "job_id": lambda v: check_str(v, 256),
    "nodes": lambda v: check_str(v, 65536),
    "iteration": check_int,
    "time": check_time,
    "exit_code": lambda v: None if v is None else check_int(v, *EXIT_CODES),
    "next_job": lambda v: check_str(v, 256, optional=True),
}


def _record(data: dict) -> tuple[TaskRecord | None, str | None]:
    return build(TaskRecord, data, _RULES, optional=("exit_code", "next_job"))


def read_checked(ledger: Path) -> Checked[TaskRecord]:
    """The ledger's records, in order, each field checked (types, finite numbers, ranges), and a problem for
    each line that is not a record (a torn line, garbage, a field of the wrong type) or for a ledger that is not
    a plain file: for the commands that report and go on (the watchdog, info, the chronicle)."""
    return checked_jsonl(ledger, _record)


def read(ledger: Path) -> list[TaskRecord]:
    """The ledger's records, in order; any line that is not one is a LedgerError naming the file, the line and
    what was wrong (rollback refuses to act on a ledger it cannot read whole; the task hooks pass over a bad line
    and say so, see begin)."""
    checked = read_checked(ledger)
    if checked.problems:
        more = f" (and {len(checked.problems) - 1} more)" if len(checked.problems) > 1 else ""
        raise LedgerError(f"unreadable task ledger: {checked.problems[0]}{more}; repair or remove the line")
    return checked.records


def attempts(records: list[TaskRecord], resumed_at: int | None = None) -> list[Attempt]:
    """Begin/end pairs since the last launch, in order.

    A begin with no end is a task that runs, or was killed before it could record its end (its node
    died, its save outlasted Slurm's KillWait). Once another task has begun, the checkpoint that one
    began at is where the killed one left the run: that is its end iteration, so a task killed after it
    saved counts as progress and one killed before any save does not. `resumed_at` (the latest
    checkpoint's iteration, from a task about to begin) does the same for the last one.
    """
    launches = [i for i, rec in enumerate(records) if rec.event == "launch"]
    records = records[launches[-1] + 1:] if launches else records
    out: list[Attempt] = []
    open_begin: dict[str, TaskRecord] = {}
    order: list[str] = []
    ends: dict[str, TaskRecord] = {}
    for rec in records:
        if rec.event == "begin":
            open_begin[rec.job_id] = rec
            order.append(rec.job_id)
        elif rec.event == "end":
            ends[rec.job_id] = rec
    for i, job_id in enumerate(order):
        begin, end = open_begin[job_id], ends.get(job_id)
        left_at = open_begin[order[i + 1]].iteration if i + 1 < len(order) else resumed_at
        out.append(Attempt(job_id, begin.nodes, begin.iteration, end.iteration if end else left_at,
                           end.exit_code if end else None, begin.time, end.time if end else None))
    return out


def running(records: list[TaskRecord]) -> Attempt | None:
    """The last array task that began and has not ended (training now, or killed without an end record)."""
    open_tasks = [a for a in attempts(records) if a.ended is None]
    return open_tasks[-1] if open_tasks else None


def exhausted(history: list[Attempt], budget: int) -> list[Attempt] | None:
    """The last `budget` attempts if none of them progressed, else None. budget 0 disables the check."""
    if budget <= 0 or len(history) < budget:
        return None
    recent = history[-budget:]
    return None if any(a.progressed for a in recent) else recent


def slurm_job_id(env: dict[str, str] | None = None) -> str:
    """This task's id (`ARRAY_TASK`, or the job's), `local-PID` outside Slurm; `env` defaults to os.environ."""
    return _task_id(slurm.TaskEnv.from_env(env))


def _task_id(task: slurm.TaskEnv) -> str:
    return task.task_id if task.task_id is not None else f"local-{os.getpid()}"


def begin(output: Path, checkpoints: Path, budget: int, env: dict[str, str] | None = None) -> list[Attempt] | None:
    """Record a task start; returns the failing attempts when the budget is spent (do not train)."""
    task = slurm.TaskEnv.from_env(env)
    ledger = Path(output) / LEDGER_NAME
    start = latest_iteration(checkpoints)
    # A torn line (a node that died mid-write) costs only itself: the task trains on, the hook says which line
    # was skipped (skipped_lines), and the watchdog alerts about it.
    failing = exhausted(attempts(read_checked(ledger).records, resumed_at=start), budget)
    if failing is not None:
        return failing
    append(ledger, TaskRecord("begin", _task_id(task), task.node_list, start, time.time()))
    return None


def end(output: Path, checkpoints: Path, exit_code: int, env: dict[str, str] | None = None) -> Attempt:
    """Record a task end; returns the joined attempt."""
    task = slurm.TaskEnv.from_env(env)
    ledger = Path(output) / LEDGER_NAME
    job_id = _task_id(task)
    append(ledger, TaskRecord("end", job_id, task.node_list, latest_iteration(checkpoints), time.time(), exit_code))
    return next(a for a in reversed(attempts(read_checked(ledger).records)) if a.job_id == job_id)


def skipped_lines(output: Path) -> list[str]:
    """Each ledger line the task hooks passed over because it is not a record (file, line, what was wrong)."""
    return [str(problem) for problem in read_checked(Path(output) / LEDGER_NAME).problems]


def stopped(records: list[TaskRecord]) -> bool:
    """Whether the failure budget already stopped this launch's array (and alerted about it)."""
    launches = [i for i, rec in enumerate(records) if rec.event == "launch"]
    since = records[launches[-1] + 1:] if launches else records
    return any(rec.event == "stop" for rec in since)


def mark_stop(output: Path, env: dict[str, str] | None = None) -> None:
    """Record that the budget stopped the array: later tasks stop without alerting again."""
    task = slurm.TaskEnv.from_env(env)
    append(Path(output) / LEDGER_NAME, TaskRecord("stop", _task_id(task), task.node_list, 0, time.time()))


def mark_resize(output: Path, array_job_id: str, nodes: int, iteration: int, next_job: str) -> None:
    """Record that array `array_job_id` handed the run to `next_job`, submitted at `nodes` nodes."""
    append(Path(output) / LEDGER_NAME, TaskRecord("resize", array_job_id, str(nodes), iteration, time.time(),
                                                  next_job=next_job))


def resized(records: list[TaskRecord], array_job_id: str) -> str | None:
    """The job that array `array_job_id` handed the run to, if it did."""
    return next((rec.next_job for rec in records if rec.event == "resize" and rec.job_id == array_job_id), None)


def mark_launch(output: Path, job_id: str) -> None:
    """A new launch starts a fresh budget: the on-call person has dealt with the failures."""
    append(Path(output) / LEDGER_NAME, TaskRecord("launch", job_id, "", 0, time.time()))
