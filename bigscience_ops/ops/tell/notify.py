"""When alerts go out, for the watchdog and the hourly hub-sync and backup jobs: at most once per cooldown
per condition, with a recovery message when the condition clears (an Outbox of channels.py sends them); an
event (a checkpoint set aside: EVENT_KINDS) once, ever. What was sent is kept in the alert state between hourly
runs (alert_state.py: a small JSON file beside the run's main_log.txt, or in the user's state folder while that
cannot be written), which the watchdog and the jobs share: each read-modify-write holds an flock on `<state>.lock`.

Each channel (channels.CHANNELS: email, webhook) has a state of its own, under its name: every condition
records, per channel, when it was last sent and why the last try failed, so a channel that fails is
tried again on the next run while the others keep their cooldown (a webhook answering 500 never repeats
the email), and each channel that told of an alert gets its own recovery. What the messages say is
alert_text.py's. Every state entry is scrubbed of credentials (redact.scrub); the state file is written
mode 0600.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from bigscience_ops.ops.alerts import EVENT_KINDS, Alert, StatusReport, raise_alert
from bigscience_ops.ops.tell import alert_text
from bigscience_ops.ops.tell.alert_state import (  # noqa: F401 - the state's reader and place: importable from here too
    STATE_LIMIT, UNREADABLE, State, StateUnwritable, default_state_path, open_alerts, read_state, state_file,
    state_problem,
)
from bigscience_ops.ops.tell.channels import NAMES, Outbox
from bigscience_ops.ops.tell.message import NotifyError, subject_line
from bigscience_ops.redact import env_secrets, scrub
from bigscience_ops.schema import AlertsConfig

_State, _state_file = State, state_file  # their names before alert_state.py


# --- alerts with cooldown and recovery, per channel --------------------------------------------------

@dataclass(frozen=True)
class Notice:
    """One message the watchdog sent, or failed to send, on some channels."""

    kind: str
    """alert, recovery or finished."""
    conditions: tuple[str, ...]
    message_id: str
    subject: str
    channels: tuple[str, ...]
    """Where it went (or, with `error`, where it could not go): channel names (email, webhook)."""
    error: str | None = None
    """Why those channels could not send it (scrubbed; the next run tries again); None when it went out."""


def _record(entries: dict[str, dict], key: str, message: str, now: datetime) -> dict:
    """Record that condition `key` holds at `now` with `message`; returns its entry."""
    entry = entries.setdefault(key, {"since": now.isoformat(), "sent": {}})
    entry["message"] = scrub(message)
    return entry


def _sent_at(entry: dict, channel: str) -> datetime | None:
    when = entry.get("sent", {}).get(channel)
    return datetime.fromisoformat(when) if when else None


def _due(entry: dict, channel: str, now: datetime, cooldown_minutes: float) -> bool:
    """Whether `channel` is due to tell of the entry: never sent on it, or last sent a cooldown ago or more."""
    last = _sent_at(entry, channel)
    return last is None or now - last >= timedelta(minutes=cooldown_minutes)


def _tried(entry: dict, channel: str, error: str | None, sent: str | None) -> None:
    """Record one channel's try: on success its sent time becomes `sent` (None: forgotten, after a recovery)
    and its failure is cleared; on failure the error is kept and the sent time left alone."""
    failed = entry.setdefault("failed", {})
    if error is not None:
        failed[channel] = scrub(error)
        return
    failed.pop(channel, None)
    if sent is None:
        entry.setdefault("sent", {}).pop(channel, None)
    else:
        entry.setdefault("sent", {})[channel] = sent
    if not failed:
        del entry["failed"]


def _groups(wanted: dict[str, tuple[str, ...]]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(keys, channels) for each distinct non-empty set of keys the channels want: one message each."""
    out: dict[tuple[str, ...], list[str]] = {}
    for channel, keys in wanted.items():
        if keys:
            out.setdefault(keys, []).append(channel)
    return [(keys, tuple(on)) for keys, on in out.items()]


def _check_cooldown(cooldown_minutes: float) -> None:
    if cooldown_minutes < 0:
        raise NotifyError(f"cooldown_minutes: got {cooldown_minutes!r}; allowed: 0 or more minutes")


def _send(outbox: Outbox, subject: str, body: str, on: Sequence[str], now: datetime,
          env: Mapping[str, str] | None) -> tuple[str, list[str], dict[str, str]]:
    """Send one message on the channels `on`: (Message-ID, the channels it went out on, the failed ones with why)."""
    message = outbox.compose(subject, body, now=now)
    failed = outbox.deliver(message, on, env=env)
    return message.message_id, [c for c in on if c not in failed], failed


def _notices(kind: str, conditions: tuple[str, ...], message_id: str, subject: str, sent: Sequence[str],
             failed: Mapping[str, str]) -> list[Notice]:
    out = [Notice(kind, conditions, message_id, _subject(subject), tuple(sent))] if sent else []
    return out + [Notice(kind, conditions, message_id, _subject(subject), (c,), why) for c, why in failed.items()]


@dataclass(frozen=True)
class _Outgoing:
    """One message decided under the state's lock, to be sent after it is released."""

    kind: str  # alert, recovery, finished
    keys: tuple[str, ...]  # the state's keys it tells of
    conditions: tuple[str, ...]
    on: tuple[str, ...]  # the channels it goes out on
    subject: str
    body: str


def notify(report: StatusReport, outbox: Outbox, state_path: str | os.PathLike[str], *,
           experiment: str | None = None, cooldown_minutes: float = AlertsConfig.cooldown_minutes, log_path: str | None = None,
           now: datetime | None = None, env: Mapping[str, str] | None = None) -> list[Notice]:
    """Send the report's alerts on each channel that has not sent the same condition within the cooldown,
    and a recovery on each channel that told of a condition that has cleared. Returns the messages sent
    and those a channel failed to send (Notice.error): a failed channel is tried again on the next run
    while the others keep their cooldown.

    The state's lock is held to decide what is due and to record what went out, never while a message is
    sent: a slow mail server or webhook never keeps the hourly jobs of the run from their own alerts.
    While Slurm cannot be queried nothing is known to have cleared, so no recovery is sent then.
    """
    _check_cooldown(cooldown_minutes)
    now = now or report.checked_at
    experiment = experiment or report.job_name
    prefix = f"{report.job_name}::"
    told = {prefix + a.condition: a for a in report.alerts}
    current = {k: a for k, a in told.items() if a.kind not in EVENT_KINDS}
    wanted = outbox.names
    unknown = any(a.condition == "slurm-error" for a in report.alerts)
    path = Path(state_path)
    outgoing: list[_Outgoing] = []
    with _state_file(path) as state:  # decide, under the lock
        for key, alert in current.items():
            _record(state.active, key, alert.message, now)
        due = {c: tuple(k for k in told if (_due(state.active[k], c, now, cooldown_minutes) if k in current
                                            else not _sent_at(state.events.get(k, {}), c))) for c in wanted}
        for keys, on in _groups(due):
            alerts = [told[k] for k in keys]
            subject, body = alert_text.alert_email(experiment, report, alerts, cooldown_minutes, log_path)
            outgoing.append(_Outgoing("alert", keys, tuple(a.condition for a in alerts), on, subject, body))
        cleared = [] if unknown else [k for k in state.active if k.startswith(prefix) and k not in current]
        owed = {c: tuple(k for k in cleared if _sent_at(state.active[k], c)) for c in wanted}
        for keys, on in _groups(owed):
            conditions = tuple(k[len(prefix):] for k in keys)
            subject, body = alert_text.recovery_email(experiment, report, [state.active[k] for k in keys],
                                                      conditions, now)
            outgoing.append(_Outgoing("recovery", keys, conditions, on, subject, body))
        if report.finished_at is not None:
            told_finished = _told(state, report.job_name)
            on = tuple(c for c in outbox.names if told_finished.get(c) != report.finished_at)
            if on:
                outgoing.append(_Outgoing("finished", (), (), on, *alert_text.finished_email(experiment, report)))
    sent_out = [(o, *_send(outbox, o.subject, o.body, o.on, now, env)) for o in outgoing]  # no lock held
    notices: list[Notice] = []
    try:
        with _state_file(path) as state:  # record what went out, in the state as it is now
            _record_sent(state, sent_out, told, current, report, wanted, prefix, unknown, now, notices)
    except (StateUnwritable, OSError) as exc:  # sent: telling the caller so beats sending it again
        raise NotifyError(f"{_sent_lines(sent_out)}, but {exc}: the next run may send it again") from None
    return notices


def _record_sent(state: State, sent_out: list, told: dict[str, Alert], current: dict[str, Alert],
                 report: StatusReport, wanted: Sequence[str], prefix: str, unknown: bool, now: datetime,
                 notices: list[Notice]) -> None:
    """Record in `state` what `notify` sent (and failed to send), adding a Notice per message to `notices`."""
    stamp = now.isoformat()
    for o, message_id, sent, failed in sent_out:
        if o.kind == "alert":
            for key in o.keys:
                entries = state.active if key in current else state.events
                entry = _record(entries, key, told[key].message, now)
                if key not in current:
                    entry.pop("since", None)  # an event has a time of its own, in its message
                for channel in o.on:
                    _tried(entry, channel, failed.get(channel), stamp)
        elif o.kind == "recovery":
            for key in o.keys:
                if key in state.active:
                    for channel in o.on:
                        _tried(state.active[key], channel, failed.get(channel), None)
        else:
            state.finished[report.job_name] = _told(state, report.job_name) | {
                c: report.finished_at for c in sent}
        notices += _notices(o.kind, o.conditions, message_id, o.subject, sent, failed)
    if not unknown:  # done once no channel still owes its recovery
        for key in [k for k in state.active if k.startswith(prefix) and k not in current]:
            if not any(_sent_at(state.active[key], c) for c in wanted):
                del state.active[key]


def _sent_lines(sent_out: list) -> str:
    """`the alert went out on email (<id>)`: what `notify` sent, for an error that comes after."""
    done = [f"the {o.kind} went out on {', '.join(sent)} ({message_id})" for o, message_id, sent, _ in sent_out if sent]
    return "; ".join(done) or "nothing went out"


def told_events(state_path: str | os.PathLike[str], job_name: str, channels: Sequence[str] | None = None) -> set[str]:
    """The events (`kind:subject` of EVENT_KINDS) of `job_name` the alert state says were told: on every one of
    `channels`, or (None) on any channel. Reads only; an unreadable state has told nothing (alert_state.py)."""
    state, _ = read_state(Path(state_path))
    prefix = f"{job_name}::"
    out = set()
    for key, entry in state.events.items():
        if not key.startswith(prefix):
            continue
        sent = entry.get("sent", {})
        if (all(sent.get(c) for c in channels) if channels is not None else any(sent.values())):
            out.add(key[len(prefix):])
    return out


def _told(state: _State, job_name: str) -> dict:
    """The final iteration each channel announced for `job_name` (a file from before channels: one for all)."""
    told = state.finished.get(job_name)
    return dict(told) if isinstance(told, dict) else {c: told for c in NAMES} if told is not None else {}


def _subject(subject: str) -> str:
    """The subject as message.compose makes it (scrubbed, one line, no link, capped)."""
    return subject_line(subject)


# --- the hourly jobs' failures (hub-sync, backup) -------------------------------------------------

@dataclass(frozen=True)
class JobNotice:
    """What notify_job did about one run of an hourly job."""

    kind: str
    """alert (emailed), held (a failure within the cooldown, not emailed), recovery (emailed), or
    quiet (a success with no emailed failure before it)."""
    line: str
    """What happened, for the job's log; empty when quiet."""


def _now() -> datetime:
    """The clock of notify_job (local time, as the watchdog's reports); tests of the commands replace it."""
    return datetime.now().replace(microsecond=0)


def notify_job(outbox: Outbox, state_path: str | os.PathLike[str], job: str, error: str | None, *,
               experiment: str, command: str, cooldown_minutes: float = AlertsConfig.cooldown_minutes, now: datetime | None = None,
               env: Mapping[str, str] | None = None) -> JobNotice:
    """Report one run of an hourly job (`job`: hub-sync, backup) that failed with `error` or, with
    None, worked. A failure is sent at once and then at most once per `cooldown_minutes` while it
    lasts, on each channel by itself; the first success after a sent failure sends one recovery on
    each channel that told of it; a failure never sent clears silently. `command` is what to run by
    hand to see the failure. The state's lock is never held while a message is sent (see notify).

    A channel that fails raises NotifyError (naming it, and what did go out) with the state saved, so
    the next run tries that channel again while the others keep their cooldown.
    """
    _check_cooldown(cooldown_minutes)
    now = now or _now()
    error = None if error is None else scrub(error, env_secrets(outbox.secret_envs, env))
    wanted = outbox.names
    path = Path(state_path)
    with _state_file(path) as state:  # decide, under the lock
        note = _set_aside_note(state)
        if error is not None:
            entry = _record(state.jobs, job, error, now)
            on = tuple(c for c in wanted if _due(entry, c, now, cooldown_minutes))
            if not on:
                last = max(t for c in wanted if (t := _sent_at(entry, c)) is not None)
                return JobNotice("held", f"{job} failed again (failing since {entry['since']}); the alert email was "
                                         f"held back: last sent {last.isoformat()}, it repeats at most every "
                                         f"{cooldown_minutes:g} minutes while {job} keeps failing{note}")
            kind = "alert"
            alert = raise_alert("job-failed", subject=job, job=job, experiment=experiment, command=command)
            subject, body = alert_text.job_alert_email(experiment, job, alert, error,
                                                       datetime.fromisoformat(entry["since"]), cooldown_minutes, now)
        else:
            entry = state.jobs.get(job)
            on = tuple(c for c in wanted if entry is not None and _sent_at(entry, c))
            if entry is None or not on:  # no failure, or one never sent
                state.jobs.pop(job, None)
                return JobNotice("quiet", note.removeprefix("; "))
            kind = "recovery"
            subject, body = alert_text.job_recovery_email(experiment, job, entry, now)
    message_id, sent, failed = _send(outbox, subject, body, on, now, env)  # no lock held
    with _state_file(path) as state:  # record what went out, in the state as it is now
        if kind == "alert":
            entry = _record(state.jobs, job, error, now)
            for channel in on:
                _tried(entry, channel, failed.get(channel), now.isoformat())
        elif job in state.jobs:
            entry = state.jobs[job]
            for channel in on:
                _tried(entry, channel, failed.get(channel), None)
            if not any(_sent_at(entry, c) for c in wanted):
                del state.jobs[job]
    if not note:
        return _job_outcome(kind, outbox, message_id, subject, sent, failed)
    try:
        outcome = _job_outcome(kind, outbox, message_id, subject, sent, failed)
    except NotifyError as exc:
        raise NotifyError(f"{exc}{note}") from None
    return JobNotice(outcome.kind, outcome.line + note)


def _set_aside_note(state: _State) -> str:
    """`; the alert state ... was set aside ...` when loading it found it unreadable, else an empty string."""
    if state.problem is None:
        return ""
    return (f"; the alert state was unreadable ({state.problem}) and was set aside as {state.set_aside}: cooldowns "
            "started afresh")


def _job_outcome(kind: str, outbox: Outbox, message_id: str, subject: str, sent: Sequence[str],
                 failed: Mapping[str, str]) -> JobNotice:
    line = f"{kind} email sent to {outbox.destinations(sent)} ({message_id}): {_subject(subject)}" if sent else ""
    if failed:
        raise NotifyError("; ".join(failed.values()) + (f" (the {kind} did go out: {line})" if line else ""))
    return JobNotice(kind, line)
