"""bsops' own job names: the hourly jobs' reserved form, which no experiment's job name can take.

The watchdog, `cron run` and a launch find jobs in the queue by name. An hourly job named `x-backup` is
also the training job of an experiment named `x-backup`: that experiment's running training would read
as x's backup still running (skipped every hour), and its backup as that experiment running. So the
hourly jobs are named `bsops.<job name>.<kind>` and nothing else may start with `bsops.`:
experiment names (config.files.check_name) and slurm.job_name (schema's job-name character set)
refuse it. Slurm takes any text as a job name; `.` is in every name character set of bsops, so the
form needs no new character, and the kind, last and without a dot, makes each hourly name one job's.
"""

from __future__ import annotations

import re

RESERVED_PREFIX = "bsops."
"""The start of every hourly job's name; no experiment name or slurm.job_name may start with it."""
_KIND = re.compile(r"[a-z][a-z-]*")


RUNNER_NAMES = ("bsops-cron-hourly", "bsops-cron-daily")
"""The cron runners' job names (ops/cron/runner.py, with cron.yaml's default name_prefix): reserved too, so no
training is taken for a runner, nor a runner cancelled as an extra chain."""


def reserved_problem(name: str) -> str | None:
    """Why `name` cannot be an experiment's job name (it has bsops' reserved form), else None."""
    if name in RUNNER_NAMES:
        return f"it is the job name of bsops' {name.rsplit('-', 1)[1]} cron runner, which bsops reserves"
    if name.startswith(RESERVED_PREFIX):
        return (f"it starts with {RESERVED_PREFIX!r}, the form bsops reserves for its hourly jobs' names "
                f"({RESERVED_PREFIX}<job name>.<kind>), so no training can be taken for one of them")
    return None


def hourly_job_name(job_name: str, kind: str) -> str:
    """The Slurm name of the hourly job `kind` (`slurm-status`, `hub-sync`, `backup`) of the training named
    `job_name`: `bsops.<job_name>.<kind>`. Raises ValueError for a kind with a dot or a name in the reserved form."""
    if not _KIND.fullmatch(kind):
        raise ValueError(f"hourly job kind {kind!r}: allowed: lowercase letters and '-'")
    if not job_name or reserved_problem(job_name) is not None:
        raise ValueError(f"training job name {job_name!r}: allowed: a non-empty name not starting with "
                         f"{RESERVED_PREFIX!r}")
    return f"{RESERVED_PREFIX}{job_name}.{kind}"


def is_hourly_job_name(name: str) -> bool:
    """Whether `name` has the hourly jobs' reserved form."""
    head, dot, kind = name.rpartition(".")
    return name.startswith(RESERVED_PREFIX) and bool(dot) and len(head) > len(RESERVED_PREFIX) \
        and bool(_KIND.fullmatch(kind))
