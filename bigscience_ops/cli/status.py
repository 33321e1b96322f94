"""`bsops status`: the on-call check."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bigscience_ops.cli.base import (
    TEXT, FiniteFloat, SafePath, echo_detail, echo_run_folder, load_experiment, main, open_run, resolve, run_option,
    trainings_option, verbose_option,
)

if TYPE_CHECKING:
    from bigscience_ops.ops.tell.channels import Outbox


@main.command("status")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--job-name", type=TEXT, default=None, help="The Slurm job name to watch (compared whole, any length).")
@click.option("--log", "log_path", type=SafePath(dir_okay=False, path_type=Path), default=None,
              help="The run's main_log.txt, checked for progress; the watchdog's lines go to watchdog.log beside it.")
@click.option("--cron-dir", type=SafePath(file_okay=False, path_type=Path), default=None,
              help="Also check the cron runner chains of this folder (alert when one is gone or late).")
@click.option("--stall-minutes", type=FiniteFloat(0, 525_600, low_open=True, unit="minutes"), default=None,
              help="Alert when a RUNNING job's log has had no new iteration line for this long (needs --log).")
@click.option("--group", type=TEXT, default=None,
              help="Watch the jobs of every user in this Unix group (default: all users).")
@click.option("--user", "users", type=TEXT, multiple=True, help="Watch this user's jobs (repeatable).")
@click.option("--contact", type=TEXT, default=None,
              help="Who the ALERT line says to alert (default: the watchdog's own wording).")
@click.option("--timeout", type=FiniteFloat(0, 3600, low_open=True, unit="seconds"), default=60.0, show_default=True,
              help="Seconds to wait for each Slurm query (squeue, sacct, the cron chains' squeue) before "
                   "reporting Slurm as unreachable.")
@click.option("--no-email", is_flag=True, help="Print (and log) only; send no email.")
@click.option("--email-to", type=TEXT, multiple=True, help="Alert recipient (repeatable); without one no email is sent.")
@click.option("--email-from", type=TEXT, default=None, help="Sender address (default: bsops@<this host>).")
@click.option("--smtp-host", type=TEXT, default="localhost", show_default=True)
@click.option("--smtp-port", type=click.IntRange(1, 65535), default=None,
              help="Default: 587 for starttls, 465 for ssl, 25 for none.")
@click.option("--smtp-security", type=click.Choice(["starttls", "ssl", "none"]), default="starttls",
              show_default=True)
@click.option("--smtp-user", type=TEXT, default=None, help="SMTP login; the password is read from --smtp-password-env.")
@click.option("--smtp-password-env", type=TEXT, default=None,
              help="Name of the environment variable holding the password.")
@click.option("--alert-state", type=SafePath(dir_okay=False, path_type=Path), default=None,
              help="Cooldown state file (default: .bsops-alerts.json next to --log).")
@click.option("--cooldown-minutes", type=FiniteFloat(0, 525_600, unit="minutes"), default=None,
              help="Send the same alert at most once per this many minutes (default: alerts.cooldown_minutes, or 60).")
@verbose_option
def status_command(exp: str | None, run: Path | None, trainings_dir: Path | None, job_name: str | None,
                   log_path: Path | None, cron_dir: Path | None, stall_minutes: float | None, group: str | None,
                   users: tuple[str, ...], contact: str | None, timeout: float, no_email: bool,
                   email_to: tuple[str, ...],
                   email_from: str | None, smtp_host: str, smtp_port: int | None, smtp_security: str,
                   smtp_user: str | None, smtp_password_env: str | None, alert_state: Path | None,
                   cooldown_minutes: float) -> None:
    """Is EXP (or --job-name) running or scheduled? Prints one line per job and ALERT lines.

    With EXP, the job name, the run's main_log.txt, the stall limit, the group and the alert
    emails come from the experiment's config; options given explicitly win (a run named by its folder, EXP or
    --run, reads the experiment the run recorded). With EXP the run folder
    also tells a finished training (healthy, announced once) from one that ended without finishing,
    and the log's recent iteration lines are checked for training health (alerts.health: NaN, loss
    spikes, grad-norm explosions, fp16 loss-scale collapse, skipped steps, slow nodes).
    Exit code 0 healthy, 1 alert, 2 Slurm could not be queried or an alert email failed.
    """
    from bigscience_ops import slurm
    from bigscience_ops.ops.tell import channels
    from bigscience_ops.ops.watch import watchdog
    from bigscience_ops.ops.watch.status import DEFAULT_CONTACT

    failures: list[slurm.SlurmError] = []

    def query(**kwargs):  # squeue; what failed is kept for --verbose
        try:
            return slurm.query_jobs(**kwargs)
        except slurm.SlurmError as exc:
            failures.append(exc)
            raise

    experiment_outbox = None
    experiment = None
    state = None
    if exp is not None or run is not None:
        from bigscience_ops.ops.watch import lifecycle
        from bigscience_ops.run.opening import is_run_folder_name

        if run is not None or is_run_folder_name(exp):  # a run named by its folder: as it recorded itself
            experiment = _with_configured_channels(open_run(exp, run, trainings_dir), trainings_dir, email_to)
        else:  # by its experiment: today's alert channels and limits, which the on-call person changes without a launch
            experiment = load_experiment(exp, trainings_dir)
            echo_run_folder(exp, trainings_dir, experiment)
        state = lifecycle.run_state(experiment, timeout=timeout)
        if not email_to and not no_email:  # --email-to replaces the experiment's channels: not even built then
            experiment_outbox = channels.outbox_from_alerts(experiment.alerts)
    slurm_cfg, alerts = (experiment.slurm, experiment.alerts) if experiment else (None, None)
    job_name = resolve(job_name, slurm_cfg and slurm_cfg.job_name)
    if job_name is None:
        raise click.UsageError("give an experiment (EXP) or --job-name")
    given_outbox = None
    if email_to and not no_email:
        given_outbox = _email_outbox(email_to, email_from, smtp_host, smtp_port, smtp_security, smtp_user,
                                     smtp_password_env)
    settings = watchdog.WatchSettings(
        job_name=job_name, users=users, group=resolve(group, slurm_cfg and slurm_cfg.group),
        log_path=resolve(log_path, experiment and Path(experiment.paths.logs) / "main_log.txt"),
        stall_minutes=resolve(stall_minutes, alerts and alerts.stall_minutes),
        contact=resolve(contact or None, None, DEFAULT_CONTACT), outbox=resolve(given_outbox, experiment_outbox),
        state_path=alert_state, cooldown_minutes=resolve(cooldown_minutes, alerts and alerts.cooldown_minutes, 60.0),
        experiment=experiment.name if experiment else None, timeout=timeout, cron_dir=cron_dir,
        health=alerts and alerts.health)
    result = watchdog.watch(settings, run=state, query=query)
    for line in result.lines:
        click.echo(line)
    for failure in failures:
        echo_detail(failure)
    sys.exit(result.exit_code)


def _with_configured_channels(opened, trainings_dir: Path | None, email_to: tuple[str, ...]):
    """The run as recorded, told through its experiment file's channels (run_ref.with_configured_settings); with no
    experiment file to take them from, through --email-to alone (a line says so)."""
    import dataclasses

    from bigscience_ops.run import opening as run_ref
    from bigscience_ops.schema import AlertsConfig

    try:
        return run_ref.with_configured_settings(opened, trainings_dir)
    except run_ref.RunRecordError as exc:
        if not email_to:
            click.echo(f"alerts: not sent: {exc}; pass --email-to to be told", err=True)
        return dataclasses.replace(opened.experiment, alerts=dataclasses.replace(
            AlertsConfig(), stall_minutes=opened.experiment.alerts.stall_minutes,
            cooldown_minutes=opened.experiment.alerts.cooldown_minutes, health=opened.experiment.alerts.health))


def _email_outbox(email_to: tuple[str, ...], email_from: str | None, host: str, port: int | None, security: str,
                  user: str | None, password_env: str | None) -> Outbox:
    """The email channel that --email-to and the --smtp-* options describe, alone: no channel of the experiment's."""
    from bigscience_ops.deadline import this_host
    from bigscience_ops.ops.tell import channels, email

    smtp = email.SmtpSettings(host=host, port=port or email.DEFAULT_PORTS[security], security=security,
                              recipients=email_to, user=user, password_env=password_env)
    return channels.Outbox((email.EmailChannel(smtp),), sender=email_from or f"bsops@{this_host()}")
