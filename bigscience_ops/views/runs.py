"""`bsops runs`: the runs this user launched (runs_index.py), each with where it stands, from its own files.

The index only says where runs are. Each run folder it names is opened as the run recorded itself
(run_ref.py): the experiment is the name in the run's newest record (experiment.json, or
launches/<time>/experiment.json on Slurm), the job is the kind of that record (a Slurm launch folder, or
a local launch's record in the run folder) with the job id Slurm answered (launches/<time>/sbatch.json;
a local launch's made-up id from the task ledger's newest array task), and the state is read with the
readers the watchdog uses: the latest checkpoint, the task ledger and the kill switch
(ops/watch/lifecycle.run_state), the failure budget's stop (ledger.stopped), the run's lock (a launch or
an array task holding it trains it now: run_lock.holder) and the alert state beside its log
(ops/tell/notify.open_alerts). An index line whose experiment or job is not what the run recorded is
shown as the run recorded it, with what the index says beside (`index_says`). Only a run with no
readable record (its folder missing or unreadable) is shown with the index's claims, which are checked
like every name (runs_index.RULES). No Slurm is asked: a list of twenty runs answers at once.

Bounded: the index's newest runs_index.MAX_READ bytes are read (the older lines counted and reported), and
the newest `limit` run folders are opened (the others counted and reported); a line that is not a launch
is skipped, counted by what was wrong, and reported. Nothing is dropped without a line saying so.

States: training (its lock is held), finished (the latest checkpoint is the last iteration),
stopped (the kill switch, the failure budget, or a task that ended with exit 0 short of the end),
failed (the last task's exit code), killed (a task began and recorded no end, and nothing holds
the run), waiting (launched, no task has begun yet: queued, or cancelled before it started), never
trained (no task recorded), missing (the folder is gone) and unreadable (its record cannot be read,
or the folder is a link).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bigscience_ops.run import ledger
from bigscience_ops.run import lock as run_lock
from bigscience_ops.run import index as runs_index
from bigscience_ops.run import log as runlog
from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import Problem, RecordFileError, excerpt, kind_of, read_small
from bigscience_ops.run.index import Launch

ALERT_CHARS = 120
MAX_ROWS = 100
"""Run folders opened and listed by default, the newest launches first (`bsops runs --limit`)."""
SHOWN_PROBLEMS = 10
"""Skipped index lines named one by one; the rest are in the counts."""
SBATCH_JSON = "sbatch.json"
"""A Slurm launch's answer from sbatch, in its launches/<time>/ folder (submit.SlurmExecutor.start)."""
SBATCH_LIMIT = 64 * 1024
_TASK = re.compile(r"([0-9]{1,20})_[0-9]{1,10}")


@dataclass(frozen=True)
class RunRow:
    experiment: str
    folder: str
    state: str
    detail: str
    """Why it is in that state, in words."""
    iteration: int | None
    """The latest checkpoint's iteration (None when the run cannot be read)."""
    total: int | None
    """The run's last iteration."""
    launched: float
    """When the index last recorded a launch of it (epoch seconds)."""
    launches: int
    job: str
    job_id: str | None
    last_alert: str | None = None
    problems: list[str] = field(default_factory=list)
    """What of the run's own files could not be read, one line each."""
    from_record: bool = True
    """Whether experiment and job are the run's own record's (False: no record could be read; the index's)."""
    index_says: list[str] = field(default_factory=list)
    """Where the index's newest line for the folder claims another experiment or job than the record: its claims."""


@dataclass(frozen=True)
class RunsList:
    index: Path
    rows: list[RunRow]
    problems: list[str]
    """Index lines that are not launches (file, line, what), each skipped: the first SHOWN_PROBLEMS; or why the index
    file itself was not read (a link, a FIFO, a folder)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Every skipped index line, counted by what was wrong."""
    unread: int = 0
    """Older index lines not read (the index is over runs_index.MAX_READ bytes): counted, never parsed."""
    unread_all_counted: bool = True
    not_shown: int = 0
    """Run folders of the index not opened or listed (past `limit`)."""
    index_read: bool = True
    """False: the index file is not a plain file (a link, a FIFO, a folder) or cannot be opened: nothing read."""

    @property
    def skipped_lines(self) -> int:
        return sum(self.skipped.values())

    def notes(self) -> list[str]:
        """One line for each kind of index line not listed: skipped (with the counts by why), not read, not shown."""
        out = [] if self.index_read else [f"the runs index was not read: {self.problems[0]}"]
        if self.skipped:
            kinds = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0])))
            out.append(f"{self.skipped_lines} index line(s) skipped: {kinds}")
        if self.unread:
            least = "" if self.unread_all_counted else "at least "
            out.append(f"{least}{self.unread} older index line(s) not read: only the newest "
                       f"{runs_index.MAX_READ / 2**20:g} MiB of {self.index} are read (move the older lines to "
                       "another file)")
        if self.not_shown:
            out.append(f"{self.not_shown} older run folder(s) of the index not shown (--limit)")
        return out


def list_runs(index: Path | None = None, limit: int = MAX_ROWS) -> RunsList:
    """The run folders the index names, the newest launch first (the newest `limit`), each with its state; every index
    line that is not listed is counted."""
    path = runs_index.index_path() if index is None else Path(index)
    read = runs_index.read_index(path)
    folders = runs_index.latest_by_folder(read.records)
    rows = [run_row(launch, count) for launch, count in folders[:limit]]
    lines = [p for p in read.problems if p.line]
    return RunsList(path, rows, [str(p) for p in read.problems[:SHOWN_PROBLEMS]],
                    dict(Counter(_why(p) for p in lines)), read.unread, read.counted_all,
                    max(0, len(folders) - limit), len(lines) == len(read.problems))


def _why(problem: Problem) -> str:
    """What was wrong with a skipped index line, as a short kind to count it under."""
    what = problem.what
    if what.startswith("field "):
        return f"bad {what.split()[1].rstrip(':')}"
    if what.startswith("a line of "):
        return "too long"
    if what.startswith(("unknown field", "missing field")):
        return what.split("(")[0].strip().replace("field", "fields")
    return what.split(":")[0].split(" (")[0]


def run_row(launch: Launch, launches: int = 1) -> RunRow:
    """Where the run of one index line stands, from its folder alone: the experiment and job its record holds."""
    from bigscience_ops.ops.watch import lifecycle
    from bigscience_ops.run.opening import open_run

    folder = Path(launch.folder)
    claimed = dict(experiment=launch.experiment, job=launch.job, job_id=launch.job_id)
    row = dict(folder=launch.folder, launched=launch.time, launches=launches)
    if os.path.islink(folder):
        return RunRow(state="unreadable", detail=f"the run folder is {kind_of(folder)}: a launch records the folder "
                      "itself, and a run is never read through a link", iteration=None, total=None,
                      from_record=False, **claimed, **row)
    if not folder.is_dir():
        return RunRow(state="missing", detail="the run folder is gone (moved or deleted)", iteration=None, total=None,
                      from_record=False, **claimed, **row)
    try:
        # The store is the experiment file's to name, never a record's: `runs` loads no experiment file (settings
        # False: the sections are empty), so it reads no store; status and info report the store's problems.
        opened = open_run(folder=folder, settings=False)
        state = lifecycle.run_state(opened.experiment)
    except (BsopsError, OSError) as exc:
        return RunRow(state="unreadable", detail=str(exc), iteration=None, total=None, from_record=False, **claimed,
                      **row)
    exp = opened.experiment
    records = ledger.read_checked(folder / ledger.LEDGER_NAME).records
    job, job_id, job_problem = recorded_job(folder, opened.record, records)
    name, detail = _state(state, ledger.stopped(records), run_lock.holder(folder), bool(records))
    problems = [str(p) for p in state.problems] + ([job_problem] if job_problem else [])
    return RunRow(experiment=exp.name, state=name, detail=detail, iteration=state.iteration, total=state.train_iters,
                  job=job, job_id=job_id, last_alert=_last_alert(exp), problems=problems,
                  index_says=_disagreements(launch, exp.name, job, job_id), **row)


def recorded_job(folder: Path, record: Path | None, records: list[ledger.TaskRecord]) -> tuple[str, str | None,
                                                                                                str | None]:
    """(job kind, job id, a problem or None) of the run's newest launch, from its own records: a record in
    launches/<time>/ is a Slurm launch, its id the one in sbatch.json beside it (a resubmission where the task ledger
    records a node phase handing the run to that id); a record in the run folder is a local launch, its made-up id the
    array of the ledger's newest task (ARRAY_TASK). An id that is not digits[_digits] is a problem, not shown."""
    if record is None or record.parent == folder:
        task = next((r.job_id for r in reversed(records) if r.event == "begin" and _TASK.fullmatch(r.job_id)), None)
        return "local", _TASK.fullmatch(task).group(1) if task else None, None
    answer = record.parent / SBATCH_JSON
    expected = "the JSON object sbatch's answer is recorded as (its job_id digits[_digits])"
    try:
        data = read_small(answer, SBATCH_LIMIT)
    except RecordFileError as exc:
        return "slurm", None, f"{answer}: {exc.what}; expected {expected}"
    if data is None:
        return "slurm", None, None  # written after sbatch answers: none yet, or a record made by hand
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "slurm", None, f"{answer}: not JSON (it holds {excerpt(data)}); expected {expected}"
    job_id = value.get("job_id") if isinstance(value, dict) else None
    if job_id is None:
        return "slurm", None, None  # sbatch failed: its error is recorded there, no job was submitted
    why = runs_index.check_job_id(job_id)
    if why is not None:
        return "slurm", None, f"{answer}: job_id {why}"
    resubmitted = any(r.event == "resize" and r.next_job == job_id for r in records)
    return ("resubmission" if resubmitted else "slurm"), job_id, None


def _disagreements(launch: Launch, experiment: str, job: str, job_id: str | None) -> list[str]:
    """What the index line claims that the run's record does not say: its experiment, its job (kind or id)."""
    out = []
    if launch.experiment != experiment:
        out.append(f"experiment {launch.experiment}")
    same_kind = launch.job == job or {launch.job, job} == {"slurm", "resubmission"}
    if not same_kind or (job_id is not None and launch.job_id != job_id):
        out.append(f"job {launch.job}" + (f" {launch.job_id}" if launch.job_id else ""))
    return out


def _state(state, budget_stopped: bool, holder: str | None, launched: bool) -> tuple[str, str]:
    """(state, why) from lifecycle.RunState and what the ledger and the lock say."""
    last = state.last_task
    if holder is not None:
        return ("training" if "rollback" not in holder else "in use"), f"held by {holder}"
    if state.finished:
        return "finished", f"the latest checkpoint is the last iteration, {state.train_iters}"
    if state.kill_switch is not None:
        return "stopped", f"the kill switch {state.kill_switch} exists"
    if budget_stopped:
        return "stopped", "the failure budget stopped the array (tasks in a row without progress)"
    if last is None:
        return ("waiting", "launched; no array task has begun yet (queued, or cancelled before it started)") if \
            launched else ("never trained", "no array task recorded")
    if last.ended is None:
        return "killed", f"task {last.job_id} began at iteration {last.start_iteration} and recorded no end"
    if last.exit_code:
        return "failed", f"task {last.job_id} ended with exit code {last.exit_code}"
    return "stopped", (f"task {last.job_id} ended with exit 0 at iteration {last.end_iteration}, short of the end: the "
                       "next array task or launch resumes")


def _last_alert(exp) -> str | None:
    """The newest open alert of the run's alert state (beside its main_log.txt), as one short line."""
    from bigscience_ops.ops.tell import notify

    open_now, problem = notify.open_alerts(notify.default_state_path(runlog.main_log(exp.paths.logs)))
    if problem is not None:
        return f"the alert state cannot be read: {problem}"
    if not open_now:
        return None
    condition, entry = open_now[0]
    message = str(entry.get("message", "")).strip().split("\n")[0]
    line = f"{condition} since {entry.get('since')}: {message}"
    return line if line.isprintable() and len(line) <= ALERT_CHARS else excerpt(line, ALERT_CHARS)


def runs_data(result: RunsList) -> dict:
    """`runs` for --json."""
    return {"index": str(result.index), "runs": [asdict(row) for row in result.rows], "problems": result.problems,
            "skipped": result.skipped, "skipped_lines": result.skipped_lines, "unread_lines": result.unread,
            "unread_all_counted": result.unread_all_counted, "not_shown": result.not_shown,
            "index_read": result.index_read, "notes": result.notes()}
