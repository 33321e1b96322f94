"""`bsops status`: the on-call check."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    TEXT, FiniteFloat, SafePath, dry_run_option, echo_detail, echo_json, json_option, main, open_run_saying,
    overrides_argument, run_option, trainings_option, verbose_option,
)
from bigscience_ops.run import log as runlog
from bigscience_ops.schema import AlertsConfig


@dataclasses.dataclass(frozen=True)
class ByName:
    """A job watched by its name alone, with no experiment: --job-name and --log (refused with a run)."""

    job_name: str | None = None
    log_path: Path | None = None


@dataclasses.dataclass(frozen=True)
class Telling:
    """What the check does besides printing: email (--no-email: not), log and keep its alert state (--alert-state:
    where), or none of it (--dry-run)."""

    no_email: bool = False
    alert_state: Path | None = None
    dry_run: bool = False


class _StatusCommand(click.Command):
    """Hands the command the options that describe one thing as one value (ByName, Telling)."""

    def invoke(self, ctx: click.Context) -> object:
        for name, group in (("by_name", ByName), ("telling", Telling)):
            ctx.params[name] = group(**{f.name: ctx.params.pop(f.name) for f in dataclasses.fields(group)})
        return super().invoke(ctx)


@main.command("status", cls=_StatusCommand)
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--job-name", type=TEXT, default=None,
              help="Without EXP: the Slurm job name to watch (compared whole, any length); not a field: a run is "
                   "watched under the job name it recorded.")
@click.option("--log", "log_path", type=SafePath(dir_okay=False, path_type=Path), default=None,
              help="With --job-name: a main_log.txt checked for progress; the watchdog's lines go to watchdog.log "
                   "beside it. Not a field: a run's log is the one it recorded.")
@click.option("--cron-dir", type=SafePath(file_okay=False, path_type=Path), default=None,
              help="Also check the cron runner chains of this folder (alert when one is gone or late).")
@click.option("--user", "users", type=TEXT, multiple=True,
              help="Also watch this user's jobs (repeatable); with neither --user nor slurm.group: every user's.")
@click.option("--contact", type=TEXT, default=None,
              help="Who the ALERT line says to alert (default: the watchdog's own wording).")
@click.option("--timeout", type=FiniteFloat(0, 3600, low_open=True, unit="seconds"), default=60.0, show_default=True,
              help="Seconds to wait for each Slurm query (squeue, sacct, the cron chains' squeue) before "
                   "reporting Slurm as unreachable.")
@click.option("--no-email", is_flag=True, help="Print (and log) only; send no email and no webhook message.")
@click.option("--alert-state", type=SafePath(dir_okay=False, path_type=Path), default=None,
              help="Cooldown state file (default: .bsops-alerts.json next to --log; in $XDG_STATE_HOME/bsops while "
                   "that folder cannot be written).")
@json_option
@dry_run_option
@overrides_argument
@verbose_option
def status_command(exp: str | None, run: Path | None, trainings_dir: Path | None, by_name: ByName,
                   cron_dir: Path | None, users: tuple[str, ...], contact: str | None, timeout: float,
                   telling: Telling, as_json: bool, overrides: tuple[str, ...]) -> None:
    """Is EXP (or --job-name) running or scheduled? Prints one line per job and ALERT lines.

    With EXP (an experiment, or a run folder, or --run), the run is read as it recorded itself: its job name,
    main_log.txt and slurm.group; the alert settings (alerts.*: recipients, SMTP server, webhook, stall limit,
    cooldown, training health) are its experiment file's today, changed by SECTION.KEY=VALUE overrides
    (`bsops status tiny alerts.stall_minutes=30 'alerts.email_to=[me@example.org]'`); --job-name and --log are for a
    job watched by its name alone, and refused with a run. A record that cannot be read is alerted on, and the run watched as its experiment file says
    today. With EXP the run folder also tells a finished
    training (healthy, announced once) from one that ended without finishing, and the log's recent iteration lines
    are checked for training health (alerts.health: NaN, loss spikes, grad-norm explosions, fp16 loss-scale
    collapse, skipped steps, slow nodes). With --job-name alone, nothing is sent: the lines are printed and logged.

    A run launched with `bsops launch --local` is watched through its processes (those holding the run's lock:
    its launcher, its task, its trainers, named), never the Slurm queue. A task pending on nodes that only an
    administrator brings back (down, drained, reserved, not available) alerts once it has waited
    alerts.blocked_minutes; a checkpoint the trainer set aside alerts once. Where the log's folder cannot be written,
    the alert state and the lines go to $XDG_STATE_HOME/bsops (~/.local/state/bsops), and that is an alert too
    (docs/ON-CALL-FAULTS.md).
    Exit code 0 healthy, 1 alert, 2 Slurm could not be queried or an alert email failed.
    """
    from bigscience_ops import slurm
    from bigscience_ops.ops.tell import channels
    from bigscience_ops.ops.watch import watchdog
    from bigscience_ops.ops.alerts import DEFAULT_CONTACT

    job_name, log_path = by_name.job_name, by_name.log_path
    no_email, alert_state, dry_run = telling.no_email, telling.alert_state, telling.dry_run
    failures: list[slurm.SlurmError] = []

    def query(**kwargs):  # squeue; what failed is kept for --verbose
        try:
            return slurm.query_jobs(**kwargs)
        except slurm.SlurmError as exc:
            failures.append(exc)
            raise

    experiment = outbox = state = None
    if (exp is not None or run is not None) and (job_name is not None or log_path is not None):
        given = " and ".join(f"{flag} {value}" for flag, value in (("--job-name", job_name), ("--log", log_path))
                             if value is not None)
        raise click.UsageError(
            f"got {given} with a run ({exp or run}); allowed: --job-name and --log without EXP or --run (a job "
            "watched by its name alone), or a run, watched under the job name and log it recorded (a run not yet "
            "launched: its slurm.job_name and paths.logs, which SECTION.KEY=VALUE sets)")
    if exp is not None or run is not None:
        from bigscience_ops.ops.watch import lifecycle

        opened = open_run_saying(exp, run, trainings_dir, overrides=overrides, fallback=True, err=as_json)
        experiment = opened.experiment  # the run as recorded, told through today's channels (never a record's)
        if opened.settings_problem is not None and not no_email and not dry_run:
            click.echo(f"alerts: not sent: {opened.settings_problem}", err=True)
        state = lifecycle.run_state(experiment, timeout=timeout)
        if opened.record_problem is not None:  # a torn record: watched as the file says, and alerted on
            state = dataclasses.replace(state, problems=(*state.problems, opened.record_problem))
        outbox = None if no_email or dry_run else channels.outbox_from_alerts(experiment.alerts)
    elif overrides:
        raise click.UsageError(f"got {' '.join(overrides)} without an experiment; allowed: SECTION.KEY=VALUE after EXP")
    slurm_cfg, alerts = (experiment.slurm, experiment.alerts) if experiment else (None, None)
    job_name = job_name if experiment is None else slurm_cfg.job_name
    if job_name is None:
        raise click.UsageError("give an experiment (EXP) or --job-name")
    settings = watchdog.WatchSettings(
        job_name=job_name, users=users, group=slurm_cfg and slurm_cfg.group,
        log_path=log_path if experiment is None else runlog.main_log(experiment.paths.logs),
        stall_minutes=alerts and alerts.stall_minutes, contact=contact or DEFAULT_CONTACT, outbox=outbox,
        state_path=alert_state, cooldown_minutes=alerts.cooldown_minutes if alerts else AlertsConfig.cooldown_minutes,
        experiment=experiment.name if experiment else None, timeout=timeout, cron_dir=cron_dir,
        health=alerts and alerts.health, dry_run=dry_run)
    result = watchdog.watch(settings, run=state, query=query)
    if as_json:
        echo_json({"job_name": job_name, "experiment": settings.experiment, "exit_code": result.exit_code,
                   "healthy": result.report.healthy, "finished_at": result.report.finished_at,
                   "alerts": [{"condition": a.condition, "message": a.message} for a in result.report.alerts],
                   "sent": [{"kind": n.kind, "subject": n.subject, "channels": list(n.channels), "error": n.error}
                            for n in result.notices],
                   "lines": list(result.lines), "dry_run": dry_run})
    for line in result.lines if not as_json else ():
        click.echo(line)
    if dry_run and not as_json:
        told = (f"tell {', '.join(alerts.email_to)} of {len(result.report.alerts)} alert(s) as their cooldown allows, "
                if alerts is not None and alerts.email_to and result.report.alerts and not no_email else "")
        click.echo(f"dry run: nothing sent, logged or written; would {told}append these lines to watchdog.log"
                   f"{' beside ' + str(settings.log_path) if settings.log_path else ''} and keep the alert state")
    for failure in failures:
        echo_detail(failure)
    sys.exit(result.exit_code)
