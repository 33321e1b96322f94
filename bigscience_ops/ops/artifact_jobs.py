"""The experiment's hourly hub-sync and backup jobs for cron.hourly/, rendered like the status watchdog.

Each job runs `bsops hub-sync EXP --alert` or `bsops backup EXP --alert`: on failure the command
exits non-zero and emails the experiment's alerts recipients at most once per
alerts.cooldown_minutes while it keeps failing, then once when it works again (ops/notify.py's
cooldown state, shared with the watchdog).
"""

from __future__ import annotations

from pathlib import Path

from bigscience_ops import render as rendering
from bigscience_ops.schema import Experiment
from bigscience_ops.ops.cron import CronSettings, RunnerScript

JOBS = ("status", "hub-sync", "backup")
# One hourly sync must end well before the next; a backup of a large checkpoint may take hours
# (the runner skips the next hour's job while one is still queued or running).
TIME_LIMITS = {"hub-sync": "00:50:00", "backup": "12:00:00"}


def render_job(kind: str, cron_dir: Path, exp: Experiment, trainings_dir: Path, settings: CronSettings,
               workdir: Path | None = None) -> RunnerScript:
    """cron.hourly/<exp>-<kind>.slurm for kind hub-sync or backup, run in `workdir` as the status job is."""
    if kind not in TIME_LIMITS:
        raise ValueError(f"job kind {kind!r}: one of {', '.join(TIME_LIMITS)}")
    cron_dir = Path(cron_dir).resolve()
    job_name = f"{exp.slurm.job_name}-{kind}"
    optional = [(opt, getattr(settings, opt)) for opt in ("partition", "account", "qos") if getattr(settings, opt)]
    text = rendering.environment().get_template(f"{kind}-job.slurm.j2").render(
        job_name=job_name, experiment=exp.name, trainings_dir=str(Path(trainings_dir).resolve()),
        time=TIME_LIMITS[kind], optional=optional, env_setup=[rendering.Raw(line) for line in settings.env_setup],
        logs=str(cron_dir / "logs"), workdir=str(Path(workdir or Path.cwd()).resolve()),
    )
    return RunnerScript(cron_dir / "cron.hourly" / f"{exp.name}-{kind}.slurm", text)
