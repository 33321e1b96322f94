"""Alert emails, received by a real SMTP server (aiosmtpd) on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from bigscience_ops.ops.tell import channels, notify
from bigscience_ops.ops.tell.channels import Outbox
from bigscience_ops.ops.tell.message import SUBJECT_MAX, NotifyError, header_text
from bigscience_ops.ops.watch import status
from tests.fixtures_smtp import PASSWORD, T0, Inbox, free_port, plain_outbox, server_tls, serving
from tests.hang import ends_within


def missing_report(now: datetime) -> status.StatusReport:
    return status.evaluate("tr1-13B-round3", [], now=now)


def send(outbox: Outbox, env: dict[str, str] | None = None) -> str:
    """One message on every channel of `outbox`: its Message-ID, or NotifyError."""
    return outbox.send(outbox.compose("s", "b"), env=env)


def test_alert_email_arrives_with_proper_headers(plain_server) -> None:
    inbox, port = plain_server
    outbox = plain_outbox(port)
    message = outbox.compose("subject", "body", now=T0)
    message_id = outbox.send(message)
    got = inbox.messages[0]
    assert got["Message-ID"] == message_id and message_id.startswith("<") and message_id.endswith("@example.org>")
    assert parsedate_to_datetime(got["Date"]) == T0.astimezone()
    assert got["From"] == "bsops-bot@example.org" and got["Subject"] == "subject"
    assert inbox.envelopes[0] == ("bsops-bot@example.org", ["oncall@example.org", "lead@example.org"])


def test_notify_cooldown_and_recovery(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    outbox, state = plain_outbox(port), tmp_path / "alerts.json"

    def run(now: datetime, report: status.StatusReport) -> list[notify.Notice]:
        return notify.notify(report, outbox, state, experiment="tr1-13B", cooldown_minutes=60, now=now,
                             log_path="/runs/tr1-13B/logs/main_log.txt")

    first = run(T0, missing_report(T0))
    assert [(n.kind, n.conditions) for n in first] == [("alert", ("not-scheduled",))]
    msg = inbox.messages[0]
    body = msg.get_content()
    assert msg["Subject"] == "[ALERT] tr1-13B: launch it again: nothing running or queued"  # details: the body
    assert "***ALERT: tr1-13B-round3 is not RUNNING or SCHEDULED! Alert someone at the on-call person***" in body
    assert "Experiment: tr1-13B" in body and "bsops launch tr1-13B" in body and "main_log.txt" in body
    assert msg["Message-ID"] == first[0].message_id

    assert run(T0 + timedelta(minutes=30), missing_report(T0 + timedelta(minutes=30))) == []
    again = run(T0 + timedelta(minutes=61), missing_report(T0 + timedelta(minutes=61)))
    assert [n.kind for n in again] == ["alert"] and len(inbox.messages) == 2

    # Slurm unreachable: a new alert, but the old condition is not known to have cleared.
    unreachable = status.StatusReport("tr1-13B-round3", T0 + timedelta(minutes=70), ("x",),
                                      (status.Alert("slurm-error", "***ALERT: cannot query Slurm***"),), 2)
    assert [n.conditions for n in run(T0 + timedelta(minutes=70), unreachable)] == [("slurm-error",)]

    running = status.StatusReport("tr1-13B-round3", T0 + timedelta(minutes=80),
                                  ("[2026-11-22 11:20:00] tr1-13B-round3 is running for 0:05:00",))
    recovered = run(T0 + timedelta(minutes=80), running)
    assert [(n.kind, set(n.conditions)) for n in recovered] == [("recovery", {"not-scheduled", "slurm-error"})]
    last = inbox.messages[-1]
    assert last["Subject"].startswith("[RECOVERED] tr1-13B:") and "is running" in last.get_content()
    assert json.loads(state.read_text())["active"] == {}
    assert run(T0 + timedelta(minutes=90), running) == [] and len(inbox.messages) == 4


def test_a_held_array_leads_with_its_release_not_a_second_launch(plain_server, tmp_path: Path) -> None:
    from tests.fixtures_status import seed_job

    inbox, port = plain_server
    held = seed_job(job_id="720000_[1-5%1]", array_job_id="720000", array_task="1-5%1", state="PENDING",
                    reason="JobHeldAdmin", nodes="", elapsed_s=0, start_time=None)
    report = status.evaluate("tr1-13B-round3", [held], now=T0)
    notify.notify(report, plain_outbox(port), tmp_path / "alerts.json", experiment="tr1-13B", now=T0)
    [msg] = inbox.messages
    assert msg["Subject"] == "[ALERT] tr1-13B: release held array 720000 (scontrol release 720000)"
    todo = msg.get_content().replace("\r\n", "\n").split("What to do:\n", 1)[1].split("\n")
    assert todo[0].startswith("- Array 720000 is held by an administrator (JobHeldAdmin): release it (`scontrol "
                              "release 720000`); do not launch again")
    assert "launch the training again" not in msg.get_content()


def test_every_subject_leads_with_what_to_do_in_under_120_characters() -> None:
    from tests.fixtures_status import seed_job

    name = "tr1-13B-round3-a-long-experiment-name"
    reports = [status.evaluate(name, [], now=T0),
               status.evaluate(name, [seed_job(name=name), seed_job(name=name, job_id="720001")], now=T0),
               status.evaluate(name, [seed_job(name=name, state="PENDING", reason="PartitionDown")], now=T0)]
    alerts = [a for r in reports for a in r.alerts]
    assert [a.condition for a in alerts] == ["not-scheduled", "overlap", "never-starts"]
    for alert in alerts:
        subject = header_text(notify.alert_text.alert_email(name, reports[0], [alert], 60, None)[0], SUBJECT_MAX)
        words = subject.split(": ", 1)[1]
        assert words.split()[0] in ("launch", "cancel", "release", "read", "check"), subject
        assert not words.endswith("..."), subject  # nothing of what to do was cut
    assert alerts[1].headline == "cancel the newer job (scancel 720001): 2 trainings at once"


def test_a_state_file_from_before_channels_keeps_its_cooldown_and_finish(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    state = tmp_path / "alerts.json"
    state.write_text(json.dumps({"version": 1, "finished": {"job-b": 120}, "jobs": {}, "active": {
        "tr1-13B-round3::not-scheduled": {"since": T0.isoformat(), "last_sent": T0.isoformat(), "message": "x"}}}))
    outbox = plain_outbox(port)
    assert notify.notify(missing_report(T0 + timedelta(minutes=30)), outbox, state, cooldown_minutes=60,
                         now=T0 + timedelta(minutes=30)) == []
    done = status.StatusReport("job-b", T0, ("finished",), finished_at=120)
    assert notify.notify(done, outbox, state, now=T0) == [] and inbox.messages == []  # announced already
    assert json.loads(state.read_text())["active"]["tr1-13B-round3::not-scheduled"]["sent"]["email"] == T0.isoformat()


def test_a_finished_run_with_an_alert_gets_both_mails_and_records_the_alert(plain_server, tmp_path: Path) -> None:
    """A run can finish with an alert open (training health on its last lines): the finish mail and the alert both
    go out and the alert's sending is recorded (the finished mail's bookkeeping once shadowed the alerts told)."""
    from bigscience_ops.ops.alerts import raise_alert

    inbox, port = plain_server
    state = tmp_path / "alerts.json"
    alert = raise_alert("health-skipped", finding="3 skipped steps")
    done = status.StatusReport("job-b", T0, ("finished",), alerts=(alert,), exit_code=status.EXIT_ALERT,
                               finished_at=120)
    notify.notify(done, plain_outbox(port), state, now=T0)
    assert len(inbox.messages) == 2
    assert json.loads(state.read_text())["active"]["job-b::health-skipped"]["sent"]["email"] == T0.isoformat()


def test_conditions_of_other_jobs_are_left_alone(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    outbox, state = plain_outbox(port), tmp_path / "alerts.json"
    notify.notify(status.evaluate("job-a", [], now=T0), outbox, state, now=T0)
    ok = status.StatusReport("job-b", T0, ())
    assert notify.notify(ok, outbox, state, now=T0) == []
    assert list(json.loads(state.read_text())["active"]) == ["job-a::not-scheduled"]


def test_starttls_login_with_password_from_the_environment(starttls_server, cert) -> None:
    inbox, port = starttls_server
    outbox = plain_outbox(port, security="starttls", user="bot", password_env="BSOPS_TEST_SMTP_PASSWORD",
                          ca_file=cert[0])
    send(outbox, env={"BSOPS_TEST_SMTP_PASSWORD": PASSWORD})
    assert inbox.logins == ["bot"] and len(inbox.messages) == 1


def test_wrong_password_is_an_error_that_does_not_show_it(starttls_server, cert) -> None:
    inbox, port = starttls_server
    outbox = plain_outbox(port, security="starttls", user="bot", password_env="PW", ca_file=cert[0])
    with pytest.raises(NotifyError, match=f"127.0.0.1:{port}") as info:
        send(outbox, env={"PW": "wrong-" + PASSWORD})
    assert PASSWORD not in str(info.value) and inbox.messages == []


def test_missing_password_variable_is_named(starttls_server, cert) -> None:
    _, port = starttls_server
    outbox = plain_outbox(port, security="starttls", user="bot", password_env="BSOPS_NO_SUCH_VAR")
    with pytest.raises(NotifyError, match="BSOPS_NO_SUCH_VAR"):
        send(outbox, env={})


def test_implicit_tls(cert) -> None:
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), ssl_context=server_tls(cert))
    controller.start()
    try:
        send(plain_outbox(controller.port, security="ssl", ca_file=cert[0]))
    finally:
        controller.stop()
    assert len(inbox.messages) == 1


def test_untrusted_certificate_is_refused(starttls_server) -> None:
    _, port = starttls_server
    with pytest.raises(NotifyError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
        send(plain_outbox(port, security="starttls"))


def test_failed_send_is_retried_on_the_next_run(tmp_path: Path) -> None:
    port = free_port()  # nothing listens here
    state = tmp_path / "alerts.json"
    [failed] = notify.notify(missing_report(T0), plain_outbox(port), state, now=T0)
    assert failed.kind == "alert" and failed.channels == ("email",) and f"127.0.0.1:{port}" in failed.error
    entry = json.loads(state.read_text())["active"]["tr1-13B-round3::not-scheduled"]
    assert entry["sent"] == {} and f"127.0.0.1:{port}" in entry["failed"]["email"]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        sent = notify.notify(missing_report(T0), plain_outbox(port), state, now=T0 + timedelta(minutes=1))
    finally:
        controller.stop()
    assert [(n.kind, n.error) for n in sent] == [("alert", None)] and len(inbox.messages) == 1
    assert "failed" not in json.loads(state.read_text())["active"]["tr1-13B-round3::not-scheduled"]


@pytest.mark.parametrize(("changes", "field_name"), [
    ({"security": "tls"}, "smtp.security"),
    ({"port": 0}, "smtp.port"),
    ({"recipients": ()}, "smtp.recipients"),
    ({"sender": "bot"}, "smtp.sender"),
    ({"user": "bot"}, "smtp.password_env"),
    ({"host": ""}, "smtp.host"),
])
def test_settings_are_validated(changes: dict, field_name: str) -> None:
    with pytest.raises(NotifyError, match=field_name):
        plain_outbox(**{"port": 25, **changes})


# --- `bsops status`: one watchdog run end to end -----------------------------------------------------

BSOPS = ("import sys\nfrom bigscience_ops.cli import main\ntry:\n    main()\nfinally:\n"
         "    sys.stderr.write('heavy modules: %s' % sorted({'torch', 'deepspeed'} & set(sys.modules)))\n")


def bsops(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    return subprocess.run([sys.executable, "-c", BSOPS, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_status_command_emails_once_when_slurm_cannot_be_queried(plain_server, tmp_path: Path) -> None:
    """The alert channel is the experiment's (alerts.*), here set on the command line: status has no --smtp-* of its
    own, one setting with one default."""
    inbox, port = plain_server
    log = tmp_path / "logs" / "main_log.txt"
    (tmp_path / "trainings").mkdir()
    (tmp_path / "trainings" / "watched.yaml").write_text(f"base: tiny\npaths: {{output: {tmp_path / 'run'}}}\n")
    args = ("status", "watched", "--trainings-dir", str(tmp_path / "trainings"), "slurm.job_name=tr1-13B-round3",
            f"paths.logs={log.parent}", "--timeout", "1", "alerts.email_to=[oncall@example.org]", "alerts.smtp_host=127.0.0.1",
            f"alerts.smtp_port={port}", "alerts.smtp_security=none", "alerts.email_from=bot@example.org")
    env = {"SLURM_CONF": "/nonexistent/slurm.conf"}
    first = bsops(*args, env=env)
    assert first.returncode == status.EXIT_ERROR, first.stderr
    assert "heavy modules: []" in first.stderr
    assert "***ALERT: cannot query Slurm for tr1-13B-round3" in first.stdout
    assert len(inbox.messages) == 1 and "cannot query Slurm" in inbox.messages[0]["Subject"]
    assert "alert email sent to oncall@example.org" in first.stdout
    second = bsops(*args, env=env)
    assert second.returncode == status.EXIT_ERROR and len(inbox.messages) == 1  # within the cooldown
    logged = (log.parent / "watchdog.log").read_text()
    assert logged.count("***ALERT: cannot query Slurm") == 2 and logged.count("email sent") == 1
    assert not log.exists(), "the watchdog writes nothing into the log it measures"
    assert (log.parent / ".bsops-alerts.json").exists()
    quiet = bsops(*args, "--no-email", "--alert-state", str(tmp_path / "other.json"), env=env)
    assert quiet.returncode == status.EXIT_ERROR and len(inbox.messages) == 1


# --- the hourly jobs' failures: notify_job ------------------------------------------------------------

def job(outbox: Outbox, state: Path, error: str | None, now: datetime) -> notify.JobNotice:
    return notify.notify_job(outbox, state, "hub-sync", error, experiment="tr1-13B",
                             command="bsops hub-sync tr1-13B", cooldown_minutes=60, now=now)


def test_job_failure_is_emailed_once_per_cooldown_then_one_recovery(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    outbox, state = plain_outbox(port), tmp_path / "logs" / ".bsops-alerts.json"
    notify.notify(missing_report(T0), outbox, state, now=T0)  # the watchdog shares the file
    assert len(inbox.messages) == 1

    assert job(outbox, state, "push refused: quota exceeded", T0).kind == "alert"
    msg = inbox.messages[1]
    assert msg["Subject"] == "[bsops] tr1-13B: hub-sync failed"
    body = msg.get_content()
    assert "quota exceeded" in body and "bsops hub-sync tr1-13B" in body
    assert "repeats at most every 60 minutes while it keeps failing; a recovery email" in body
    held = [job(outbox, state, "push refused: quota exceeded", T0 + timedelta(minutes=m)) for m in (20, 40)]
    assert [h.kind for h in held] == ["held", "held"] and len(inbox.messages) == 2
    assert "held back" in held[0].line and f"last sent {T0.isoformat()}" in held[0].line

    again = job(outbox, state, "push refused: disk full", T0 + timedelta(minutes=61))
    assert again.kind == "alert" and len(inbox.messages) == 3
    assert "failing since 2026-11-22 10:00 (1 h 01 min)" in inbox.messages[2].get_content()
    assert job(outbox, state, "push refused: disk full", T0 + timedelta(minutes=62)).kind == "held"

    recovered = job(outbox, state, None, T0 + timedelta(minutes=90))
    assert recovered.kind == "recovery" and len(inbox.messages) == 4
    last = inbox.messages[3]
    assert last["Subject"] == "[RECOVERED] tr1-13B: hub-sync works again"
    text = last.get_content()
    assert "failed from 2026-11-22 10:00 for 1 h 30 min" in text and "disk full" in text
    assert job(outbox, state, None, T0 + timedelta(minutes=150)).kind == "quiet" and len(inbox.messages) == 4

    saved = json.loads(state.read_text())
    assert saved["jobs"] == {} and list(saved["active"]) == ["tr1-13B-round3::not-scheduled"]
    assert notify.notify(missing_report(T0 + timedelta(minutes=30)), outbox, state,
                         now=T0 + timedelta(minutes=30)) == []  # the watchdog's cooldown survived the job's writes


def test_job_failure_never_emailed_clears_silently_and_a_failed_send_is_retried(tmp_path: Path) -> None:
    port = free_port()  # nothing listens here yet
    outbox, state = plain_outbox(port), tmp_path / "alerts.json"
    with pytest.raises(NotifyError, match=f"127.0.0.1:{port}"):
        job(outbox, state, "backup store is full", T0)
    assert json.loads(state.read_text())["jobs"]["hub-sync"]["sent"] == {}
    with pytest.raises(NotifyError):
        job(outbox, state, "backup store is full", T0 + timedelta(minutes=5))  # not held back: never sent
    inbox = Inbox()
    with serving(inbox, port):
        assert job(outbox, state, None, T0 + timedelta(minutes=10)).kind == "quiet"
    assert json.loads(state.read_text())["jobs"] == {} and inbox.messages == []
    with pytest.raises(NotifyError):
        job(outbox, state, "backup store is full", T0 + timedelta(minutes=20))
    with serving(inbox, port):
        assert job(outbox, state, "backup store is full", T0 + timedelta(minutes=21)).kind == "alert"
    assert len(inbox.messages) == 1 and "since 2026-11-22 10:20" in inbox.messages[0].get_content()


def test_job_cooldown_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(NotifyError, match=r"cooldown_minutes: got -1; allowed: 0 or more"):
        notify.notify_job(plain_outbox(25), tmp_path / "a.json", "backup", "x", experiment="e", command="c",
                          cooldown_minutes=-1, now=T0)


COUNT = ("import sys\nfrom pathlib import Path\nfrom bigscience_ops.ops.tell import notify\n"
         "for _ in range(int(sys.argv[2])):\n"
         "    with notify._state_file(Path(sys.argv[1])) as state:\n"
         "        state.finished['count'] = state.finished.get('count', 0) + 1\n")


def test_the_state_file_is_updated_under_a_lock_by_concurrent_writers(tmp_path: Path) -> None:
    import sys

    state = tmp_path / "alerts.json"
    writers = [subprocess.Popen([sys.executable, "-c", COUNT, str(state), "150"]) for _ in range(3)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
    assert json.loads(state.read_text())["finished"]["count"] == 450
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alerts.json", "alerts.json.lock"]


# --- safe headers, scrubbed texts -----------------------------------------------------------------------

# Each breaks a line for str.splitlines() or is a control character: email refuses every one in a header.
LINE_BREAKS = {"newline": "\n", "CR": "\r", "VT": "\x0b", "FF": "\x0c", "FS": "\x1c", "GS": "\x1d", "RS": "\x1e",
               "NEL": "\x85", "LINE SEPARATOR": "\u2028", "PARAGRAPH SEPARATOR": "\u2029", "NUL": "\x00", "ESC": "\x1b"}


@pytest.mark.parametrize("char", LINE_BREAKS.values(), ids=LINE_BREAKS.keys())
def test_a_job_name_with_any_line_break_still_sends_a_one_line_subject(plain_server, tmp_path: Path, char: str) -> None:
    inbox, port = plain_server
    name = f"tr1{char}Bcc: victim@example.org{char}{char}x" + "y" * 300
    report = status.evaluate(name, [], now=T0)
    sent = notify.notify(report, plain_outbox(port), tmp_path / "alerts.json", now=T0)
    assert [n.kind for n in sent] == ["alert"] and len(inbox.messages) == 1
    msg = inbox.messages[0]
    subject = msg["Subject"]
    assert len(subject) <= SUBJECT_MAX and subject.startswith("[ALERT] tr1 Bcc: victim@example[.]org x")  # no link
    assert all(c.isprintable() for c in subject) and sent[0].subject == subject
    assert msg["Bcc"] is None and inbox.envelopes[0][1] == ["oncall@example.org", "lead@example.org"]
    assert "not RUNNING or SCHEDULED" in msg.get_content()  # the details are in the body

    channels.send_alert(_alerts(port), f"[bsops] cron.hourly: {name} failed", f"argv: squeue {name}")
    assert len(inbox.messages) == 2 and len(inbox.messages[1]["Subject"]) <= SUBJECT_MAX


def _alerts(port: int):
    from bigscience_ops.schema import AlertsConfig

    return AlertsConfig(email_to=["oncall@example.org"], email_from="bot@example.org", smtp_host="127.0.0.1",
                        smtp_port=port)


def test_a_failure_text_with_credentials_is_scrubbed_in_the_email_and_the_state_file(plain_server, tmp_path: Path,
                                                                                     monkeypatch) -> None:
    inbox, port = plain_server
    token = "hf_" + "Ab3" * 8
    monkeypatch.setenv("BSOPS_SMTP_PASSWORD", "smtp-Pa55-word")
    # No login (the plain server takes none), but the password's variable is named: its value is a secret.
    outbox = plain_outbox(port, password_env="BSOPS_SMTP_PASSWORD")
    error = (f"`git push https://bot:{token}@hub.example/x.git` exited 128: remote: denied\n"
             f"> Authorization: Bearer {token}\nfetch https://mirror.example/x?access_token=abcd1234&x=1\n"
             "the SMTP password smtp-Pa55-word leaked here")
    state = tmp_path / "logs" / ".bsops-alerts.json"
    assert job(outbox, state, error, T0).kind == "alert"
    body = inbox.messages[0].get_content()
    saved = state.read_text()
    for text in (body, saved, inbox.messages[0]["Subject"]):
        assert token not in text and "abcd1234" not in text and "smtp-Pa55-word" not in text
    assert "exited 128: remote: denied" in body and "hxxps[:]//<redacted>@hub[.]example/x.git" in body  # no link
    assert state.stat().st_mode & 0o777 == 0o600
    assert inbox.messages[0]["Subject"] == "[bsops] tr1-13B: hub-sync failed"  # the error itself is only in the body


def test_addresses_with_line_breaks_are_refused_naming_the_field() -> None:
    with pytest.raises(NotifyError, match="smtp.recipients"):
        plain_outbox(25, recipients=("oncall@example.org\u2028Bcc: x@example.org",))
    with pytest.raises(NotifyError, match="smtp.sender"):
        plain_outbox(25, sender="bot@example.org\nBcc: x@example.org")


# --- the state's lock is never held across a send; an unreadable state is set aside --------------------------

class _SlowInbox(Inbox):
    """A mail server that takes each message's data only once `release` is set (it tells `reached` first)."""

    def __init__(self) -> None:
        import threading

        super().__init__()
        self.reached, self.release = threading.Event(), threading.Event()

    async def handle_DATA(self, server, session, envelope):
        import asyncio

        self.reached.set()
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 60)
        return await super().handle_DATA(server, session, envelope)


def test_a_slow_mail_server_never_holds_the_state_lock_from_the_hourly_jobs(plain_server, tmp_path: Path) -> None:
    """The watchdog's alert waits on a server that does not answer; hub-sync --alert of the same run, with the same
    state file, sends its own alert meanwhile, and both end up in the state."""
    import threading

    fast, fast_port = plain_server
    slow = _SlowInbox()
    controller = Controller(slow, hostname="127.0.0.1", port=free_port())
    controller.start()
    state = tmp_path / "alerts.json"
    watchdog_done: list[list[notify.Notice]] = []
    watchdog = threading.Thread(target=lambda: watchdog_done.append(notify.notify(
        missing_report(T0), plain_outbox(controller.port), state, now=T0)))
    try:
        watchdog.start()
        assert slow.reached.wait(30), "the watchdog's message never reached the server"
        # Waiting for the watchdog's lock would last until the slow server lets go (60 s): a hang, far past this
        # send's fraction of a second; and the watchdog would no longer be alive after it.
        told = ends_within(lambda: notify.notify_job(plain_outbox(fast_port), state, "hub-sync", "push refused",
                                                     experiment="e", command="bsops hub-sync e", now=T0),
                           "the state's lock held across the watchdog's send", seconds=30)
        assert told.kind == "alert" and len(fast.messages) == 1
        assert watchdog.is_alive()  # still waiting on the slow server
    finally:
        slow.release.set()
        watchdog.join(60)
        controller.stop()
    [sent] = watchdog_done[0]
    assert sent.kind == "alert" and sent.error is None and len(slow.messages) == 1
    saved = json.loads(state.read_text())
    assert saved["jobs"]["hub-sync"]["sent"]["email"] == T0.isoformat()
    assert saved["active"]["tr1-13B-round3::not-scheduled"]["sent"]["email"] == T0.isoformat()


@pytest.mark.parametrize("content", [b"{\"active\": {\"x::y\": {\"sin", b"\xff\xfe", b"[]", b'{"jobs": {"backup": 7}}'],
                         ids=["torn", "binary", "a list", "an entry not an object"])
def test_an_unreadable_state_is_set_aside_and_the_job_alert_still_goes_out(plain_server, tmp_path: Path,
                                                                           content: bytes) -> None:
    inbox, port = plain_server
    state = tmp_path / "alerts.json"
    state.write_bytes(content)
    assert notify.state_problem(state) is not None
    told = notify.notify_job(plain_outbox(port), state, "backup", "disk full", experiment="e", command="c", now=T0)
    assert told.kind == "alert" and len(inbox.messages) == 1 and "set aside as" in told.line
    [aside] = tmp_path.glob("alerts.json.unreadable-*")
    assert aside.read_bytes() == content and json.loads(state.read_text())["jobs"]["backup"]["sent"]
    assert state.stat().st_mode & 0o777 == 0o600
    problem = notify.state_problem(state)  # the copy set aside keeps the watchdog's alert open until deleted
    assert problem is not None and str(aside) in problem.what
    aside.unlink()
    assert notify.state_problem(state) is None


def test_a_state_that_is_a_link_is_never_read_or_written_through(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": "TOPSECRET"}')
    state = tmp_path / "logs" / "alerts.json"
    state.parent.mkdir()
    state.symlink_to(outside)
    problem = notify.state_problem(state)
    assert problem is not None and "TOPSECRET" not in str(problem)
    assert [n.kind for n in notify.notify(missing_report(T0), plain_outbox(port), state, now=T0)] == ["alert"]
    assert outside.read_text() == '{"secret": "TOPSECRET"}' and not state.is_symlink()
    [aside] = state.parent.glob("alerts.json.unreadable-*")
    assert aside.is_symlink()  # moved as it was, its target untouched
