"""An hourly job's run (hub-sync, backup, eval) with its failure told: what `bsops hub-sync --alert`, `bsops backup
--alert` and `bsops eval --next --alert` do around their work.

`run_alerting` runs the work, and with `alert` reports the outcome to notify.notify_job (the job-failed alert of
ops/alerts.py, at most once per cooldown, and one recovery when it works again), whose state is the watchdog's
`.bsops-alerts.json` beside the run's main_log.txt. It prints nothing and exits nothing: it returns the lines to show
and whether the run failed (the work, or a message that could not be sent); the CLI prints them and exits 2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.tell import channels, notify
from bigscience_ops.ops.tell.message import NotifyError
from bigscience_ops.redact import env_secrets, scrub

if TYPE_CHECKING:
    from bigscience_ops.schema import Experiment


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


def run_alerting(exp: Experiment, alert: bool, job: str, command: str, work: Callable[[], None]) -> JobRun:
    """Run `work` (raising BsopsError or OSError on failure). With `alert`, report the outcome, failed or worked, to
    notify.notify_job on the channels of `exp.alerts` (`command`: what to run by hand to see a failure)."""
    lines: list[str] = []
    try:
        work()
        error = None
    except (BsopsError, OSError) as exc:
        error = scrub(str(exc), env_secrets([exp.hub.token_env, exp.alerts.smtp_password_env]))
        lines.append(f"error: {error}")
    told = True
    if alert:
        told, said = tell_job(exp, job, command, error)
        lines += said
    return JobRun(error, tuple(lines), told)


def tell_job(exp: Experiment, job: str, command: str, error: str | None) -> tuple[bool, list[str]]:
    """Send the failure or the recovery as notify_job decides: (False when a message could not be sent, the lines
    to show)."""
    try:
        outbox = channels.outbox_from_alerts(exp.alerts)
        if outbox is None:
            return True, ["no alert email: alerts.email_to is empty"] if error is not None else []
        log = Path(exp.paths.logs) / "main_log.txt" if exp.paths.logs else None
        outcome = notify.notify_job(outbox, notify.default_state_path(log), job, error, experiment=exp.name,
                                    command=command, cooldown_minutes=exp.alerts.cooldown_minutes)
    except NotifyError as exc:
        kind = "alert" if error is not None else "recovery"
        return False, [f"***ALERT: the {job} {kind} email could not be sent (the next run tries again): {exc}***"]
    return True, [outcome.line] if outcome.line else []
