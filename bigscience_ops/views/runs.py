"""`bsops runs`: the runs this user launched (runs_index.py), each with where it stands, from its own files.

Each run folder of the index is opened as the run recorded itself (run_ref.py) and read with the
readers the watchdog uses: the latest checkpoint, the task ledger and the kill switch
(ops/watch/lifecycle.run_state), the failure budget's stop (ledger.stopped), the run's lock (a
launch or an array task holding it trains it now: run_lock.holder) and the alert state beside its
log (ops/tell/notify.open_alerts). No Slurm is asked: a list of twenty runs answers at once.

States: training (its lock is held), finished (the latest checkpoint is the last iteration),
stopped (the kill switch, the failure budget, or a task that ended with exit 0 short of the end),
failed (the last task's exit code), killed (a task began and recorded no end, and nothing holds
the run), waiting (launched, no task has begun yet: queued, or cancelled before it started), never
trained (no task recorded), missing (the folder is gone) and unreadable (its record cannot be read).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from bigscience_ops import ledger, run_lock, runs_index
from bigscience_ops.errors import BsopsError
from bigscience_ops.runfiles import excerpt
from bigscience_ops.runs_index import Launch

ALERT_CHARS = 120


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


@dataclass(frozen=True)
class RunsList:
    index: Path
    rows: list[RunRow]
    problems: list[str]
    """Index lines that are not launches (file, line, what), each skipped."""


def list_runs(index: Path | None = None) -> RunsList:
    """Every run folder the index names, the newest launch first, each with its state."""
    path = runs_index.index_path() if index is None else Path(index)
    read = runs_index.read_index(path)
    rows = [run_row(launch, count) for launch, count in runs_index.latest_by_folder(read.records)]
    return RunsList(path, rows, [str(p) for p in read.problems])


def run_row(launch: Launch, launches: int = 1) -> RunRow:
    """Where the run of one index line stands, from its folder alone."""
    from bigscience_ops.ops.watch import lifecycle
    from bigscience_ops.run_ref import open_run

    folder = Path(launch.folder)
    row = dict(experiment=launch.experiment, folder=launch.folder, launched=launch.time, launches=launches,
               job=launch.job, job_id=launch.job_id)
    if not folder.is_dir():
        return RunRow(state="missing", detail="the run folder is gone (moved or deleted)", iteration=None, total=None,
                      **row)
    try:
        exp = open_run(None, run=folder).experiment
        state = lifecycle.run_state(exp)
    except (BsopsError, OSError) as exc:
        return RunRow(state="unreadable", detail=str(exc), iteration=None, total=None, **row)
    records = ledger.read_checked(folder / ledger.LEDGER_NAME).records
    name, detail = _state(state, ledger.stopped(records), run_lock.holder(folder), bool(records))
    return RunRow(state=name, detail=detail, iteration=state.iteration, total=state.train_iters,
                  last_alert=_last_alert(exp), problems=[str(p) for p in state.problems], **row)


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

    open_now, problem = notify.open_alerts(notify.default_state_path(Path(exp.paths.logs) / "main_log.txt"))
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
    return {"index": str(result.index), "runs": [asdict(row) for row in result.rows], "problems": result.problems}
