"""Cron on a cluster with no crontab: self-respawning Slurm runner jobs over cron.hourly/ and cron.daily/.

`bsops cron install` submits one runner per period unless its chain is already queued. Each
runner re-arms itself first, for the next period boundary (on the hour), so queue waits never
accumulate; then it submits every job script of its folder whose previous instance is not still
queued, logs what it did, and alerts when a submission fails. Where the cluster has `scrontab`,
the same runs can be written as scrontab entries instead.
"""

from __future__ import annotations

import datetime as dt
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops import render as rendering
from bigscience_ops.config import AlertsConfig, Experiment
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.status import QUEUED_STATES
from bigscience_ops.typedyaml import build, documented, read_yaml

PERIODS = {"hourly": 3600, "daily": 86400}
SCRON_SCHEDULES = {"hourly": "0 * * * *", "daily": "0 0 * * *"}


class CronError(BsopsError):
    """A cron folder, its settings or a runner cannot be used."""


@dataclass(frozen=True)
class CronSettings:
    """cron/cron.yaml: where the runner jobs run and who hears about failures."""

    partition: str | None = documented(None, "--partition of the runner jobs")
    account: str | None = documented(None, "--account of the runner jobs")
    qos: str | None = documented(None, "--qos of the runner jobs")
    time: str = documented("00:20:00", "--time of one runner job")
    name_prefix: str = documented("bsops-cron", "runner job names are <prefix>-hourly and <prefix>-daily")
    env_setup: list[str] = documented(factory=list, doc="shell lines that put bsops on PATH")
    alerts: AlertsConfig = documented(factory=AlertsConfig, doc="who is told when a submission fails")


def load_settings(cron_dir: Path) -> CronSettings:
    path = Path(cron_dir) / "cron.yaml"
    if not path.exists():
        return CronSettings()
    return build(CronSettings, read_yaml(path), "", {}, str(path))


def runner_name(period: str, prefix: str = "bsops-cron") -> str:
    return f"{prefix}-{period}"


def check_period(period: str) -> None:
    if period not in PERIODS:
        raise CronError(f"cron period {period!r} is not one of {', '.join(PERIODS)}")


def next_boundary(now: dt.datetime, seconds: int) -> dt.datetime:
    """The next multiple of `seconds` since the epoch after `now`: on the hour for hourly runs."""
    stamp = int(now.timestamp())
    return dt.datetime.fromtimestamp((stamp // seconds + 1) * seconds, tz=now.tzinfo)


def begin_arg(when: dt.datetime) -> str:
    """sbatch --begin takes local wall-clock time."""
    return when.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def folder_jobs(cron_dir: Path, period: str) -> list[tuple[Path, str]]:
    """(script, job name) for each *.slurm in cron.<period>/; the name from #SBATCH --job-name or the file."""
    folder = Path(cron_dir) / f"cron.{period}"
    jobs = []
    for script in sorted(folder.glob("*.slurm")):
        jobs.append((script, script_job_name(script)))
    return jobs


def script_job_name(script: Path) -> str:
    for line in script.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        for prefix in ("#SBATCH --job-name=", "#SBATCH -J "):
            if line.startswith(prefix):
                words = shlex.split(line[len(prefix):], comments=False)
                if words:
                    return words[0]
    return script.stem


@dataclass(frozen=True)
class RunnerScript:
    path: Path
    text: str


def render_runner(cron_dir: Path, period: str, settings: CronSettings, period_seconds: int | None = None) -> RunnerScript:
    """The runner job script for one period (period_seconds overrides the period, for tests)."""
    check_period(period)
    cron_dir = Path(cron_dir).resolve()
    name = runner_name(period, settings.name_prefix)
    path = cron_dir / "runners" / f"{name}.slurm"
    optional = [(opt, getattr(settings, opt)) for opt in ("partition", "account", "qos") if getattr(settings, opt)]
    text = rendering.environment().get_template("cron-runner.slurm.j2").render(
        name=name, period=period, seconds=period_seconds or PERIODS[period], time=settings.time,
        optional=optional, env_setup=[rendering.Raw(line) for line in settings.env_setup],
        cron_dir=str(cron_dir), script=str(path), logs=str(cron_dir / "logs"),
    )
    return RunnerScript(path, text)


def write_runner(runner: RunnerScript) -> Path:
    runner.path.parent.mkdir(parents=True, exist_ok=True)
    (runner.path.parent.parent / "logs").mkdir(parents=True, exist_ok=True)
    runner.path.write_text(runner.text, encoding="utf-8")
    runner.path.chmod(0o755)
    return runner.path


def render_status_job(cron_dir: Path, exp: Experiment, trainings_dir: Path, settings: CronSettings) -> RunnerScript:
    """The experiment's hourly watchdog job, for cron.hourly/."""
    job_name = f"{exp.slurm.job_name}-slurm-status"
    path = Path(cron_dir).resolve() / "cron.hourly" / f"{exp.name}-slurm-status.slurm"
    optional = [(opt, getattr(settings, opt)) for opt in ("partition", "account", "qos") if getattr(settings, opt)]
    text = rendering.environment().get_template("status-job.slurm.j2").render(
        job_name=job_name, experiment=exp.name, trainings_dir=str(Path(trainings_dir).resolve()),
        optional=optional, env_setup=[rendering.Raw(line) for line in settings.env_setup],
        logs=str(Path(cron_dir).resolve() / "logs"),
    )
    return RunnerScript(path, text)


def scrontab_text(cron_dir: Path, settings: CronSettings) -> str:
    """scrontab entries doing what the self-respawning runners do (no re-arming needed there)."""
    cron_dir = Path(cron_dir).resolve()
    lines = ["# bsops cron: written by `bsops cron install --scrontab`; install with `scrontab FILE`"]
    for period in PERIODS:
        lines.append(f"#SCRON --job-name={shlex.quote(runner_name(period, settings.name_prefix))}")
        lines.append(f"#SCRON --time={shlex.quote(settings.time)}")
        for opt in ("partition", "account", "qos"):
            if getattr(settings, opt):
                lines.append(f"#SCRON --{opt}={shlex.quote(getattr(settings, opt))}")
        command = ["bsops", "cron", "run", period, "--cron-dir", str(cron_dir), "--no-rearm"]
        setup = "; ".join(settings.env_setup)
        shell = (setup + "; " if setup else "") + shlex.join(command)
        lines.append(f"{SCRON_SCHEDULES[period]} {shell}")
    return "\n".join(lines) + "\n"


def scrontab_available() -> bool:
    return shutil.which("scrontab") is not None


def log_line(now: dt.datetime, text: str) -> str:
    return f"[{now.strftime('%Y-%m-%d %H:%M:%S')}] {text}"


@dataclass
class RunReport:
    """What one runner pass did; `lines` go to cron/logs/cron.<period>.log."""

    period: str
    rearmed_job: str | None = None
    submitted: list[tuple[str, str]] = field(default_factory=list)  # (job name, job id)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (job name, why)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (script, error)
    lines: list[str] = field(default_factory=list)


def _me() -> str:
    import getpass

    return getpass.getuser()


def _queued(jobs: list, name: str, exclude_id: str | None = None) -> list:
    return [j for j in jobs if j.name == name and j.state in QUEUED_STATES and j.job_id != exclude_id]


def run_pass(cron_dir: Path, period: str, runner: Path | None, period_seconds: int | None = None,
             now: dt.datetime | None = None, self_job_id: str | None = None) -> RunReport:
    """One runner pass: re-arm (unless runner is None), then submit the folder's jobs not already queued."""
    from bigscience_ops import slurm

    check_period(period)
    now = now or dt.datetime.now().astimezone()
    seconds = period_seconds or PERIODS[period]
    name = runner_name(period, load_settings(cron_dir).name_prefix)
    report = RunReport(period)
    jobs = slurm.query_jobs(users=[_me()])
    if runner is not None:
        waiting = _queued(jobs, name, exclude_id=self_job_id)
        if waiting:
            report.lines.append(log_line(now, f"{name} already re-armed as job {waiting[0].job_id}"))
        else:
            when = next_boundary(now, seconds)
            report.rearmed_job = slurm.submit(slurm.sbatch_argv(runner, begin=begin_arg(when)))
            report.lines.append(log_line(now, f"re-armed {name} as job {report.rearmed_job} for {begin_arg(when)}"))
    for script, name in folder_jobs(cron_dir, period):
        queued = _queued(jobs, name)
        if queued:
            why = f"previous instance {queued[0].job_id} still {queued[0].state.lower()}"
            report.skipped.append((name, why))
            report.lines.append(log_line(now, f"skipped {script.name} ({name}): {why}"))
            continue
        try:
            job_id = slurm.submit(slurm.sbatch_argv(script))
        except (BsopsError, ValueError) as exc:
            report.failed.append((str(script), str(exc)))
            report.lines.append(log_line(now, f"***ALERT: cron.{period}: submitting {script} failed: {exc}***"))
            continue
        report.submitted.append((name, job_id))
        report.lines.append(log_line(now, f"submitted {script.name} ({name}) as job {job_id}"))
    if not folder_jobs(cron_dir, period):
        report.lines.append(log_line(now, f"cron.{period}/ has no job scripts"))
    if report.failed:
        report.lines.append(log_line(now, _email_failures(load_settings(cron_dir).alerts, period, report)))
    log = Path(cron_dir) / "logs" / f"cron.{period}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("\n".join(report.lines) + "\n")
    return report


def _email_failures(alerts: AlertsConfig, period: str, report: RunReport) -> str:
    from bigscience_ops.ops import notify

    failures = "\n".join(f"- {script}: {error}" for script, error in report.failed)
    body = (f"The {period} cron runner could not submit {len(report.failed)} job(s):\n{failures}\n\n"
            f"Fix the script or the cluster problem named above; the runner tries again next {period} run.")
    return notify.send_alert(alerts, f"[bsops] cron.{period}: submission failed", body)


@dataclass(frozen=True)
class ChainState:
    name: str
    jobs: list  # queued runner jobs of this chain

    def describe(self) -> str:
        if not self.jobs:
            return f"{self.name}: NOT QUEUED (run `bsops cron install`)"
        parts = []
        for job in self.jobs:
            when = job.start_time.strftime("%Y-%m-%d %H:%M:%S") if job.start_time else "unknown"
            if job.state == "RUNNING":
                parts.append(f"job {job.job_id} running since {when}")
            else:
                parts.append(f"job {job.job_id} {job.state.lower()} ({job.reason}), next run {when}")
        extra = " (more than one chain: cancel the extras)" if len(self.jobs) > 1 else ""
        return f"{self.name}: " + "; ".join(parts) + extra


def chains(cron_dir: Path) -> list[ChainState]:
    from bigscience_ops import slurm

    prefix = load_settings(cron_dir).name_prefix
    jobs = slurm.query_jobs(users=[_me()])
    return [ChainState(runner_name(p, prefix), _queued(jobs, runner_name(p, prefix))) for p in PERIODS]


def install(cron_dir: Path, period_seconds: int | None = None, periods: tuple[str, ...] = tuple(PERIODS)) -> list[str]:
    """Write the runners and submit each whose chain is not already queued; returns what was done."""
    from bigscience_ops import slurm

    settings = load_settings(cron_dir)
    for period in periods:
        (Path(cron_dir) / f"cron.{period}").mkdir(parents=True, exist_ok=True)
    jobs = slurm.query_jobs(users=[_me()])
    done = []
    for period in periods:
        path = write_runner(render_runner(cron_dir, period, settings, period_seconds))
        name = runner_name(period, settings.name_prefix)
        queued = _queued(jobs, name)
        if queued:
            done.append(f"{name}: already queued as job {queued[0].job_id}; left as it is")
            continue
        job_id = slurm.submit(slurm.sbatch_argv(path))
        done.append(f"{name}: submitted {path} as job {job_id}")
    return done


def install_scrontab(cron_dir: Path) -> tuple[Path, bool]:
    """Write the scrontab file; install it with `scrontab` when the cluster has the client."""
    from bigscience_ops import slurm

    path = Path(cron_dir) / "runners" / "bsops.scrontab"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scrontab_text(cron_dir, load_settings(cron_dir)), encoding="utf-8")
    if scrontab_available():
        slurm.run(["scrontab", str(path)])
        return path, True
    return path, False
