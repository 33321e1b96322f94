"""A real SMTP server (aiosmtpd) on 127.0.0.1 for the alert tests: plain, STARTTLS with a login, a test certificate.

`plain_server` and `starttls_server` give `(inbox, port)`; `inbox.messages` holds what was received.
`plain_outbox(port)` sends to the plain server (and, given `webhook_env`, to a webhook too);
`alerts_yaml(port)` is the `alerts:` section of an experiment that emails the plain server.
"""

from __future__ import annotations

import contextlib

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

from bigscience_ops.launch.local import free_port
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


@contextlib.contextmanager
def https_hook(cert: tuple[str, str], path: str = "/hook") -> Iterator[Hooked]:
    """An https server on loopback with the test certificate that records the JSON body of each POST to
    `hooked.url` (trust it with ca_file=cert[0]) and answers `hooked.status`."""
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
    hooked.url = f"https://127.0.0.1:{server.server_address[1]}{path}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield hooked
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def mail_and_hook(cert: tuple[str, str]) -> Iterator[tuple[Inbox, int, Hooked]]:
    """One SMTP server and one https webhook (https_hook) shared by a module's rows, each row emptying them:
    (inbox, the SMTP port, the webhook)."""
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        with https_hook(cert) as hooked:
            yield inbox, controller.port, hooked
    finally:
        controller.stop()


@pytest.fixture
def webhook_server(cert: tuple[str, str]) -> Iterator[Hooked]:
    """An https server with the test certificate that records JSON POSTs to a Slack-like URL (https_hook)."""
    with https_hook(cert, "/services/T000/B000/SECRETPART") as hooked:
        yield hooked


# --- hostile servers: a loopback server whose every connection runs a script of the test's -----------------

DRIP_S = 0.1
"""How often a dripping server sends its next line: shorter than the limit (tests/hostile/test_hostile_network.py's 0.25 s),
so that a time per read would never end a drip."""


class Loopback:
    """A TCP server on 127.0.0.1 (`port`) that runs `serve(conn, stop)` for each connection in a thread of its
    own, after a TLS handshake with `tls` when given. `stop` is set when the server closes, which also shuts
    every connection down: a script that waits or drips for ever ends then. What a script raises (the client
    went away) ends its connection quietly; `connections` counts them."""

    def __init__(self, serve, tls: ssl.SSLContext | None = None) -> None:
        import socket
        import threading

        self.serve, self.tls = serve, tls
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._open: list = []
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        import threading

        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            thread = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _handle(self, conn) -> None:
        try:
            conn.settimeout(30)
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
                self._open.append(conn)
            self.serve(conn, self.stop)
        except (OSError, ValueError):
            pass  # the client hung up (a deadline cut it off): what these servers are for
        finally:
            conn.close()

    def close(self) -> list[str]:
        """Stop; returns the scripts still running a few seconds later (none, unless one ignores `stop`)."""
        import socket

        self.stop.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread now, not at its next 0.2 s poll
        except OSError:
            pass
        self.listener.close()
        for conn in list(self._open):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(5)
        return [t.name for t in self._threads if t.is_alive()]


def drip(conn, stop, line: bytes, every: float = DRIP_S) -> None:
    """Send `line` now and every `every` seconds until the server stops or the client hangs up."""
    conn.sendall(line)
    while not stop.wait(every):
        conn.sendall(line)


def read_line(reader) -> bytes:
    line = reader.readline(100_000)
    if not line:
        raise ConnectionAbortedError("the client hung up")
    return line


@dataclass
class SmtpScript:
    """What a scripted SMTP server answers: `banner`, then per command verb (EHLO, HELO, STARTTLS, AUTH, MAIL,
    RCPT, DATA, `.` for the end of the message's data, QUIT) the raw reply lines in `replies`, else an
    accepting default. A verb in `drips` (or `banner`) is answered with that line again every DRIP_S seconds
    for ever; `silent_after` is a verb after whose reply nothing more is said (nor read, nor TLS begun)."""

    banner: bytes = b"220 hostile.example ESMTP\r\n"
    replies: dict[str, bytes] = field(default_factory=dict)
    drips: dict[str, bytes] = field(default_factory=dict)
    silent_after: str | None = None
    tls: ssl.SSLContext | None = None
    """The context STARTTLS upgrades with (advertised only with it)."""
    pause_s: float = 0.0
    """How long it thinks before each reply, the banner included (each well within a per-read timeout)."""
    commands: list[str] = field(default_factory=list)
    """The verbs the client sent, in order."""

    DEFAULTS = {"EHLO": b"250-hostile.example\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME\r\n",
                "HELO": b"250 hostile.example\r\n", "STARTTLS": b"220 go ahead\r\n", "AUTH": b"235 welcome\r\n",
                "MAIL": b"250 sender ok\r\n", "RCPT": b"250 recipient ok\r\n", "DATA": b"354 end with .\r\n",
                ".": b"250 queued\r\n", "QUIT": b"221 bye\r\n", "RSET": b"250 ok\r\n", "NOOP": b"250 ok\r\n"}

    def reply(self, verb: str) -> bytes:
        if verb in self.replies:
            return self.replies[verb]
        if verb == "EHLO" and self.tls is not None:
            return b"250-hostile.example\r\n250-STARTTLS\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME\r\n"
        return self.DEFAULTS.get(verb, b"502 not implemented\r\n")

    def serve(self, conn, stop) -> None:
        if "banner" in self.drips:
            drip(conn, stop, self.drips["banner"])
            return
        stop.wait(self.pause_s)
        conn.sendall(self.banner)
        if self.silent_after == "banner" or not self.banner.startswith(b"220 "):
            stop.wait()
            return
        reader = conn.makefile("rb")
        while True:
            line = read_line(reader)
            verb = line.split(b" ", 1)[0].strip().upper().decode("ascii", "replace")
            self.commands.append(verb)
            if verb == "AUTH" and line.split()[1:2] == [b"LOGIN"] and len(line.split()) == 3:
                conn.sendall(b"334 UGFzc3dvcmQ6\r\n")  # LOGIN with the name given: ask for the password
                read_line(reader)
            if verb in self.drips:
                drip(conn, stop, self.drips[verb])
                return
            stop.wait(self.pause_s)
            conn.sendall(self.reply(verb))
            if self.silent_after == verb:
                stop.wait()
                return
            if verb == "DATA" and self.reply(verb).startswith(b"354"):
                while read_line(reader) != b".\r\n":
                    pass
                self.commands.append(".")
                if "." in self.drips:
                    drip(conn, stop, self.drips["."])
                    return
                conn.sendall(self.reply("."))
            elif verb == "STARTTLS" and self.reply(verb).startswith(b"220") and self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
                reader = conn.makefile("rb")
            elif verb == "QUIT":
                return


@pytest.fixture
def scripted_smtp() -> Iterator:
    """`start(script) -> port`: a Loopback SMTP server running `script` (an SmtpScript) on each connection;
    every server started is stopped, and must have stopped, at the end."""
    servers: list[Loopback] = []

    def start(script: SmtpScript, tls: ssl.SSLContext | None = None) -> int:
        servers.append(Loopback(script.serve, tls))
        return servers[-1].port

    yield start
    stuck = [name for server in servers for name in server.close()]
    assert not stuck, f"scripts still running after the server stopped: {stuck}"
