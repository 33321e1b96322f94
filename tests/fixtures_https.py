"""Hostile https servers on 127.0.0.1 for the webhook tests: each connection runs a script of the test's.

`hostile_https(script, tls=...) -> Server` starts a Loopback (fixtures_smtp) that does the TLS handshake
with the test certificate (`cert`, trusted with ca_file=cert[0]) unless told otherwise, then runs
`script(conn, stop, server)`: read the request (`read_request`), answer anything at all, drip, stall or
hang up. `answer(raw)` is the script that reads the request and sends `raw` bytes; the SCRIPTS table
holds the hostile ones. Every server records the requests it read (`server.requests`) and is stopped
at the end, and must have stopped: no script outlives its test.

`wrong_host_cert` is a certificate for wrong.example.org (not 127.0.0.1), its own CA.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from tests.fixtures_smtp import DRIP_S, Loopback, drip, read_line, server_tls

SECRET = "SECRETPART"
"""In every test URL's path: never to be seen in an error, a line or a state file."""


@dataclass
class Request:
    line: bytes
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    """A hostile server and what it was sent."""

    loopback: Loopback
    requests: list[Request] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.loopback.port

    def url(self, scheme: str = "https") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/services/T000/B000/{SECRET}"


def read_request(conn: socket.socket, server: Server) -> Request:
    """The request line, headers and body (by Content-Length) a client sent; kept in server.requests."""
    reader = conn.makefile("rb")
    line = read_line(reader)
    headers = {}
    while (header := read_line(reader)) not in (b"\r\n", b"\n"):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", "0")))
    request = Request(line, headers, body)
    server.requests.append(request)
    return request


Script = Callable[[socket.socket, threading.Event, Server], None]


def answer(raw: bytes) -> Script:
    """Read the request, send `raw`, hang up."""
    def script(conn, stop, server):
        read_request(conn, server)
        conn.sendall(raw)
    return script


def status(code: int, reason: str = "X", headers: str = "") -> Script:
    return answer(f"HTTP/1.1 {code} {reason}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n".encode())


def redirect(code: int, location: str) -> Script:
    return status(code, "Moved", f"Location: {location}\r\n")


def _then(first: bytes, line: bytes, every: float = DRIP_S) -> Script:
    """Read the request, send `first`, then `line` every `every` seconds for ever."""
    def script(conn, stop, server):
        read_request(conn, server)
        conn.sendall(first)
        drip(conn, stop, line, every)
    return script


def _slowly(lines: list[bytes], every: float) -> Script:
    """Read the request, then send each of `lines` `every` seconds apart: a whole answer, each line far within any
    time per read, all of them past the deadline."""
    def script(conn, stop, server):
        read_request(conn, server)
        for line in lines:
            if stop.wait(every):
                return
            conn.sendall(line)
    return script


def _silent_after(first: bytes | None) -> Script:
    """Read the request, send `first` (when given), then say nothing more and keep the connection open."""
    def script(conn, stop, server):
        read_request(conn, server)
        if first:
            conn.sendall(first)
        stop.wait()
    return script


def _huge_body(conn, stop, server) -> None:
    read_request(conn, server)
    size = 100 * 1024 * 1024
    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
    chunk = b"x" * 65536
    for _ in range(size // len(chunk)):
        if stop.is_set():
            return
        conn.sendall(chunk)


def _close_write_half(conn, stop, server) -> None:
    """Half-open: read the request, end its own side (a FIN, no TLS close_notify) and keep the socket open."""
    read_request(conn, server)
    conn.shutdown(socket.SHUT_WR)
    stop.wait()


def _reset(conn, stop, server) -> None:
    """Read the request, then reset the connection (RST, no FIN)."""
    read_request(conn, server)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()


def _hang_up(conn, stop, server) -> None:
    read_request(conn, server)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

SCRIPTS: dict[str, Script] = {
    # slow: each is only ever cut off by the whole exchange's deadline
    "drip headers": _then(b"HTTP/1.1 200 OK\r\n", b"X-Drip: 1\r\n"),
    "drip status line": _then(b"H", b"T", DRIP_S / 2),
    "a whole answer, one line every 0.8 s": _slowly([b"HTTP/1.1 200 OK\r\n", *[b"X-Slow: 1\r\n"] * 6,
                                                     b"Content-Length: 2\r\n\r\nok"], 0.8),
    "drip body": _then(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"o"),
    "drip chunked body": _then(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"1\r\no\r\n"),
    "100 Continue for ever": _then(b"", b"HTTP/1.1 100 Continue\r\n\r\n"),
    "103 Early Hints then nothing": _silent_after(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"),
    "200 without a length, never closed": _silent_after(b"HTTP/1.1 200 OK\r\n\r\nok"),
    "reads the request, never answers": _silent_after(None),
    # wrong in what they say
    "huge headers (count)": answer(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 2000 + b"\r\n"),
    "huge header line": answer(b"HTTP/1.1 200 OK\r\nX-A: " + b"b" * (1024 * 1024) + b"\r\n\r\n"),
    "huge body": _huge_body,
    "garbage status line": answer(b"SPAM EGGS HAM\r\n\r\n"),
    "status line of digits gone wrong": answer(b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n"),
    "no status line (HTTP/0.9)": answer(b"ok\n"),
    "body shorter than its length": answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nok"),
    "101 Switching Protocols": status(101, "Switching Protocols", "Upgrade: websocket\r\n"),
    "400": status(400), "401": status(401), "403": status(403), "404": status(404), "410": status(410),
    "413": status(413), "429": status(429, "Too Many", "Retry-After: 3600\r\n"),
    "500": status(500), "502": status(502), "503": status(503), "504": status(504),
    # hanging up
    "hangs up after the request": _hang_up,
    "resets after the request": _reset,
    "closes its half, keeps the socket": _close_write_half,
}
"""Hostile https answers, by what they do; each must be a failed channel in bounded time."""


@pytest.fixture(scope="session")
def wrong_host_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for wrong.example.org: (cert.pem, key.pem)."""
    folder = tmp_path_factory.mktemp("tls-wrong-host")
    key, crt = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(crt), "-subj", "/CN=wrong.example.org",
                    "-addext", "subjectAltName=DNS:wrong.example.org"], check=True, capture_output=True, timeout=60)
    return str(crt), str(key)


@pytest.fixture
def hostile_https(cert: tuple[str, str]) -> Iterator[Callable[..., Server]]:
    """`start(script, tls=<server context>|None) -> Server`: TLS with the test certificate unless `tls` says
    otherwise (None: plain TCP, the script does what it likes with the bytes)."""
    servers: list[Server] = []
    default = server_tls(cert)

    def start(script: Script, tls: ssl.SSLContext | None | str = "default") -> Server:
        server = Server(None)  # type: ignore[arg-type]
        server.loopback = Loopback(lambda conn, stop: script(conn, stop, server),
                                   default if tls == "default" else tls)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    stuck = [name for server in servers for name in server.loopback.close()]
    assert not stuck, f"scripts still running after the server stopped: {stuck}"
