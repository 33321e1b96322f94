"""Alert emails for the watchdog and the hourly hub-sync and backup jobs: sent over SMTP (and posted to a
webhook, ops/webhook.py), at most once per cooldown per condition, with a recovery email when the
condition clears. The state between hourly runs is a small JSON file, `.bsops-alerts.json` beside the
run's main_log.txt, which the watchdog and the jobs share: each read-modify-write holds an flock on
`<state>.lock`.

Email and webhook are channels with a state each: every condition records, per channel, when it was
last sent and why the last try failed, so a channel that fails is tried again on the next run while
the other keeps its cooldown (a webhook answering 500 never repeats the email), and each channel that
told of an alert gets its own recovery. A failure names the channel (the webhook by its variable,
never its URL) and is scrubbed like everything else. What the emails say is alert_text.py's.

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
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops import alert_text, webhook
from bigscience_ops.ops.status import StatusReport
from bigscience_ops.redact import env_secrets, scrub

if TYPE_CHECKING:
    from bigscience_ops.schema import AlertsConfig

SECURITY_CHOICES = ("starttls", "ssl", "none")
DEFAULT_PORTS = {"starttls": 587, "ssl": 465, "none": 25}
"""The usual SMTP port of each security choice."""
SUBJECT_MAX = 120
"""Characters in a subject at most; what a subject leaves out is in the body."""
CHANNELS = ("email", "webhook")
"""Where a message goes: the recipients by SMTP, the webhook by an https POST; each keeps its own state."""


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


def channels(settings: SmtpSettings) -> tuple[str, ...]:
    """The channels `settings` send on: email when there are recipients, webhook when its variable is named."""
    return tuple(c for c, on in zip(CHANNELS, (bool(settings.recipients), bool(settings.webhook_env))) if on)


def destinations(settings: SmtpSettings, only: Sequence[str] | None = None) -> str:
    """Who a message went to, for logs: the addresses and/or the webhook (by its variable, never its URL);
    `only` names the channels meant (default: all of them)."""
    where = []
    if settings.recipients and (only is None or "email" in only):
        where.append(", ".join(settings.recipients))
    if settings.webhook_env and (only is None or "webhook" in only):
        where.append(f"the webhook in ${settings.webhook_env}")
    return " and ".join(where)


def send_alert(alerts: AlertsConfig, subject: str, body: str) -> str:
    """Send one alert to an alerts section's channels; returns a line saying what happened (never raises)."""
    settings = smtp_from_alerts(alerts)
    if settings is None:
        return "no alert email: alerts.email_to is empty"
    message = build_message(settings, subject, body)
    failed = deliver(settings, message)
    sent = [c for c in channels(settings) if c not in failed]
    went = f"alert email sent to {destinations(settings, sent)} ({message['Message-ID']})" if sent else ""
    if not failed:
        return went
    also = f"; {went}" if went else ""
    return f"***ALERT: the alert email could not be sent: {'; '.join(failed.values())}***{also}"



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
    """Send one message on every channel; returns its Message-ID. Raises NotifyError naming each channel
    that failed (the server, or the webhook's variable) and the cause, after trying the others."""
    failed = deliver(settings, message, env=env)
    if failed:
        raise NotifyError("; ".join(failed.values()))
    return str(message["Message-ID"])


def deliver(settings: SmtpSettings, message: EmailMessage, on: Sequence[str] | None = None, *,
            env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Send one message on each channel of `on` (default: all of `settings`'), each whatever the others
    do; returns the channels that failed with why (empty when all went out)."""
    env = os.environ if env is None else env
    failed = {}
    for channel in channels(settings) if on is None else on:
        try:
            if channel == "email":
                _send_email(settings, message, env)
            else:
                _post(settings, message, env)
        except NotifyError as exc:
            failed[channel] = str(exc)
    return failed


def _post(settings: SmtpSettings, message: EmailMessage, env: Mapping[str, str]) -> None:
    try:
        url = webhook.url_from(env, settings.webhook_env or "")
        webhook.post(url, str(message["Subject"]), message.get_content(), timeout=settings.timeout_s,
                     ca_file=settings.ca_file)
    except webhook.WebhookError as exc:
        named = settings.webhook_env and settings.webhook_env in str(exc)
        raise NotifyError(f"{exc}{'' if named else f' (the webhook in ${settings.webhook_env})'}") from None


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


# --- alerts with cooldown and recovery, per channel --------------------------------------------------

@dataclass(frozen=True)
class Notice:
    """One message the watchdog sent, or failed to send, on some channels."""

    kind: str
    """alert, recovery or finished."""
    conditions: tuple[str, ...]
    message_id: str
    subject: str
    channels: tuple[str, ...] = ("email",)
    """Where it went (or, with `error`, where it could not go): email, webhook."""
    error: str | None = None
    """Why those channels could not send it (scrubbed; the next run tries again); None when it went out."""


@dataclass
class _State:
    active: dict[str, dict] = field(default_factory=dict)  # watchdog condition ("job::condition") -> entry
    finished: dict[str, dict | int] = field(default_factory=dict)  # job name -> channel -> final iteration announced
    jobs: dict[str, dict] = field(default_factory=dict)  # failing hourly job ("hub-sync", "backup") -> entry
    # An entry: since (first seen), message (the latest text), sent (channel -> when last sent), failed
    # (channel -> why its last try failed, while it does). A file from before channels holds one last_sent
    # for both, and one announced iteration per job: read as each channel's.


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
    state = _State(active=dict(data.get("active", {})), finished=dict(data.get("finished", {})),
                   jobs=dict(data.get("jobs", {})))
    for entry in [*state.active.values(), *state.jobs.values()]:
        if "sent" not in entry:  # one time for every channel (version 1)
            last = entry.pop("last_sent", None)
            entry["sent"] = {c: last for c in CHANNELS} if last else {}
    return state


def _save_state(path: Path, state: _State) -> None:
    """Write the state atomically, mode 0600 (it holds error texts), every message scrubbed once more."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for entry in [*state.active.values(), *state.jobs.values()]:
        if isinstance(entry.get("message"), str):
            entry["message"] = scrub(entry["message"])
        failed = entry.get("failed", {})
        for channel in failed:
            failed[channel] = scrub(str(failed[channel]))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps({"version": 2, "active": state.active, "finished": state.finished, "jobs": state.jobs},
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


def _record(entries: dict[str, dict], key: str, message: str, now: datetime) -> dict:
    """Record that condition `key` holds at `now` with `message`; returns its entry."""
    entry = entries.setdefault(key, {"since": now.isoformat(), "sent": {}})
    entry["message"] = scrub(message)
    return entry


def _sent_at(entry: dict, channel: str) -> datetime | None:
    when = entry.get("sent", {}).get(channel)
    return datetime.fromisoformat(when) if when else None


def _due(entry: dict, channel: str, now: datetime, cooldown_minutes: float) -> bool:
    """Whether `channel` is due to tell of the entry: never sent on it, or last sent a cooldown ago or more."""
    last = _sent_at(entry, channel)
    return last is None or now - last >= timedelta(minutes=cooldown_minutes)


def _tried(entry: dict, channel: str, error: str | None, sent: str | None) -> None:
    """Record one channel's try: on success its sent time becomes `sent` (None: forgotten, after a recovery)
    and its failure is cleared; on failure the error is kept and the sent time left alone."""
    failed = entry.setdefault("failed", {})
    if error is not None:
        failed[channel] = scrub(error)
        return
    failed.pop(channel, None)
    if sent is None:
        entry.setdefault("sent", {}).pop(channel, None)
    else:
        entry.setdefault("sent", {})[channel] = sent
    if not failed:
        del entry["failed"]


def _groups(wanted: dict[str, tuple[str, ...]]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(keys, channels) for each distinct non-empty set of keys the channels want: one message each."""
    out: dict[tuple[str, ...], list[str]] = {}
    for channel, keys in wanted.items():
        if keys:
            out.setdefault(keys, []).append(channel)
    return [(keys, tuple(on)) for keys, on in out.items()]


def _check_cooldown(cooldown_minutes: float) -> None:
    if cooldown_minutes < 0:
        raise NotifyError(f"cooldown_minutes: got {cooldown_minutes!r}; allowed: 0 or more minutes")


def _send(settings: SmtpSettings, subject: str, body: str, on: Sequence[str], now: datetime,
          env: Mapping[str, str] | None) -> tuple[str, list[str], dict[str, str]]:
    """Send one message on the channels `on`: (Message-ID, the channels it went out on, the failed ones with why)."""
    message = build_message(settings, subject, body, now=now)
    failed = deliver(settings, message, on, env=env)
    return str(message["Message-ID"]), [c for c in on if c not in failed], failed


def _notices(kind: str, conditions: tuple[str, ...], message_id: str, subject: str, sent: Sequence[str],
             failed: Mapping[str, str]) -> list[Notice]:
    out = [Notice(kind, conditions, message_id, _subject(subject), tuple(sent))] if sent else []
    return out + [Notice(kind, conditions, message_id, _subject(subject), (c,), why) for c, why in failed.items()]


def notify(report: StatusReport, settings: SmtpSettings, state_path: str | os.PathLike[str], *,
           experiment: str | None = None, cooldown_minutes: float = 60.0, log_path: str | None = None,
           now: datetime | None = None, env: Mapping[str, str] | None = None) -> list[Notice]:
    """Send the report's alerts on each channel that has not sent the same condition within the cooldown,
    and a recovery on each channel that told of a condition that has cleared. Returns the messages sent
    and those a channel failed to send (Notice.error): a failed channel is tried again on the next run
    while the others keep their cooldown.

    While Slurm cannot be queried nothing is known to have cleared, so no recovery is sent then.
    """
    _check_cooldown(cooldown_minutes)
    now = now or report.checked_at
    experiment = experiment or report.job_name
    prefix = f"{report.job_name}::"
    current = {prefix + a.condition: a for a in report.alerts}
    wanted = channels(settings)
    stamp = now.isoformat()
    notices: list[Notice] = []
    with _state_file(Path(state_path)) as state:
        for key, alert in current.items():
            _record(state.active, key, alert.message, now)
        due = {c: tuple(k for k in current if _due(state.active[k], c, now, cooldown_minutes)) for c in wanted}
        for keys, on in _groups(due):
            alerts = [current[k] for k in keys]
            subject, body = alert_text.alert_email(experiment, report, alerts, cooldown_minutes, log_path)
            message_id, sent, failed = _send(settings, subject, body, on, now, env)
            for key in keys:
                for channel in on:
                    _tried(state.active[key], channel, failed.get(channel), stamp)
            notices += _notices("alert", tuple(a.condition for a in alerts), message_id, subject, sent, failed)
        unknown = any(a.condition == "slurm-error" for a in report.alerts)
        cleared = [] if unknown else [k for k in state.active if k.startswith(prefix) and k not in current]
        owed = {c: tuple(k for k in cleared if _sent_at(state.active[k], c)) for c in wanted}
        for keys, on in _groups(owed):
            conditions = tuple(k[len(prefix):] for k in keys)
            subject, body = alert_text.recovery_email(experiment, report, [state.active[k] for k in keys],
                                                      conditions, now)
            message_id, sent, failed = _send(settings, subject, body, on, now, env)
            for key in keys:
                for channel in on:
                    _tried(state.active[key], channel, failed.get(channel), None)
            notices += _notices("recovery", conditions, message_id, subject, sent, failed)
        for key in cleared:  # done once no channel still owes its recovery
            if not any(_sent_at(state.active[key], c) for c in wanted):
                del state.active[key]
        if report.finished_at is not None:
            notices += _announce_finish(report, settings, state, experiment, wanted, now, env)
    return notices


def _announce_finish(report: StatusReport, settings: SmtpSettings, state: _State, experiment: str,
                     wanted: Sequence[str], now: datetime, env: Mapping[str, str] | None) -> list[Notice]:
    """The finish, once per channel."""
    told = state.finished.get(report.job_name)
    told = dict(told) if isinstance(told, dict) else {c: told for c in CHANNELS} if told is not None else {}
    on = [c for c in wanted if told.get(c) != report.finished_at]
    if not on:
        return []
    subject, body = alert_text.finished_email(experiment, report)
    message_id, sent, failed = _send(settings, subject, body, on, now, env)
    state.finished[report.job_name] = told | {c: report.finished_at for c in sent}
    return _notices("finished", (), message_id, subject, sent, failed)


def _subject(subject: str) -> str:
    """The subject as build_message puts it in the header."""
    return header_text(scrub(subject), SUBJECT_MAX)


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
    None, worked. A failure is sent at once and then at most once per `cooldown_minutes` while it
    lasts, on each channel by itself; the first success after a sent failure sends one recovery on
    each channel that told of it; a failure never sent clears silently. `command` is what to run by
    hand to see the failure.

    A channel that fails raises NotifyError (naming it, and what did go out) with the state saved, so
    the next run tries that channel again while the others keep their cooldown.
    """
    _check_cooldown(cooldown_minutes)
    now = now or _now()
    error = None if error is None else scrub(error, env_secrets([settings.password_env], env))
    wanted = channels(settings)
    with _state_file(Path(state_path)) as state:
        if error is not None:
            entry = _record(state.jobs, job, error, now)
            on = [c for c in wanted if _due(entry, c, now, cooldown_minutes)]
            if not on:
                last = max(t for c in wanted if (t := _sent_at(entry, c)) is not None)
                return JobNotice("held", f"{job} failed again (failing since {entry['since']}); the alert email was "
                                         f"held back: last sent {last.isoformat()}, it repeats at most every "
                                         f"{cooldown_minutes:g} minutes while {job} keeps failing")
            subject, body = alert_text.job_alert_email(experiment, job, error, command,
                                                       datetime.fromisoformat(entry["since"]), cooldown_minutes, now)
            message_id, sent, failed = _send(settings, subject, body, on, now, env)
            for channel in on:
                _tried(entry, channel, failed.get(channel), now.isoformat())
            return _job_outcome("alert", settings, message_id, subject, sent, failed)
        entry = state.jobs.get(job)
        on = [c for c in wanted if entry is not None and _sent_at(entry, c)]
        if entry is None or not on:  # no failure, or one never sent
            state.jobs.pop(job, None)
            return JobNotice("quiet", "")
        subject, body = alert_text.job_recovery_email(experiment, job, entry, now)
        message_id, sent, failed = _send(settings, subject, body, on, now, env)
        for channel in on:
            _tried(entry, channel, failed.get(channel), None)
        if not any(_sent_at(entry, c) for c in wanted):
            del state.jobs[job]
        return _job_outcome("recovery", settings, message_id, subject, sent, failed)


def _job_outcome(kind: str, settings: SmtpSettings, message_id: str, subject: str, sent: Sequence[str],
                 failed: Mapping[str, str]) -> JobNotice:
    line = f"{kind} email sent to {destinations(settings, sent)} ({message_id}): {_subject(subject)}" if sent else ""
    if failed:
        raise NotifyError("; ".join(failed.values()) + (f" (the {kind} did go out: {line})" if line else ""))
    return JobNotice(kind, line)
