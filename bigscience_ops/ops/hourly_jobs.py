"""The experiment's hourly jobs for cron.hourly/, all three from templates/hourly-job.slurm.j2.

- status: the watchdog, `bsops status EXP --cron-dir CRON`; an alert (exit code 1) is the
  watchdog working, so the job exits 0 for it.
- hub-sync, backup: `bsops hub-sync EXP --alert`, `bsops backup EXP --alert`. On failure the
  command exits non-zero and emails the experiment's alerts recipients at most once per
  alerts.cooldown_minutes while it keeps failing, then once when it works again (ops/notify.py's
  cooldown state, shared with the watchdog).
"""

from __future__ import annotations

from pathlib import Path

from bigscience_ops import render as rendering
from bigscience_ops.config import Experiment
from bigscience_ops.ops.cron import CronSettings, RunnerScript

JOBS = ("status", "hub-sync", "backup")
# What the job's name (<slurm.job_name>-<suffix>) and file (<exp>-<suffix>.slurm) end with.
SUFFIXES = {"status": "slurm-status", "hub-sync": "hub-sync", "backup": "backup"}
# The watchdog answers within its Slurm timeouts; one hourly sync must end well before the next; a
# backup of a large checkpoint may take hours (the runner skips the next hour's job while one is
# still queued or running).
TIME_LIMITS = {"status": "00:10:00", "hub-sync": "00:50:00", "backup": "12:00:00"}


def render_job(kind: str, cron_dir: Path, exp: Experiment, trainings_dir: Path, settings: CronSettings) -> RunnerScript:
    """cron.hourly/<exp>-<suffix>.slurm for one kind of JOBS."""
    if kind not in JOBS:
        raise ValueError(f"job kind {kind!r}: one of {', '.join(JOBS)}")
    cron_dir = Path(cron_dir).resolve()
    suffix = SUFFIXES[kind]
    optional = [(opt, getattr(settings, opt)) for opt in ("partition", "account", "qos") if getattr(settings, opt)]
    text = rendering.environment().get_template("hourly-job.slurm.j2").render(
        kind=kind, job_name=f"{exp.slurm.job_name}-{suffix}", experiment=exp.name,
        trainings_dir=str(Path(trainings_dir).resolve()), time=TIME_LIMITS[kind], optional=optional,
        env_setup=[rendering.Raw(line) for line in settings.env_setup], logs=str(cron_dir / "logs"),
        cron_dir=str(cron_dir),
    )
    return RunnerScript(cron_dir / "cron.hourly" / f"{exp.name}-{suffix}.slurm", text)
