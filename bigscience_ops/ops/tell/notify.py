"""When alerts go out, for the watchdog and the hourly hub-sync and backup jobs: at most once per cooldown
per condition, with a recovery message when the condition clears (an Outbox of channels.py sends them).
The state between hourly runs is a small JSON file, `.bsops-alerts.json` beside the run's main_log.txt,
which the watchdog and the jobs share: each read-modify-write holds an flock on `<state>.lock`.

Each channel (channels.CHANNELS: email, webhook) has a state of its own, under its name: every condition
records, per channel, when it was last sent and why the last try failed, so a channel that fails is
tried again on the next run while the others keep their cooldown (a webhook answering 500 never repeats
the email), and each channel that told of an alert gets its own recovery. What the messages say is
alert_text.py's. Every state entry is scrubbed of credentials (redact.scrub); the state file is written
mode 0600.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from bigscience_ops.data import locks
from bigscience_ops.ops.tell import alert_text
from bigscience_ops.ops.tell.channels import NAMES, Outbox
from bigscience_ops.ops.tell.message import SUBJECT_MAX, NotifyError, header_text
from bigscience_ops.ops.watch.status import StatusReport
from bigscience_ops.redact import env_secrets, scrub

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


@dataclass
class _State:
    active: dict[str, dict] = field(default_factory=dict)  # watchdog condition ("job::condition") -> entry
    finished: dict[str, dict | int] = field(default_factory=dict)  # job name -> channel -> final iteration announced
    jobs: dict[str, dict] = field(default_factory=dict)  # failing hourly job ("hub-sync", "backup") -> entry
    # An entry: since (first seen), message (the latest text), sent (channel -> when last sent), failed
    # (channel -> why its last try failed, while it does). A file from before channels holds one last_sent
    # for all, and one announced iteration per job: read as each channel's.


def default_state_path(log_path: str | os.PathLike[str] | None) -> Path:
    """Where a run's alert state lives: `.bsops-alerts.json` next to its main_log.txt (~/.cache/bsops/ without one)."""
    folder = Path(log_path).parent if log_path else Path.home() / ".cache" / "bsops"
    return folder / ".bsops-alerts.json"


def _load_state(path: Path) -> _State:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return _State()
    except (OSError, ValueError) as exc:
        raise NotifyError(f"alert state file {path} is unreadable ({exc}); delete it to start afresh") from None
    state = _State(active=dict(data.get("active", {})), finished=dict(data.get("finished", {})),
                   jobs=dict(data.get("jobs", {})))
    for entry in [*state.active.values(), *state.jobs.values()]:
        if "sent" not in entry:  # one time for every channel (version 1)
            last = entry.pop("last_sent", None)
            entry["sent"] = {c: last for c in NAMES} if last else {}
    return state


def _save_state(path: Path, state: _State) -> None:
    """Write the state atomically, mode 0600 (it holds error texts), every message scrubbed once more."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for entry in [*state.active.values(), *state.jobs.values()]:
        if isinstance(entry.get("message"), str):
            entry["message"] = scrub(entry["message"])
        failed = entry.get("failed", {})
        for channel in failed:
            failed[channel] = scrub(str(failed[channel]))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps({"version": 2, "active": state.active, "finished": state.finished, "jobs": state.jobs},
                                indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


@contextmanager
def _state_file(path: Path) -> Iterator[_State]:
    """The state of `path`, saved when the block ends (also when it raises), under an exclusive flock
    on `<path>.lock` so the watchdog and the hourly jobs of one run never lose each other's updates.

    The lock file stays (removing it would let a waiter and a newcomer hold two locks at once).
    Where the filesystem has no flock the state is used unlocked: the save is still an atomic
    rename, so two writers at once can only drop one update (one email too many), never corrupt it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            locks.try_flock(lock)  # False without flock: carry on unlocked (see above)
        except OSError as exc:
            raise NotifyError(f"cannot lock alert state file {path}: {exc}") from None
        state = _load_state(path)
        try:
            yield state
        finally:
            _save_state(path, state)  # closing the file releases the flock


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


def notify(report: StatusReport, outbox: Outbox, state_path: str | os.PathLike[str], *,
           experiment: str | None = None, cooldown_minutes: float = 60.0, log_path: str | None = None,
           now: datetime | None = None, env: Mapping[str, str] | None = None) -> list[Notice]:
    """Send the report's alerts on each channel that has not sent the same condition within the cooldown,
    and a recovery on each channel that told of a condition that has cleared. Returns the messages sent
    and those a channel failed to send (Notice.error): a failed channel is tried again on the next run
    while the others keep their cooldown.

    While Slurm cannot be queried nothing is known to have cleared, so no recovery is sent then.
    """
    _check_cooldown(cooldown_minutes)
    now = now or report.checked_at
    experiment = experiment or report.job_name
    prefix = f"{report.job_name}::"
    current = {prefix + a.condition: a for a in report.alerts}
    wanted = outbox.names
    stamp = now.isoformat()
    notices: list[Notice] = []
    with _state_file(Path(state_path)) as state:
        for key, alert in current.items():
            _record(state.active, key, alert.message, now)
        due = {c: tuple(k for k in current if _due(state.active[k], c, now, cooldown_minutes)) for c in wanted}
        for keys, on in _groups(due):
            alerts = [current[k] for k in keys]
            subject, body = alert_text.alert_email(experiment, report, alerts, cooldown_minutes, log_path)
            message_id, sent, failed = _send(outbox, subject, body, on, now, env)
            for key in keys:
                for channel in on:
                    _tried(state.active[key], channel, failed.get(channel), stamp)
            notices += _notices("alert", tuple(a.condition for a in alerts), message_id, subject, sent, failed)
        unknown = any(a.condition == "slurm-error" for a in report.alerts)
        cleared = [] if unknown else [k for k in state.active if k.startswith(prefix) and k not in current]
        owed = {c: tuple(k for k in cleared if _sent_at(state.active[k], c)) for c in wanted}
        for keys, on in _groups(owed):
            conditions = tuple(k[len(prefix):] for k in keys)
            subject, body = alert_text.recovery_email(experiment, report, [state.active[k] for k in keys],
                                                      conditions, now)
            message_id, sent, failed = _send(outbox, subject, body, on, now, env)
            for key in keys:
                for channel in on:
                    _tried(state.active[key], channel, failed.get(channel), None)
            notices += _notices("recovery", conditions, message_id, subject, sent, failed)
        for key in cleared:  # done once no channel still owes its recovery
            if not any(_sent_at(state.active[key], c) for c in wanted):
                del state.active[key]
        if report.finished_at is not None:
            notices += _announce_finish(report, outbox, state, experiment, now, env)
    return notices


def _announce_finish(report: StatusReport, outbox: Outbox, state: _State, experiment: str, now: datetime,
                     env: Mapping[str, str] | None) -> list[Notice]:
    """The finish, once per channel."""
    told = state.finished.get(report.job_name)
    told = dict(told) if isinstance(told, dict) else {c: told for c in NAMES} if told is not None else {}
    on = [c for c in outbox.names if told.get(c) != report.finished_at]
    if not on:
        return []
    subject, body = alert_text.finished_email(experiment, report)
    message_id, sent, failed = _send(outbox, subject, body, on, now, env)
    state.finished[report.job_name] = told | {c: report.finished_at for c in sent}
    return _notices("finished", (), message_id, subject, sent, failed)


def _subject(subject: str) -> str:
    """The subject as message.compose makes it (scrubbed, one line, capped)."""
    return header_text(scrub(subject), SUBJECT_MAX)


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
               experiment: str, command: str, cooldown_minutes: float = 60.0, now: datetime | None = None,
               env: Mapping[str, str] | None = None) -> JobNotice:
    """Report one run of an hourly job (`job`: hub-sync, backup) that failed with `error` or, with
    None, worked. A failure is sent at once and then at most once per `cooldown_minutes` while it
    lasts, on each channel by itself; the first success after a sent failure sends one recovery on
    each channel that told of it; a failure never sent clears silently. `command` is what to run by
    hand to see the failure.

    A channel that fails raises NotifyError (naming it, and what did go out) with the state saved, so
    the next run tries that channel again while the others keep their cooldown.
    """
    _check_cooldown(cooldown_minutes)
    now = now or _now()
    error = None if error is None else scrub(error, env_secrets(outbox.secret_envs, env))
    wanted = outbox.names
    with _state_file(Path(state_path)) as state:
        if error is not None:
            entry = _record(state.jobs, job, error, now)
            on = [c for c in wanted if _due(entry, c, now, cooldown_minutes)]
            if not on:
                last = max(t for c in wanted if (t := _sent_at(entry, c)) is not None)
                return JobNotice("held", f"{job} failed again (failing since {entry['since']}); the alert email was "
                                         f"held back: last sent {last.isoformat()}, it repeats at most every "
                                         f"{cooldown_minutes:g} minutes while {job} keeps failing")
            subject, body = alert_text.job_alert_email(experiment, job, error, command,
                                                       datetime.fromisoformat(entry["since"]), cooldown_minutes, now)
            message_id, sent, failed = _send(outbox, subject, body, on, now, env)
            for channel in on:
                _tried(entry, channel, failed.get(channel), now.isoformat())
            return _job_outcome("alert", outbox, message_id, subject, sent, failed)
        entry = state.jobs.get(job)
        on = [c for c in wanted if entry is not None and _sent_at(entry, c)]
        if entry is None or not on:  # no failure, or one never sent
            state.jobs.pop(job, None)
            return JobNotice("quiet", "")
        subject, body = alert_text.job_recovery_email(experiment, job, entry, now)
        message_id, sent, failed = _send(outbox, subject, body, on, now, env)
        for channel in on:
            _tried(entry, channel, failed.get(channel), None)
        if not any(_sent_at(entry, c) for c in wanted):
            del state.jobs[job]
        return _job_outcome("recovery", outbox, message_id, subject, sent, failed)


def _job_outcome(kind: str, outbox: Outbox, message_id: str, subject: str, sent: Sequence[str],
                 failed: Mapping[str, str]) -> JobNotice:
    line = f"{kind} email sent to {outbox.destinations(sent)} ({message_id}): {_subject(subject)}" if sent else ""
    if failed:
        raise NotifyError("; ".join(failed.values()) + (f" (the {kind} did go out: {line})" if line else ""))
    return JobNotice(kind, line)
