"""The experiment's hourly jobs for cron.hourly/: the status watchdog, the Hub sync, the backup and the eval scheduler.

One template (templates/hourly-job.slurm.j2) renders all four; `JOBS` says what differs: the bsops
command each runs, its time limit and the comment that tells a reader what the job does. Each job is named
`bsops.<training job name>.<suffix>` (slurm.names): experiment names and slurm.job_name refuse that form, so
the watchdog never takes an hourly job for a training, nor `cron run` a training for an hourly job. hub-sync
and backup run with `--alert`: on failure they exit non-zero and email the experiment's alerts
recipients at most once per alerts.cooldown_minutes while it keeps failing, then once when it works
again (ops/tell/notify.py's cooldown state, shared with the watchdog). The eval scheduler (`bsops eval --next
--alert`) submits the eval jobs themselves, named `bsops.<training job name>.eval`: it is named `...eval-next` so
that neither `cron run` nor the scheduler's own queue check takes one for the other. The watchdog's alert (exit 1) is
already emailed, so for the runner its job succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.launch import render as rendering
from bigscience_ops.run import log as runlog
from bigscience_ops.errors import ConfigError
from bigscience_ops.ops.schedule.cron import PERIODS, CronSettings, RunnerScript, folder_scripts
from bigscience_ops.schema import Experiment


@dataclass(frozen=True)
class HourlyJob:
    suffix: str  # the last part of the job name (bsops.<training>.<suffix>) and of the script's file name
    command: str  # the bsops command it runs
    time: str  # --time: one sync must end well before the next; a backup of a large checkpoint may take hours
    what: str
    about: tuple[str, ...]
    alert_is_success: bool = False
    arguments: tuple[str, ...] = ("--alert",)
    """What follows `bsops <command> EXP --trainings-dir DIR` (the watchdog's are its cron folder's)."""
    opt_in: bool = False
    """Written only when --jobs names it: the eval scheduler submits jobs of its own (GPU hours), which a run that
    sets eval: for `bsops eval --step` by hand may not want every hour."""


JOBS: dict[str, HourlyJob] = {
    "status": HourlyJob(
        "slurm-status", "status", "00:10:00", "watchdog",
        ("It checks the training and the cron chains, logs to watchdog.log beside the run's main_log.txt and",
         "emails the on-call people on an alert."), alert_is_success=True),
    "hub-sync": HourlyJob(
        "hub-sync", "hub-sync", "00:50:00", "Hub sync",
        ("It pushes the run's logs, TensorBoard events and codecarbon records to their Hub repos (the",
         "token comes from the environment variable hub.token_env); a failure is emailed to the on-call people.")),
    "backup": HourlyJob(
        "backup", "backup", "12:00:00", "checkpoint backup",
        ("It copies new checkpoints to backup.dest with a verified manifest each, finishes a copy an",
         "earlier run left half-done, applies scratch retention, and emails the on-call people on a failure.")),
    "eval": HourlyJob(
        "eval-next", "eval", "00:10:00", "eval scheduler",
        ("It submits an eval job (eval.partition, eval.nodes, eval.time) for the newest complete checkpoint without",
         "a result, one at a time, and emails the on-call people when an eval job failed."),
        arguments=("--next", "--alert"), opt_in=True),
}


def missing_setting(kind: str, exp: Experiment) -> tuple[str, str] | None:
    """(field, what to set) when exp lacks what job `kind` needs (an hourly job that could only fail
    and alert every hour), else None."""
    if kind == "backup" and not exp.backup.dest:
        return "backup.dest", "the backup folder the hourly backup copies checkpoints to"
    hub = exp.hub
    if kind == "hub-sync" and not (hub.logs_repo or hub.tensorboard_repo or hub.codecarbon_repo):
        return "hub.logs_repo", "at least one of hub.logs_repo, hub.tensorboard_repo, hub.codecarbon_repo"
    if kind == "eval" and not exp.eval.configured:
        return "eval.tasks", "something to evaluate: eval.tasks (lm-eval task names or task YAML files) or eval.sources"
    return None


def configured(exp: Experiment) -> list[str]:
    """The jobs `cron add` writes without --jobs: those of JOBS that exp has the settings for (the watchdog always),
    the opt-in ones left out."""
    return [kind for kind, job in JOBS.items() if not job.opt_in and missing_setting(kind, exp) is None]


def job_name_of(kind: str, exp: Experiment) -> str:
    """The Slurm name of exp's hourly job `kind`: `bsops.<training job name>.<suffix>` (slurm.hourly_job_name), a
    form no experiment's training can take, so neither is ever taken for the other. Raises ConfigError for a
    training job name in that reserved form (an experiment built without the config's checks)."""
    training = exp.slurm.job_name or exp.name
    try:
        return slurm.hourly_job_name(training, JOBS[kind].suffix)
    except ValueError as exc:
        raise ConfigError(f"experiment {exp.name}", "slurm.job_name", training, f"the hourly {kind} job: {exc}") \
            from None


def render(kind: str, cron_dir: Path, exp: Experiment, trainings_dir: Path, settings: CronSettings,
           workdir: Path | None = None) -> RunnerScript:
    """cron.hourly/<exp>-<suffix>.slurm for one of JOBS, named job_name_of(kind, exp); the job runs in `workdir`
    (default: the current folder), the folder exp's relative outputs resolved against
    (experiment_files.outputs_folder). Raises ConfigError when exp lacks a setting the job needs (missing_setting)."""
    if kind not in JOBS:
        raise ValueError(f"job kind {kind!r}: one of {', '.join(JOBS)}")
    missing = missing_setting(kind, exp)
    if missing is not None:
        field, what = missing
        raise ConfigError(f"experiment {exp.name}", field, None,
                          f"the hourly {kind} job needs {what}: set it, or leave {kind} out of --jobs")
    job = JOBS[kind]
    cron_dir = Path(cron_dir).resolve()
    [(_, job_name)] = rendering.slurm_options(f"experiment {exp.name}", {"job-name": job_name_of(kind, exp)})
    optional = rendering.slurm_options(f"{cron_dir / 'cron.yaml'}", {
        opt: getattr(settings, opt) or None for opt in ("partition", "account", "qos")})
    arguments = ["--cron-dir", str(cron_dir)] if kind == "status" else list(job.arguments)
    text = rendering.environment().get_template("hourly-job.slurm.j2").render(
        job_name=job_name, experiment=exp.name,
        trainings_dir=str(Path(trainings_dir).resolve()), time=job.time, what=job.what, about=job.about,
        command=job.command, arguments=arguments, alert_is_success=job.alert_is_success, optional=optional,
        env_setup=[rendering.Raw(line) for line in settings.env_setup], output=rendering.output_option(cron_dir / "logs", "%x-%j.out"),
        workdir=str(Path(workdir or Path.cwd()).resolve()),
    )
    return RunnerScript(cron_dir / "cron.hourly" / f"{exp.name}-{job.suffix}.slurm", text)


# ----------------------------------------------------------------------------- installed jobs

MARK = "rendered by `bsops cron add`"  # in the header comment of every job render() writes


@dataclass(frozen=True)
class Installed:
    """A job script of a cron folder: the experiment and kind for one `bsops cron add` wrote, else None."""

    path: Path
    period: str
    experiment: str | None
    kind: str | None


def installed(cron_dir: Path) -> list[Installed]:
    """Every job script of cron.hourly/ and cron.daily/, with the experiment and kind of those bsops wrote.

    Read only by file name and header comment: a script is never run or sourced to find out."""
    found = []
    for period in PERIODS:
        for script in folder_scripts(cron_dir, period):
            experiment = kind = None
            ours = MARK in (runlog.head(script, 4000) or b"").decode("utf-8", errors="replace")
            for name, job in JOBS.items():
                if ours and script.stem.endswith(f"-{job.suffix}") and len(script.stem) > len(job.suffix) + 1:
                    experiment, kind = script.stem[:-len(job.suffix) - 1], name
                    break
            found.append(Installed(script, period, experiment, kind))
    return found


def remove(cron_dir: Path, experiment: str, kinds: list[str]) -> list[Path]:
    """Delete the job scripts `bsops cron add` wrote for `experiment` of `kinds`; returns the files removed."""
    removed = []
    for job in installed(cron_dir):
        if job.experiment == experiment and job.kind in kinds:
            job.path.unlink()
            removed.append(job.path)
    return removed

