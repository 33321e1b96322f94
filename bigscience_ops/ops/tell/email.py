"""The email channel: alerts to the on-call list over SMTP, with settings of its own (SmtpSettings).

The SMTP password is read from the environment variable the settings name; it is never stored,
logged, or put into an error message (nor into a message: it is among the channel's secret_envs).
Addresses are checked to be one line each, as the subject is (message.header_text), so nothing a
setting holds can add a header. A failure names the server, never the password.

One email is one exchange with the server, and it has a total time (SmtpSettings.timeout_s,
deadline.Deadline): the connection, the banner, STARTTLS or TLS, the login and the message must all be
done within it, so a server that drips its banner or answers each command slowly is cut off when the
time is up, and the channel has failed. Once the server has taken the message, a slow goodbye (QUIT)
no longer counts as a failure: the alert went out, and sending it again would repeat it.
"""

from __future__ import annotations

import smtplib
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import format_datetime
from typing import TYPE_CHECKING, ClassVar

from bigscience_ops.deadline import Deadline, connect, in_time, tls_context
from bigscience_ops.ops.tell.message import ChannelError, Message, NotifyError, header_text
from bigscience_ops.redact import scrub

if TYPE_CHECKING:
    from bigscience_ops.schema import AlertsConfig

SECURITY_CHOICES = ("starttls", "ssl", "none")
DEFAULT_PORTS = {"starttls": 587, "ssl": 465, "none": 25}
"""The usual SMTP port of each security choice."""
TIMEOUT_S = 30.0
"""The whole of one email at most (connect, banner, TLS, login, the message), unless the settings say otherwise."""


class _Smtp(smtplib.SMTP):
    """smtplib's client on a connection that keeps `deadline` (deadline.connect) from the first byte."""

    def __init__(self, deadline: Deadline, host: str, port: int, **options: object) -> None:
        self.deadline = deadline  # before smtplib's __init__, which connects
        super().__init__(host, port, timeout=deadline.seconds, **options)  # type: ignore[arg-type]

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return connect(host, port, self.deadline)


class _SmtpSsl(smtplib.SMTP_SSL):
    """SMTP over TLS from the start: _Smtp's connection, wrapped with the settings' context (whose TLS sockets keep
    the same deadline, deadline.tls_context)."""

    def __init__(self, deadline: Deadline, host: str, port: int, **options: object) -> None:
        self.deadline = deadline
        super().__init__(host, port, timeout=deadline.seconds, **options)  # type: ignore[arg-type]

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return self.context.wrap_socket(connect(host, port, self.deadline), server_hostname=self._host)


def _local_hostname(deadline: Deadline) -> str:
    """The name smtplib would say EHLO with (its own rule: the FQDN, else [address]), looked up within `deadline`
    (the resolver takes no timeout); this host's plain name when the lookup takes longer than half of it."""
    def smtplib_rule() -> str:
        fqdn = socket.getfqdn()
        return fqdn if "." in fqdn else f"[{socket.gethostbyname(socket.gethostname())}]"

    try:
        return in_time(smtplib_rule, Deadline(deadline.remaining() / 2), "looking up this host's name")
    except OSError:
        return socket.gethostname() or "localhost"


@dataclass(frozen=True)
class SmtpSettings:
    """Where alert emails go and how they get there."""

    host: str
    """SMTP server name or address."""
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
    """CA bundle to verify the server with, instead of the system's (a site CA, a test server)."""
    timeout_s: float = TIMEOUT_S
    """The whole of one email at most: connect, banner, STARTTLS or TLS, login and the message."""

    def __post_init__(self) -> None:
        recipients = (self.recipients,) if isinstance(self.recipients, str) else tuple(self.recipients)
        object.__setattr__(self, "recipients", recipients)
        if self.security not in SECURITY_CHOICES:
            raise NotifyError(f"smtp.security: got {self.security!r}; allowed: {', '.join(SECURITY_CHOICES)}")
        if not self.host:
            raise NotifyError("smtp.host: got an empty host; give the SMTP server's name or address")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise NotifyError(f"smtp.port: got {self.port!r}; allowed: a port number 1-65535")
        if not recipients or not all("@" in r and header_text(r) == r for r in recipients):
            raise NotifyError(f"smtp.recipients: got {list(recipients)!r}; allowed: one or more email addresses, "
                              "each without spaces, control characters or line breaks")
        if self.user and not self.password_env:
            raise NotifyError(f"smtp.password_env: got None while smtp.user is {self.user!r}; allowed: the "
                              f"name of the environment variable that holds the password")


@dataclass(frozen=True)
class EmailChannel:
    """Every message, as one email to all the recipients."""

    settings: SmtpSettings
    name: ClassVar[str] = "email"

    @classmethod
    def from_alerts(cls, alerts: AlertsConfig) -> EmailChannel | None:
        """alerts.email_to by alerts.smtp_*; None without a recipient."""
        if not alerts.email_to:
            return None
        return cls(SmtpSettings(host=alerts.smtp_host, recipients=tuple(alerts.email_to), port=alerts.smtp_port,
                                security=alerts.smtp_security, user=alerts.smtp_user,
                                password_env=alerts.smtp_password_env if alerts.smtp_user else None,
                                timeout_s=TIMEOUT_S))

    @property
    def secret_envs(self) -> tuple[str, ...]:
        return (self.settings.password_env,) if self.settings.password_env else ()

    def destination(self) -> str:
        return ", ".join(self.settings.recipients)

    def send(self, message: Message, env: Mapping[str, str]) -> None:
        settings, email = self.settings, self.email(message)
        password = None
        if settings.user:
            password = env.get(settings.password_env or "")
            if password is None:
                raise ChannelError(self.name, f"environment variable {settings.password_env} (smtp.password_env) is "
                                              f"not set; export the SMTP password for {settings.user!r} in it")
        where = f"{settings.host}:{settings.port} ({settings.security})"
        deadline = Deadline(settings.timeout_s)
        client: smtplib.SMTP | None = None
        try:
            context = tls_context(settings.ca_file, deadline) if settings.security != "none" else None
            local = _local_hostname(deadline)
            if settings.security == "ssl":
                client = _SmtpSsl(deadline, settings.host, settings.port, local_hostname=local, context=context)
            else:
                client = _Smtp(deadline, settings.host, settings.port, local_hostname=local)
            if settings.security == "starttls":
                client.starttls(context=context)
            if settings.user:
                client.login(settings.user, password or "")
            client.send_message(email)
        except (smtplib.SMTPException, OSError, ValueError) as exc:
            if client is not None:
                client.close()
            if deadline.expired:
                detail = (f"the server did not finish within {settings.timeout_s:g} s (the whole exchange's limit: "
                          f"a slow or dripping server is cut off; last: {type(exc).__name__})")
            else:
                detail = header_text(scrub(f"{type(exc).__name__}: {exc}", [password] if password else []), 500)
            raise ChannelError(self.name, f"could not send email {message.subject!r} via {where}: {detail}") from None
        try:
            client.quit()
        except (smtplib.SMTPException, OSError):
            client.close()  # the server has the message: a goodbye that fails changes nothing

    def email(self, message: Message) -> EmailMessage:
        """The message as an email: From, To, Subject, Date (RFC 5322, with zone), Message-ID, the body."""
        msg = EmailMessage()
        msg["From"] = message.sender
        msg["To"] = ", ".join(self.settings.recipients)
        msg["Subject"] = message.subject
        msg["Date"] = format_datetime(message.date)
        msg["Message-ID"] = message.message_id
        msg.set_content(message.body)
        return msg
