"""Alert texts and channels that mutation testing found untested (scripts/mutation.py): each test here fails on a
mutant of ops/tell/ that every other test let through. Mail goes to a real SMTP server on loopback; the tests read
the facts in what arrives (counts, names, numbers), not its sentences."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from bigscience_ops.ops.alerts import Alert
from bigscience_ops.ops.tell import alert_state, channels, notify
from bigscience_ops.ops.watch import status
from tests.fixtures_smtp import T0, plain_outbox


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
