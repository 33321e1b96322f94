"""The watchdog as an hourly job (ops/hourly_job.py): `bsops status EXP --cron-dir DIR` every hour."""

from __future__ import annotations

from bigscience_ops.ops.hourly_job import CRON_DIR, HourlyJob

STATUS = HourlyJob(
    "status", "slurm-status", "status", "00:10:00", "watchdog",
    ("It checks the training and the cron chains, logs to watchdog.log beside the run's main_log.txt and",
     "emails the on-call people on an alert."),
    arguments=("--cron-dir", CRON_DIR), alert_is_success=True)

JOBS = (STATUS,)
