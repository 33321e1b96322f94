"""The webhook channel: every alert as one Slack-compatible JSON POST, with settings of its own (WebhookSettings).

The webhook's URL is a secret (whoever holds it can post to the channel), so it is never in a YAML
file, an argument, a log or an error: `alerts.webhook_url_env` names the environment variable that
holds it, and only an https URL is used. It gets the same messages as email, under the same cooldown
and recovery rules but with a state of its own (notify.py): a failing webhook is retried on the next
run and neither repeats nor holds back the email (nor the email the webhook).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.tell.message import ChannelError, Message
from bigscience_ops.redact import scrub

if TYPE_CHECKING:
    from bigscience_ops.schema import AlertsConfig


class WebhookError(BsopsError):
    """The webhook cannot be reached or its setting is unusable: names the variable, never the URL."""


def url_from(env: Mapping[str, str], variable: str) -> str:
    """The webhook URL held in `variable`: set, one line, https with a host."""
    url = env.get(variable, "").strip()
    if not url:
        raise WebhookError(f"environment variable {variable} (alerts.webhook_url_env) is not set or empty; export "
                           "the webhook's https URL in it")
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname or any(c.isspace() for c in url) or parts.username:
        raise WebhookError(f"the webhook URL in {variable} (alerts.webhook_url_env) is not an https URL with a host "
                           "and no credentials or spaces; the URL itself is not shown, as it is a secret")
    return url


def post(url: str, subject: str, body: str, *, timeout: float = 30.0, ca_file: str | None = None) -> None:
    """POST {"text": subject, blank line, body} to `url`; raises WebhookError (without the URL) on failure."""
    host = urlsplit(url).hostname
    data = json.dumps({"text": f"{subject}\n\n{body}"}).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "bsops"})
    try:
        context = ssl.create_default_context(cafile=ca_file)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        raise WebhookError(f"the webhook at {host} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ssl.SSLError, ValueError) as exc:
        raise WebhookError(f"could not post to the webhook at {host}: {scrub(str(exc), [url])}") from None
    if not 200 <= status < 300:
        raise WebhookError(f"the webhook at {host} answered HTTP {status}")


@dataclass(frozen=True)
class WebhookSettings:
    """Where the webhook's URL is found and how it is reached."""

    url_env: str
    """Name of the environment variable holding the https URL (alerts.webhook_url_env); never the URL itself."""
    ca_file: str | None = None
    """CA bundle to verify the server with, instead of the system's (a site CA, a test server)."""
    timeout_s: float = 30.0


@dataclass(frozen=True)
class WebhookChannel:
    """Every message, as one POST of {"text": subject, blank line, body}."""

    settings: WebhookSettings
    name: ClassVar[str] = "webhook"

    @classmethod
    def from_alerts(cls, alerts: AlertsConfig) -> WebhookChannel | None:
        """alerts.webhook_url_env; None without it."""
        return cls(WebhookSettings(alerts.webhook_url_env)) if alerts.webhook_url_env else None

    @property
    def secret_envs(self) -> tuple[str, ...]:
        return ()

    def destination(self) -> str:
        return f"the webhook in ${self.settings.url_env}"

    def send(self, message: Message, env: Mapping[str, str]) -> None:
        variable = self.settings.url_env
        try:
            post(url_from(env, variable), message.subject, message.body, timeout=self.settings.timeout_s,
                 ca_file=self.settings.ca_file)
        except WebhookError as exc:
            named = variable in str(exc)
            raise ChannelError(self.name, f"{exc}{'' if named else f' (the webhook in ${variable})'}") from None
