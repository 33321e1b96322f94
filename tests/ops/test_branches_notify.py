"""The alert state's bookkeeping branches no other test runs (issue 51), through a real SMTP server on loopback and a
webhook channel whose URL variable is not set (a real failure of that channel, before any network):
- one channel failing while the other sends: the failure is kept for that channel alone and cleared once it sends;
- the hourly jobs' failure and recovery with a failing channel, and with an alert state found unreadable;
- the alert state becoming unwritable while a message was being sent: the caller hears what went out;
- a report that could not query Slurm sends no recovery and forgets nothing;
- which events were told, per job and per channel.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bigscience_ops.ops.alerts import StatusReport, raise_alert
from bigscience_ops.ops.tell import alert_state, notify
from bigscience_ops.ops.tell.message import NotifyError
from tests.fixtures_smtp import T0, Inbox, plain_outbox, serving
from bigscience_ops.launch.local import free_port

HOOK = "BSOPS_TEST_UNSET_WEBHOOK"
JOB = "tr-branches"


FACTS = {"not-scheduled": {"stopped": ""}, "slurm-error": {"detail": "slurmctld does not answer"}}


def _report(*kinds: str, at: datetime = T0) -> StatusReport:
    return StatusReport(JOB, at, ()).adding([raise_alert(kind, job=JOB, **FACTS[kind]) for kind in kinds])


def _state(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_cooldown_below_zero_is_refused(tmp_path: Path, plain_server) -> None:
    _, port = plain_server
    with pytest.raises(NotifyError, match="-1"):
        notify.notify(_report("not-scheduled"), plain_outbox(port), tmp_path / "s.json", cooldown_minutes=-1)
    with pytest.raises(NotifyError, match="-1"):
        notify.notify_job(plain_outbox(port), tmp_path / "s.json", "backup", "boom", experiment="e", command="c",
                          cooldown_minutes=-1)
    assert not (tmp_path / "s.json").exists()


def test_a_failing_channel_is_tried_again_alone_and_its_failure_cleared(tmp_path: Path, plain_server,
                                                                       monkeypatch) -> None:
    inbox, port = plain_server
    state = tmp_path / "s.json"
    outbox = plain_outbox(port, webhook_env=HOOK)
    first = notify.notify(_report("not-scheduled"), outbox, state, env={})
    assert [(n.channels, n.error is None) for n in first] == [(("email",), True), (("webhook",), False)]
    [entry] = _state(state)["active"].values()
    assert list(entry["sent"]) == ["email"] and list(entry["failed"]) == ["webhook"]
    # Within the cooldown: only the webhook is due, and it fails again; the email keeps its cooldown.
    again = notify.notify(_report("not-scheduled", at=T0 + timedelta(minutes=5)), outbox, state, env={})
    assert [(n.channels, n.error is None) for n in again] == [(("webhook",), False)] and len(inbox.messages) == 1
    # The condition clears: a recovery on the email that told of it; nothing is owed on the webhook.
    cleared = notify.notify(_report(at=T0 + timedelta(minutes=10)), outbox, state, env={})
    assert [(n.kind, n.channels) for n in cleared] == [("recovery", ("email",))] and len(inbox.messages) == 2
    assert _state(state)["active"] == {}


def test_a_report_that_could_not_ask_slurm_sends_no_recovery_and_forgets_nothing(tmp_path: Path,
                                                                               plain_server) -> None:
    inbox, port = plain_server
    state = tmp_path / "s.json"
    notify.notify(_report("not-scheduled"), plain_outbox(port), state)
    unknown = notify.notify(_report("slurm-error", at=T0 + timedelta(minutes=90)), plain_outbox(port), state)
    assert [n.kind for n in unknown] == ["alert"] and len(inbox.messages) == 2
    assert {k.split("::")[1] for k in _state(state)["active"]} == {"not-scheduled", "slurm-error"}


class _FillsTheDisk(Inbox):
    """A mail server during whose delivery the folder of the alert state stops taking new files (a folder takes
    the name the state's new copy is written under)."""

    blocked: Path | None = None

    async def handle_DATA(self, server, session, envelope):
        if self.blocked is not None:
            self.blocked.mkdir()
        return await super().handle_DATA(server, session, envelope)


def test_an_alert_state_that_cannot_be_written_after_a_message_went_out_says_what_went_out(tmp_path: Path) -> None:
    inbox, port = _FillsTheDisk(), free_port()
    state = tmp_path / ".bsops-alerts.json"
    inbox.blocked = state.with_name(f".{state.name}.{os.getpid()}.tmp")
    with serving(inbox, port):
        with pytest.raises(NotifyError) as caught:
            notify.notify(_report("not-scheduled"), plain_outbox(port), state)
    assert len(inbox.messages) == 1 and inbox.messages[0]["Message-ID"] in str(caught.value)
    [entry] = _state(state)["active"].values()  # as decided before sending: not recorded as sent
    assert not entry.get("sent")  # the next run may send it again, and the caller was told it went out


def test_an_hourly_jobs_failure_with_a_failing_channel_and_its_recovery(tmp_path: Path, plain_server) -> None:
    inbox, port = plain_server
    state = tmp_path / "s.json"
    outbox = plain_outbox(port, webhook_env=HOOK)
    kwargs = dict(experiment="e", command="bsops backup e", env={})
    with pytest.raises(NotifyError, match=HOOK) as caught:
        notify.notify_job(outbox, state, "backup", "disk full", now=T0, **kwargs)
    assert inbox.messages[0]["Message-ID"] in str(caught.value)  # it did go out on the email
    assert list(_state(state)["jobs"]["backup"]["failed"]) == ["webhook"]
    recovered = notify.notify_job(outbox, state, "backup", None, now=T0 + timedelta(minutes=5), **kwargs)
    assert recovered.kind == "recovery" and len(inbox.messages) == 2 and _state(state)["jobs"] == {}


def test_an_hourly_job_finding_the_alert_state_unreadable_says_so_with_its_outcome(tmp_path: Path,
                                                                                  plain_server) -> None:
    inbox, port = plain_server
    state = tmp_path / "s.json"
    kwargs = dict(experiment="e", command="bsops backup e", env={})
    state.write_text("[not a state]")
    sent = notify.notify_job(plain_outbox(port), state, "backup", "disk full", now=T0, **kwargs)
    [aside] = tmp_path.glob(f"s.json{alert_state.UNREADABLE}*")
    assert sent.kind == "alert" and str(aside) in sent.line and len(inbox.messages) == 1
    state.write_text("[not a state again]")
    with pytest.raises(NotifyError, match=HOOK) as caught:
        notify.notify_job(plain_outbox(port, webhook_env=HOOK), state, "hub-sync", "push refused",
                          now=T0 + timedelta(minutes=1), **kwargs)
    assert str(state) in str(caught.value) and len(inbox.messages) == 2
    state.write_text("[and again]")
    quiet = notify.notify_job(plain_outbox(port), state, "hub-sync", None, now=T0 + timedelta(minutes=2), **kwargs)
    assert quiet.kind == "quiet" and str(state) in quiet.line and len(inbox.messages) == 2


def test_events_told_are_per_job_and_per_channel(tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    alert_state.save_state(state, alert_state.State(events={
        f"{JOB}::checkpoint-set-aside:a": {"message": "m", "sent": {"email": T0.isoformat()}},
        f"{JOB}::checkpoint-set-aside:b": {"message": "m", "sent": {"email": T0.isoformat(),
                                                                   "webhook": T0.isoformat()}},
        "other-job::checkpoint-set-aside:c": {"message": "m", "sent": {"email": T0.isoformat()}}}))
    assert notify.told_events(state, JOB) == {"checkpoint-set-aside:a", "checkpoint-set-aside:b"}
    assert notify.told_events(state, JOB, ("email", "webhook")) == {"checkpoint-set-aside:b"}
    assert notify.told_events(state, "nobody") == set()
