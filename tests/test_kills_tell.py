"""Alert texts and channels that mutation testing found untested (scripts/mutation.py): each test here fails on a
mutant of ops/tell/ that every other test let through. Mail goes to a real SMTP server on loopback; the tests read
the facts in what arrives (counts, names, numbers), not its sentences."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from bigscience_ops.ops.alerts import Alert
from bigscience_ops.ops.tell import notify
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
