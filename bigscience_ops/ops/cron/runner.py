"""Cron on a cluster with no crontab: self-respawning Slurm runner jobs over cron.hourly/ and cron.daily/.

`bsops cron install` submits one runner per period unless its chain is already queued. Each
runner's job script re-arms itself first, for the next period boundary (on the hour), before
anything that can fail runs; then `bsops cron run` (run_pass) submits every job script of its
folder whose previous instance is not still queued, checks that the other chains are alive, and
logs and emails every failure: a failing query, sbatch or re-arm never ends a chain silently.
Where the cluster has `scrontab`, the same runs can be entries of the user's scrontab instead
(ops/cron/scrontab.py).

The cron folder is the user's own (`default_cron_dir`: $BSOPS_CRON_DIR, else $XDG_DATA_HOME/bsops/cron,
else ~/.local/share/bsops/cron), never bsops' installed package. Every runner and job script names
its folder absolutely, so the chains keep reading the folder they were installed with.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.launch import render as rendering
from bigscience_ops.launch.jobs import ScriptJob, SlurmJob, SlurmScripts, run_job, submit, write_files
from bigscience_ops.run import log as runlog
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.tell import channels
from bigscience_ops.schema import SLURM_NAME, SLURM_NAMES, SLURM_TIME, AlertsConfig
from bigscience_ops.typedyaml import build, documented, read_yaml
from bigscience_ops.untrusted import kind_of

PERIODS = {"hourly": 3600, "daily": 86400}


class CronError(BsopsError):
    """A cron folder, its settings or a runner cannot be used."""


@dataclass(frozen=True)
class CronSettings:
    """cron/cron.yaml: where the runner jobs run and who hears about failures."""

    partition: str | None = documented(None, "--partition of the runner jobs", charset=SLURM_NAMES)
    account: str | None = documented(None, "--account of the runner jobs", charset=SLURM_NAME)
    qos: str | None = documented(None, "--qos of the runner jobs", charset=SLURM_NAME)
    time: str = documented("00:20:00", "--time of one runner job", charset=SLURM_TIME)
    name_prefix: str = documented("bsops-cron", "runner job names are <prefix>-hourly and <prefix>-daily",
                                  charset=SLURM_NAME)
    env_setup: list[str] = documented(factory=list, doc="shell lines that put bsops on PATH (trusted shell code, "
                                      "one line per item)", trusted_shell_line=True)
    alerts: AlertsConfig = documented(factory=AlertsConfig, doc="who is told when a submission fails")


def default_cron_dir(env: dict[str, str] | None = None) -> Path:
    """The user's cron folder: $BSOPS_CRON_DIR, else $XDG_DATA_HOME/bsops/cron, else ~/.local/share/bsops/cron."""
    env = os.environ if env is None else env
    if env.get("BSOPS_CRON_DIR"):
        return Path(env["BSOPS_CRON_DIR"]).expanduser()
    data = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return Path(data).expanduser() / "bsops" / "cron"


def _my_jobs(timeout: float = slurm.DEFAULT_TIMEOUT_S) -> list:
    """This user's queued jobs (a SLURM_CONF naming a missing file fails at once: slurm.run checks it)."""
    return slurm.query_jobs(users=[_me()], timeout=timeout)


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


def folder_scripts(cron_dir: Path, period: str) -> list[Path]:
    """The job scripts of cron.<period>/: each *.slurm; run_pass reads each one's job name as sbatch does
    (slurm.script_job_name), and reports and skips one it cannot read or that is not a plain file
    (script_problem)."""
    return sorted((Path(cron_dir) / f"cron.{period}").glob("*.slurm"))


def script_problem(script: Path) -> str | None:
    """Why `script` is not run (None: it is a plain file): a symbolic link (whatever it points at: sbatch would
    submit the target, which anyone who can write the folder can aim anywhere), a FIFO (sbatch would wait on it),
    a folder or a device. Read with lstat, a link never followed."""
    try:
        if stat.S_ISREG(os.lstat(script).st_mode):
            return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return (f"is {kind_of(script)}, not a plain file; allowed: a regular job script in the folder (a cron job is "
            "never run through a link)")


def shown_name(path: Path | str) -> str:
    """A file's name or path for a terminal, a log line or an alert: its control characters (a line break in the
    name, an escape sequence) shown as visible escapes (run/log.for_terminal)."""
    return runlog.for_terminal(str(path))


@dataclass(frozen=True)
class RunnerScript:
    path: Path
    text: str

    def as_job(self, kind: str = "runner") -> ScriptJob:
        """The script as every executor takes it (launch/jobs.py), named as sbatch reads it; its cron folder's logs/
        made (Slurm does not make its --output's folder)."""
        return ScriptJob(self.path.stem, self.path, self.text, folders=(self.path.parent.parent / "logs",), kind=kind)


def render_runner(cron_dir: Path, period: str, settings: CronSettings, period_seconds: int | None = None) -> RunnerScript:
    """The runner job script for one period (period_seconds overrides the period, for tests)."""
    check_period(period)
    cron_dir = Path(cron_dir).resolve()
    name = runner_name(period, settings.name_prefix)
    path = cron_dir / "runners" / f"{name}.slurm"
    where = f"{cron_dir / 'cron.yaml'}"
    rendering.slurm_options(where, {"job-name": name})
    optional = rendering.slurm_options(where, {opt: getattr(settings, opt) or None for opt in ("partition", "account", "qos")})
    text = rendering.environment().get_template("cron-runner.slurm.j2").render(
        name=name, period=period, seconds=period_seconds or PERIODS[period], time=settings.time,
        optional=optional, env_setup=[rendering.Raw(line) for line in settings.env_setup],
        cron_dir=str(cron_dir), script=str(path), output=rendering.output_option(cron_dir / "logs", "%x-%j.out"),
    )
    return RunnerScript(path, text)


def write_runner(runner: RunnerScript) -> Path:
    """Write a runner or an hourly job's script (and its folder's logs/), as the executors write a job."""
    return write_files(runner.as_job())


def log_line(now: dt.datetime, text: str) -> str:
    """One line of a cron log (and of `bsops cron run`'s output): a file's name or sbatch's answer in `text` shows
    its control characters escaped (run/log.for_terminal), so it stays one line and runs nothing on a terminal."""
    return f"[{now.strftime('%Y-%m-%d %H:%M:%S')}] {runlog.for_terminal(text)}"


@dataclass
class RunReport:
    """What one runner pass did; `lines` go to cron/logs/cron.<period>.log."""

    period: str
    rearmed_job: str | None = None
    submitted: list[tuple[str, str]] = field(default_factory=list)  # (job name, job id)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (job name, why)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (what, error): a script, squeue, a chain
    lines: list[str] = field(default_factory=list)


def _me() -> str:
    return getpass.getuser()


def _queued(jobs: list, name: str, exclude_id: str | None = None) -> list:
    """The queued records of the job named `name` among `jobs` (its handle's), but job `exclude_id`."""
    return [j for j in SlurmJob(name).records(jobs) if j.job_id != exclude_id]


def run_pass(cron_dir: Path, period: str, runner: Path | None, period_seconds: int | None = None,
             now: dt.datetime | None = None, self_job_id: str | None = None, rearmed_job: str | None = None,
             rearmed_for: str | None = None, rearm_error: str | None = None) -> RunReport:
    """One runner pass, after the job script re-armed the chain (`rearmed_job`) or failed to
    (`rearm_error`): submit the folder's jobs not already queued, keep exactly one next runner,
    check the other chains, and log and email every failure (a failing squeue included).

    `runner` None means scrontab runs the schedule: nothing is re-armed and no chain is checked.
    """
    check_period(period)
    now = now or dt.datetime.now().astimezone()
    settings = load_settings(cron_dir)
    name = runner_name(period, settings.name_prefix)
    report = RunReport(period, rearmed_job=rearmed_job)

    def fail(what: str, error: str) -> None:
        report.failed.append((what, error))
        report.lines.append(log_line(now, f"***ALERT: cron.{period}: {what} failed: {error}***"))

    if rearmed_job:
        report.lines.append(log_line(now, f"re-armed {name} as job {rearmed_job} for {rearmed_for or '?'}"))
    if rearm_error:
        fail("re-arming", " ".join(rearm_error.split()))
    try:
        jobs = _my_jobs()
    except slurm.SlurmError as exc:
        fail("squeue", slurm.said(exc))
        jobs = None
    note = slurm.unparsed_note(jobs) if jobs is not None else None
    if note is not None:
        report.lines.append(log_line(now, note))
    if jobs is not None and runner is not None:
        _keep_one_next_runner(report, jobs, name, runner, period_seconds or PERIODS[period], now, self_job_id, fail)
    if jobs is not None:
        _submit_folder(report, cron_dir, period, jobs, now, fail)
        if runner is not None:
            for state in chains(cron_dir, jobs=jobs, now=now):
                if state.name != name and state.installed:
                    for problem in state.problems:
                        fail(f"chain {state.name}", problem)
    if report.failed:
        report.lines.append(log_line(now, _email_failures(settings.alerts, period, report)))
    report.lines.append(log_line(now, f"pass done: {len(report.submitted)} submitted, {len(report.skipped)} "
                                      f"skipped, {len(report.failed)} failed"))
    runlog.append_lines(log_path(cron_dir, period), report.lines)  # a FIFO there: refused, never waited on
    return report


def _keep_one_next_runner(report: RunReport, jobs: list, name: str, runner: Path, seconds: int,
                          now: dt.datetime, self_job_id: str | None, fail) -> None:
    """Exactly one runner waits for the next period: re-arm here when the script could not, cancel extras."""
    waiting = [j for j in _queued(jobs, name, exclude_id=self_job_id) if j.state != "RUNNING"]
    if report.rearmed_job is None and not waiting:
        when = slurm.begin_arg(next_boundary(now, seconds))
        try:
            report.rearmed_job = submit(runner, slurm.SbatchOptions(begin=when), name=name).job_id
        except (BsopsError, ValueError) as exc:
            fail("re-arming again", slurm.said(exc))
            return
        report.lines.append(log_line(now, f"re-armed {name} as job {report.rearmed_job} for {when}"))
        return
    if not waiting:  # the runner re-armed has started already, and has not yet re-armed in turn
        return
    # Keep the runner this pass re-armed while it waits. Once it has started (a pass that outlasts the period's
    # boundary), the runner that one re-armed waits: keep the oldest, which is that one unless a chain forked.
    ids = [j.job_id for j in waiting]
    keep = report.rearmed_job if report.rearmed_job in ids else min(waiting, key=lambda j: int(j.array_job_id)).job_id
    extras = [j.job_id for j in waiting if j.job_id != keep]
    if extras:
        try:
            slurm.cancel(extras)
            report.lines.append(log_line(now, f"cancelled extra {name} job(s) {', '.join(extras)}: one chain only"))
        except slurm.SlurmError as exc:
            fail("cancelling extra runners", slurm.said(exc))


def _submit_folder(report: RunReport, cron_dir: Path, period: str, jobs: list, now: dt.datetime, fail) -> None:
    scripts = folder_scripts(cron_dir, period)
    for script in scripts:
        problem = script_problem(script)
        if problem is not None:  # a link, a FIFO or a folder: refused by name, the others still run
            fail(f"reading {shown_name(script)}", problem)
            continue
        try:
            name = slurm.script_job_name(script)
        except (ValueError, OSError) as exc:  # one bad script is reported and skipped, never ends the pass
            fail(f"reading {shown_name(script)}", slurm.said(exc))
            continue
        queued = _queued(jobs, name)
        if queued:
            why = f"previous instance {queued[0].job_id} still {queued[0].state.lower()}"
            report.skipped.append((name, why))
            report.lines.append(log_line(now, f"skipped {shown_name(script.name)} ({name}): {why}"))
            continue
        try:
            job_id = run_job(ScriptJob(name, script, kind=period), SlurmScripts()).job_id or ""  # written already
        except (BsopsError, ValueError) as exc:
            fail(f"submitting {shown_name(script)}", slurm.said(exc))
            continue
        report.submitted.append((name, job_id))
        report.lines.append(log_line(now, f"submitted {shown_name(script.name)} ({name}) as job {job_id}"))
    if not scripts:
        report.lines.append(log_line(now, f"cron.{period}/ has no job scripts"))


def log_path(cron_dir: Path, period: str) -> Path:
    return Path(cron_dir) / "logs" / f"cron.{period}.log"


def _email_failures(alerts: AlertsConfig, period: str, report: RunReport) -> str:
    from bigscience_ops.ops.tell.quoting import quote_untrusted as q  # a script's name and output: never a link

    failures = "\n".join(f"- {q(what, mark=False)}: {q(error, 2000, mark=False)}" for what, error in report.failed)
    body = (f"The {period} cron runner hit {len(report.failed)} problem(s):\n{failures}\n\n"
            f"The runner was re-armed before anything else ran, so it tries again next {period} run; fix the "
            f"script or the cluster problem named above. `bsops cron status` shows the chains.")
    first = q(report.failed[0][0], mark=False)  # a script's path: its name may look like a host (never a link)
    return channels.send_alert(alerts, f"[bsops] cron.{period}: {first} failed", body)


@dataclass(frozen=True)
class ChainState:
    name: str
    jobs: list  # queued runner jobs of this chain
    problems: tuple[str, ...] = ()
    """Why the chain needs a person: not queued, forked, or it missed its period."""
    installed: bool = True
    """Its runner script exists (`bsops cron install` wrote it)."""

    def describe(self) -> str:
        parts = []
        for job in self.jobs:
            when = job.start_time.strftime("%Y-%m-%d %H:%M:%S") if job.start_time else "unknown"
            if job.state == "RUNNING":
                parts.append(f"job {job.job_id} running since {when}")
            else:
                parts.append(f"job {job.job_id} {job.state.lower()} ({job.reason}), next run {when}")
        text = f"{self.name}: " + ("; ".join(parts) if parts else "no runner queued")
        return text + "".join(f" ***ALERT: {p}***" for p in self.problems)


RUNNER_BYTES = 1 << 16
"""The most of a runner script read for its period (the script `render_runner` writes is about 2 KB)."""


def runner_period(cron_dir: Path, period: str, prefix: str) -> int:
    """The period a chain was installed with (--period-seconds in its runner script), else the nominal one."""
    path = Path(cron_dir) / "runners" / f"{runner_name(period, prefix)}.slurm"
    text = (runlog.head(path, RUNNER_BYTES) or b"").decode("utf-8", errors="replace")  # a FIFO: never waited on
    match = re.search(r"--period-seconds (\d+)", text)
    return int(match.group(1)) if match else PERIODS[period]


def chains(cron_dir: Path, jobs: list | None = None, now: dt.datetime | None = None,
           timeout: float = slurm.DEFAULT_TIMEOUT_S) -> list[ChainState]:
    """Each installed runner chain and what is wrong with it; queries Slurm when `jobs` is None.

    A chain is in trouble when no runner is queued, when two are waiting (a fork), or when it
    missed its period: its waiting runner is more than a period past its start time, or its last
    pass (the log's time) is more than two periods old.
    """
    prefix = load_settings(cron_dir).name_prefix
    jobs = _my_jobs(timeout) if jobs is None else jobs
    now = (now or dt.datetime.now().astimezone()).astimezone()
    states = []
    for period in PERIODS:
        name = runner_name(period, prefix)
        installed = (Path(cron_dir) / "runners" / f"{name}.slurm").exists()
        queued = _queued(jobs, name)
        seconds = runner_period(cron_dir, period, prefix)
        problems = []
        if not queued:
            problems.append(f"{name} is not queued: the {period} jobs no longer run (run `bsops cron install`)"
                            if installed else f"{name} is not installed (run `bsops cron install`)")
        waiting = [j for j in queued if j.state != "RUNNING"]
        if len(waiting) > 1:
            problems.append(f"{name} has {len(waiting)} runners waiting ({', '.join(j.job_id for j in waiting)}): "
                            f"cancel all but one")
        for job in waiting:
            start = job.start_time.astimezone() if job.start_time else None
            if start is not None and (now - start).total_seconds() > seconds:
                problems.append(f"{name} missed its period: job {job.job_id} was due at {start:%Y-%m-%d %H:%M:%S} "
                                f"and still waits ({job.reason})")
        log = log_path(cron_dir, period)
        if installed and log.exists():
            last = dt.datetime.fromtimestamp(log.stat().st_mtime).astimezone()
            if (now - last).total_seconds() > 2 * seconds:
                problems.append(f"{name} missed its period: its last pass ended at {last:%Y-%m-%d %H:%M:%S} "
                                f"({log}), more than two periods ago")
        states.append(ChainState(name, queued, tuple(problems), installed))
    return states


def install(cron_dir: Path, period_seconds: int | None = None, periods: tuple[str, ...] = tuple(PERIODS),
            dry_run: bool = False) -> list[str]:
    """Write the runners and submit each whose chain is not already queued; returns what was done (`dry_run`: what
    would be, with nothing written or submitted; the queue is read)."""
    settings = load_settings(cron_dir)
    if not dry_run:
        for period in periods:
            (Path(cron_dir) / f"cron.{period}").mkdir(parents=True, exist_ok=True)
    jobs = _my_jobs()
    done = []
    executor = SlurmScripts()
    for period in periods:
        runner = render_runner(cron_dir, period, settings, period_seconds)
        job = runner.as_job()
        queued = _queued(jobs, job.name)
        if dry_run:
            done.append(f"{job.name}: dry run, nothing written or submitted: would write {runner.path} and " + (
                f"leave job {queued[0].job_id}, already queued" if queued else "submit it"))
            continue
        path = executor.write(job)  # written again, queued or not: the chain's next run reads this one
        if queued:
            done.append(f"{job.name}: already queued as job {queued[0].job_id}; left as it is")
            continue
        job_id = executor.start(job, path).job_id
        done.append(f"{job.name}: submitted {path} as job {job_id}")
    return done
