"""What every alert channel is and sends: the Channel protocol, the Message, and the errors.

A message is made once (`compose`) and goes out on each channel as it is: its subject is scrubbed of
credentials (redact.scrub), made one safe line and capped at SUBJECT_MAX characters, since a job name or
an error text may hold any control character or Unicode line break (U+2028, U+0085, ...), which email
refuses in a header; the details (argv, log lines, errors) go in the body, scrubbed too. Its
Message-ID, made in the sender's domain, names it in logs whichever channels carried it.

A channel (channels.py lists them) is a small class: its `name` keys its part of the alert state,
`from_alerts` builds it from an `alerts:` section (or says it is not configured there), `destination`
says where it delivers without a secret, `secret_envs` names the variables whose values no message may
carry, and `send` delivers one message or raises ChannelError naming what failed.

Every connection a channel makes keeps one Deadline: a total time for the whole exchange (name
lookup, connect, TLS handshake, every read and write), not a time per read. Its sockets (`connect`,
and the TLS sockets a `tls_context` makes) set their timeout to what is left before each operation
and refuse any operation once nothing is left, so a server that answers one byte at a time, or one
header line every few seconds, is cut off when the channel's time is up. No signal, no thread per
read: a name lookup alone runs in a daemon thread, since the resolver takes no timeout.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import make_msgid
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from bigscience_ops.errors import BsopsError
from bigscience_ops.redact import scrub
from bigscience_ops.validation import is_email_address

if TYPE_CHECKING:
    from bigscience_ops.schema import AlertsConfig

SUBJECT_MAX = 120
"""Characters in a subject at most; what a subject leaves out is in the body."""


class NotifyError(BsopsError):
    """An alert could not be sent, or the alert settings or state are unusable."""


class ChannelError(NotifyError):
    """One channel could not send a message: the text names the channel's destination (never a secret) and why."""

    def __init__(self, channel: str, message: str) -> None:
        super().__init__(message)
        self.channel = channel


def header_text(text: str, limit: int | None = None) -> str:
    """`text` fit for one email header: every control character and line break (str.isprintable()
    is false for each, U+2028 and U+0085 included) becomes a space, runs of spaces one, and a
    text over `limit` characters is cut with '...'."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if limit is not None and len(flat) > limit:
        flat = flat[:limit - 3].rstrip() + "..."
    return flat


def one_address(address: str) -> bool:
    """Whether `address` is an email address on one line (validation.is_email_address, the rule the config's
    addresses are checked with)."""
    return is_email_address(address)


@dataclass(frozen=True)
class Message:
    """One alert, recovery or finish, as every channel sends it."""

    sender: str
    """Who it is from (an email address); its domain names the Message-ID."""
    subject: str
    """One line, scrubbed, at most SUBJECT_MAX characters."""
    body: str
    """Scrubbed; its lines end in a newline, as email carries them."""
    date: datetime
    """When it was made, with its time zone."""
    message_id: str
    """`<...@domain>`, unique: how logs and the alert state name it."""


def compose(sender: str, subject: str, body: str, *, now: datetime | None = None,
            secrets: Sequence[str] = ()) -> Message:
    """A message from `sender`: the subject scrubbed of credentials and `secrets`, made one safe line and
    capped (header_text); the body scrubbed the same way, its line ends made `\\n`."""
    lines = re.sub(r"\r\n|\r", "\n", scrub(body, secrets))
    return Message(sender=sender, subject=header_text(scrub(subject, secrets), SUBJECT_MAX),
                   body=lines if lines.endswith("\n") else lines + "\n", date=(now or datetime.now()).astimezone(),
                   message_id=make_msgid(idstring="bsops", domain=sender.rpartition("@")[2]))


class Channel(Protocol):
    """One way an alert reaches people. A class that follows this and has a line in channels.CHANNELS is a
    channel: the alert state, the cooldown, the watchdog's lines and the hourly jobs use it by that alone."""

    name: ClassVar[str]
    """Its key in the alert state file (per condition: when it last sent, why it last failed)."""

    @classmethod
    def from_alerts(cls, alerts: AlertsConfig) -> Channel | None:
        """The channel an `alerts:` section configures; None when the section does not use it."""
        ...

    @property
    def secret_envs(self) -> tuple[str, ...]:
        """Names of the environment variables whose values must never be in a message (a password)."""
        ...

    def destination(self) -> str:
        """Where it delivers, for logs: addresses, or the variable that holds a secret URL (never the URL)."""
        ...

    def send(self, message: Message, env: Mapping[str, str]) -> None:
        """Deliver `message` (secrets read from `env`); raises ChannelError naming the destination and the cause."""
        ...


class DeadlineExceeded(TimeoutError):
    """A connection's Deadline passed: the exchange did not end within the time it was given."""


class Deadline:
    """The moment (time.monotonic) by which one whole exchange with a server must be over."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def remaining(self) -> float:
        """Seconds left; raises DeadlineExceeded when none are."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"the {self.seconds:g} s allowed for the whole exchange ran out")
        return left


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every operation may take only what is left of its deadline."""

    deadline: Deadline

    def _arm(self) -> None:
        self.settimeout(self.deadline.remaining())

    def connect(self, address: Any) -> None:
        self._arm()
        super().connect(address)

    def recv(self, *args: Any) -> bytes:
        self._arm()
        return super().recv(*args)

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return super().recv_into(*args)

    def send(self, *args: Any) -> int:
        self._arm()
        return super().send(*args)

    def sendall(self, *args: Any) -> None:  # one call: CPython bounds the whole of it by the timeout
        self._arm()
        super().sendall(*args)


class _DeadlineSSLSocket(ssl.SSLSocket):
    """A TLS socket whose handshake, reads and writes may each take only what is left of the deadline of the
    context that made it (a subclass per context sets `deadline`; tls_context)."""

    deadline: ClassVar[Deadline]

    def _arm(self) -> None:
        self.settimeout(self.deadline.remaining())

    def do_handshake(self, *args: Any) -> None:
        self._arm()
        super().do_handshake(*args)

    def read(self, *args: Any) -> Any:
        self._arm()
        return super().read(*args)

    def write(self, *args: Any) -> int:
        self._arm()
        return super().write(*args)

    def recv(self, *args: Any) -> bytes:
        self._arm()
        return super().recv(*args)

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return super().recv_into(*args)

    def send(self, *args: Any) -> int:  # sendall sends through here, piece by piece
        self._arm()
        return super().send(*args)

    def unwrap(self) -> socket.socket:
        self._arm()
        return super().unwrap()


def tls_context(ca_file: str | None, deadline: Deadline) -> ssl.SSLContext:
    """The default client context (certificate and host name checked; `ca_file` instead of the system's CAs when
    given), whose sockets all keep `deadline`, the handshake included."""
    context = ssl.create_default_context(cafile=ca_file)
    context.sslsocket_class = type("DeadlineSSLSocket", (_DeadlineSSLSocket,), {"deadline": deadline})
    return context


def in_time(work: Any, deadline: Deadline, what: str) -> Any:
    """`work()` (a blocking call that takes no timeout: the resolver) run in a daemon thread, waited for until
    `deadline`; raises DeadlineExceeded naming `what` when it has not returned by then (the thread is left to
    end on its own: it holds no socket of ours and never keeps the process alive)."""
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = work()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread as it is)
            done["error"] = exc

    thread = threading.Thread(target=run, name=f"bsops-{what}", daemon=True)
    thread.start()
    thread.join(deadline.remaining())
    if thread.is_alive():
        raise DeadlineExceeded(f"{what} did not end within the {deadline.seconds:g} s allowed")
    if "error" in done:
        raise done["error"]
    return done["value"]


def connect(host: str, port: int, deadline: Deadline) -> socket.socket:
    """A TCP connection to host:port (each address the name has, in turn) whose every later operation keeps
    `deadline`; the name lookup and each connect attempt keep it too."""
    addresses = in_time(lambda: socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM), deadline,
                        f"looking up {host}")
    error: OSError = OSError(f"{host} has no address")
    for family, kind, proto, _, address in addresses:
        sock = _DeadlineSocket(family, kind, proto)
        sock.deadline = deadline
        try:
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
            if deadline.expired:
                break
    raise error
