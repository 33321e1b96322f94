"""Alert texts and channels that mutation testing found untested (scripts/mutation.py): each test here fails on a
mutant of ops/tell/ that every other test let through. Mail goes to a real SMTP server on loopback; the tests read
the facts in what arrives (counts, names, numbers), not its sentences."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from bigscience_ops.ops.alerts import Alert
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.tell import alert_state, alert_text, channels, job_alerts, notify
from bigscience_ops.ops.tell.message import NotifyError
from bigscience_ops.ops.watch import status
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_smtp import T0, alerts_yaml, free_port, plain_outbox


def _report(extra: int) -> status.StatusReport:
    """The watchdog's report of a run with nothing queued (one alert), and `extra` more alerts after it."""
    others = [Alert("stalled", "no new iteration for 3 hours"), Alert("health-nan", "lm loss is nan at 120"),
              Alert("overlap", "two tasks of the array run at once")][:extra]
    return status.evaluate("tr1-13B-round3", [], now=T0).adding(others)


def _more(subject: str) -> int | None:
    """The N of a subject's `(+N more)`: how many alerts the subject does not name; None when it names them all."""
    found = re.findall(r"\(\+(\d+)\b", subject)
    assert len(found) <= 1, subject
    return int(found[0]) if found else None


def test_an_alert_email_subject_counts_the_alerts_it_does_not_name(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    for extra in (0, 1, 3):
        notices = notify.notify(_report(extra), plain_outbox(port), tmp_path / f"state-{extra}.json",
                                experiment="tr1-13B", now=T0)
        assert [len(n.conditions) for n in notices] == [1 + extra]
    subjects = [m["Subject"] for m in inbox.messages]
    assert [_more(s) for s in subjects] == [None, 1, 3]
    # the first alert's headline leads every subject: the same words before the count
    assert len({s.split(" (+")[0] for s in subjects}) == 1


def test_a_recovery_names_each_condition_that_cleared(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    outbox, state = plain_outbox(port), tmp_path / "state.json"
    notify.notify(_report(2), outbox, state, experiment="tr1-13B", now=T0)
    later = T0 + timedelta(minutes=10)
    healthy = status.StatusReport("tr1-13B-round3", later, ())
    [notice] = notify.notify(healthy, outbox, state, experiment="tr1-13B", now=later)
    assert notice.kind == "recovery" and set(notice.conditions) == {"not-scheduled", "stalled", "health-nan"}
    subject = inbox.messages[-1]["Subject"]
    assert all(c in subject for c in notice.conditions)


# --------------------------------------------------------------------------- the alert state, read as untrusted input

ISO = "2026-11-22T10:00:00"
GOOD_ENTRY = {"since": ISO, "message": "m", "sent": {"email": ISO, "webhook": None}, "failed": {"webhook": "down"}}
STATES = {  # a state file's content -> whether it reads (True) or is a problem naming the section (its name)
    "empty": ({}, True),
    "every section well formed": ({"active": {"j::stalled": GOOD_ENTRY}, "jobs": {"backup": GOOD_ENTRY},
                                   "events": {"j::checkpoint-set-aside:x": {"message": "m", "sent": {"email": ISO}}},
                                   "finished": {"j": {"email": 120}, "old": 7}}, True),
    "a list": ([], "list"),
    "active not an object": ({"active": []}, "active"),
    "jobs entry not an object": ({"jobs": {"backup": 1}}, "backup"),
    "since no time": ({"active": {"k": {**GOOD_ENTRY, "since": "then"}}}, "since"),
    "since missing": ({"active": {"k": {"message": "m"}}}, "since"),
    "since too long": ({"active": {"k": {**GOOD_ENTRY, "since": ISO + " " * 60}}}, "since"),
    "message no text": ({"active": {"k": {**GOOD_ENTRY, "message": 5}}}, "message"),
    "last_sent no time": ({"active": {"k": {**GOOD_ENTRY, "last_sent": "x"}}}, "last_sent"),
    "sent no object": ({"active": {"k": {**GOOD_ENTRY, "sent": []}}}, "sent"),
    "sent a time that is none": ({"jobs": {"k": {**GOOD_ENTRY, "sent": {"email": "x"}}}}, "sent"),
    "failed not text": ({"active": {"k": {**GOOD_ENTRY, "failed": {"email": 1}}}}, "failed"),
    "failed no object": ({"active": {"k": {**GOOD_ENTRY, "failed": "down"}}}, "failed"),
    "events not an object": ({"events": []}, "events"),
    "event not an object": ({"events": {"e": []}}, "events"),
    "event message no text": ({"events": {"e": {"message": 1}}}, "message"),
    "event sent None": ({"events": {"e": {"sent": {"email": None}}}}, "sent"),
    "event sent no object": ({"events": {"e": {"sent": 1}}}, "sent"),
    "event failed not text": ({"events": {"e": {"failed": {"email": 2}}}}, "failed"),
    "finished a boolean": ({"finished": {"j": True}}, "finished"),
    "finished below 0": ({"finished": {"j": {"email": -1}}}, "finished"),
    "finished not an object": ({"finished": [1]}, "finished"),
    "finished channel no text": ({"finished": {"j": {"1": "120"}}}, "finished"),
}


@pytest.mark.parametrize("case", list(STATES))
def test_an_alert_state_of_the_wrong_shape_is_a_problem_naming_where(tmp_path: Path, case: str) -> None:
    content, expected = STATES[case]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(content))
    state, problem = alert_state.read_state(path)
    if expected is True:
        assert problem is None
        assert state.active == content.get("active", {}) and state.jobs == content.get("jobs", {})
        assert state.events == content.get("events", {}) and state.finished == content.get("finished", {})
    else:
        assert state == alert_state.State() and (problem.file, problem.line) == (str(path), 0)
        assert expected in problem.what
        assert alert_state.state_problem(path) == problem


def test_a_state_from_before_channels_reads_as_each_channels_and_open_alerts_come_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    old = {"since": "2026-11-22T08:00:00", "message": "old", "last_sent": ISO}
    never = {"since": "2026-11-22T09:00:00", "message": "never sent", "last_sent": None}
    path.write_text(json.dumps({"active": {"j::stalled": old, "j::overlap": never},
                                "jobs": {"backup": {"since": "2026-11-22T09:30:00", "message": "b"}}}))
    state, problem = alert_state.read_state(path)
    assert problem is None and state.active["j::stalled"]["sent"] == {c: ISO for c in channels.NAMES}
    assert state.active["j::overlap"]["sent"] == {} and "last_sent" not in state.active["j::stalled"]
    entries, problem = alert_state.open_alerts(path)
    assert problem is None and [c for c, _ in entries] == ["backup", "j::overlap", "j::stalled"]
    alert_state.save_state(path, state)
    assert path.stat().st_mode & 0o777 == 0o600 and json.loads(path.read_text())["version"] == 2
    assert alert_state.read_state(path)[0] == state


def test_unreadable_states_set_aside_are_counted_and_a_lock_that_is_no_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert alert_state.state_problem(path) is None
    for n in range(3):
        (tmp_path / f"state.json{alert_state.UNREADABLE}2026112{n}-000000").write_text("x")
    problem = alert_state.state_problem(path)
    assert problem.file == str(path) and f"state.json{alert_state.UNREADABLE}20261122-000000" in problem.what
    assert "2 more" in problem.what
    for aside in tmp_path.glob(f"state.json{alert_state.UNREADABLE}*"):
        aside.unlink()
    (tmp_path / "state.json.lock").mkdir()
    problem = alert_state.state_problem(path)
    assert problem.file == str(tmp_path / "state.json.lock")
    path.write_text("{")
    state = alert_state.load_state(path)
    assert state.problem.file == str(path) and state.set_aside.read_text() == "{" and not path.exists()


# --------------------------------------------------------------------------- the texts' facts

def test_a_span_is_told_in_days_hours_and_minutes() -> None:
    assert re.findall(r"\d+", alert_text.lasted(timedelta(days=2, hours=3, minutes=5))) == ["2", "3", "05"]
    assert re.findall(r"\d+", alert_text.lasted(timedelta(hours=23, minutes=59, seconds=40))) == ["1", "0", "00"]
    assert re.findall(r"\d+", alert_text.lasted(timedelta(minutes=-5))) == ["0", "00"]
    assert re.findall(r"\d+", alert_text.lasted(timedelta(hours=25))) == ["1", "1", "00"]


def test_the_finished_recovery_and_job_mails_carry_their_facts() -> None:
    report = status.StatusReport("tr1-13B-round3", T0, ("[stamp] line one", "[stamp] line two"), finished_at=4321)
    subject, body = alert_text.finished_email("tr1-13B", report)
    assert "tr1-13B" in subject and "4321" in subject and "tr1-13B-round3" in body
    assert body.endswith("\n") and "[stamp] line one\n[stamp] line two\n" in body
    entries = [{"message": "lost the queue", "since": "2026-11-22T08:00:00"}, {}]
    subject, body = alert_text.recovery_email("tr1-13B", report, entries, ["not-scheduled", "stalled"], T0)
    assert "not-scheduled" in subject and "stalled" in subject
    lines = body.splitlines()
    [first] = [line for line in lines if "lost the queue" in line]
    assert "2026-11-22T08:00:00" in first
    [second] = [line for line in lines if line.startswith("- ") and "lost the queue" not in line]
    assert "stalled" in second and "?" in second
    assert body.endswith("\n") and "[stamp] line one\n[stamp] line two\n" in body
    alert = Alert("job-failed", "backup failed")
    _, body = alert_text.job_alert_email("tr1-13B", "backup", alert, "disk\nfull", T0 - timedelta(hours=2), 60,
                                         T0)
    assert "disk\nfull" in body and "2026-11-22 08:00" in body
    _, body = alert_text.job_alert_email("tr1-13B", "backup", alert, "disk full", T0, 60, T0)
    assert "2026-11-22 10:00" not in body and "disk full" in body


def test_an_unprintable_character_past_the_basic_plane_is_escaped_whole() -> None:
    from bigscience_ops.ops.tell import quoting

    assert quoting.quote_untrusted("a\U000e0001b") == '"a\\U000e0001b"'
    assert quoting.quote_untrusted("a\u2028b") == '"a\\u2028b"' and quoting.quote_untrusted("a\x07b") == '"a\\x07b"'


def test_a_state_from_before_channels_remembers_the_finish_it_announced(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"finished": {"tr1-13B-round3": 4321}}))
    report = status.StatusReport("tr1-13B-round3", T0, ("[stamp] done",), finished_at=4321)
    assert notify.notify(report, plain_outbox(port), state, experiment="tr1-13B", now=T0) == []
    [notice] = notify.notify(dataclasses.replace(report, finished_at=4400), plain_outbox(port), state,
                             experiment="tr1-13B", now=T0)
    assert notice.kind == "finished" and len(inbox.messages) == 1 and "4400" in inbox.messages[0]["Subject"]
    state.write_text(json.dumps({"events": {"tr1-13B-round3::checkpoint-set-aside:x": {"message": "m"},
                                            "tr1-13B-round3::checkpoint-set-aside:y": {"sent": {"email": T0.isoformat()}},
                                            "other::checkpoint-set-aside:z": {"sent": {"email": T0.isoformat()}}}}))
    assert notify.told_events(state, "tr1-13B-round3") == {"checkpoint-set-aside:y"}
    assert notify.told_events(state, "tr1-13B-round3", ["email", "webhook"]) == set()


# --------------------------------------------------------------------------- the hourly jobs' alerts

def _teller(trainings: Path, tmp_path: Path, port: int) -> job_alerts.Teller:
    (trainings / "told.yaml").write_text(tiny_yaml(tmp_path / "told", alerts_yaml(port)))
    exp = load_experiment("told", trainings)
    return job_alerts.Teller("told", exp.alerts, exp.paths.logs, ("KILLS_TELL_SECRET",))


def test_an_hourly_jobs_failure_is_scrubbed_told_once_and_its_recovery_follows(plain_server, trainings: Path,
                                                                                tmp_path: Path, monkeypatch) -> None:
    inbox, port = plain_server
    monkeypatch.setenv("KILLS_TELL_SECRET", "hunter2-secret")
    teller = _teller(trainings, tmp_path, port)

    def fails() -> None:
        raise OSError("copy failed, token hunter2-secret")

    quiet = job_alerts.run_alerting(teller, False, "backup", "bsops backup told", fails)
    assert quiet.told and "hunter2-secret" not in quiet.error and "copy failed" in quiet.error
    assert quiet.lines == (f"error: {quiet.error}",) and inbox.messages == []
    failed = job_alerts.run_alerting(teller, True, "backup", "bsops backup told", fails)
    assert failed.told and failed.error == quiet.error and failed.lines[0] == quiet.lines[0] and len(failed.lines) == 2
    [mail] = inbox.messages
    assert "hunter2-secret" not in mail.get_content() and "copy failed" in mail.get_content()
    worked = job_alerts.run_alerting(teller, True, "backup", "bsops backup told", lambda: None)
    assert worked.error is None and worked.told and len(inbox.messages) == 2 and len(worked.lines) == 1
    assert inbox.messages[1]["Message-ID"] in worked.lines[0]


def test_send_alert_says_where_the_mail_went_or_why_it_did_not(plain_server, trainings: Path, tmp_path: Path) -> None:
    inbox, port = plain_server
    alerts = _teller(trainings, tmp_path, port).alerts
    line = channels.send_alert(alerts, "subject", "body")
    [mail] = inbox.messages
    assert mail["Message-ID"] in line and "oncall@example.org" in line and "***ALERT" not in line
    closed = dataclasses.replace(alerts, smtp_port=free_port())
    line = channels.send_alert(closed, "subject", "body")
    assert line.startswith("***ALERT") and str(closed.smtp_port) in line and len(inbox.messages) == 1


# --------------------------------------------------------------------------- SMTP over TLS from the start

def test_an_alert_goes_over_tls_from_the_start_to_a_server_it_verifies(cert: tuple[str, str], tmp_path: Path) -> None:
    from aiosmtpd.controller import Controller

    from tests.fixtures_smtp import Inbox, server_tls

    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), ssl_context=server_tls(cert))
    controller.start()
    try:
        outbox = plain_outbox(controller.port, security="ssl", ca_file=cert[0])
        message_id = outbox.send(outbox.compose("over tls", "body", now=T0))
        [mail] = inbox.messages
        assert mail["Message-ID"] == message_id and mail["Subject"] == "over tls"
        untrusted = plain_outbox(controller.port, security="ssl")  # the system's CAs do not know the test's
        with pytest.raises(NotifyError) as caught:
            untrusted.send(untrusted.compose("over tls", "body", now=T0))
        assert str(controller.port) in str(caught.value) and len(inbox.messages) == 1
    finally:
        controller.stop()


def test_an_hourly_jobs_alert_without_mail_or_with_its_state_elsewhere_says_so(plain_server, trainings: Path,
                                                                                tmp_path: Path, monkeypatch) -> None:
    inbox, port = plain_server
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    teller = _teller(trainings, tmp_path, port)
    nobody = dataclasses.replace(teller, alerts=dataclasses.replace(teller.alerts, email_to=()))
    told, said = job_alerts.tell_job(nobody, "backup", "bsops backup told", "disk full")
    assert told and len(said) == 1 and inbox.messages == []
    assert job_alerts.tell_job(nobody, "backup", "bsops backup told", None) == (True, [])
    blocked = tmp_path / "logs-is-a-file"
    blocked.write_text("not a folder")
    elsewhere = dataclasses.replace(teller, logs=str(blocked))
    told, said = job_alerts.tell_job(elsewhere, "backup", "bsops backup told", "disk full")
    assert told and len(said) == 2 and str(tmp_path / "xdg") in said[0] and len(inbox.messages) == 1
    assert "bsops backup told" in inbox.messages[0].get_content()
    closed = dataclasses.replace(teller, alerts=dataclasses.replace(teller.alerts, smtp_port=free_port()))
    told, said = job_alerts.tell_job(closed, "hub-sync", "bsops hub-sync told", "push refused")
    assert not told and len(said) == 1 and "hub-sync" in said[0] and str(closed.alerts.smtp_port) in said[0]


# --------------------------------------------------------------------------- what a webhook receives

def test_a_webhook_post_goes_to_its_path_and_query_as_json_and_only_a_2xx_is_delivered(cert: tuple[str, str]) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bigscience_ops.ops.tell import webhook
    from tests.fixtures_smtp import server_tls

    seen: list[tuple[str, dict, dict]] = []
    answer = {"status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's hook name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append((self.path, dict(self.headers), json.loads(body)))
            self.send_response(answer["status"])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = server_tls(cert).wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    base = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        for status in (200, 204, 299):
            answer["status"] = status
            webhook.post(f"{base}/hook/T0K3N?key=v4lue", "subject", "body", ca_file=cert[0])
        assert [path for path, _, _ in seen] == ["/hook/T0K3N?key=v4lue"] * 3
        headers = {k.lower(): v for k, v in seen[0][1].items()}
        assert headers["content-type"] == "application/json" and headers["user-agent"] == "bsops"
        assert seen[0][2] == {"text": "subject\n\nbody"}
        webhook.post(base, "s", "b", ca_file=cert[0])
        assert seen[-1][0] == "/"
        for status in (300, 399, 400, 500):
            answer["status"] = status
            with pytest.raises(webhook.WebhookError) as caught:
                webhook.post(f"{base}/hook/T0K3N", "s", "b", ca_file=cert[0])
            assert str(status) in str(caught.value) and "T0K3N" not in str(caught.value)
        with pytest.raises(webhook.WebhookError) as caught:
            webhook.post(f"https://127.0.0.1:{free_port()}/hook/T0K3N", "s", "b", ca_file=cert[0])
        assert "T0K3N" not in str(caught.value)
        with pytest.raises(webhook.WebhookError):
            webhook.post(f"http://127.0.0.1:{server.server_address[1]}/hook", "s", "b", ca_file=cert[0])
    finally:
        server.shutdown()
        server.server_close()


def test_an_event_is_told_once_beside_the_conditions_and_never_recovers(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    outbox, state = plain_outbox(port), tmp_path / "state.json"
    event = Alert("checkpoint-set-aside:global_step10@1790000000", "global_step10 set aside")
    first = notify.notify(_report(0).adding([event]), outbox, state, experiment="tr1-13B", now=T0, cooldown_minutes=60)
    assert [set(n.conditions) for n in first] == [{"not-scheduled", event.condition}]
    recorded = json.loads(state.read_text())
    [told] = recorded["events"].values()
    assert "since" not in told and told["sent"]["email"] == T0.isoformat()
    later = T0 + timedelta(hours=2)
    again = notify.notify(dataclasses.replace(_report(0).adding([event]), checked_at=later), outbox, state,
                          experiment="tr1-13B", now=later, cooldown_minutes=60)  # past the cooldown: sent again
    assert [n.conditions for n in again] == [("not-scheduled",)]
    assert notify.told_events(state, "tr1-13B-round3") == {event.condition}
    cleared = notify.notify(status.StatusReport("tr1-13B-round3", later, ()), outbox, state, experiment="tr1-13B",
                            now=later + timedelta(minutes=1))
    assert [(n.kind, n.conditions) for n in cleared] == [("recovery", ("not-scheduled",))] and len(inbox.messages) == 3


def test_an_alerts_section_with_a_login_logs_in_with_the_password_its_variable_holds(
        starttls_server, cert: tuple[str, str], trainings: Path, tmp_path: Path, monkeypatch) -> None:
    from bigscience_ops.ops.tell.email import TIMEOUT_S, EmailChannel
    from tests.fixtures_smtp import PASSWORD

    inbox, port = starttls_server
    alerts = _teller(trainings, tmp_path, port).alerts
    plain = EmailChannel.from_alerts(alerts)
    assert plain.settings.user is None and plain.settings.password_env is None and plain.secret_envs == ()
    assert plain.settings.timeout_s == TIMEOUT_S and plain.settings.recipients == ("oncall@example.org",)
    login = EmailChannel.from_alerts(dataclasses.replace(alerts, smtp_user="bot", smtp_password_env="KILLS_SMTP_PW",
                                                         smtp_security="starttls"))
    assert (login.settings.user, login.settings.password_env, login.secret_envs) == (
        "bot", "KILLS_SMTP_PW", ("KILLS_SMTP_PW",))
    assert EmailChannel.from_alerts(dataclasses.replace(alerts, email_to=())) is None
    channel = EmailChannel(dataclasses.replace(login.settings, ca_file=cert[0]))
    outbox = channels.Outbox((channel,), "bot@example.org")
    outbox.send(outbox.compose("logged in", "body", now=T0), env={"KILLS_SMTP_PW": PASSWORD})
    assert inbox.logins == ["bot"] and len(inbox.messages) == 1


def test_the_alert_state_goes_to_the_users_folder_while_its_own_cannot_be_written_and_comes_back(tmp_path: Path,
                                                                                                  monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    assert alert_state.user_state_folder(env) == tmp_path / "xdg" / "bsops"
    for other in ({}, {"XDG_STATE_HOME": "relative/path"}, {"XDG_STATE_HOME": ""}):
        assert alert_state.user_state_folder(other) == tmp_path / "home" / ".local" / "state" / "bsops"
    assert alert_state.default_state_path(None) == tmp_path / "home" / ".cache" / "bsops" / ".bsops-alerts.json"
    run = tmp_path / "run" / "logs"
    state, log = run / ".bsops-alerts.json", run / "watchdog.log"
    away_state, away_log = alert_state.elsewhere(state, "tr1/13B:round 3", env)
    assert away_state.parent == away_log.parent == tmp_path / "xdg" / "bsops"
    assert away_state.name.startswith("tr1_13B_round_3-") and away_state.name.endswith(".alerts.json")
    assert away_log.name == away_state.name.replace(".alerts.json", ".watchdog.log")
    other_state, _ = alert_state.elsewhere(tmp_path / "other" / ".bsops-alerts.json", "tr1/13B:round 3", env)
    assert other_state != away_state and alert_state.elsewhere(state, "..", env)[0].name.startswith("run-")
    here = alert_state.place(state, log, "tr1", env)
    assert (here.state, here.log, here.moved, here.usual) == (state, log, None, None) and run.is_dir()
    assert not list(run.glob(".bsops-probe*"))
    log.unlink(missing_ok=True)
    log.mkdir()  # something else in watchdog.log's place
    moved = alert_state.place(state, log, "tr1", env)
    assert moved.state == alert_state.elsewhere(state, "tr1", env)[0] and moved.usual == state
    assert moved.log == alert_state.elsewhere(state, "tr1", env)[1] and str(log) in moved.moved
    assert alert_state.place(state, None, "tr1", env, why="told so").moved == "told so"
    moved.state.parent.mkdir(parents=True, exist_ok=True)
    moved.state.write_text(json.dumps({"active": {}, "finished": {"tr1": 7}}))
    log.rmdir()
    back = alert_state.place(state, log, "tr1", env)
    assert back.moved is None and json.loads(state.read_text())["finished"] == {"tr1": 7}
    assert state.stat().st_mode & 0o777 == 0o600


# --------------------------------------------------------------------------- the alert state's bounds and its file

def _read(tmp_path: Path, content: object) -> tuple[alert_state.State, object]:
    path = tmp_path / "bounds.json"
    path.write_text(json.dumps(content))
    return alert_state.read_state(path)


def test_an_alert_states_times_and_iterations_are_read_up_to_their_bounds(tmp_path: Path) -> None:
    from bigscience_ops.untrusted import MAX_STEP

    longest = ISO + "." + "1" * (64 - len(ISO) - 1)  # fractions of a second: still an ISO time
    assert len(longest) == 64
    assert _read(tmp_path, {"active": {"k": {**GOOD_ENTRY, "since": longest}}})[1] is None
    assert "since" in _read(tmp_path, {"active": {"k": {**GOOD_ENTRY, "since": longest + "1"}}})[1].what
    for told in (0, MAX_STEP, {"email": 0}, {"email": MAX_STEP}):
        state, problem = _read(tmp_path, {"finished": {"j": told}})
        assert problem is None and state.finished == {"j": told}
    for told in (MAX_STEP + 1, {"email": MAX_STEP + 1}, -1):
        assert "finished" in _read(tmp_path, {"finished": {"j": told}})[1].what


def test_an_alert_state_that_cannot_be_read_is_a_problem_of_its_file_as_a_whole(tmp_path: Path) -> None:
    from bigscience_ops.untrusted import excerpt

    path = tmp_path / "state.json"
    (tmp_path / "elsewhere.json").write_text("{}")
    path.symlink_to(tmp_path / "elsewhere.json")  # a link is never followed
    state, problem = alert_state.read_state(path)
    assert state == alert_state.State() and (problem.file, problem.line) == (str(path), 0)
    assert isinstance(problem.what, str) and problem.what
    path.unlink()
    path.write_bytes(b"{not json")
    state, problem = alert_state.read_state(path)
    assert state == alert_state.State() and (problem.file, problem.line) == (str(path), 0)
    assert problem.held == excerpt(b"{not json") and isinstance(problem.what, str) and problem.what != problem.held


def test_an_alert_state_is_saved_in_a_new_folder_with_every_message_and_failure_scrubbed(tmp_path: Path) -> None:
    secret = "https://bot:hunter2pass@example.org/x"
    entry = {"since": ISO, "message": f"push to {secret}", "sent": {}, "failed": {"webhook": f"refused {secret}"}}
    event = {"message": "set aside", "sent": {"email": ISO}, "failed": {"webhook": f"down {secret}"}}
    path = tmp_path / "a" / "b" / "state.json"
    alert_state.save_state(path, alert_state.State(active={"j::stalled": dict(entry)}, jobs={"backup": dict(entry)},
                                                   events={"j::e": event}))
    text = path.read_text()
    assert "hunter2pass" not in text
    saved = json.loads(text)
    for section, key in (("active", "j::stalled"), ("jobs", "backup")):
        assert set(saved[section][key]) == set(entry) and "push to" in saved[section][key]["message"]
        assert list(saved[section][key]["failed"]) == ["webhook"]
    assert set(saved["events"]["j::e"]) == set(event)


def test_an_unreadable_state_set_aside_counts_the_others_and_its_lock_problem_is_the_whole_file(
        tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    (tmp_path / f"state.json{alert_state.UNREADABLE}20261120-000000").write_text("x")
    problem = alert_state.state_problem(path)
    assert (problem.file, problem.line) == (str(path), 0) and re.findall(r"\d+ more", problem.what) == []
    (tmp_path / f"state.json{alert_state.UNREADABLE}20261121-000000").write_text("x")
    assert re.findall(r"(\d+) more", alert_state.state_problem(path).what) == ["1"]
    for aside in tmp_path.glob(f"state.json{alert_state.UNREADABLE}*"):
        aside.unlink()
    (tmp_path / "state.json.lock").symlink_to(tmp_path / "nowhere")
    problem = alert_state.state_problem(path)
    assert (problem.file, problem.line) == (str(tmp_path / "state.json.lock"), 0) and isinstance(problem.what, str)


def test_the_state_kept_elsewhere_is_named_after_the_job_and_a_hash_of_its_usual_place(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    state = tmp_path / "run" / ".bsops-alerts.json"

    def slug_and_digest(name: str, where: Path = state) -> tuple[str, str]:
        found = re.fullmatch(r"(.*)-([0-9a-f]+)\.alerts\.json", alert_state.elsewhere(where, name, env)[0].name)
        return found.group(1), found.group(2)

    assert slug_and_digest("x" * 70) == ("x" * 60, slug_and_digest("run")[1])
    assert len(slug_and_digest("run")[1]) == 12
    assert slug_and_digest("XX.run")[0] == "XX.run" and slug_and_digest("..tr1.")[0] == "tr1."
    odd = tmp_path / "r\udcffun" / ".bsops-alerts.json"  # a folder whose name is no UTF-8
    assert slug_and_digest("run", odd)[1] != slug_and_digest("run")[1]


def test_a_state_kept_elsewhere_moves_back_unless_something_else_holds_its_place(tmp_path: Path) -> None:
    import os

    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    run = tmp_path / "run"
    run.mkdir()
    state = run / ".bsops-alerts.json"
    moved = alert_state.place(state, None, "tr1", env, why="told so")
    assert moved.log is None and moved.moved == "told so"
    away = moved.state
    away.parent.mkdir(parents=True)
    away.write_text(json.dumps({"finished": {"tr1": 7}}))
    state.write_text(json.dumps({"finished": {"tr1": 3}}))
    os.utime(state, (1_700_000_000, 1_700_000_000))
    os.utime(away, (1_700_000_000, 1_700_000_000))  # as new as the one there: it goes back
    assert alert_state.place(state, None, "tr1", env).moved is None
    assert json.loads(state.read_text())["finished"] == {"tr1": 7} and not away.exists()
    away.write_text(json.dumps({"finished": {"tr1": 9}}))
    state.unlink()
    state.mkdir()  # a folder in the state's place, older than the state kept elsewhere, which stays there
    os.utime(state, (1_700_000_000, 1_700_000_000))
    assert alert_state.place(state, None, "tr1", env).moved is None
    assert json.loads(away.read_text())["finished"] == {"tr1": 9}


def test_what_the_watchdog_cannot_write_is_named_and_nothing_a_link_points_at_is_touched(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess

    folder = tmp_path / "logs"
    folder.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (folder / f".bsops-probe.{os.getpid()}").symlink_to(target)
    assert alert_state.unwritable(folder) is not None and target.read_text() == "keep me"
    (folder / f".bsops-probe.{os.getpid()}").unlink()
    log = tmp_path / "new" / "deep" / "watchdog.log"
    old_umask = os.umask(0)
    try:
        assert alert_state.unwritable(folder, (log,)) is None
    finally:
        os.umask(old_umask)
    assert log.stat().st_mode & 0o777 == 0o644
    fifo = folder / "watchdog.log"
    os.mkfifo(fifo)

    def blocked(*_: object) -> None:
        raise AssertionError("opening a FIFO blocked")  # no OSError: unwritable would take it for a reason

    before = signal.signal(signal.SIGALRM, blocked)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        why = alert_state.unwritable(folder, (fifo,))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert why is not None and str(fifo) in why
    busy = tmp_path / "busy"  # a program being run: it can be read, never written (even by root)
    busy.write_bytes(Path("/bin/sleep").read_bytes())
    busy.chmod(0o755)
    running = subprocess.Popen([str(busy), "30"])
    try:
        why = alert_state.unwritable(folder, (busy,))
    finally:
        running.kill()
        running.wait()
    assert why is not None and str(busy) in why


def test_an_unwritable_state_says_why_and_which_file(tmp_path: Path) -> None:
    import errno

    path = tmp_path / "state.json"
    full = alert_state.StateUnwritable(path, OSError(errno.ENOSPC, "No space left on device"))
    assert (full.path, full.why) == (path, "No space left on device") and str(path) in str(full)
    odd = alert_state.StateUnwritable(path, OSError("the disk is gone"))
    assert odd.why == "the disk is gone" and str(path) in str(odd)


# --------------------------------------------------------------------------- what the watchdog's alert says

def test_an_alert_email_names_the_job_the_log_each_step_and_how_often_it_repeats() -> None:
    report = status.StatusReport("tr1-13B-round3", T0, ("[stamp] queue empty", "[stamp] log quiet"))
    stalled, nan = Alert("stalled", "no new iteration for 3 hours"), Alert("health-nan", "lm loss is nan at 120")
    event = Alert("checkpoint-set-aside:global_step10@1790000000", "global_step10 set aside")

    def email(due: list[Alert], log_path: str | None = "/runs/tr1/main_log.txt") -> tuple[str, list[str], list[str]]:
        _, body = alert_text.alert_email("tr1-13B", report, due, 45, log_path)
        assert body.endswith("\n") and not body.endswith("\n\n")
        head, footer = body.split("\n\n")[0].splitlines(), body.rstrip("\n").split("\n\n")[-1].splitlines()
        return body, head, footer

    body, head, footer = email([stalled, nan])
    assert len(footer) == 2 and "45" in footer[0]
    assert len([line for line in body.splitlines() if line.startswith("- ")]) == 3  # each alert's step, then status
    assert "tr1-13B-round3" in body and len(head) == 4 and "/runs/tr1/main_log.txt" in head[3]
    _, head, footer = email([stalled, event], None)
    assert len(footer) == 3 and "45" in footer[0] and len(head) == 3 and "None" not in "\n".join(head)
    _, _, footer = email([event])
    assert len(footer) == 1 and "45" not in footer[0]


def test_an_untrusted_text_shows_its_first_40_lines_and_counts_the_rest() -> None:
    def shown(n: int) -> tuple[int, list[str]]:
        out = alert_text.untrusted_text("\n".join(f"line {i}" for i in range(n)))
        return len(out.split("\n")), re.findall(r"\(\+(\d+) more", out)

    assert shown(40) == (40, []) and shown(41) == (41, ["1"]) and shown(45) == (41, ["5"])


# --------------------------------------------------------------------------- quoting: exact values

def test_quoting_defangs_every_scheme_and_look_alike_and_bounds_what_it_shows() -> None:
    from bigscience_ops.ops.tell import quoting

    assert quoting.quote_untrusted("javascript:alert(1)") == '"javascript[:]alert(1)"'
    assert quoting.quote_untrusted("foo+bar://h.example/x") == '"foo+bar[:]//h[.]example/x"'
    assert quoting.quote_untrusted("evil\u3002com") == '"evil[.]com"'
    assert quoting.defang_names("evil\uff0ecom") == "evil[.]com" and quoting.defang_names("a\uff20evil") == "a[@]evil"
    assert quoting.quote_untrusted(12345) == '"12345"'
    assert quoting.quote_untrusted("a" * 10, 10) == '"aaaaaaaaaa"'
    assert quoting.quote_untrusted("a" * 11, 10) == '"aaaaaaaaaa"... (11 characters)'
    assert quoting.defang_block("a" * 10, 10) == "a" * 10
    assert quoting.defang_block("a" * 11 + "\nb\tc", 10) == "a" * 10 + "...\nb\tc"
    # escapes make a value longer: shown whole up to 4 * limit + 16 characters, else cut to 4 * limit
    wide, narrow = "\U000e0001", "\x01"  # escaped as 10 and 4 characters
    for value, length in ((wide * 5, 50), (wide * 5 + narrow + "aa", 56), (wide * 5 + narrow + "aaa", 40)):
        quoted = quoting.quote_untrusted(value, 10)
        assert len(quoted) == length + 2 and quoted.startswith('"' + "\\U000e0001" * 4)


# --------------------------------------------------------------------------- cooldowns, failures and what is recorded

HOOK = "BSOPS_KILLS_TELL_WEBHOOK"
"""A webhook's URL variable that only the `env` a test passes holds."""
JOB_KW = dict(experiment="tr1-13B", command="bsops backup tr1-13B")


def _active(state: Path) -> dict:
    return json.loads(state.read_text())["active"]


def test_a_cooldown_of_zero_repeats_at_once_and_the_default_repeats_after_the_schemas_cooldown(plain_server,
                                                                                               tmp_path: Path) -> None:
    from bigscience_ops.schema import AlertsConfig

    inbox, port = plain_server  # the default is alerts.cooldown_minutes' own (240), never a second one typed here
    outbox, hour = plain_outbox(port), T0 + timedelta(minutes=AlertsConfig.cooldown_minutes)
    for _ in range(2):
        assert len(notify.notify(_report(0), outbox, tmp_path / "zero.json", cooldown_minutes=0, now=T0)) == 1
        assert notify.notify_job(outbox, tmp_path / "zero-job.json", "backup", "disk full", cooldown_minutes=0,
                                 now=T0, **JOB_KW).kind == "alert"
    assert len(inbox.messages) == 4
    notify.notify(_report(0), outbox, tmp_path / "hour.json", now=T0)
    assert notify.notify(_report(0), outbox, tmp_path / "hour.json", now=hour - timedelta(seconds=1)) == []
    assert len(notify.notify(_report(0), outbox, tmp_path / "hour.json", now=hour)) == 1
    job = tmp_path / "hour-job.json"
    assert notify.notify_job(outbox, job, "backup", "disk full", now=T0, **JOB_KW).kind == "alert"
    assert notify.notify_job(outbox, job, "backup", "disk full", now=hour - timedelta(seconds=1), **JOB_KW).kind == "held"
    assert notify.notify_job(outbox, job, "backup", "disk full", now=hour, **JOB_KW).kind == "alert"
    assert len(inbox.messages) == 8


def test_a_channel_that_fails_is_told_of_with_the_message_the_others_sent(plain_server, tmp_path: Path,
                                                                           monkeypatch) -> None:
    monkeypatch.delenv(HOOK, raising=False)
    inbox, port = plain_server
    ok, failed = notify.notify(_report(1), plain_outbox(port, webhook_env=HOOK), tmp_path / "s.json",
                               experiment="tr1-13B", now=T0, env={})
    assert (ok.channels, ok.error, failed.channels) == (("email",), None, ("webhook",)) and failed.error
    assert (failed.kind, failed.conditions, failed.message_id, failed.subject) == (
        ok.kind, ok.conditions, ok.message_id, ok.subject)
    assert ok.message_id == inbox.messages[0]["Message-ID"] and len(ok.conditions) == 2
    [lost] = notify.notify(_report(0), plain_outbox(free_port()), tmp_path / "none.json", now=T0)
    assert lost.channels == ("email",) and lost.error
    [entry] = _active(tmp_path / "none.json").values()  # nothing went out: sent on no channel
    assert entry["sent"] == {} and set(entry) == {"since", "message", "sent", "failed"}


def test_an_event_a_channel_failed_to_tell_is_tried_again_on_it_alone(plain_server, tmp_path: Path,
                                                                      monkeypatch) -> None:
    monkeypatch.delenv(HOOK, raising=False)
    inbox, port = plain_server
    outbox, state = plain_outbox(port, webhook_env=HOOK), tmp_path / "s.json"
    event = Alert("checkpoint-set-aside:global_step10@1790000000", "global_step10 set aside")
    notify.notify(_report(0).adding([event]), outbox, state, now=T0, env={})
    later = T0 + timedelta(minutes=5)
    again = notify.notify(dataclasses.replace(_report(0).adding([event]), checked_at=later), outbox, state, now=later,
                          env={})
    assert [(n.channels, n.error is not None, len(n.conditions)) for n in again] == [(("webhook",), True, 2)]
    [told] = json.loads(state.read_text())["events"].values()
    assert told["sent"] == {"email": T0.isoformat()} and list(told["failed"]) == ["webhook"] and "since" not in told
    assert len(inbox.messages) == 1


def test_a_recovery_that_failed_is_still_owed_and_goes_out_once_the_mail_server_is_back(tmp_path: Path) -> None:
    from tests.fixtures_smtp import Inbox, serving

    inbox, port = Inbox(), free_port()
    state, job = tmp_path / "s.json", tmp_path / "job.json"
    with serving(inbox, port):
        notify.notify(_report(0), plain_outbox(port), state, now=T0)
        notify.notify_job(plain_outbox(port), job, "backup", "disk full", now=T0, **JOB_KW)
    at = T0 + timedelta(minutes=10)
    [failed] = notify.notify(status.StatusReport("tr1-13B-round3", at, ()), plain_outbox(port), state, now=at)
    assert failed.kind == "recovery" and failed.error and list(_active(state)) == ["tr1-13B-round3::not-scheduled"]
    with pytest.raises(NotifyError):
        notify.notify_job(plain_outbox(port), job, "backup", None, now=at, **JOB_KW)
    assert list(json.loads(job.read_text())["jobs"]) == ["backup"]
    at += timedelta(minutes=10)
    with serving(inbox, port):
        [recovered] = notify.notify(status.StatusReport("tr1-13B-round3", at, ()), plain_outbox(port), state, now=at)
        assert notify.notify_job(plain_outbox(port), job, "backup", None, now=at, **JOB_KW).kind == "recovery"
    assert (recovered.kind, recovered.error) == ("recovery", None) and _active(state) == {}
    assert json.loads(job.read_text())["jobs"] == {} and len(inbox.messages) == 4


def test_a_finish_is_announced_once_per_channel_whatever_another_channel_does(plain_server, tmp_path: Path,
                                                                              monkeypatch) -> None:
    monkeypatch.delenv(HOOK, raising=False)
    inbox, port = plain_server
    outbox, state = plain_outbox(port, webhook_env=HOOK), tmp_path / "s.json"
    report = status.StatusReport("tr1-13B-round3", T0, ("[stamp] done",), finished_at=4321)
    first = notify.notify(report, outbox, state, experiment="exp-x", now=T0, env={})
    assert [(n.kind, n.conditions, n.channels, n.error is None) for n in first] == [
        ("finished", (), ("email",), True), ("finished", (), ("webhook",), False)]
    for minutes in (5, 10):
        again = notify.notify(report, outbox, state, experiment="exp-x", now=T0 + timedelta(minutes=minutes), env={})
        assert [(n.channels, n.error is None) for n in again] == [(("webhook",), False)]
    assert len(inbox.messages) == 1 and "exp-x" in inbox.messages[0]["Subject"]
    assert json.loads(state.read_text())["finished"] == {"tr1-13B-round3": {"email": 4321}}


def test_a_report_that_could_not_ask_slurm_forgets_no_alert_even_one_never_sent(plain_server, tmp_path: Path) -> None:
    from bigscience_ops.ops.alerts import raise_alert

    inbox, port = plain_server
    state = tmp_path / "s.json"
    notify.notify(_report(0), plain_outbox(free_port()), state, now=T0)  # sent nowhere
    unknown = status.StatusReport("tr1-13B-round3", T0, ()).adding(
        [raise_alert("slurm-error", job="tr1-13B-round3", detail="slurmctld does not answer")])
    notify.notify(unknown, plain_outbox(port), state, now=T0 + timedelta(minutes=5))
    assert set(_active(state)) == {"tr1-13B-round3::not-scheduled", "tr1-13B-round3::slurm-error"}


def test_an_hourly_job_finding_its_state_unreadable_still_names_the_mail_it_sent(plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    state = tmp_path / "s.json"
    state.write_text("[not a state]")
    sent = notify.notify_job(plain_outbox(port), state, "hub-sync", "push refused", now=T0, env={},
                             experiment="tr1-13B", command="bsops sync tr1-13B")
    [mail] = inbox.messages
    assert sent.kind == "alert" and mail["Message-ID"] in sent.line and "oncall@example.org" in sent.line
    assert "hub-sync" in mail.get_content()
    state.write_text("[not a state again]")
    quiet = notify.notify_job(plain_outbox(port), state, "backup", None, now=T0, env={}, **JOB_KW)
    assert quiet.kind == "quiet" and quiet.line and quiet.line[0].isalpha()


def test_the_channels_read_the_environment_given_and_a_mail_carries_the_time_of_its_report(
        plain_server, cert: tuple[str, str], tmp_path: Path, monkeypatch) -> None:
    from email.utils import parsedate_to_datetime

    from tests.fixtures_smtp import https_hook

    monkeypatch.delenv(HOOK, raising=False)
    inbox, port = plain_server
    monkeypatch.delenv("KILLS_TELL_PW", raising=False)
    outbox = plain_outbox(port, webhook_env=HOOK, ca_file=cert[0], password_env="KILLS_TELL_PW")
    with https_hook(cert) as hooked:
        env = {HOOK: hooked.url, "KILLS_TELL_PW": "hunter2-smtp-pass"}
        [notice] = notify.notify(_report(0), outbox, tmp_path / "s.json", now=T0, env=env)
        assert (notice.channels, notice.error, len(hooked.posts)) == (("email", "webhook"), None, 1)
        job, error = tmp_path / "job.json", "push refused by hunter2-smtp-pass"  # a secret only `env` holds
        told = notify.notify_job(outbox, job, "hub-sync", error, now=T0, env=env, **JOB_KW)
        assert told.kind == "alert" and len(hooked.posts) == 2 and len(inbox.messages) == 2
        assert all(parsedate_to_datetime(m["Date"]) == T0.astimezone() for m in inbox.messages)
        assert "hunter2" not in job.read_text() + inbox.messages[1].get_content() + json.dumps(hooked.posts)
        assert "push refused" in job.read_text()
        # the email told of backup; the webhook failed (no URL in its environment), and alone tries again
        with pytest.raises(NotifyError):
            notify.notify_job(outbox, job, "backup", "disk full", now=T0, env={**env, HOOK: ""}, **JOB_KW)
        again = notify.notify_job(outbox, job, "backup", "disk full", now=T0 + timedelta(minutes=5), env=env, **JOB_KW)
    assert again.kind == "alert" and HOOK in again.line and "oncall@example.org" not in again.line
    assert len(inbox.messages) == 3 and len(hooked.posts) == 3


def test_an_hourly_job_that_sent_nothing_names_no_message(tmp_path: Path) -> None:
    with pytest.raises(NotifyError) as caught:
        notify.notify_job(plain_outbox(free_port()), tmp_path / "s.json", "backup", "disk full", now=T0, **JOB_KW)
    assert re.search(r"<[^<>\s]+@[^<>\s]+>", str(caught.value)) is None  # no Message-ID: nothing went out
    assert list(json.loads((tmp_path / "s.json").read_text())["jobs"]["backup"]["failed"]) == ["email"]


def test_a_recovery_another_run_recorded_meanwhile_is_recorded_once(tmp_path: Path) -> None:
    from tests.fixtures_smtp import Inbox, serving

    state = tmp_path / "s.json"

    class Meanwhile(Inbox):
        """A mail server during whose delivery of the recovery another watchdog run records that it sent one."""

        async def handle_DATA(self, server, session, envelope):
            if "RECOVERED" in envelope.original_content.decode("utf-8", "replace"):
                recorded = json.loads(state.read_text())
                for entry in recorded["active"].values():
                    entry["sent"] = {}
                state.write_text(json.dumps(recorded))
            return await super().handle_DATA(server, session, envelope)

    inbox, port = Meanwhile(), free_port()
    with serving(inbox, port):
        notify.notify(_report(0), plain_outbox(port), state, now=T0)
        at = T0 + timedelta(minutes=10)
        [recovery] = notify.notify(status.StatusReport("tr1-13B-round3", at, ()), plain_outbox(port), state, now=at)
    assert (recovery.kind, recovery.error) == ("recovery", None) and _active(state) == {} and len(inbox.messages) == 2


def test_a_recovery_names_the_slurm_job_and_an_error_line_is_shown_up_to_the_line_bound() -> None:
    from bigscience_ops.ops.tell.quoting import LINE_MAX, QUOTE_MAX

    report = status.StatusReport("tr1-13B-round3", T0, ("[stamp] queue fine",))
    _, body = alert_text.recovery_email("tr1-13B", report, [{"message": "m", "since": ISO}], ["stalled"], T0)
    assert "tr1-13B-round3" in body
    long_line = "a" * (QUOTE_MAX + 100)  # longer than one quoted value, well within an alert's line
    assert QUOTE_MAX + 100 < LINE_MAX and alert_text.untrusted_text(f"{long_line}\nb") == f"{long_line}\nb"
