"""The alert channels, their message and the hourly jobs' alerts where mutation testing found them untested
(scripts/mutation.py): each test here fails on a mutant of ops/tell/{message,channels,email,webhook,job_alerts}.py
that every other test let through. Mail goes to real SMTP servers on loopback (aiosmtpd, or a scripted one), posts to
real https servers; the tests read the facts in what arrives or fails (who, which name, which bound, which
channel), not its sentences."""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from bigscience_ops.launch.local import free_port
from bigscience_ops.ops.tell import alert_state, channels, email, job_alerts, message, notify, webhook
from bigscience_ops.ops.tell.channels import Outbox
from bigscience_ops.ops.tell.email import EmailChannel
from bigscience_ops.ops.tell.message import ChannelError, NotifyError
from bigscience_ops.ops.tell.webhook import WebhookChannel, WebhookError, WebhookSettings
from bigscience_ops.schema import AlertsConfig
from tests.fixtures_https import SCRIPTS, SECRET, answer, hostile_https, read_request, status  # noqa: F401 (a fixture)
from tests.fixtures_smtp import T0, Inbox, SmtpScript, drip, plain_settings, server_tls
from tests.hang import ends_within

SENDER = "bot@example.org"
HOOK = "KILLS_CH_HOOK"
"""The variable the tests' webhook URL is in."""


# --------------------------------------------------------------------------- the message every channel sends

def test_a_message_is_scrubbed_of_the_secrets_given_in_its_subject_and_body_and_ends_its_lines() -> None:
    made = message.compose(SENDER, "disk of pw-9f8e7d full", "mount said pw-9f8e7d\r\nthen", now=T0,
                           secrets=["pw-9f8e7d"])
    assert "pw-9f8e7d" not in made.subject and "pw-9f8e7d" not in made.body
    assert message.subject_line("token pw-9f8e7d leaked", ["pw-9f8e7d"]).count("pw-9f8e7d") == 0
    assert message.compose(SENDER, "s", "one line", now=T0).body == "one line\n"
    assert message.compose(SENDER, "s", "ended\n", now=T0).body == "ended\n"


def test_a_message_id_names_bsops_in_the_domain_after_the_senders_last_at() -> None:
    assert message.compose(SENDER, "s", "b", now=T0).message_id.endswith(".bsops@example.org>")
    assert message.compose('"ops@team"@example.org', "s", "b", now=T0).message_id.endswith(".bsops@example.org>")


def test_a_header_cut_to_its_limit_is_exactly_the_limit_and_drops_the_space_before_the_ellipsis() -> None:
    assert message.header_text("x" * 200, 120) == "x" * 117 + "..."
    assert message.header_text("abcd efgh", 8) == "abcd..."
    assert message.header_text("abcd efgh", 9) == "abcd efgh"


def test_a_channel_error_names_the_channel_that_failed(tmp_path: Path) -> None:
    made = message.compose(SENDER, "s", "b", now=T0)
    with pytest.raises(ChannelError) as hook:
        WebhookChannel(WebhookSettings(HOOK)).send(made, {})
    login = EmailChannel(plain_settings(free_port(), user="ops", password_env="KILLS_CH_SMTP_PW"))
    with pytest.raises(ChannelError) as mail:
        login.send(made, {})
    with pytest.raises(ChannelError) as closed:
        EmailChannel(plain_settings(free_port())).send(made, {})
    assert (hook.value.channel, mail.value.channel, closed.value.channel) == ("webhook", "email", "email")
    assert str(hook.value).count(HOOK) == 1  # the variable named once, whoever named it first


# --------------------------------------------------------------------------- the outbox

def test_an_outbox_built_from_a_generator_keeps_every_channel() -> None:
    mail, hook = EmailChannel(plain_settings(25)), WebhookChannel(WebhookSettings(HOOK))
    outbox = Outbox((c for c in (mail, hook)), SENDER)
    assert outbox.channels == (mail, hook) and outbox.names == ("email", "webhook")
    assert outbox.destinations() == "oncall@example.org, lead@example.org and the webhook in $KILLS_CH_HOOK"
    assert hash(Outbox([mail], SENDER)) == hash(Outbox((mail,), SENDER))


def test_an_outboxs_message_is_scrubbed_of_every_channels_secret_and_the_secrets_given(monkeypatch) -> None:
    monkeypatch.setenv("KILLS_CH_SMTP_PW", "pw-51d0a7")
    login = EmailChannel(plain_settings(25, user="ops", password_env="KILLS_CH_SMTP_PW"))
    made = Outbox((login,), SENDER).compose("pw-51d0a7 and tok-77e1", "pw-51d0a7 then tok-77e1", now=T0,
                                            secrets=["tok-77e1"])
    assert not re.search("pw-51d0a7|tok-77e1", made.subject + made.body)


def _message_ids(line: str) -> list[str]:
    return re.findall(r"<[^<>\s]+@example\.org>", line)


def test_send_alert_names_only_the_channels_that_took_it_and_nothing_after_the_alarm_when_none_did(
        webhook_server, cert: tuple[str, str], monkeypatch) -> None:
    monkeypatch.setenv(HOOK, webhook_server.url)
    monkeypatch.setenv("SSL_CERT_FILE", cert[0])  # the channels an alerts section builds trust the system's CAs
    closed = free_port()
    alerts = AlertsConfig(email_to=["oncall@example.org"], email_from=SENDER, smtp_host="127.0.0.1",
                          smtp_port=closed, webhook_url_env=HOOK)
    line = channels.send_alert(alerts, "[ALERT] tiny: x", "body")
    assert len(webhook_server.posts) == 1 and line.startswith("***ALERT")
    assert str(closed) in line and f"${HOOK}" in line and "oncall@example.org" not in line
    assert len(_message_ids(line)) == 1
    nowhere = channels.send_alert(replace(alerts, webhook_url_env=None), "[ALERT] tiny: x", "body")
    assert nowhere.startswith("***ALERT") and nowhere.endswith("***") and str(closed) in nowhere
    assert _message_ids(nowhere) == []


# --------------------------------------------------------------------------- the hourly jobs' alerts

def _teller(port: int, logs: Path | None, **changes) -> job_alerts.Teller:
    alerts = AlertsConfig(email_to=["oncall@example.org"], email_from=SENDER, smtp_host="127.0.0.1", smtp_port=port,
                          **changes)
    return job_alerts.Teller("kc", alerts, None if logs is None else str(logs), ())


def _fails() -> None:
    raise OSError("the store is full")


def test_an_hourly_jobs_alert_keeps_its_cooldown_names_its_command_and_says_which_notice_could_not_go(
        plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    teller = _teller(port, tmp_path / "logs", cooldown_minutes=0)
    down = replace(teller, alerts=replace(teller.alerts, smtp_port=free_port()))
    first = job_alerts.run_alerting(teller, True, "backup", "bsops backup kc-by-hand", _fails)
    assert first.told and len(inbox.messages) == 1 and "bsops backup kc-by-hand" in inbox.messages[0].get_content()
    assert job_alerts.run_alerting(teller, True, "backup", "c", _fails).told and len(inbox.messages) == 2  # 0 minutes
    alert = job_alerts.run_alerting(down, True, "backup", "c", _fails)
    assert not alert.told and alert.failed and "backup alert" in alert.lines[-1]
    recovery = job_alerts.run_alerting(down, True, "backup", "c", lambda: None)
    assert recovery.error is None and not recovery.told and recovery.failed
    assert recovery.lines[-1].count("backup recovery") == 1 and "backup alert" not in recovery.lines[-1]
    told = job_alerts.run_alerting(teller, True, "backup", "c", lambda: None)
    assert told.told and len(told.lines) == 1 and len(inbox.messages) == 3
    assert job_alerts.run_alerting(teller, True, "backup", "c", lambda: None).lines == ()  # nothing to say


def test_an_hourly_jobs_alert_of_a_run_without_logs_keeps_its_state_in_the_users_cache(plain_server, tmp_path: Path,
                                                                                      monkeypatch) -> None:
    inbox, port = plain_server
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    told, said = job_alerts.tell_job(_teller(port, None), "backup", "c", "the store is full")
    assert told and len(said) == 1 and len(inbox.messages) == 1
    assert "backup" in alert_state.read_state(notify.default_state_path(None))[0].jobs


def test_an_hourly_jobs_alert_whose_state_cannot_be_saved_beside_the_log_is_sent_with_it_kept_elsewhere(
        plain_server, tmp_path: Path, monkeypatch) -> None:
    """The log folder can be written (a probe file goes in), but the state's own new file cannot (a folder holds
    its name): nothing was sent on the strength of that state, so it is sent again, with the state in the user's
    state folder, and the job's output says so."""
    inbox, port = plain_server
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    logs = tmp_path / "logs"
    usual = logs / ".bsops-alerts.json"
    (logs / f"..bsops-alerts.json.{os.getpid()}.tmp").mkdir(parents=True)  # write_atomically's new file
    told, said = job_alerts.tell_job(_teller(port, logs), "backup", "c", "the store is full")
    assert told and len(said) == 2 and len(inbox.messages) == 1
    kept = alert_state.elsewhere(usual, "kc")[0]
    assert kept.parent == tmp_path / "xdg" / "bsops" and str(kept) in said[0] and str(usual) in said[0]
    assert "backup" in alert_state.read_state(kept)[0].jobs and not usual.exists()


# --------------------------------------------------------------------------- email: its settings

def test_smtp_settings_take_one_address_as_one_recipient_and_ports_1_to_65535() -> None:
    assert plain_settings(25, recipients="oncall@example.org").recipients == ("oncall@example.org",)
    assert plain_settings(25, recipients=["a@example.org", "b@example.org"]).recipients == (
        "a@example.org", "b@example.org")
    assert [plain_settings(port).port for port in (1, 65535)] == [1, 65535]
    for port in (0, 65536, True, "25"):
        with pytest.raises(NotifyError, match="smtp.port"):
            plain_settings(port)


def test_each_channel_an_alerts_section_builds_gets_its_modules_total_time_as_it_is_then(monkeypatch) -> None:
    monkeypatch.setattr(email, "TIMEOUT_S", 7.5)
    monkeypatch.setattr(webhook, "TIMEOUT_S", 2.5)
    outbox = channels.outbox_from_alerts(AlertsConfig(email_to=["oncall@example.org"], webhook_url_env=HOOK,
                                                      email_from=SENDER))
    assert outbox is not None and [c.settings.timeout_s for c in outbox.channels] == [7.5, 2.5]


# --------------------------------------------------------------------------- email: the name it says EHLO with

@dataclass
class Named(Inbox):
    """An inbox that also keeps the name each client said EHLO (or HELO) with."""

    helos: list[str] = field(default_factory=list)

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd handler hook
        self.helos.append(session.host_name)
        return await super().handle_DATA(server, session, envelope)


HOST_2 = "127.0.0.2"
"""A loopback address no client reaches by accident (a host of None is 127.0.0.1 or ::1)."""


@pytest.fixture(scope="module")
def cert_2(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.2: (cert.pem, key.pem)."""
    folder = tmp_path_factory.mktemp("tls-2")
    key, crt = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-keyout", str(key), "-out", str(crt), "-subj", f"/CN={HOST_2}",
                    "-addext", f"subjectAltName=IP:{HOST_2}"], check=True, capture_output=True, timeout=60)
    return str(crt), str(key)


@pytest.fixture(scope="module")
def mail_at_2(cert_2: tuple[str, str]) -> Iterator[tuple[Named, int, int]]:
    """SMTP servers on 127.0.0.2, plain and TLS from the start (cert_2), sharing one inbox: (inbox, plain port,
    TLS port). They name themselves (aiosmtpd would look this host's name up for each connection otherwise)."""
    inbox = Named()
    plain = Controller(inbox, hostname=HOST_2, port=free_port(), server_hostname="mx.test")
    tls = Controller(inbox, hostname=HOST_2, port=free_port(), server_hostname="mx.test",
                     ssl_context=server_tls(cert_2))
    plain.start()
    tls.start()
    try:
        yield inbox, plain.port, tls.port
    finally:
        plain.stop()
        tls.stop()


def _mail(port: int, **changes) -> EmailChannel:
    return EmailChannel(plain_settings(port, host=HOST_2, **changes))


def _said_ehlo(mail_at_2, channel: EmailChannel) -> str:
    inbox = mail_at_2[0]
    channel.send(message.compose(SENDER, "s", "b", now=T0), {})
    return inbox.helos[-1]


def _lookup(monkeypatch, fqdn: str, takes: float = 0.0, hostname: str | None = None) -> None:
    """This host's name, as the resolver gives it: `fqdn` after `takes` seconds; [10.1.2.3] its address."""
    def getfqdn(*_: object) -> str:
        time.sleep(takes)
        return fqdn

    monkeypatch.setattr(socket, "getfqdn", getfqdn)
    monkeypatch.setattr(socket, "gethostbyname", lambda _: "10.1.2.3")
    if hostname is not None:
        monkeypatch.setattr(socket, "gethostname", lambda: hostname)


def test_an_email_says_ehlo_with_this_hosts_qualified_name_else_its_address(mail_at_2, monkeypatch) -> None:
    _lookup(monkeypatch, "node7.cluster.example.org")
    assert _said_ehlo(mail_at_2, _mail(mail_at_2[1])) == "node7.cluster.example.org"
    _lookup(monkeypatch, "node7")
    assert _said_ehlo(mail_at_2, _mail(mail_at_2[1])) == "[10.1.2.3]"


def test_an_emails_name_lookup_that_ends_within_half_its_time_is_used(mail_at_2, monkeypatch) -> None:
    # a lookup of 0.3 s within half of 4 s: far from the bound, so a busy machine does not change the answer
    _lookup(monkeypatch, "slow.example.org", takes=0.3)
    assert _said_ehlo(mail_at_2, _mail(mail_at_2[1], timeout_s=4.0)) == "slow.example.org"


def test_an_emails_name_lookup_past_half_its_time_gives_way_to_the_plain_host_name(mail_at_2, cert_2,
                                                                                  monkeypatch) -> None:
    """Past half of the email's total, this host's plain name is said (`localhost` without one), over TLS from the
    start too, and the email still goes."""
    # given up at 1 s, a lookup that would take 3 s (longer than the whole 2 s); the second left sends the email
    _lookup(monkeypatch, "slow.example.org", takes=3.0, hostname="node7")
    assert _said_ehlo(mail_at_2, _mail(mail_at_2[1], timeout_s=2.0)) == "node7"
    _lookup(monkeypatch, "slow.example.org", takes=3.0, hostname="")
    tls = _mail(mail_at_2[2], timeout_s=2.0, security="ssl", ca_file=cert_2[0])
    assert _said_ehlo(mail_at_2, tls) == "localhost"


def test_a_plain_relay_never_reads_the_ca_file(mail_at_2) -> None:
    inbox = mail_at_2[0]
    before = len(inbox.messages)
    _mail(mail_at_2[1], ca_file="/nonexistent/ca.pem").send(message.compose(SENDER, "s", "b", now=T0), {})
    assert len(inbox.messages) == before + 1


# --------------------------------------------------------------------------- email: what a failure says

def _email_error(channel: EmailChannel, env: dict[str, str] | None = None) -> str:
    """The detail of the ChannelError sending to `channel` raises: what follows `via HOST:PORT (SECURITY): `."""
    settings = channel.settings
    with pytest.raises(ChannelError) as failed:
        channel.send(message.compose(SENDER, "s", "b", now=T0), env or {})
    return str(failed.value).split(f"via {settings.host}:{settings.port} ({settings.security}): ", 1)[1]


def test_an_smtp_servers_long_refusal_is_cut_at_500_characters_and_names_its_kind(scripted_smtp) -> None:
    port = scripted_smtp(SmtpScript(replies={"MAIL": b"550 " + b"no such sender " * 150 + b"\r\n"}))
    detail = _email_error(EmailChannel(plain_settings(port)))
    assert len(detail) == 500 and detail.startswith("SMTPSenderRefused")


def test_an_smtp_server_that_echoes_the_password_never_gets_it_into_the_error(scripted_smtp) -> None:
    port = scripted_smtp(SmtpScript(replies={"AUTH": b"535 5.7.8 rejected s3cret-Pa55word\r\n"}))
    channel = EmailChannel(plain_settings(port, user="ops", password_env="KILLS_CH_SMTP_PW"))
    detail = _email_error(channel, {"KILLS_CH_SMTP_PW": "s3cret-Pa55word"})
    assert detail.startswith("SMTPAuthenticationError") and "s3cret-Pa55word" not in detail and "535" in detail


def test_an_smtp_server_that_goes_silent_is_a_failure_naming_the_total_time(scripted_smtp) -> None:
    port = scripted_smtp(SmtpScript(silent_after="banner"))
    assert "0.3" in _email_error(EmailChannel(plain_settings(port, timeout_s=0.3)))


# --------------------------------------------------------------------------- webhook: its URL and proxy

def test_only_an_https_url_is_a_webhook_and_post_refuses_another_before_connecting() -> None:
    with pytest.raises(WebhookError):
        webhook.url_from({HOOK: "http://hooks.example.org/services/x"}, HOOK)
    assert webhook.url_from({HOOK: " https://hooks.example.org/x "}, HOOK) == "https://hooks.example.org/x"
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with pytest.raises(WebhookError):
            webhook.post(f"http://127.0.0.1:{listener.getsockname()[1]}/services/x", "s", "b")
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody knocked
            listener.accept()


def _proxy(monkeypatch, value: str) -> None:
    for name in ("no_proxy", "NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("https_proxy", value)


@pytest.mark.parametrize("value, expected", [
    ("127.0.0.1:3128", ("127.0.0.1", 3128, {})),
    ("https://proxy.example.org:3129", ("proxy.example.org", 3129, {})),
    ("http://ops@proxy.example.org", ("proxy.example.org", 443,
                                      {"Proxy-Authorization": "Basic " + base64.b64encode(b"ops:").decode()})),
    ("socks5://proxy.example.org:1080", None),
    ("http://:3128", None),
])
def test_the_https_proxy_is_read_as_urllib_reads_it(value: str, expected, monkeypatch) -> None:
    """A proxy without a scheme is http; http and https proxies only, with a host; a user without a password logs
    in with an empty one; a proxy named without a port is on 443. None: refused."""
    _proxy(monkeypatch, value)
    if expected is None:
        with pytest.raises(WebhookError):
            webhook.proxy_for("hooks.example.org")
    else:
        assert webhook.proxy_for("hooks.example.org") == expected


def _refuse_tunnel(conn, stop, server) -> None:
    read_request(conn, server)
    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")


def test_a_webhook_url_without_a_port_is_reached_on_443(hostile_https, monkeypatch) -> None:
    proxy = hostile_https(_refuse_tunnel, tls=None)
    _proxy(monkeypatch, f"http://127.0.0.1:{proxy.port}")
    with pytest.raises(WebhookError):
        webhook.post("https://127.0.0.1/services/x", "s", "b", timeout=5.0)
    assert [r.line.split()[:2] for r in proxy.requests] == [[b"CONNECT", b"127.0.0.1:443"]]


# --------------------------------------------------------------------------- webhook: its answer

def _ok(size: int, code: int = 200) -> bytes:
    return f"HTTP/1.1 {code} OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n".encode() + b"k" * size


def _flood(conn, stop, server) -> None:
    """A 200 whose body never ends: more than a webhook's longest answer at once, then a byte every DRIP_S."""
    read_request(conn, server)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n" + b"k" * (webhook.MAX_ANSWER_BYTES + 5000))
    drip(conn, stop, b"k")


def test_a_webhook_answer_is_read_whole_up_to_its_bound_and_no_further(hostile_https, cert: tuple[str, str]) -> None:
    limit = webhook.MAX_ANSWER_BYTES

    def post(raw: bytes) -> None:
        webhook.post(hostile_https(answer(raw)).url(), "s", "b", timeout=10.0, ca_file=cert[0])

    post(_ok(limit))
    with pytest.raises(WebhookError) as over:
        post(_ok(limit + 1))
    assert "127.0.0.1" in str(over.value)
    with pytest.raises(WebhookError):  # a 200 cut short delivered nothing
        post(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nok")
    with pytest.raises(WebhookError) as flood:  # cut off at the bound, not at the deadline
        ends_within(lambda: webhook.post(hostile_https(_flood).url(), "s", "b", timeout=2.0, ca_file=cert[0]),
                    "an answer that never ends")
    assert str(limit) in str(flood.value)


def test_a_3xx_answer_is_a_redirect_and_its_body_is_never_read(hostile_https, cert: tuple[str, str]) -> None:
    def failure(script) -> str:
        with pytest.raises(WebhookError) as failed:
            webhook.post(hostile_https(script).url(), "s", "b", timeout=10.0, ca_file=cert[0])
        return str(failed.value)

    assert ["redirect" in failure(status(code)) for code in (300, 399, 400)] == [True, True, False]
    assert "300" in failure(answer(b"HTTP/1.1 300 Choices\r\nContent-Length: 100\r\n\r\nok"))


def test_a_webhook_servers_garbage_is_cut_at_500_characters_names_its_kind_and_never_the_url(
        hostile_https, cert: tuple[str, str]) -> None:
    server = hostile_https(answer(b"HTTP/1.1 2OO " + b"gone wrong at /services/T000/B000/SECRETPART " * 30 + b"\r\n"))
    with pytest.raises(WebhookError) as failed:
        webhook.post(server.url(), "s", "b", timeout=10.0, ca_file=cert[0])
    detail = str(failed.value).split("127.0.0.1: ", 1)[1]
    assert len(detail) == 500 and detail.startswith("BadStatusLine") and SECRET not in str(failed.value)


def test_a_webhook_channel_keeps_its_own_total_time(hostile_https, cert: tuple[str, str]) -> None:
    server = hostile_https(SCRIPTS["reads the request, never answers"])
    channel = WebhookChannel(WebhookSettings(HOOK, ca_file=cert[0], timeout_s=0.3))
    with pytest.raises(ChannelError) as failed:
        ends_within(lambda: channel.send(message.compose(SENDER, "s", "b", now=T0), {HOOK: server.url()}),
                    "a webhook that never answers")
    assert "0.3" in str(failed.value) and str(failed.value).count(HOOK) == 1
