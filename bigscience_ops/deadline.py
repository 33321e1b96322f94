"""Total deadlines for network calls: a time for a whole exchange, not a time per read.

Every connection bsops makes to a server (an alert channel's, the Hub's) keeps one Deadline: its sockets
(`connect`, and the TLS sockets a `tls_context` makes) set their timeout to what is left before each
operation (connect, TLS handshake, every read and write) and refuse any operation once nothing is left,
so a server that answers one byte at a time, or one header line every few seconds, is cut off when the
exchange's time is up. No signal, no thread per read: a blocking call that takes no timeout (the name
lookup, a library's request) runs in a daemon thread waited for until the deadline (`in_time`).
Subprocesses (git, git-lfs) have their own: ops/keep/gitlfs.py.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Any, ClassVar


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


class _Armed:
    """Each I/O call of a socket may take only what is left of its deadline (mixed in before the socket class)."""

    deadline: Deadline

    def _arm(self) -> None:
        self.settimeout(self.deadline.remaining())  # type: ignore[attr-defined]

    def recv(self, *args: Any) -> bytes:
        self._arm()
        return super().recv(*args)  # type: ignore[misc]

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return super().recv_into(*args)  # type: ignore[misc]

    def send(self, *args: Any) -> int:  # an SSL socket's sendall sends through here, piece by piece
        self._arm()
        return super().send(*args)  # type: ignore[misc]


class _DeadlineSocket(_Armed, socket.socket):
    """A TCP socket whose every operation may take only what is left of its deadline."""

    def connect(self, address: Any) -> None:
        self._arm()
        super().connect(address)

    def sendall(self, *args: Any) -> None:  # one call: CPython bounds the whole of it by the timeout
        self._arm()
        super().sendall(*args)


class _DeadlineSSLSocket(_Armed, ssl.SSLSocket):
    """A TLS socket whose handshake, reads and writes may each take only what is left of the deadline of the
    context that made it (a subclass per context sets `deadline`; tls_context)."""

    deadline: ClassVar[Deadline]

    def do_handshake(self, *args: Any) -> None:
        self._arm()
        super().do_handshake(*args)

    def read(self, *args: Any) -> Any:
        self._arm()
        return super().read(*args)

    def write(self, *args: Any) -> int:
        self._arm()
        return super().write(*args)

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


def this_host(seconds: float = 5.0) -> str:
    """This machine's fully qualified name (a sender's domain, an EHLO name), looked up within `seconds` (the
    resolver takes no timeout: a broken DNS would hold an hourly job for minutes); its plain name otherwise."""
    try:
        return in_time(socket.getfqdn, Deadline(seconds), "looking up this host's name")
    except OSError:
        return socket.gethostname() or "localhost"
