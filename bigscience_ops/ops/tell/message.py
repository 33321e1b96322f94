"""What every alert channel is and sends: the Channel protocol, the Message, and the errors.

A message is made once (`compose`) and goes out on each channel as it is: its subject is scrubbed of
credentials (redact.scrub), made one safe line and capped at SUBJECT_MAX characters, since a job name or
an error text may hold any control character or Unicode line break (U+2028, U+0085, ...), which email
refuses in a header; the details (argv, log lines, errors) go in the body, scrubbed too. Neither holds a live
link or a raw control character, whatever built them (quoting.defang_block: the values of a run's files are
quoted one by one before, quoting.quote_untrusted). Its
Message-ID, made in the sender's domain, names it in logs whichever channels carried it.

A channel (channels.py lists them) is a small class: its `name` keys its part of the alert state,
`from_alerts` builds it from an `alerts:` section (or says it is not configured there), `destination`
says where it delivers without a secret, `secret_envs` names the variables whose values no message may
carry, and `send` delivers one message or raises ChannelError naming what failed.

Every connection a channel makes keeps one total deadline (deadline.py): a time for the whole exchange
(name lookup, connect, TLS handshake, every read and write), not a time per read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import make_msgid
from typing import TYPE_CHECKING, ClassVar, Protocol

from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.tell.quoting import defang_block
from bigscience_ops.redact import scrub
from bigscience_ops.config.validation import is_email_address

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


def subject_line(subject: str, secrets: Sequence[str] = ()) -> str:
    """The subject as a message carries it: scrubbed of credentials and `secrets`, made one safe line (header_text),
    no link (quoting.defang_block) and capped at SUBJECT_MAX characters."""
    return header_text(defang_block(header_text(scrub(subject, secrets))), SUBJECT_MAX)


def compose(sender: str, subject: str, body: str, *, now: datetime | None = None,
            secrets: Sequence[str] = ()) -> Message:
    """A message from `sender`: the subject scrubbed of credentials and `secrets`, made one safe line without a link
    and capped (subject_line); the body scrubbed the same way, its line ends made `\\n`, every line printable and
    without a live link (quoting.defang_block: the net under the values from a run's files, which alert_text and
    the watchdog quote one by one with quoting.quote_untrusted)."""
    lines = defang_block(re.sub(r"\r\n|\r", "\n", scrub(body, secrets)))
    return Message(sender=sender, subject=subject_line(subject, secrets),
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
