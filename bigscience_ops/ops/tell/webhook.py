"""The webhook channel: every alert as one Slack-compatible JSON POST, with settings of its own (WebhookSettings).

The webhook's URL is a secret (whoever holds it can post to the channel), so it is never in a YAML
file, an argument, a log or an error: `alerts.webhook_url_env` names the environment variable that
holds it, and only an https URL is used. It gets the same messages as email, under the same cooldown
and recovery rules but with a state of its own (notify.py): a failing webhook is retried on the next
run and neither repeats nor holds back the email (nor the email the webhook).

One POST is one exchange with the URL's host (through the https proxy of the environment, when one is
set, as a CONNECT tunnel: the TLS session is still with that host), and it has a total time
(WebhookSettings.timeout_s, deadline.Deadline) from the name lookup to the answer's last byte: a server
that holds the answer back, or drips it, is a failed channel when that time is up. Only a 2xx answer,
read whole (at most MAX_ANSWER_BYTES), delivers the alert. A redirect is never followed (it would send
the alert elsewhere, or drop it): it is a failed channel like any other status, named by its number.
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import unquote, urlsplit

from bigscience_ops.errors import BsopsError
from bigscience_ops.deadline import Deadline, connect, tls_context
from bigscience_ops.ops.tell.message import ChannelError, Message, header_text
from bigscience_ops.redact import scrub

if TYPE_CHECKING:
    from bigscience_ops.schema import AlertsConfig

TIMEOUT_S = 30.0
"""The whole of one POST at most, from the name lookup to the answer's last byte, unless the settings say otherwise."""
MAX_ANSWER_BYTES = 64 * 1024
"""The longest answer body read: a webhook answers `ok` or a short JSON; more is a server gone wrong."""


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


def proxy_for(host: str) -> tuple[str, int, dict[str, str]] | None:
    """The https proxy the environment names for `host` (https_proxy, unless no_proxy covers it), as urllib
    would use it: (proxy host, port, the CONNECT request's headers); None to go straight to `host`."""
    proxy = urllib.request.getproxies_environment().get("https")
    if not proxy or urllib.request.proxy_bypass_environment(host):
        return None
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookError("the https_proxy environment variable is not an http://host:port proxy (not shown)")
    headers = {}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    return parts.hostname, parts.port or 443, headers  # urllib's port for a proxy named without one


def post(url: str, subject: str, body: str, *, timeout: float = TIMEOUT_S, ca_file: str | None = None) -> None:
    """POST {"text": subject, blank line, body} to `url`, all of it within `timeout` seconds; raises
    WebhookError (without the URL) unless the answer is a 2xx, complete in time."""
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme != "https" or not host:
        raise WebhookError("the webhook URL is not an https URL with a host (not shown: it is a secret)")
    secrets = [url, *(p for p in (parts.path, parts.query) if len(p) > 1)]
    data = json.dumps({"text": f"{subject}\n\n{body}"}).encode("utf-8")
    deadline = Deadline(timeout)
    try:
        status = _exchange(host, parts.port or 443, parts.path or "/", parts.query, data, deadline, ca_file)
    except (http.client.HTTPException, OSError, ValueError) as exc:
        if deadline.expired:
            raise WebhookError(f"the webhook at {host} did not answer in full within {timeout:g} s (the whole "
                               "exchange's limit: a slow or dripping server is cut off)") from None
        said = header_text(scrub(f"{type(exc).__name__}: {exc}", secrets), 500)  # a server's bytes: one line
        raise WebhookError(f"could not post to the webhook at {host}: {said}") from None
    if 300 <= status < 400:
        raise WebhookError(f"the webhook at {host} answered HTTP {status}, a redirect, which bsops never follows "
                           "(the alert was not delivered; check the URL)")
    if not 200 <= status < 300:
        raise WebhookError(f"the webhook at {host} answered HTTP {status}")


def _exchange(host: str, port: int, path: str, query: str, data: bytes, deadline: Deadline,
              ca_file: str | None) -> int:
    """One POST over one connection kept to `deadline`: the answer's status (its body read when it is a 2xx)."""
    proxy = proxy_for(host)
    target = (host, port) if proxy is None else proxy[:2]
    conn = http.client.HTTPSConnection(*target, timeout=deadline.remaining(), context=tls_context(ca_file, deadline))
    # http.client connects (and tunnels, and starts TLS) through this: every socket of the POST keeps the deadline
    conn._create_connection = lambda address, *_: connect(*address, deadline)  # type: ignore[attr-defined]
    if proxy is not None:
        conn.set_tunnel(host, port, headers=proxy[2])
    try:
        conn.request("POST", path + (f"?{query}" if query else ""), body=data,
                     headers={"Content-Type": "application/json", "User-Agent": "bsops", "Connection": "close"})
        response = conn.getresponse()
        if 200 <= response.status < 300:
            _read_answer(response, host)
        return response.status
    finally:
        conn.close()


def _read_answer(response: http.client.HTTPResponse, host: str) -> None:
    """Read the answer's body to its end: at most MAX_ANSWER_BYTES, and all that its length promised."""
    size = 0
    while size <= MAX_ANSWER_BYTES and (chunk := response.read(MAX_ANSWER_BYTES + 1 - size)):
        size += len(chunk)
    if size > MAX_ANSWER_BYTES:
        raise WebhookError(f"the webhook at {host} answered HTTP {response.status} with a body of more than "
                           f"{MAX_ANSWER_BYTES} bytes, which no webhook sends")
    if response.length:  # the server hung up before the end its Content-Length named
        raise http.client.IncompleteRead(b"", response.length)


@dataclass(frozen=True)
class WebhookSettings:
    """Where the webhook's URL is found and how it is reached."""

    url_env: str
    """Name of the environment variable holding the https URL (alerts.webhook_url_env); never the URL itself."""
    ca_file: str | None = None
    """CA bundle to verify the server with, instead of the system's (a site CA, a test server)."""
    timeout_s: float = TIMEOUT_S
    """The whole of one POST at most (name lookup, connect, TLS, request, the complete answer)."""


@dataclass(frozen=True)
class WebhookChannel:
    """Every message, as one POST of {"text": subject, blank line, body}."""

    settings: WebhookSettings
    name: ClassVar[str] = "webhook"

    @classmethod
    def from_alerts(cls, alerts: AlertsConfig) -> WebhookChannel | None:
        """alerts.webhook_url_env; None without it."""
        return cls(WebhookSettings(alerts.webhook_url_env, timeout_s=TIMEOUT_S)) if alerts.webhook_url_env else None

    @property
    def secret_envs(self) -> tuple[str, ...]:
        return (self.settings.url_env,)  # the URL is a secret: no message carries it

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
