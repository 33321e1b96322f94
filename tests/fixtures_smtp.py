"""A real SMTP server (aiosmtpd) on 127.0.0.1 for the alert tests: plain, STARTTLS with a login, a test certificate.

`plain_server` and `starttls_server` give `(inbox, port)`; `inbox.messages` holds what was received.
`plain_outbox(port)` sends to the plain server (and, given `webhook_env`, to a webhook too);
`alerts_yaml(port)` is the `alerts:` section of an experiment that emails the plain server.
"""

from __future__ import annotations

import email
import email.policy
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from bigscience_ops.launch import free_port
from bigscience_ops.ops.tell.channels import Outbox
from bigscience_ops.ops.tell.email import EmailChannel, SmtpSettings
from bigscience_ops.ops.tell.webhook import WebhookChannel, WebhookSettings

PASSWORD = "s3cret-Pa55word"
T0 = datetime(2026, 11, 22, 10, 0, 0)


@dataclass
class Inbox:
    """The messages the server received, and who logged in."""

    messages: list[email.message.EmailMessage] = field(default_factory=list)
    envelopes: list[tuple[str, list[str]]] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd handler hook
        msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        self.messages.append(msg)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 OK"

    def authenticate(self, server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and auth_data.password == PASSWORD.encode()
        if ok:
            self.logins.append(auth_data.login.decode())
        return AuthResult(success=ok, handled=False)


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1: (cert.pem, key.pem)."""
    folder = tmp_path_factory.mktemp("tls")
    key, crt = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(crt), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return str(crt), str(key)


def server_tls(cert: tuple[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    return context


@pytest.fixture
def plain_server() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield inbox, controller.port
    controller.stop()


@pytest.fixture
def starttls_server(cert: tuple[str, str]) -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), tls_context=server_tls(cert),
                            require_starttls=True, authenticator=inbox.authenticate, auth_require_tls=True)
    controller.start()
    yield inbox, controller.port
    controller.stop()


@contextmanager
def serving(inbox: Inbox, port: int) -> Iterator[None]:
    """A plain server on a given port for a while (a send that failed before it started is retried)."""
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield
    finally:
        controller.stop()


def plain_settings(port: int, **changes) -> SmtpSettings:
    values = dict(host="127.0.0.1", port=port, security="none", recipients=("oncall@example.org", "lead@example.org"))
    values.update(changes)
    return SmtpSettings(**values)


def plain_outbox(port: int, *, sender: str = "bsops-bot@example.org", webhook_env: str | None = None,
                 **changes) -> Outbox:
    """Email to the plain server on `port` (SmtpSettings `changes`), and to the webhook in `webhook_env` too when
    given (trusting `ca_file`, as the email does)."""
    found: list = [EmailChannel(plain_settings(port, **changes))]
    if webhook_env is not None:
        found.append(WebhookChannel(WebhookSettings(webhook_env, ca_file=changes.get("ca_file"))))
    return Outbox(tuple(found), sender)


def webhook_outbox(variable: str, cert: tuple[str, str], sender: str = "b@example.org") -> Outbox:
    """The webhook in `variable` alone, trusting the test certificate."""
    return Outbox((WebhookChannel(WebhookSettings(variable, ca_file=cert[0])),), sender)


def alerts_yaml(port: int, cooldown_minutes: int | None = None) -> str:
    """The `alerts:` line of an experiment file whose emails go to the plain server on `port`."""
    cooldown = "" if cooldown_minutes is None else f", cooldown_minutes: {cooldown_minutes}"
    return ("alerts: {email_to: [oncall@example.org], email_from: bot@example.org, smtp_host: 127.0.0.1, "
            f"smtp_port: {port}, smtp_security: none{cooldown}}}\n")


@dataclass
class Hooked:
    """What a webhook server received: the JSON bodies of its POSTs."""

    url: str
    posts: list[dict] = field(default_factory=list)
    status: int = 200


@pytest.fixture
def webhook_server(cert: tuple[str, str]) -> Iterator[Hooked]:
    """An https server with the test certificate that records JSON POSTs (trust it with ca_file=cert[0])."""
    import json as _json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hooked = Hooked("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's hook name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hooked.posts.append(_json.loads(body))
            self.send_response(hooked.status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = server_tls(cert).wrap_socket(server.socket, server_side=True)
    hooked.url = f"https://127.0.0.1:{server.server_address[1]}/services/T000/B000/SECRETPART"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hooked
    finally:
        server.shutdown()
        server.server_close()
