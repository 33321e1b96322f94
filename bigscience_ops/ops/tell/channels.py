"""The alert channels bsops knows, and one message sent on those an alerts section configures.

CHANNELS is the registry: each entry a class that follows message.Channel. A new channel is a module
beside email.py and webhook.py (the class and its own settings dataclass) and one line in CHANNELS;
building an `alerts:` section's channels, sending, the per-channel cooldown state (notify.py) and the
watchdog's lines all go through this list and the channel objects. Its order is the order a message
goes out in and its destinations are listed in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from bigscience_ops.deadline import this_host
from bigscience_ops.ops.tell.email import EmailChannel
from bigscience_ops.ops.tell.message import Channel, ChannelError, Message, NotifyError, compose, one_address
from bigscience_ops.ops.tell.webhook import WebhookChannel
from bigscience_ops.redact import env_secrets

if TYPE_CHECKING:
    from bigscience_ops.schema import AlertsConfig

CHANNELS: tuple[type[Channel], ...] = (
    EmailChannel,
    WebhookChannel,
)
NAMES = tuple(channel.name for channel in CHANNELS)
"""Every channel's key in the alert state file."""


@dataclass(frozen=True)
class Outbox:
    """The channels messages go out on, and the address they are from."""

    channels: tuple[Channel, ...]
    sender: str
    """From address of every message (alerts.email_from, else bsops@<this host>); its domain names the Message-ID."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(self.channels))
        names = [c.name for c in self.channels]
        if not names or len(set(names)) != len(names):
            raise NotifyError(f"alert channels: got {names}; allowed: one or more of {', '.join(NAMES)}, each once")
        if not one_address(self.sender):
            raise NotifyError(f"smtp.sender: got {self.sender!r}; allowed: an email address without spaces, control "
                              "characters or line breaks")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.channels)

    @property
    def secret_envs(self) -> tuple[str, ...]:
        """The variables whose values no message carries: every channel's."""
        return tuple(name for c in self.channels for name in c.secret_envs)

    def compose(self, subject: str, body: str, *, now: datetime | None = None, secrets: Sequence[str] = ()) -> Message:
        """One message from this outbox's sender, scrubbed of `secrets` and of every channel's secrets."""
        return compose(self.sender, subject, body, now=now, secrets=[*secrets, *env_secrets(self.secret_envs)])

    def deliver(self, message: Message, on: Sequence[str] | None = None, *,
                env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Send `message` on each channel named in `on` (default: all), each whatever the others do; returns
        the channels that failed with why (empty when all went out)."""
        env = os.environ if env is None else env
        failed = {}
        for channel in self.channels:
            if on is None or channel.name in on:
                try:
                    channel.send(message, env)
                except ChannelError as exc:
                    failed[channel.name] = str(exc)
        return failed

    def send(self, message: Message, *, env: Mapping[str, str] | None = None) -> str:
        """Send `message` on every channel; returns its Message-ID. Raises NotifyError naming each channel that
        failed and the cause, after trying the others."""
        failed = self.deliver(message, env=env)
        if failed:
            raise NotifyError("; ".join(failed.values()))
        return message.message_id

    def destinations(self, only: Sequence[str] | None = None) -> str:
        """Who a message went to, for logs: each channel's destination; `only` names the channels meant
        (default: all of them)."""
        return " and ".join(c.destination() for c in self.channels if only is None or c.name in only)


def outbox_from_alerts(alerts: AlertsConfig) -> Outbox | None:
    """The channels an experiment's (or cron.yaml's) alerts section configures; None when nobody is to be told."""
    found = tuple(channel for kind in CHANNELS if (channel := kind.from_alerts(alerts)) is not None)
    if not found:
        return None
    return Outbox(found, sender=alerts.email_from or f"bsops@{this_host()}")


def send_alert(alerts: AlertsConfig, subject: str, body: str) -> str:
    """Send one alert on an alerts section's channels; returns a line saying what happened (a channel that
    fails is named in it, not raised)."""
    outbox = outbox_from_alerts(alerts)
    if outbox is None:
        return "no alert email: alerts.email_to is empty"
    message = outbox.compose(subject, body)
    failed = outbox.deliver(message)
    sent = [c for c in outbox.names if c not in failed]
    went = f"alert email sent to {outbox.destinations(sent)} ({message.message_id})" if sent else ""
    if not failed:
        return went
    also = f"; {went}" if went else ""
    return f"***ALERT: the alert email could not be sent: {'; '.join(failed.values())}***{also}"
