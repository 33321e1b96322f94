"""`bsops cron ...`: the self-respawning runner chains and the jobs they run."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    EXIT_PROBLEMS,
    TEXT,
    SafePath,
    cron_dir_option,
    default_cron_dir,
    dry_run_option,
    echo_json,
    json_option,
    load_experiment,
    main,
    trainings_option,
    verbose_option,
)


@main.group()
def cron() -> None:
    """Cron for clusters without crontab: self-respawning Slurm jobs over cron.hourly/ and cron.daily/.

    The cron folder is yours: --cron-dir, else $BSOPS_CRON_DIR, else $XDG_DATA_HOME/bsops/cron, else
    ~/.local/share/bsops/cron. The runners and jobs name it, so they keep the folder they were installed with.
    """


def _cron_dir(cron_dir: Path | None) -> Path:
    """--cron-dir, else the default, which is then named on stderr (the user may not know where it is)."""
    if cron_dir is not None:
        return cron_dir
    chosen = default_cron_dir()
    click.echo(f"cron folder: {chosen} (the default; --cron-dir or $BSOPS_CRON_DIR chooses another)", err=True)
    return chosen


def _kinds(jobs: str | None) -> list[str] | None:
    """--jobs as a list of hourly_registry.JOBS, None when not given (a usage error names the value and the allowed
    kinds)."""
    from bigscience_ops.ops import hourly_registry

    if jobs is None:
        return None
    kinds = [j.strip() for j in jobs.split(",") if j.strip()]
    if not kinds or [k for k in kinds if k not in hourly_registry.JOBS]:
        raise click.BadParameter(f"got {jobs!r}; allowed: a comma-separated list of {', '.join(hourly_registry.JOBS)}",
                                 param_hint="--jobs")
    return kinds


@cron.command("install")
@cron_dir_option
@click.option("--period-seconds", type=click.IntRange(min=1, max=10**7), default=None,
              help="Re-arm every N seconds instead of hourly/daily (for testing a chain).")
@click.option("--scrontab", "use_scrontab", is_flag=True,
              help="Merge the runs into your scrontab as one marked block instead of runner jobs.")
@dry_run_option
@verbose_option
def cron_install(cron_dir: Path | None, period_seconds: int | None, use_scrontab: bool, dry_run: bool) -> None:
    """Submit the hourly and daily runner jobs, unless their chains are already queued."""
    from bigscience_ops.ops.cron import runner as cronlib

    cron_dir = _cron_dir(cron_dir)
    if use_scrontab:
        from bigscience_ops.ops.cron import scrontab

        if dry_run:
            block = scrontab.block(cron_dir, cronlib.load_settings(cron_dir))
            click.echo(f"dry run: nothing written; would merge into your scrontab (its other entries kept):\n{block}",
                       nl=False)
            return
        path, installed = scrontab.install(cron_dir)
        click.echo(f"wrote {path}" + ("; merged into your scrontab (your other entries are kept)" if installed else
                                      "; this machine has no scrontab client: on a login node, add this block "
                                      "with `scrontab -e`"))
        return
    for line in cronlib.install(cron_dir, period_seconds, dry_run=dry_run):
        click.echo(line)


@cron.command("status")
@cron_dir_option
@json_option
@verbose_option
def cron_status(cron_dir: Path | None, as_json: bool) -> None:
    """Show each runner chain and its next run; exit 1 when a chain is missing, forked or missed its period."""
    from bigscience_ops.ops.cron import runner as cronlib

    states = cronlib.chains(_cron_dir(cron_dir))
    if as_json:
        echo_json([{"chain": state.name, "installed": state.installed, "problems": list(state.problems),
                    "jobs": [{"job_id": job.job_id, "state": job.state, "reason": job.reason,
                              "start_time": job.start_time.timestamp() if job.start_time else None}
                             for job in state.jobs]} for state in states])
    for state in states if not as_json else ():
        click.echo(state.describe())
    if any(state.problems for state in states):
        sys.exit(EXIT_PROBLEMS)


@cron.command("add")
@click.argument("exp", type=TEXT)
@click.option("--jobs", type=TEXT, default=None, metavar="LIST",
              help="Comma-separated hourly jobs to write (`bsops cron jobs` lists them): status (the watchdog), "
                   "hub-sync, backup, eval (the eval scheduler: `bsops eval next EXP`, written only when named). "
                   "Default: every job whose settings EXP has (hub repos, backup.dest), the opt-in ones left out.")
@cron_dir_option
@trainings_option
@dry_run_option
def cron_add(exp: str, jobs: str | None, cron_dir: Path | None, trainings_dir: Path | None, dry_run: bool) -> None:
    """Render EXP's hourly jobs (status watchdog, Hub sync, checkpoint backup, eval scheduler) into cron.hourly/.

    Without --jobs, a job whose settings EXP lacks is left out, and the command says which and why; the eval
    scheduler, which submits eval jobs of its own, is written only when --jobs names it."""
    from bigscience_ops.config.files import experiment_path, outputs_folder
    from bigscience_ops.ops.cron import runner as cronlib
    from bigscience_ops.ops import hourly_registry

    given = _kinds(jobs)
    cron_dir = _cron_dir(cron_dir)
    settings = cronlib.load_settings(cron_dir)
    experiment = load_experiment(exp, trainings_dir)
    kinds = given if given is not None else hourly_registry.configured(experiment)
    if given is None:
        for kind in hourly_registry.JOBS:
            if kind in kinds:
                continue
            missing = hourly_registry.missing_setting(kind, experiment)
            if missing is None:  # an opt-in job EXP has the settings for
                click.echo(f"not adding the {kind} job: it is written only when asked (--jobs "
                           f"{','.join([*kinds, kind])})")
                continue
            field, what = missing
            click.echo(f"not adding the {kind} job: {field} is not set ({what})")
    path = experiment_path(exp, trainings_dir)
    folder, workdir = path.parent, outputs_folder(path)  # the jobs resolve EXP's outputs as this command did
    rendered = [hourly_registry.render(kind, cron_dir, experiment, folder, settings, workdir) for kind in kinds]
    for job in rendered:  # all rendered before any is written: a refused value leaves the folder as it was
        click.echo(f"dry run: nothing written; would write {job.path}" if dry_run
                   else f"wrote {cronlib.write_runner(job)}")
    if not (cron_dir / "runners").is_dir():
        click.echo(f"no runner chain in {cron_dir} yet: `bsops cron install` (with the same folder) starts it")


@cron.command("jobs")
@json_option
def cron_jobs(as_json: bool) -> None:
    """List the hourly jobs `bsops cron add --jobs` takes: name, period, time limit, what it is and what it runs."""
    from bigscience_ops.ops import hourly_job, hourly_registry

    listed = []
    for job in hourly_registry.JOBS.values():
        runs = " ".join(["bsops", job.command, "EXP", *("CRON_DIR" if a == hourly_job.CRON_DIR else a for a in job.arguments)])
        listed.append({"name": job.name, "period": job.period, "time": job.time, "opt_in": job.opt_in,
                       "what": job.what, "runs": runs})
        if as_json:
            continue
        click.echo(f"{job.name:<10} {job.period:<7} {job.time:<9} {'opt-in ' if job.opt_in else ''}{job.what}: {runs}")
    if as_json:
        echo_json(listed)


@cron.command("list")
@cron_dir_option
@json_option
def cron_list(cron_dir: Path | None, as_json: bool) -> None:
    """List the jobs of the cron folder: experiment, job kind, period and file.

    A file's name is shown with its control characters escaped (a line break in it is `\\x0a`); a *.slurm entry
    that is not a plain file (a link, a FIFO, a folder) is listed with why `bsops cron run` does not run it."""
    from bigscience_ops.ops import hourly_registry
    from bigscience_ops.ops.cron import runner as cronlib

    found = hourly_registry.installed(_cron_dir(cron_dir))
    if as_json:
        echo_json([{"experiment": job.experiment, "kind": job.kind, "period": job.period, "path": str(job.path),
                    "not_run": cronlib.script_problem(job.path)} for job in found])
        return
    for job in found:
        problem = cronlib.script_problem(job.path)
        refused = f"  (not run: it {problem})" if problem else ""
        click.echo(f"{job.experiment or '-':<24} {job.kind or 'other':<9} {job.period:<7} "
                   f"{cronlib.shown_name(job.path)}{refused}")
    if not found:
        click.echo("no jobs installed (bsops cron add EXP writes them)")


@cron.command("remove")
@click.argument("exp", type=TEXT)
@click.option("--jobs", type=TEXT, default=None, metavar="LIST",
              help="Comma-separated jobs to remove (`bsops cron jobs` lists them; default: all of EXP's).")
@cron_dir_option
@dry_run_option
def cron_remove(exp: str, jobs: str | None, cron_dir: Path | None, dry_run: bool) -> None:
    """Remove EXP's jobs that `bsops cron add` wrote (other files of the folder are left alone).

    Exits 1 when there was none to remove."""
    from bigscience_ops.ops import hourly_registry

    kinds = _kinds(jobs) or list(hourly_registry.JOBS)
    cron_dir = _cron_dir(cron_dir)
    if dry_run:
        removed = [job.path for job in hourly_registry.installed(cron_dir) if job.experiment == exp and job.kind in kinds]
    else:
        removed = hourly_registry.remove(cron_dir, exp, kinds)
    for path in removed:
        click.echo(f"dry run: nothing removed; would remove {path}" if dry_run else f"removed {path}")
    if not removed:
        click.echo(f"no {'/'.join(kinds)} job of {exp} in {cron_dir} (bsops cron list shows what is there)")
        sys.exit(EXIT_PROBLEMS)


@cron.command("run", hidden=True)
@click.argument("period", type=click.Choice(["hourly", "daily"]))
@cron_dir_option
@click.option("--runner", type=SafePath(dir_okay=False, path_type=Path), default=None,
              help="This runner's script, re-submitted for the next period first.")
@click.option("--period-seconds", type=click.IntRange(min=1, max=10**7), default=None)
@click.option("--no-rearm", is_flag=True, help="Do not re-arm (scrontab runs the schedule).")
@click.option("--rearmed", type=TEXT, default=None, help="The job id the runner script re-armed the chain as.")
@click.option("--rearmed-for", type=TEXT, default=None, help="The --begin of that job.")
# Not TEXT: it carries sbatch's answer, several lines; run_pass joins them into one before logging.
@click.option("--rearm-error", default=None, help="Why the runner script could not re-arm (logged and emailed).")
def cron_run(period: str, cron_dir: Path | None, runner: Path | None, period_seconds: int | None, no_rearm: bool,
             rearmed: str | None, rearmed_for: str | None, rearm_error: str | None) -> None:
    """One runner pass after the script re-armed: submit every job of the folder not already queued.

    Only plain files are submitted: a *.slurm that is a link, a FIFO or a folder is refused by name (logged and
    emailed as a failure), and the other jobs still run."""
    from bigscience_ops import slurm
    from bigscience_ops.ops.cron import runner as cronlib

    report = cronlib.run_pass(cron_dir or default_cron_dir(), period, None if no_rearm else runner,
                              period_seconds, self_job_id=slurm.TaskEnv.from_env().job_id, rearmed_job=rearmed,
                              rearmed_for=rearmed_for, rearm_error=rearm_error)
    for line in report.lines:  # each made one line without a control character (cron.log_line)
        click.echo(line)
    if report.failed:
        sys.exit(EXIT_PROBLEMS)
