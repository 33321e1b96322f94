"""The Hub sync and the checkpoint backup as hourly jobs (ops/hourly_job.py); each runs with --alert: on a
failure it exits non-zero and emails the experiment's alerts recipients at most once per alerts.cooldown_minutes
while it keeps failing, then once when it works again (ops/tell/notify.py's cooldown state)."""

from __future__ import annotations

from bigscience_ops.ops.hourly_job import HourlyJob, Missing
from bigscience_ops.schema import Experiment


def _hub(exp: Experiment) -> Missing | None:
    hub = exp.hub
    if hub.logs_repo or hub.tensorboard_repo or hub.codecarbon_repo:
        return None
    return "hub.logs_repo", "at least one of hub.logs_repo, hub.tensorboard_repo, hub.codecarbon_repo"


def _backup(exp: Experiment) -> Missing | None:
    return None if exp.backup.dest else ("backup.dest", "the backup folder the hourly backup copies checkpoints to")


HUB_SYNC = HourlyJob(
    "hub-sync", "hub-sync", "hub-sync", "00:50:00", "Hub sync",
    ("It pushes the run's logs, TensorBoard events and codecarbon records to their Hub repos (the",
     "token comes from the environment variable hub.token_env); a failure is emailed to the on-call people."),
    needs=_hub)

BACKUP = HourlyJob(
    "backup", "backup", "backup", "12:00:00", "checkpoint backup",
    ("It copies new checkpoints to backup.dest with a verified manifest each, finishes a copy an",
     "earlier run left half-done, applies scratch retention, and emails the on-call people on a failure."),
    needs=_backup)

JOBS = (HUB_SYNC, BACKUP)
