"""The registry of hourly jobs, and each rendered for one experiment into the cron folder (above the folders of ops/
whose jobs it registers; nothing in them imports it).

Each job is an `hourly.HourlyJob` declared beside its library code and registered here (PLUGINS): the watchdog
(ops/watch/as_hourly_job.py), the Hub sync and the backup (ops/keep/as_hourly_jobs.py), the eval scheduler (ops/evaluate/as_hourly_job.py).
A new one is its module and a line in PLUGINS. One template (templates/hourly-job.slurm.j2) renders them all. Each
job is named `bsops.<training job name>.<suffix>` (slurm.names): experiment names and slurm.job_name refuse that
form, so the watchdog never takes an hourly job for a training, nor `cron run` a training for an hourly job. The
runner (cron.run_pass) submits each through the Slurm executor (launch/jobs.py) unless its previous one is queued.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.launch import render as rendering
from bigscience_ops.run import log as runlog
from bigscience_ops.errors import ConfigError
from bigscience_ops.ops.evaluate import as_hourly_job as evaluate_jobs
from bigscience_ops.ops.hourly_job import CRON_DIR, HourlyJob, Missing
from bigscience_ops.ops.keep import as_hourly_jobs as keep_jobs
from bigscience_ops.ops.cron.runner import PERIODS, CronSettings, RunnerScript, folder_scripts
from bigscience_ops.ops.watch import as_hourly_job as watch_jobs
from bigscience_ops.schema import Experiment

PLUGINS: tuple[HourlyJob, ...] = (*watch_jobs.JOBS, *keep_jobs.JOBS, *evaluate_jobs.JOBS)
"""The hourly jobs bsops ships, in the order `cron add` writes and lists them."""

JOBS: dict[str, HourlyJob] = {}
"""The registered jobs by name: PLUGINS, and any register() added (a site's own, a test's)."""


def register(job: HourlyJob) -> HourlyJob:
    """Add `job` to JOBS. Raises ValueError for a name or suffix taken already, a suffix that cannot end a Slurm job
    name of the reserved form, or a period that is not a cron folder's."""
    taken = [j.name for j in JOBS.values() if job.suffix == j.suffix or job.name == j.name]
    if taken:
        raise ValueError(f"hourly job {job.name!r} (suffix {job.suffix!r}): the name or suffix is taken by "
                         f"{', '.join(taken)}; allowed: names and suffixes of none of {', '.join(JOBS)}")
    if job.period not in PERIODS:
        raise ValueError(f"hourly job {job.name!r}: period {job.period!r}; allowed: {', '.join(PERIODS)}")
    slurm.hourly_job_name("x", job.suffix)  # a ValueError naming the suffix and the allowed characters
    JOBS[job.name] = job
    return job


def unregister(name: str) -> None:
    JOBS.pop(name, None)


for _job in PLUGINS:
    register(_job)


def missing_setting(kind: str, exp: Experiment) -> Missing | None:
    """(field, what to set) when exp lacks what job `kind` needs (an hourly job that could only fail and alert every
    hour), else None."""
    return JOBS[kind].needs(exp)


def configured(exp: Experiment) -> list[str]:
    """The jobs `cron add` writes without --jobs: those of JOBS that exp has the settings for (the watchdog always),
    the opt-in ones left out."""
    return [kind for kind, job in JOBS.items() if not job.opt_in and missing_setting(kind, exp) is None]


def job_name_of(kind: str, exp: Experiment) -> str:
    """The Slurm name of exp's hourly job `kind`: `bsops.<training job name>.<suffix>` (slurm.hourly_job_name), a
    form no experiment's training can take, so neither is ever taken for the other. Raises ConfigError for a
    training job name in that reserved form (an experiment built without the config's checks)."""
    training = exp.slurm.job_name
    try:
        return slurm.hourly_job_name(training, JOBS[kind].suffix)
    except ValueError as exc:
        raise ConfigError(f"experiment {exp.name}", "slurm.job_name", training, f"the hourly {kind} job: {exc}") \
            from None


def render(kind: str, cron_dir: Path, exp: Experiment, trainings_dir: Path, settings: CronSettings,
           workdir: Path | None = None) -> RunnerScript:
    """cron.<period>/<exp>-<suffix>.slurm for one of JOBS, named job_name_of(kind, exp); the job runs in `workdir`
    (default: the current folder), the folder exp's relative outputs resolved against
    (config.files.outputs_folder). Raises ConfigError when exp lacks a setting the job needs (its `needs`)."""
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
    arguments = [str(cron_dir) if arg == CRON_DIR else arg for arg in job.arguments]
    text = rendering.environment().get_template("hourly-job.slurm.j2").render(
        job_name=job_name, experiment=exp.name,
        trainings_dir=str(Path(trainings_dir).resolve()), time=job.time, what=job.what, about=job.about,
        command=job.command.split(), arguments=arguments, alert_is_success=job.alert_is_success, optional=optional,
        env_setup=[rendering.Raw(line) for line in settings.env_setup],
        output=rendering.output_option(cron_dir / "logs", "%x-%j.out"),
        workdir=str(Path(workdir or Path.cwd()).resolve()),
    )
    return RunnerScript(cron_dir / f"cron.{job.period}" / f"{exp.name}-{job.suffix}.slurm", text)


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
            for name, job in sorted(JOBS.items(), key=lambda item: -len(item[1].suffix)):  # x-hub-sync: not -sync
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

