"""The interface of an hourly job: what the cron runner submits every period for one experiment. It stands below
every folder of ops/ (as alerts.py): the folders declare their jobs with it, and ops/hourly_registry.py registers them.

A job is declared beside its library code (ops/watch/as_hourly_job.py, ops/keep/as_hourly_jobs.py, ops/evaluate/as_hourly_job.py) as one
`HourlyJob` value and registered in hourly_registry.PLUGINS; nothing else names it. A new hourly job is one module
(its HourlyJob and whatever library code it runs) and one line there. What a job is:

- its name (what `bsops cron add --jobs` takes) and the suffix of its Slurm name, `bsops.<training>.<suffix>`;
- its schedule: the cron period whose folder holds its script (cron.hourly/ or cron.daily/) and its --time;
- what it needs from the experiment (`needs`: the field to set when it could only fail and alert every period);
- what it runs: `bsops <command> EXP --trainings-dir DIR <arguments>`, rendered into templates/hourly-job.slurm.j2
  and submitted by the runner through the Slurm executor (launch/jobs.py) unless its previous instance is queued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bigscience_ops.schema import Experiment

Missing = tuple[str, str]
"""(the experiment's field, what to set there)."""

CRON_DIR = "{cron_dir}"
"""In `arguments`: replaced by the cron folder the job is rendered for (the watchdog checks its chains)."""


def needs_nothing(exp: Experiment) -> Missing | None:
    return None


@dataclass(frozen=True)
class HourlyJob:
    name: str
    """What --jobs takes (status, hub-sync, ...)."""
    suffix: str
    """The last part of its Slurm name (bsops.<training>.<suffix>) and of its script's file name (<exp>-<suffix>)."""
    command: str
    """The bsops command it runs (`bsops <command> EXP --trainings-dir DIR <arguments>`): its words, space-separated
    for a subcommand (`eval next`)."""
    time: str
    """--time: one run must end well before the next; a backup of a large checkpoint may take hours."""
    what: str
    """Its name in the script's header comment ("the hourly <what> of EXP")."""
    about: tuple[str, ...]
    """The header comment's further lines: what it does, whom it tells."""
    needs: Callable[[Experiment], Missing | None] = needs_nothing
    """What it needs from the experiment: None when the experiment has it, else (field, what to set)."""
    arguments: tuple[str, ...] = ("--alert",)
    """What follows `bsops <command> EXP --trainings-dir DIR` (CRON_DIR stands for the cron folder)."""
    period: str = "hourly"
    """Its schedule: the cron folder it goes into, cron.<period>/ (ops/cron/runner.PERIODS)."""
    alert_is_success: bool = False
    """Exit code 1 is an alert already emailed: for the runner, the job worked (the watchdog's)."""
    opt_in: bool = False
    """Written only when --jobs names it (a job that starts jobs of its own, GPU hours)."""
