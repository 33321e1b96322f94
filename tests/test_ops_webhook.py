"""Alerts to a chat webhook (alerts.webhook_url_env): the same messages, cooldown and recovery as email,
posted over https to a real local server; the URL, a secret, never shows."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bigscience_ops.ops.tell import channels, notify
from bigscience_ops.ops.tell.channels import Outbox
from bigscience_ops.ops.tell.message import NotifyError
from bigscience_ops.ops.tell.webhook import WebhookChannel
from bigscience_ops.ops.watch import status, watchdog
from bigscience_ops.schema import AlertsConfig
from tests.fixtures_smtp import plain_outbox, webhook_outbox
from tests.fixtures_status import seed_job

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
