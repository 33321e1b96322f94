"""Hostile servers on loopback, one behaviour a row: each is a failed channel (ChannelError naming the channel,
never the webhook URL or the SMTP password), never a hang, never another exception. A server that drips or stays
silent does so for ever: only the channel's whole-exchange deadline ends the send, and a send that outlives
tests/hang.py's far deadline (a channel whose timeout is per read, or none) fails its row.

The webhook rows run against real https servers with a test certificate (tests/fixtures_https.py); the email
rows against a scripted SMTP server (tests/fixtures_smtp.py, SmtpScript). A server that drips sends its next
line every DRIP_S seconds for ever: only the whole exchange's deadline (deadline.Deadline) ends it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

import pytest

from bigscience_ops.ops.tell.email import EmailChannel
from bigscience_ops.ops.tell.message import ChannelError, compose
from bigscience_ops.ops.tell.webhook import WebhookChannel, WebhookSettings
from tests.fixtures_https import OK, SCRIPTS, SECRET, answer, hostile_https, redirect, wrong_host_cert  # noqa: F401
from tests.fixtures_smtp import DRIP_S, PASSWORD, SmtpScript, drip, plain_settings, server_tls
from tests.hang import ends_within

TIMEOUT_S = 0.25
"""Each channel's whole-exchange limit in the rows that only fail (a drip, a silence, any refusal): a busy machine
that needs longer makes them fail all the same, by their deadline, which is what they check. Longer than DRIP_S, so
that a time per read would never end a drip."""
ANSWER_TIMEOUT_S = 10.0
"""The limit where a row checks what the answer said (a status, a redirect, a good answer): never reached."""
VAR = "BSOPS_TEST_HOSTILE_WEBHOOK"
PASSWORD_VAR = "BSOPS_TEST_HOSTILE_SMTP_PASSWORD"
MESSAGE = compose("bot@example.org", "[ALERT] tiny: not running", "tiny stopped at iteration 0\n")


def failed_in_time(send: Callable[[], None], channel: str) -> ChannelError:
    """Run `send`, which must raise ChannelError for `channel` and never hang (tests/hang.py); the error."""
    with pytest.raises(ChannelError) as failed:
        ends_within(send, f"a {channel} send to a hostile server, its timeout not kept")
    assert failed.value.channel == channel
    assert SECRET not in str(failed.value) and PASSWORD not in str(failed.value)
    assert "\n" not in str(failed.value)  # one line: it goes into the alert state and the watchdog's log
    return failed.value


def post(url: str, ca_file: str | None, timeout_s: float = TIMEOUT_S) -> Callable[[], None]:
    channel = WebhookChannel(WebhookSettings(VAR, ca_file=ca_file, timeout_s=timeout_s))
    return lambda: channel.send(MESSAGE, {VAR: url})


# --- the webhook ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("behaviour", list(SCRIPTS))
def test_a_hostile_webhook_answer_is_a_failed_channel_in_bounded_time(behaviour: str, hostile_https, cert) -> None:
    server = hostile_https(SCRIPTS[behaviour])
    failed_in_time(post(server.url(), cert[0]), "webhook")
    assert len(server.requests) <= 1  # read at most once: never retried within a run


@pytest.mark.parametrize("code", [101, 300, 301, 302, 303, 304, 307, 308, 400, 404, 418, 500, 599])
def test_any_status_but_2xx_is_named_in_the_failure(code: int, hostile_https, cert) -> None:
    server = hostile_https(answer(f"HTTP/1.1 {code} Whatever\r\nContent-Length: 0\r\n\r\n".encode()))
    assert str(code) in str(failed_in_time(post(server.url(), cert[0], ANSWER_TIMEOUT_S), "webhook"))


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_redirect_is_never_followed_to_http_or_https(code: int, scheme: str, hostile_https, cert) -> None:
    """The target (a server that would take the POST) is never asked: the alert counts as not delivered."""
    target = hostile_https(answer(OK), tls=None if scheme == "http" else "default")
    server = hostile_https(redirect(code, target.url(scheme)))
    error = failed_in_time(post(server.url(), cert[0], ANSWER_TIMEOUT_S), "webhook")
    assert str(code) in str(error) and target.url(scheme) not in str(error)
    assert len(server.requests) == 1 and target.requests == [] and target.loopback.connections == 0


def _plain_http(conn, stop, server) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def _silent(conn, stop, server) -> None:
    stop.wait()


def _reset_at_once(conn, stop, server) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()


def _tls_drip(conn, stop, server) -> None:
    drip(conn, stop, b"\x16", DRIP_S / 2)  # a TLS record's first byte, then one more now and then


@pytest.mark.parametrize("behaviour, script, tls", [
    ("accepts, never says a word", _silent, None),
    ("drips the TLS handshake", _tls_drip, None),
    ("plain http on the https port", _plain_http, None),
    ("resets the connection at once", _reset_at_once, None),
])
def test_a_hostile_webhook_connection_is_a_failed_channel_in_bounded_time(behaviour, script, tls, hostile_https,
                                                                         cert) -> None:
    server = hostile_https(script, tls=tls)
    failed_in_time(post(server.url(), cert[0]), "webhook")


@pytest.mark.parametrize("trusted", ["wrong host name", "self-signed without its CA", "another CA"])
def test_a_certificate_that_does_not_check_out_is_a_failed_channel(trusted: str, hostile_https, cert,
                                                                   wrong_host_cert, monkeypatch) -> None:
    """Nothing is posted to a server whose certificate is for another name or from a CA not trusted."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    served, ca_file = {"wrong host name": (wrong_host_cert, wrong_host_cert[0]),
                       "self-signed without its CA": (cert, None),
                       "another CA": (cert, wrong_host_cert[0])}[trusted]
    server = hostile_https(answer(OK), tls=server_tls(served))
    failed_in_time(post(server.url(), ca_file), "webhook")
    assert server.requests == []


def test_nothing_listening_is_a_failed_channel() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    failed_in_time(post(f"https://127.0.0.1:{port}/x/{SECRET}", None), "webhook")


@pytest.mark.parametrize("raw", [OK, b"HTTP/1.1 204 No Content\r\n\r\n",
                                 b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"])
def test_the_same_servers_deliver_a_good_answer(raw: bytes, hostile_https, cert) -> None:
    """The rows above fail for what their servers do, not for how the test serves them."""
    server = hostile_https(answer(raw))
    post(server.url(), cert[0], ANSWER_TIMEOUT_S)()
    assert [r.line.split()[0] for r in server.requests] == [b"POST"]


# --- email ------------------------------------------------------------------------------------------------

TLS = object()
"""In a row's settings: ca_file is the test certificate (the server speaks TLS with it)."""

SMTP_ROWS: dict[str, tuple[SmtpScript, Mapping[str, object]]] = {
    # slow: only the whole exchange's deadline ends them
    "banner drips": (SmtpScript(drips={"banner": b"220-still here\r\n"}), {}),
    "banner drips byte by byte": (SmtpScript(drips={"banner": b"2"}), {}),
    "never says a word": (SmtpScript(banner=b"", silent_after="banner"), {}),
    "banner then silence": (SmtpScript(silent_after="banner"), {}),
    "EHLO drips": (SmtpScript(drips={"EHLO": b"250-still here\r\n"}), {}),
    "MAIL drips": (SmtpScript(drips={"MAIL": b"250-still here\r\n"}), {}),
    "end of data never acknowledged": (SmtpScript(drips={".": b"250-still here\r\n"}), {}),
    "STARTTLS agreed, no handshake": (SmtpScript(silent_after="STARTTLS", tls=TLS), {"security": "starttls"}),
    # refusals at each step, 4xx and 5xx
    "banner 421": (SmtpScript(banner=b"421 too busy\r\n"), {}),
    "banner 554": (SmtpScript(banner=b"554 go away\r\n"), {}),
    "garbage banner": (SmtpScript(banner=b"hello there\r\n"), {}),
    "banner line too long": (SmtpScript(banner=b"220 " + b"x" * 20_000 + b"\r\n"), {}),
    "EHLO and HELO refused": (SmtpScript(replies={"EHLO": b"502 no\r\n", "HELO": b"501 no\r\n"}), {}),
    "STARTTLS 454": (SmtpScript(replies={"STARTTLS": b"454 TLS not available\r\n"}, tls=TLS),
                     {"security": "starttls"}),
    "STARTTLS not offered": (SmtpScript(), {"security": "starttls"}),
    "AUTH 535": (SmtpScript(replies={"AUTH": b"535 bad credentials\r\n"}), {"user": "bot"}),
    "AUTH 454": (SmtpScript(replies={"AUTH": b"454 try later\r\n"}), {"user": "bot"}),
    "MAIL 451": (SmtpScript(replies={"MAIL": b"451 try later\r\n"}), {}),
    "MAIL 550": (SmtpScript(replies={"MAIL": b"550 no such sender\r\n"}), {}),
    "RCPT 450": (SmtpScript(replies={"RCPT": b"450 mailbox busy\r\n"}), {}),
    "RCPT 550": (SmtpScript(replies={"RCPT": b"550 no such user\r\n"}), {}),
    "DATA 451": (SmtpScript(replies={"DATA": b"451 try later\r\n"}), {}),
    "DATA 554": (SmtpScript(replies={"DATA": b"554 no\r\n"}), {}),
    "end of data 452": (SmtpScript(replies={".": b"452 disk full\r\n"}), {}),
    "end of data 554": (SmtpScript(replies={".": b"554 spam\r\n"}), {}),
    "ssl to a plain server": (SmtpScript(), {"security": "ssl"}),
}


def _smtp_settings(port: int, changes: Mapping[str, object], ca_file: str):
    values = {"ca_file": ca_file, "timeout_s": TIMEOUT_S, **changes}
    if values.get("user"):
        values["password_env"] = PASSWORD_VAR
    return plain_settings(port, **values)


@pytest.mark.parametrize("behaviour", list(SMTP_ROWS))
def test_a_hostile_smtp_server_is_a_failed_channel_in_bounded_time(behaviour: str, scripted_smtp, cert) -> None:
    script, changes = SMTP_ROWS[behaviour]
    if script.tls is TLS:
        script.tls = server_tls(cert)
    channel = EmailChannel(_smtp_settings(scripted_smtp(script), changes, cert[0]))
    failed_in_time(lambda: channel.send(MESSAGE, {PASSWORD_VAR: PASSWORD}), "email")


@pytest.mark.parametrize("behaviour", ["resets at once", "ssl, certificate for another name", "nothing listening"])
def test_a_hostile_smtp_connection_is_a_failed_channel(behaviour: str, scripted_smtp, cert, wrong_host_cert) -> None:
    from tests.fixtures_smtp import Loopback

    changes: dict[str, object] = {}
    if behaviour == "resets at once":
        server = Loopback(lambda conn, stop: _reset_at_once(conn, stop, None))
        port = server.port
    elif behaviour == "ssl, certificate for another name":
        port, changes = scripted_smtp(SmtpScript(), server_tls(wrong_host_cert)), {"security": "ssl"}
    else:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    channel = EmailChannel(_smtp_settings(port, changes, wrong_host_cert[0] if changes else cert[0]))
    try:
        failed_in_time(lambda: channel.send(MESSAGE, {}), "email")
    finally:
        if behaviour == "resets at once":
            assert server.close() == []


@pytest.mark.parametrize("changes, tls", [({}, False), ({"user": "bot"}, False),
                                          ({"security": "starttls", "user": "bot"}, True), ({"security": "ssl"}, True)])
def test_the_scripted_server_takes_a_message_when_it_behaves(changes, tls, scripted_smtp, cert) -> None:
    """The rows above fail for what their scripts do; each way of sending works against a script that behaves."""
    script = SmtpScript(tls=server_tls(cert) if tls and changes["security"] == "starttls" else None)
    port = scripted_smtp(script, server_tls(cert) if changes.get("security") == "ssl" else None)
    EmailChannel(_smtp_settings(port, changes, cert[0])).send(MESSAGE, {PASSWORD_VAR: PASSWORD})
    assert script.commands[-2:] == [".", "QUIT"]


def test_a_slow_goodbye_after_the_message_is_taken_is_no_failure(scripted_smtp, cert) -> None:
    """The server took the message and then drips its answer to QUIT: the alert went out, the send succeeds
    (sending it again would repeat it), within the limit all the same."""
    script = SmtpScript(drips={"QUIT": b"221-still here\r\n"})
    channel = EmailChannel(_smtp_settings(scripted_smtp(script), {}, cert[0]))
    ends_within(lambda: channel.send(MESSAGE, {}), "the QUIT answer dripped for ever, the timeout not kept")
    assert script.commands[-2:] == [".", "QUIT"]
