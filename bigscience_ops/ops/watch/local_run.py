"""A run launched on this machine (`bsops launch --local`): watched through its processes, never the Slurm queue.

A local run has no job in any queue: asking Slurm about it says nothing (or "cannot query Slurm" where there is
no cluster), and its task ids are made up. What it has is the run's lock (run/lock.py), which every process that
writes the run holds for as long as it lives: the launcher, each task's job script (and the srun shim, tee and
task hooks it starts), and each trainer (the trainers' lock). So the run is running while the lock is held, by
these processes of this host (their pids are named), or by a holder on another host; it is finished, stopped on
purpose, not launched yet, or stopped before its end (an alert, `local-stopped`, saying how its last task
ended) once nothing holds it, as status.evaluate says of a Slurm run with nothing queued.

A launcher killed while its task runs (kill -9, a crash) is said in the running line: the task hears of it
(SIGHUP) and its trainers save and exit; once they are gone the run stops, and that is the alert.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from bigscience_ops.ops.alerts import DEFAULT_CONTACT, STAMP_FORMAT, Alert, StatusReport, raise_alert
from bigscience_ops.ops.watch import status
from bigscience_ops.ops.watch.lifecycle import RunState
from bigscience_ops.run import lock as run_lock


def check(job_name: str, run: RunState, *, now: datetime | None = None,
          log_path: str | os.PathLike[str] | None = None, stall_minutes: float | None = None,
          contact: str = DEFAULT_CONTACT) -> StatusReport:
    """Who holds the run's lock now (run_lock.in_use of its folder), then `evaluate`."""
    now = now or datetime.now().replace(microsecond=0)
    output = Path(run.experiment.paths.output) if run.experiment is not None else None
    holding = run_lock.in_use(output) if output is not None else None
    return evaluate(job_name, holding, run, now=now, log_path=log_path, stall_minutes=stall_minutes, contact=contact)


def evaluate(job_name: str, holding: run_lock.Holding | None, run: RunState, *, now: datetime,
             log_path: str | os.PathLike[str] | None = None, stall_minutes: float | None = None,
             contact: str = DEFAULT_CONTACT, progress: status.LogProgress | None = None) -> StatusReport:
    """Decide from who holds the run (`holding`, None: nobody) and its folder's state whether a local run needs a
    person: running (a line naming its processes; `stalled` when its log has had no new iteration line for over
    `stall_minutes` since its task began), else as status.not_running."""
    stamp = f"[{now:{STAMP_FORMAT}}]"
    lines: list[str] = []
    alerts: list[Alert] = []

    def alert(kind: str, headline: str = "", advice: str = "", **facts: object) -> None:
        alerts.append(raise_alert(kind, contact=contact, headline=headline, advice=advice, job=job_name, **facts))

    finished_at = None
    if holding is not None:
        lines.append(f"{stamp} {job_name} {running_text(holding, run)}")
        if stall_minutes is not None and (progress is not None or log_path is not None):
            progress = progress if progress is not None else status.read_progress(log_path)  # type: ignore[arg-type]
            task = run.last_task
            started = datetime.fromtimestamp(task.started) if task is not None and task.ended is None \
                and task.started is not None else None
            stalled = status.stall_facts(progress, log_path, started, now, stall_minutes)
            if stalled is not None:
                alert("stalled", **stalled)
    else:
        finished_at = status.not_running(job_name, run, stamp, lines, alert)
    return StatusReport(job_name, now, tuple(lines), finished_at=finished_at).adding(alerts)


def running_text(holding: run_lock.Holding, run: RunState) -> str:
    """`is running here (bsops launch --local, ...): processes 4711 bash, ...` for the status line."""
    task = run.last_task
    at = f" at iteration {run.iteration} of {run.train_iters}"
    doing = f", task {status.safe_id(task.job_id)}" if task is not None and task.ended is None else ""
    if holding.line is None:
        where = (f"processes {holding.processes()} on {holding.host}" if holding.pids
                 else "on another host")
        return (f"is running here{at}: trainers without their task hold it{doing} ({where}); they save and exit, "
                "then the run stops")
    owner = status.quote_untrusted(holding.line, 300, mark=False)
    gone = (f"; its launcher (pid {holding.owner_pid}) has ended: the task's trainers save and exit, then the run "
            "stops" if holding.owner_gone else "")
    processes = f" (processes {holding.processes()} on {holding.host})" if holding.pids else " (on another host)"
    return f"is running{at}{doing}: held by {owner}{processes}{gone}"
