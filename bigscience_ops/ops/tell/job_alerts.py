"""An hourly job's run (hub-sync, backup, eval) with its failure told: what `bsops hub-sync --alert`, `bsops backup
--alert` and `bsops eval next --alert` do around their work.

`run_alerting` runs the work, and with `alert` reports the outcome to notify.notify_job (the job-failed alert of
ops/alerts.py, at most once per cooldown, and one recovery when it works again), whose state is the watchdog's
`.bsops-alerts.json` beside the run's main_log.txt (in the user's state folder while that cannot be written, and
the job's output says so: alert_state.place). It prints nothing and exits nothing: it returns the lines to show
and whether the run failed (the work, or a message that could not be sent); the CLI prints them and exits 2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.tell import alert_state, channels, notify
from bigscience_ops.ops.tell.message import NotifyError
from bigscience_ops.redact import env_secrets, scrub
from bigscience_ops.run import log as runlog

if TYPE_CHECKING:
    from bigscience_ops.schema import AlertsConfig


@dataclass(frozen=True)
class JobRun:
    """How one alerting run of an hourly job went."""

    error: str | None
    """Why the work failed (scrubbed of the Hub token and the SMTP password); None when it worked."""
    lines: tuple[str, ...] = ()
    """What to show on stderr, in order: the error, then what the alert did (sent, held back, failed to send)."""
    told: bool = True
    """False when an alert or recovery could not be sent (the next run tries again)."""

    @property
    def failed(self) -> bool:
        """The work failed, or its alert could not be sent: the command exits 2."""
        return self.error is not None or not self.told


@dataclass(frozen=True)
class Teller:
    """What an hourly job's outcome is told with, taken from the experiment by the command that runs it (as status
    takes the watchdog's settings): the alerts section (channels and cooldown), where the watchdog keeps its alert
    state, and the names of the environment variables whose values never reach an alert or the terminal."""

    experiment: str
    alerts: AlertsConfig
    logs: str | None
    """paths.logs: the alert state is `.bsops-alerts.json` beside its main_log.txt (notify.default_state_path)."""
    secrets: tuple[str, ...]
    """The Hub token's and the SMTP password's variable names (their values are scrubbed from an error)."""


def run_alerting(teller: Teller, alert: bool, job: str, command: str, work: Callable[[], None]) -> JobRun:
    """Run `work` (raising BsopsError or OSError on failure). With `alert`, report the outcome, failed or worked, to
    notify.notify_job on the channels of the teller's alerts (`command`: what to run by hand to see a failure)."""
    lines: list[str] = []
    try:
        work()
        error = None
    except (BsopsError, OSError) as exc:
        error = scrub(str(exc), env_secrets(teller.secrets))
        lines.append(f"error: {error}")
    told = True
    if alert:
        told, said = tell_job(teller, job, command, error)
        lines += said
    return JobRun(error, tuple(lines), told)


def tell_job(teller: Teller, job: str, command: str, error: str | None) -> tuple[bool, list[str]]:
    """Send the failure or the recovery as notify_job decides: (False when a message could not be sent, the lines
    to show)."""
    said: list[str] = []
    try:
        outbox = channels.outbox_from_alerts(teller.alerts)
        if outbox is None:
            return True, ["no alert email: alerts.email_to is empty"] if error is not None else []
        log = runlog.main_log(teller.logs) if teller.logs else None
        usual = notify.default_state_path(log)
        where = alert_state.place(usual, None, teller.experiment)

        def tell(state: Path) -> notify.JobNotice:
            return notify.notify_job(outbox, state, job, error, experiment=teller.experiment, command=command,
                                     cooldown_minutes=teller.alerts.cooldown_minutes)

        try:
            outcome = tell(where.state)
        except alert_state.StateUnwritable as exc:  # nothing was sent: again, from the user's state folder
            if where.moved is not None:
                raise
            where = alert_state.place(usual, None, teller.experiment, why=f"{exc.path}: {exc.why}")
            outcome = tell(where.state)
        if where.moved is not None:
            said.append(f"***ALERT: the alert state cannot be written beside the run's log ({where.moved}): it is "
                        f"kept in {where.state} meanwhile***")
    except NotifyError as exc:
        kind = "alert" if error is not None else "recovery"
        return False, [*said, f"***ALERT: the {job} {kind} email could not be sent (the next run tries again): "
                              f"{exc}***"]
    return True, [*said, outcome.line] if outcome.line else said
