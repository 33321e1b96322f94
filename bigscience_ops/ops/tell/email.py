"""One message out: the SMTP settings, the message itself, and its delivery on each channel (email over
SMTP, a Slack-compatible webhook over https, ops/tell/webhook.py). notify.py decides when a message is due.

The SMTP password is read from the environment variable the settings name; it is never stored,
logged, or put into an error message. Every subject and body is scrubbed of credentials
(redact.scrub). Headers are made safe: a job name or error text may hold any control character or
Unicode line break (U+2028, U+0085, ...), which email refuses in a header, so subjects carry only a
short, fixed headline with those replaced and are capped at SUBJECT_MAX characters; the details
(argv, log lines, errors) go in the body. A failure names the channel (the webhook by its variable,
never its URL) and is scrubbed like everything else.
"""

from __future__ import annotations

import os
import smtplib
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import TYPE_CHECKING

from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.tell import webhook
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
    (ops/tell/webhook.py); with it, `recipients` may be empty."""

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
