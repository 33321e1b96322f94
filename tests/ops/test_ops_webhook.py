"""Alerts to a chat webhook (alerts.webhook_url_env): the same messages, cooldown and recovery as email,
posted over https to a real local server; the URL, a secret, never shows. A webhook that drips its answer or
redirects is a failed channel within its timeout, recorded so the next run tries it again, and never holds
the watchdog (`bsops status`) back."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.ops.tell import channels, notify
from bigscience_ops.ops.tell import webhook as webhook_module
from bigscience_ops.ops.tell.channels import Outbox
from bigscience_ops.ops.tell.message import NotifyError
from bigscience_ops.ops.tell.webhook import WebhookChannel, WebhookSettings
from bigscience_ops.ops.watch import status, watchdog
from bigscience_ops.schema import AlertsConfig
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_https import OK, SCRIPTS, SECRET, answer, hostile_https, read_request, redirect  # noqa: F401
from tests.fixtures_slurm import replay_squeue
from tests.fixtures_smtp import alerts_yaml, plain_outbox, webhook_outbox
from tests.fixtures_status import seed_job
from tests.hang import ends_within

NOW = datetime(2026, 11, 22, 12, 0, 0)
VAR = "BSOPS_TEST_WEBHOOK"


def _outbox(port: int, cert: tuple[str, str], **changes) -> Outbox:
    return plain_outbox(port, webhook_env=VAR, ca_file=cert[0], **changes)


def test_alert_cooldown_and_recovery_reach_the_webhook_as_they_reach_email(plain_server, webhook_server, cert,
                                                                           tmp_path: Path, monkeypatch) -> None:
    inbox, port = plain_server
    monkeypatch.setenv(VAR, webhook_server.url)
    log = tmp_path / "logs" / "main_log.txt"
    log.parent.mkdir()
    log.write_text("")
    outbox = _outbox(port, cert)

    def watch(jobs, at):
        settings = watchdog.WatchSettings("tr1-13B-round3", log_path=log, outbox=outbox, cooldown_minutes=60)
        return watchdog.watch(settings, query=lambda **_: jobs, now=at)

    down = watch([], NOW)
    assert down.exit_code == status.EXIT_ALERT and len(inbox.messages) == 1 and len(webhook_server.posts) == 1
    text = webhook_server.posts[0]["text"]
    assert text.startswith(str(inbox.messages[0]["Subject"])) and "tr1-13B-round3" in text
    assert f"the webhook in ${VAR}" in "\n".join(down.lines) and webhook_server.url not in "\n".join(down.lines)
    assert watch([], NOW + timedelta(minutes=10)).exit_code == status.EXIT_ALERT  # within the cooldown
    assert len(webhook_server.posts) == 1
    running = seed_job(start_time=NOW, elapsed_s=60)
    assert watch([running], NOW + timedelta(minutes=20)).exit_code == status.EXIT_HEALTHY
    assert len(webhook_server.posts) == 2 and "RECOVERED" in webhook_server.posts[1]["text"]
    state = (tmp_path / "logs" / ".bsops-alerts.json").read_text()
    assert webhook_server.url not in state and "SECRETPART" not in state


def test_a_webhook_alone_tells_the_hourly_jobs_failures(webhook_server, cert, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VAR, webhook_server.url)
    outbox = channels.outbox_from_alerts(AlertsConfig(webhook_url_env=VAR))
    assert outbox is not None and outbox.names == ("webhook",)
    [hook] = outbox.channels
    outbox = Outbox((WebhookChannel(dataclasses.replace(hook.settings, ca_file=cert[0])),), outbox.sender)
    outcome = notify.notify_job(outbox, tmp_path / "state.json", "backup", "disk full", experiment="tiny",
                                command="bsops backup tiny", now=NOW)
    assert outcome.kind == "alert" and f"${VAR}" in outcome.line and "SECRETPART" not in outcome.line
    [post] = webhook_server.posts
    assert "backup" in post["text"] and "disk full" in post["text"]


@pytest.mark.parametrize("url, expected", [
    (None, "is not set or empty"),
    ("http://127.0.0.1:9/services/SECRETPART", "not an https URL"),
    ("https://user:SECRETPART@hooks.example.org/x", "no credentials"),
    ("https://hooks.example.org/a b/SECRETPART", "spaces"),
])
def test_unusable_webhook_settings_are_one_clear_error_without_the_url(url, expected, cert, tmp_path: Path,
                                                                       monkeypatch) -> None:
    if url is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, url)
    outbox = webhook_outbox(VAR, cert)
    with pytest.raises(NotifyError, match=expected) as err:
        outbox.send(outbox.compose("[ALERT] tiny: x", "body"))
    assert "SECRETPART" not in str(err.value) and VAR in str(err.value)


def test_a_failing_webhook_keeps_the_alert_due_for_the_next_run(webhook_server, cert, tmp_path: Path,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv(VAR, webhook_server.url)
    webhook_server.status = 500
    outbox = webhook_outbox(VAR, cert)
    state = tmp_path / "state.json"
    with pytest.raises(NotifyError, match="answered HTTP 500") as err:
        notify.notify_job(outbox, state, "hub-sync", "remote refused", experiment="tiny", command="c", now=NOW)
    assert "SECRETPART" not in str(err.value) and f"${VAR}" in str(err.value)
    entry = json.loads(state.read_text())["jobs"]["hub-sync"]
    assert entry["sent"] == {} and "HTTP 500" in entry["failed"]["webhook"] and "SECRETPART" not in state.read_text()
    webhook_server.status = 200
    outcome = notify.notify_job(outbox, state, "hub-sync", "remote refused", experiment="tiny", command="c",
                                now=NOW + timedelta(minutes=1))
    assert outcome.kind == "alert" and len(webhook_server.posts) == 2
    sent = json.loads(state.read_text())["jobs"]["hub-sync"]["sent"]
    assert sent == {"webhook": (NOW + timedelta(minutes=1)).isoformat()}


def test_a_failing_webhook_never_repeats_the_email_and_a_failing_email_never_blocks_the_webhook(
        plain_server, webhook_server, cert, tmp_path: Path, monkeypatch) -> None:
    """Each channel keeps its own last-sent time: the webhook answering 500 for three hourly runs inside a
    240-minute cooldown costs one email, not three, and is tried again each run until it takes the alert."""
    inbox, port = plain_server
    monkeypatch.setenv(VAR, webhook_server.url)
    webhook_server.status = 500
    log = tmp_path / "logs" / "main_log.txt"
    log.parent.mkdir()
    outbox = _outbox(port, cert)

    def watch(jobs, minutes):
        settings = watchdog.WatchSettings("tr1-13B-round3", log_path=log, outbox=outbox, cooldown_minutes=240)
        return watchdog.watch(settings, query=lambda **_: jobs, now=NOW + timedelta(minutes=minutes))

    runs = [watch([], m) for m in (0, 60, 120)]
    assert len(inbox.messages) == 1 and len(webhook_server.posts) == 3
    assert [r.exit_code for r in runs] == [status.EXIT_ERROR] * 3
    for run in runs:
        failed = [line for line in run.lines if "could not" in line]
        assert len(failed) == 1 and "HTTP 500" in failed[0] and f"${VAR}" in failed[0], run.lines
        assert "SECRETPART" not in "\n".join(run.lines)
    assert "alert email sent to oncall@example.org" in "\n".join(runs[0].lines)
    logged = (log.parent / "watchdog.log").read_text()
    assert logged.count("HTTP 500") == 3 and "SECRETPART" not in logged
    webhook_server.status = 200
    fourth = watch([], 180)
    assert fourth.exit_code == status.EXIT_ALERT and len(inbox.messages) == 1 and len(webhook_server.posts) == 4
    assert watch([], 200).exit_code == status.EXIT_ALERT and len(webhook_server.posts) == 4  # its own cooldown now
    # The training runs again: each channel that told of the alert gets its recovery, once.
    running = seed_job(start_time=NOW, elapsed_s=60)
    assert watch([running], 210).exit_code == status.EXIT_HEALTHY
    assert len(inbox.messages) == 2 and len(webhook_server.posts) == 5
    assert "RECOVERED" in inbox.messages[1]["Subject"] and "RECOVERED" in webhook_server.posts[4]["text"]
    assert json.loads((log.parent / ".bsops-alerts.json").read_text())["active"] == {}
    assert watch([running], 220).exit_code == status.EXIT_HEALTHY and len(inbox.messages) == 2


def test_a_failing_email_does_not_hold_back_the_webhook(webhook_server, cert, tmp_path: Path, monkeypatch) -> None:
    from tests.fixtures_smtp import free_port

    monkeypatch.setenv(VAR, webhook_server.url)
    outbox = _outbox(free_port(), cert)  # nothing listens there
    state = tmp_path / "state.json"
    with pytest.raises(NotifyError, match="127.0.0.1") as err:
        notify.notify_job(outbox, state, "backup", "disk full", experiment="tiny", command="c", now=NOW)
    assert "webhook" in str(err.value) and "SECRETPART" not in str(err.value)  # says what did go out
    assert len(webhook_server.posts) == 1
    with pytest.raises(NotifyError):
        notify.notify_job(outbox, state, "backup", "disk full", experiment="tiny", command="c",
                          now=NOW + timedelta(minutes=5))
    assert len(webhook_server.posts) == 1  # the webhook's cooldown holds; only the email is tried again


# --- a webhook that never finishes, or sends the alert elsewhere, is a failed channel in bounded time -------

@pytest.mark.slow  # waits out real timeouts: the whole suite runs it, the fast lane does not
def test_a_dripping_webhook_is_cut_off_at_its_timeout_and_the_state_says_it_failed(hostile_https, cert,
                                                                                   tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """The issue's server: `200 OK`, then one header line every DRIP_S for ever. The POST ends at the channel's
    timeout (without one for the whole exchange it would never end: tests/hang.py fails it then), the alert state is
    saved with the webhook failed, and the next run tries again."""
    drip = hostile_https(SCRIPTS["drip headers"])
    monkeypatch.setenv(VAR, drip.url())
    outbox = Outbox((WebhookChannel(WebhookSettings(VAR, ca_file=cert[0], timeout_s=0.5)),), "b@example.org")
    state = tmp_path / "state.json"
    for minutes in (0, 60):
        with pytest.raises(NotifyError) as err:
            ends_within(lambda: notify.notify_job(outbox, state, "hub-sync", "remote refused", experiment="tiny",
                                                  command="c", now=NOW + timedelta(minutes=minutes)),
                        "a webhook dripping for ever, its timeout not kept")
        assert SECRET not in str(err.value)
        entry = json.loads(state.read_text())["jobs"]["hub-sync"]
        assert entry["sent"] == {} and "webhook" in entry["failed"] and SECRET not in state.read_text()
    assert len(drip.requests) == 2


@pytest.mark.parametrize("code", [301, 302, 307])
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_redirecting_webhook_is_a_failed_channel_and_its_target_never_hears(code: int, scheme: str, hostile_https,
                                                                              cert, tmp_path: Path,
                                                                              monkeypatch) -> None:
    target = hostile_https(answer(OK), tls=None if scheme == "http" else "default")
    server = hostile_https(redirect(code, target.url(scheme)))
    monkeypatch.setenv(VAR, server.url())
    state = tmp_path / "state.json"
    with pytest.raises(NotifyError, match=str(code)):
        notify.notify_job(webhook_outbox(VAR, cert), state, "backup", "disk full", experiment="tiny", command="c",
                          now=NOW)
    entry = json.loads(state.read_text())["jobs"]["backup"]
    assert entry["sent"] == {} and str(code) in entry["failed"]["webhook"]
    assert target.loopback.connections == 0 and SECRET not in state.read_text()


def _tunnel(conn, stop, server) -> None:
    """An https proxy: CONNECT host:port, then bytes both ways until either side hangs up."""
    import selectors
    import socket

    request = read_request(conn, server)
    host, port = request.line.split()[1].decode().rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as upstream:
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        with selectors.DefaultSelector() as selector:
            selector.register(conn, selectors.EVENT_READ, upstream)
            selector.register(upstream, selectors.EVENT_READ, conn)
            while not stop.is_set():
                for key, _ in selector.select(0.2):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)


def test_the_environments_https_proxy_carries_the_post_through_a_tunnel(webhook_server, hostile_https, cert,
                                                                        monkeypatch) -> None:
    """As urllib did: https_proxy (with its credentials) unless no_proxy names the host; TLS is still with the
    webhook's own host, checked against its certificate."""
    proxy = hostile_https(_tunnel, tls=None)
    monkeypatch.setenv(VAR, webhook_server.url)
    for name in ("no_proxy", "NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("https_proxy", f"http://ops:pr%40xy@127.0.0.1:{proxy.port}")
    outbox = webhook_outbox(VAR, cert)
    outbox.send(outbox.compose("[ALERT] tiny: x", "through the proxy"))
    [connect] = proxy.requests
    port = webhook_server.url.split(":")[2].split("/")[0]
    assert connect.line.split()[:2] == [b"CONNECT", f"127.0.0.1:{port}".encode()]
    assert connect.headers["proxy-authorization"] == "Basic " + base64.b64encode(b"ops:pr@xy").decode()
    assert len(webhook_server.posts) == 1
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    outbox.send(outbox.compose("[ALERT] tiny: y", "straight"))
    assert len(proxy.requests) == 1 and len(webhook_server.posts) == 2


# --- end to end: `bsops status EXP` with a real SMTP sink and a dripping webhook ------------------------------

@pytest.mark.slow  # waits out real timeouts: the whole suite runs it, the fast lane does not
def test_bsops_status_with_a_dripping_webhook_returns_in_time_mails_once_and_records_the_webhook_failed(
        trainings: Path, plain_server, hostile_https, cert, tmp_path: Path, monkeypatch) -> None:
    """The watchdog of an experiment whose alerts go to email and a webhook that answers `200 OK` then drips a
    header line every DRIP_S for ever: each `bsops status` returns (each channel keeps its timeout: it would never
    end otherwise, and tests/hang.py fails it), the email goes out once per cooldown, and the alert state says the webhook failed (so the next run tries it again)."""
    from bigscience_ops.run import ledger
    from bigscience_ops.cli import main
    from bigscience_ops.config.loading import load_experiment
    from bigscience_ops.ops.tell import email, webhook

    inbox, port = plain_server
    drip = hostile_https(SCRIPTS["drip headers"])
    monkeypatch.setattr(webhook, "TIMEOUT_S", 0.5)  # what from_alerts gives each channel
    monkeypatch.setattr(email, "TIMEOUT_S", 2.0)
    monkeypatch.setenv(VAR, drip.url())
    monkeypatch.setenv("SSL_CERT_FILE", cert[0])  # the default context trusts the test CA (as a site CA would be)
    monkeypatch.setenv("PATH", f"{replay_squeue(tmp_path / 'bin', 'squeue.txt')}:{os.environ['PATH']}")
    alerts = alerts_yaml(port, 60).replace("smtp_security: none", f"smtp_security: none, webhook_url_env: {VAR}")
    (trainings / "watched.yaml").write_text(tiny_yaml(tmp_path / "run", "slurm: {job_name: bsops-e2e-watched}\n",
                                                      alerts))
    exp = load_experiment("watched", trainings)
    ledger.mark_launch(Path(exp.paths.output), "4242")  # launched and gone: an alert
    slurm_timeout = 5.0

    def run_status() -> int:
        result = ends_within(lambda: CliRunner().invoke(main, ["status", "watched", "--trainings-dir", str(trainings),
                                                               "--timeout", str(slurm_timeout)]),
                             "bsops status on a webhook dripping for ever, a channel's timeout not kept")
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        assert SECRET not in result.output
        return result.exit_code

    state_file = Path(exp.paths.logs) / ".bsops-alerts.json"
    assert run_status() == status.EXIT_ERROR  # the alert, and a channel that could not take it
    assert len(inbox.messages) == 1 and len(drip.requests) == 1
    [entry] = json.loads(state_file.read_text())["active"].values()
    assert set(entry["sent"]) == {"email"} and set(entry["failed"]) == {"webhook"}
    assert run_status() == status.EXIT_ERROR  # within the cooldown: no email; the webhook tried again
    assert len(inbox.messages) == 1 and len(drip.requests) == 2
    [entry] = json.loads(state_file.read_text())["active"].values()
    assert set(entry["sent"]) == {"email"} and set(entry["failed"]) == {"webhook"}
    assert SECRET not in state_file.read_text() and SECRET not in (Path(exp.paths.logs) / "watchdog.log").read_text()


def test_a_webhook_answer_that_comes_slowly_but_whole_is_cut_off_at_the_total(hostile_https, cert) -> None:
    """Each line 0.8 s after the last is far within a time per read (the old limit), yet the whole answer takes
    6 s: the POST fails at its 1 s (with a time per read it would succeed, slowly), and the same server answering at
    once delivers."""
    slow = hostile_https(SCRIPTS["a whole answer, one line every 0.8 s"])
    with pytest.raises(webhook_module.WebhookError):
        webhook_module.post(slow.url(), "s", "b", timeout=1.0, ca_file=cert[0])
    assert len(slow.requests) == 1
    webhook_module.post(hostile_https(answer(OK)).url(), "s", "b", timeout=2.0, ca_file=cert[0])
