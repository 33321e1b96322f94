"""Alert emails for the watchdog and the hourly hub-sync and backup jobs: sent over SMTP, at most
once per cooldown per condition, with a recovery email when the condition clears. The state between
hourly runs is a small JSON file, `.bsops-alerts.json` beside the run's main_log.txt, which the
watchdog and the jobs share: each read-modify-write holds an flock on `<state>.lock`.

The SMTP password is read from the environment variable the settings name; it is never stored,
logged, or put into an error message. Every subject, body, state entry and error is scrubbed of
credentials (redact.scrub). Headers are made safe: a job name or error text may hold any control
character or Unicode line break (U+2028, U+0085, ...), which email refuses in a header, so subjects
carry only a short, fixed headline with those replaced and are capped at SUBJECT_MAX characters;
the details (argv, log lines, errors) go in the body. The state file is written mode 0600.
"""

from __future__ import annotations

import json
import os
import smtplib
import socket
import ssl
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import TYPE_CHECKING

from bigscience_ops.data import locks
from bigscience_ops.ops import webhook
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.status import Alert, StatusReport
from bigscience_ops.redact import env_secrets, scrub

if TYPE_CHECKING:
    from bigscience_ops.schema import AlertsConfig

SECURITY_CHOICES = ("starttls", "ssl", "none")
DEFAULT_PORTS = {"starttls": 587, "ssl": 465, "none": 25}
"""The usual SMTP port of each security choice."""
SUBJECT_MAX = 120
"""Characters in a subject at most; what a subject leaves out is in the body."""


def header_text(text: str, limit: int | None = None) -> str:
    """`text` fit for one email header: every control character and line break (str.isprintable()
    is false for each, U+2028 and U+0085 included) becomes a space, runs of spaces one, and a
    text over `limit` characters is cut with '...'."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if limit is not None and len(flat) > limit:
        flat = flat[:limit - 3].rstrip() + "..."
    return flat


class NotifyError(BsopsError):
    """An alert email could not be sent, or the SMTP settings are unusable."""


@dataclass(frozen=True)
class SmtpSettings:
    """Where alert emails go and how they get there."""

    host: str
    """SMTP server name or address."""
    sender: str
    """From address; its domain also names the Message-ID."""
    recipients: tuple[str, ...]
    """To addresses (the on-call list)."""
    port: int = 587
    """587 for starttls, 465 for ssl, 25 for none, usually."""
    security: str = "starttls"
    """starttls (upgrade a plain connection), ssl (TLS from the start) or none (trusted relay only)."""
    user: str | None = None
    """Login name; None to send without logging in."""
    password_env: str | None = None
    """Name of the environment variable that holds the password (never the password itself)."""
    ca_file: str | None = None
    """CA bundle to verify the server (and the webhook) with, instead of the system's (a site CA, a test server)."""
    timeout_s: float = 30.0
    webhook_env: str | None = None
    """Name of the environment variable holding a Slack-compatible webhook URL that gets every message too
    (ops/webhook.py); with it, `recipients` may be empty."""

    def __post_init__(self) -> None:
        recipients = (self.recipients,) if isinstance(self.recipients, str) else tuple(self.recipients)
        object.__setattr__(self, "recipients", recipients)
        if self.security not in SECURITY_CHOICES:
            raise NotifyError(f"smtp.security: got {self.security!r}; allowed: {', '.join(SECURITY_CHOICES)}")
        if not self.host:
            raise NotifyError("smtp.host: got an empty host; give the SMTP server's name or address")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise NotifyError(f"smtp.port: got {self.port!r}; allowed: a port number 1-65535")
        if (not recipients and not self.webhook_env) or not all("@" in r and header_text(r) == r for r in recipients):
            raise NotifyError(f"smtp.recipients: got {list(recipients)!r}; allowed: one or more email addresses, "
                              "each without spaces, control characters or line breaks")
        if "@" not in self.sender or header_text(self.sender) != self.sender or " " in self.sender:
            raise NotifyError(f"smtp.sender: got {self.sender!r}; allowed: an email address without spaces, control "
                              "characters or line breaks")
        if self.user and not self.password_env:
            raise NotifyError(f"smtp.password_env: got None while smtp.user is {self.user!r}; allowed: the "
                              f"name of the environment variable that holds the password")


def smtp_from_alerts(alerts: AlertsConfig) -> SmtpSettings | None:
    """Where an experiment's (or cron.yaml's) alerts section sends alerts; None when nobody is to be told."""
    webhook = getattr(alerts, "webhook_url_env", None)
    if not alerts.email_to and not webhook:
        return None
    return SmtpSettings(host=alerts.smtp_host, sender=alerts.email_from or f"bsops@{socket.getfqdn()}",
                        recipients=tuple(alerts.email_to), port=alerts.smtp_port, security=alerts.smtp_security,
                        user=alerts.smtp_user, password_env=alerts.smtp_password_env if alerts.smtp_user else None,
                        webhook_env=webhook)


def destinations(settings: SmtpSettings) -> str:
    """Who a message went to, for logs: the addresses and/or the webhook (by its variable, never its URL)."""
    where = [", ".join(settings.recipients)] if settings.recipients else []
    if settings.webhook_env:
        where.append(f"the webhook in ${settings.webhook_env}")
    return " and ".join(where)


def send_alert(alerts: AlertsConfig, subject: str, body: str) -> str:
    """Email one alert to an alerts section's recipients; returns a line saying what happened (never raises)."""
    settings = smtp_from_alerts(alerts)
    if settings is None:
        return "no alert email: alerts.email_to is empty"
    try:
        message_id = send(settings, build_message(settings, subject, body))
    except NotifyError as exc:
        return f"***ALERT: the alert email could not be sent: {exc}***"
    return f"alert email sent to {destinations(settings)} ({message_id})"


# --- sending -------------------------------------------------------------------------------------

def build_message(settings: SmtpSettings, subject: str, body: str, *, now: datetime | None = None,
                  secrets: Sequence[str] = ()) -> EmailMessage:
    """A complete message: From, To, Subject, Date (RFC 5322, with zone) and a unique Message-ID.

    The subject is scrubbed, made one safe line and capped (header_text); the body is scrubbed of
    credentials and of the SMTP password and `secrets`.
    """
    secrets = [*secrets, *env_secrets([settings.password_env])]
    msg = EmailMessage()
    msg["From"] = settings.sender
    msg["To"] = ", ".join(settings.recipients)
    msg["Subject"] = header_text(scrub(subject, secrets), SUBJECT_MAX)
    body = scrub(body, secrets)
    when = (now or datetime.now()).astimezone()
    msg["Date"] = format_datetime(when)
    msg["Message-ID"] = make_msgid(idstring="bsops", domain=settings.sender.rpartition("@")[2])
    msg.set_content(body)
    return msg


def send(settings: SmtpSettings, message: EmailMessage, *, env: Mapping[str, str] | None = None) -> str:
    """Send one message by email and, with a webhook, post it there too; returns its Message-ID. Raises
    NotifyError naming the server (or the webhook's variable) and the cause."""
    env = os.environ if env is None else env
    if settings.recipients:
        _send_email(settings, message, env)
    if settings.webhook_env:
        try:
            url = webhook.url_from(env, settings.webhook_env)
            webhook.post(url, str(message["Subject"]), message.get_content(), timeout=settings.timeout_s,
                         ca_file=settings.ca_file)
        except webhook.WebhookError as exc:
            raise NotifyError(str(exc)) from None
    return str(message["Message-ID"])


def _send_email(settings: SmtpSettings, message: EmailMessage, env: Mapping[str, str]) -> None:
    password = None
    if settings.user:
        password = env.get(settings.password_env or "")
        if password is None:
            raise NotifyError(f"environment variable {settings.password_env} (smtp.password_env) is not set; "
                              f"export the SMTP password for {settings.user!r} in it")
    where = f"{settings.host}:{settings.port} ({settings.security})"
    try:
        context = ssl.create_default_context(cafile=settings.ca_file) if settings.security != "none" else None
        if settings.security == "ssl":
            client: smtplib.SMTP = smtplib.SMTP_SSL(settings.host, settings.port, timeout=settings.timeout_s,
                                                    context=context)
        else:
            client = smtplib.SMTP(settings.host, settings.port, timeout=settings.timeout_s)
        with client:
            if settings.security == "starttls":
                client.starttls(context=context)
            if settings.user:
                client.login(settings.user, password or "")
            client.send_message(message)
    except (smtplib.SMTPException, OSError, ssl.SSLError) as exc:
        detail = scrub(f"{type(exc).__name__}: {exc}", [password] if password else [])
        raise NotifyError(f"could not send email {message['Subject']!r} via {where}: {detail}") from None


# --- alerts with cooldown and recovery ------------------------------------------------------------

ADVICE = {
    "not-scheduled": "Nothing is running or queued: launch the training again (`bsops launch EXP`; add "
                     "--after-current if a job of it is still queued).",
    "never-starts": "A queued job will never start on its own: release it (`scontrol release ID`) if it is "
                    "held, otherwise cancel it (`scancel ID`) and launch again.",
    "stalled": "The job runs but the training makes no progress: read the end of the log; if it hangs, "
               "`scancel` the running task (the next array task resumes from the last checkpoint) and, if "
               "one node is to blame, exclude it.",
    "overlap": "Two trainings run at once and write the same checkpoints: cancel the newer one now.",
    "cron-chain": "A cron runner chain is gone or late, so the hourly jobs (this watchdog among them) may "
                  "not run: `bsops cron status` shows the chains, `bsops cron install` re-submits a missing one.",
    "slurm-error": "The watchdog could not ask Slurm: check the controller (`sinfo`, `squeue`) from a login "
                   "node; the training's state is unknown until it answers.",
}


HEADLINES = {
    "not-scheduled": "not running or scheduled",
    "never-starts": "a queued job will never start",
    "stalled": "running but making no progress",
    "overlap": "two trainings running at once",
    "cron-chain": "a cron chain is gone or late",
    "slurm-error": "cannot query Slurm",
}
"""The subject's words for each condition: fixed text, never a job name from the queue or a log line."""


@dataclass(frozen=True)
class Notice:
    """One email the watchdog sent."""

    kind: str
    """alert or recovery."""
    conditions: tuple[str, ...]
    message_id: str
    subject: str


@dataclass
class _State:
    active: dict[str, dict] = field(default_factory=dict)  # watchdog condition ("job::condition") -> entry
    finished: dict[str, int] = field(default_factory=dict)  # job name -> the final iteration announced
    jobs: dict[str, dict] = field(default_factory=dict)  # failing hourly job ("hub-sync", "backup") -> entry
    # An entry: since (first seen), last_sent (None until emailed), message (the latest text).


def default_state_path(log_path: str | os.PathLike[str] | None) -> Path:
    """Where a run's alert state lives: `.bsops-alerts.json` next to its main_log.txt (~/.cache/bsops/ without one)."""
    folder = Path(log_path).parent if log_path else Path.home() / ".cache" / "bsops"
    return folder / ".bsops-alerts.json"


def _load_state(path: Path) -> _State:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return _State()
    except (OSError, ValueError) as exc:
        raise NotifyError(f"alert state file {path} is unreadable ({exc}); delete it to start afresh") from None
    return _State(active=dict(data.get("active", {})), finished=dict(data.get("finished", {})),
                  jobs=dict(data.get("jobs", {})))


def _save_state(path: Path, state: _State) -> None:
    """Write the state atomically, mode 0600 (it holds error texts), every message scrubbed once more."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for entries in (state.active, state.jobs):
        for entry in entries.values():
            if isinstance(entry.get("message"), str):
                entry["message"] = scrub(entry["message"])
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps({"version": 1, "active": state.active, "finished": state.finished, "jobs": state.jobs},
                                indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


@contextmanager
def _state_file(path: Path) -> Iterator[_State]:
    """The state of `path`, saved when the block ends (also when it raises), under an exclusive flock
    on `<path>.lock` so the watchdog and the hourly jobs of one run never lose each other's updates.

    The lock file stays (removing it would let a waiter and a newcomer hold two locks at once).
    Where the filesystem has no flock the state is used unlocked: the save is still an atomic
    rename, so two writers at once can only drop one update (one email too many), never corrupt it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            locks.try_flock(lock)  # False without flock: carry on unlocked (see above)
        except OSError as exc:
            raise NotifyError(f"cannot lock alert state file {path}: {exc}") from None
        state = _load_state(path)
        try:
            yield state
        finally:
            _save_state(path, state)  # closing the file releases the flock


def _holds(entries: dict[str, dict], key: str, message: str, now: datetime, cooldown_minutes: float) -> bool:
    """Record that condition `key` holds at `now` with `message`; True when an email about it is due
    (never emailed, or last emailed at least `cooldown_minutes` ago)."""
    entry = entries.setdefault(key, {"since": now.isoformat(), "last_sent": None})
    entry["message"] = scrub(message)
    last = entry.get("last_sent")
    return last is None or now - datetime.fromisoformat(last) >= timedelta(minutes=cooldown_minutes)


def _cleared(entries: dict[str, dict], keys: Sequence[str]) -> list[str]:
    """Forget those of the cleared `keys` never emailed (nothing to recover from); returns the rest,
    each owed a recovery email (delete its entry once that is sent)."""
    for key in [k for k in keys if entries[k].get("last_sent") is None]:
        del entries[key]
    return [k for k in keys if k in entries]


def _check_cooldown(cooldown_minutes: float) -> None:
    if cooldown_minutes < 0:
        raise NotifyError(f"cooldown_minutes: got {cooldown_minutes!r}; allowed: 0 or more minutes")


def notify(report: StatusReport, settings: SmtpSettings, state_path: str | os.PathLike[str], *,
           experiment: str | None = None, cooldown_minutes: float = 60.0, log_path: str | None = None,
           now: datetime | None = None, env: Mapping[str, str] | None = None) -> list[Notice]:
    """Email the report's alerts unless the same condition was emailed within the cooldown, and email
    a recovery for conditions that were alerted and have cleared. Returns the emails sent.

    While Slurm cannot be queried nothing is known to have cleared, so no recovery is sent then.
    A failed send raises NotifyError after saving what did go out; the next run retries the rest.
    """
    _check_cooldown(cooldown_minutes)
    now = now or report.checked_at
    experiment = experiment or report.job_name
    prefix = f"{report.job_name}::"
    current = {prefix + a.condition: a for a in report.alerts}
    with _state_file(Path(state_path)) as state:
        due = [a for k, a in current.items() if _holds(state.active, k, a.message, now, cooldown_minutes)]
        unknown = any(a.condition == "slurm-error" for a in report.alerts)
        cleared = _cleared(state.active, [] if unknown else
                           [k for k in state.active if k.startswith(prefix) and k not in current])
        return _send_watchdog_emails(report, settings, state, experiment, prefix, due, cleared, cooldown_minutes,
                                     log_path, now, env)


def _send_watchdog_emails(report: StatusReport, settings: SmtpSettings, state: _State, experiment: str, prefix: str,
                          due: Sequence[Alert], cleared: Sequence[str], cooldown_minutes: float, log_path: str | None,
                          now: datetime, env: Mapping[str, str] | None) -> list[Notice]:
    """Send what notify() decided, recording each email in `state` as it goes out."""
    sent: list[Notice] = []
    if due:
        subject, body = _alert_email(experiment, report, due, cooldown_minutes, log_path)
        message_id = send(settings, build_message(settings, subject, body, now=now), env=env)
        for alert in due:
            state.active[prefix + alert.condition]["last_sent"] = now.isoformat()
        sent.append(Notice("alert", tuple(a.condition for a in due), message_id, _subject(subject)))
    if cleared:
        subject, body = _recovery_email(experiment, report, [state.active[k] for k in cleared], cleared, now)
        message_id = send(settings, build_message(settings, subject, body, now=now), env=env)
        for key in cleared:
            del state.active[key]
        sent.append(Notice("recovery", tuple(k[len(prefix):] for k in cleared), message_id, _subject(subject)))
    if report.finished_at is not None and state.finished.get(report.job_name) != report.finished_at:
        subject = f"[FINISHED] {experiment}: training finished at iteration {report.finished_at}"
        body = "\n".join([f"Experiment: {experiment}", f"Slurm job name: {report.job_name}", "",
                          *report.lines, "", "Nothing is queued and none needs to be: remove its watchdog "
                          "from cron.hourly/ when the checkpoints are safe."]) + "\n"
        message_id = send(settings, build_message(settings, subject, body, now=now), env=env)
        state.finished[report.job_name] = report.finished_at
        sent.append(Notice("finished", (), message_id, _subject(subject)))
    return sent


def _subject(subject: str) -> str:
    """The subject as build_message puts it in the header."""
    return header_text(scrub(subject), SUBJECT_MAX)


def _alert_email(experiment: str, report: StatusReport, due: Sequence[Alert], cooldown: float,
                 log_path: str | None) -> tuple[str, str]:
    first = HEADLINES.get(due[0].condition, due[0].condition)
    more = f" (+{len(due) - 1} more)" if len(due) > 1 else ""
    subject = f"[ALERT] {experiment}: {first}{more}"
    advice = "\n".join(f"- {ADVICE.get(a.condition, 'Look at the status lines above.')}" for a in due)
    body = "\n".join([
        f"Experiment: {experiment}",
        f"Slurm job name: {report.job_name}",
        f"Checked at: {report.checked_at:%Y-%m-%d %H:%M:%S} on {socket.gethostname()}",
        *( [f"Log: {log_path}"] if log_path else [] ),
        "",
        *(a.message for a in due),
        "",
        "What the watchdog saw:",
        *report.lines,
        "",
        "What to do:",
        advice.replace("EXP", experiment),
        f"- Check again with: bsops status --job-name {report.job_name}",
        "",
        f"This alert repeats at most every {cooldown:g} minutes while the condition lasts; a recovery",
        "email follows when it clears.",
    ])
    return subject, body + "\n"


def _recovery_email(experiment: str, report: StatusReport, entries: Sequence[dict], keys: Sequence[str],
                    now: datetime) -> tuple[str, str]:
    conditions = ", ".join(k.split("::", 1)[1] for k in keys)
    subject = f"[RECOVERED] {experiment}: {conditions} cleared"
    lasted = [f"- {e.get('message', k)} (since {e.get('since', '?')})" for k, e in zip(keys, entries)]
    body = "\n".join([
        f"Experiment: {experiment}",
        f"Slurm job name: {report.job_name}",
        f"Checked at: {now:%Y-%m-%d %H:%M:%S} on {socket.gethostname()}",
        "",
        "These alerts have cleared; nothing more to do for them:",
        *lasted,
        "",
        "What the watchdog sees now:",
        *report.lines,
    ])
    return subject, body + "\n"


# --- the hourly jobs' failures (hub-sync, backup) -------------------------------------------------

@dataclass(frozen=True)
class JobNotice:
    """What notify_job did about one run of an hourly job."""

    kind: str
    """alert (emailed), held (a failure within the cooldown, not emailed), recovery (emailed), or
    quiet (a success with no emailed failure before it)."""
    line: str
    """What happened, for the job's log; empty when quiet."""


def _now() -> datetime:
    """The clock of notify_job (local time, as the watchdog's reports); tests of the commands replace it."""
    return datetime.now().replace(microsecond=0)


def notify_job(settings: SmtpSettings, state_path: str | os.PathLike[str], job: str, error: str | None, *,
               experiment: str, command: str, cooldown_minutes: float = 60.0, now: datetime | None = None,
               env: Mapping[str, str] | None = None) -> JobNotice:
    """Report one run of an hourly job (`job`: hub-sync, backup) that failed with `error` or, with
    None, worked. A failure is emailed at once and then at most once per `cooldown_minutes` while it
    lasts; the first success after an emailed failure sends one recovery email; a failure never
    emailed clears silently. `command` is what to run by hand to see the failure.

    A failed send raises NotifyError with the state saved, so the next run sends it (as notify() does).
    """
    _check_cooldown(cooldown_minutes)
    now = now or _now()
    error = None if error is None else scrub(error, env_secrets([settings.password_env], env))
    with _state_file(Path(state_path)) as state:
        if error is not None:
            if not _holds(state.jobs, job, error, now, cooldown_minutes):
                entry = state.jobs[job]
                return JobNotice("held", f"{job} failed again (failing since {entry['since']}); the alert email was "
                                         f"held back: last sent {entry['last_sent']}, it repeats at most every "
                                         f"{cooldown_minutes:g} minutes while {job} keeps failing")
            subject, body = _job_alert_email(experiment, job, error, command, state.jobs[job], cooldown_minutes, now)
            message_id = send(settings, build_message(settings, subject, body, now=now), env=env)
            state.jobs[job]["last_sent"] = now.isoformat()
            return JobNotice("alert", f"alert email sent to {destinations(settings)} ({message_id}): "
                                      f"{_subject(subject)}")
        if job not in state.jobs or not _cleared(state.jobs, [job]):  # no failure, or one never emailed
            return JobNotice("quiet", "")
        subject, body = _job_recovery_email(experiment, job, state.jobs[job], now)
        message_id = send(settings, build_message(settings, subject, body, now=now), env=env)
        del state.jobs[job]
        return JobNotice("recovery", f"recovery email sent to {destinations(settings)} ({message_id}): "
                                     f"{_subject(subject)}")


def _job_alert_email(experiment: str, job: str, error: str, command: str, entry: dict, cooldown: float,
                     now: datetime) -> tuple[str, str]:
    since = datetime.fromisoformat(entry["since"])
    failing = f"\n\nIt has been failing since {since:%Y-%m-%d %H:%M} ({_lasted(now - since)})." if since < now else ""
    body = (f"{job} of {experiment} failed:\n\n{error}{failing}\n\n"
            f"The next hourly run tries again; run `{command}` by hand to see it now.\n\n"
            f"This alert repeats at most every {cooldown:g} minutes while it keeps failing; a recovery email\n"
            f"follows when {job} works again.\n")
    return f"[bsops] {experiment}: {job} failed", body


def _job_recovery_email(experiment: str, job: str, entry: dict, now: datetime) -> tuple[str, str]:
    since = datetime.fromisoformat(entry["since"])
    body = (f"{job} of {experiment} works again (checked at {now:%Y-%m-%d %H:%M:%S} on {socket.gethostname()}).\n\n"
            f"It failed from {since:%Y-%m-%d %H:%M} for {_lasted(now - since)}. The last error was:\n\n"
            f"{entry.get('message', '(not recorded)')}\n\nNothing more to do for it.\n")
    return f"[RECOVERED] {experiment}: {job} works again", body


def _lasted(span: timedelta) -> str:
    minutes = max(0, round(span.total_seconds() / 60))
    days, rest = divmod(minutes, 24 * 60)
    return (f"{days} d " if days else "") + f"{rest // 60} h {rest % 60:02d} min"
