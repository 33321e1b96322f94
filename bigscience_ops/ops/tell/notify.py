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

import contextlib
import glob
import json
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from bigscience_ops.data import locks
from bigscience_ops.ops.alerts import StatusReport, raise_alert
from bigscience_ops.ops.tell import alert_text
from bigscience_ops.ops.tell.channels import NAMES, Outbox
from bigscience_ops.ops.tell.message import NotifyError, subject_line
from bigscience_ops.redact import env_secrets, scrub
from bigscience_ops.untrusted import MAX_STEP, Problem, RecordFileError, excerpt, kind_of, read_small, write_atomically

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
    problem: Problem | None = field(default=None, compare=False)
    """Why the file could not be read when it was loaded (it was set aside and the state started afresh)."""
    set_aside: Path | None = field(default=None, compare=False)


STATE_LIMIT = 16 << 20
"""The largest alert state read: a few kB for a run's conditions."""
UNREADABLE = ".unreadable-"
"""An unreadable state file is moved to `<state>.unreadable-<time>`: kept to look at, alerted about until deleted."""


def default_state_path(log_path: str | os.PathLike[str] | None) -> Path:
    """Where a run's alert state lives: `.bsops-alerts.json` next to its main_log.txt (~/.cache/bsops/ without one)."""
    folder = Path(log_path).parent if log_path else Path.home() / ".cache" / "bsops"
    return folder / ".bsops-alerts.json"


def _read_state(path: Path) -> tuple[_State, Problem | None]:
    """The state in `path` (a fresh one when there is none), or a fresh one and what makes the file unreadable:
    not a plain file (a link is never followed, a FIFO never blocked on), too big, not JSON, or an entry of the
    wrong shape (a time that is no ISO time, a message that is no text)."""
    try:
        data = read_small(path, STATE_LIMIT)
    except RecordFileError as exc:
        return _State(), Problem(str(path), 0, exc.what)
    if data is None:
        return _State(), None
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return _State(), Problem(str(path), 0, "not the JSON bsops writes", excerpt(data))
    why = _state_problem(raw)
    if why is not None:
        return _State(), Problem(str(path), 0, why)
    state = _State(active=dict(raw.get("active", {})), finished=dict(raw.get("finished", {})),
                   jobs=dict(raw.get("jobs", {})))
    for entry in [*state.active.values(), *state.jobs.values()]:
        if "sent" not in entry:  # one time for every channel (version 1)
            last = entry.pop("last_sent", None)
            entry["sent"] = {c: last for c in NAMES} if last else {}
    return state, None


def _state_problem(raw: object) -> str | None:
    """What makes `raw` not an alert state bsops wrote, or None."""
    if not isinstance(raw, dict):
        return f"a JSON {type(raw).__name__}, not an alert state (a JSON object)"
    for section in ("active", "jobs"):
        entries = raw.get(section, {})
        if not isinstance(entries, dict):
            return f"{section}: expected an object of conditions"
        for key, entry in entries.items():
            why = _entry_problem(entry)
            if why is not None:
                return f"{section} {excerpt(key)}: {why}"
    finished = raw.get("finished", {})
    if not isinstance(finished, dict) or not all(
            _iteration(v) or (isinstance(v, dict) and all(isinstance(c, str) and _iteration(n) for c, n in v.items()))
            for v in finished.values()):
        return "finished: expected {job: {channel: iteration}}"
    return None


def _iteration(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def _entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return "expected an object"
    if not _iso(entry.get("since")):
        return "since: expected an ISO date and time"
    if not isinstance(entry.get("message", ""), str):
        return "message: expected text"
    if "last_sent" in entry and not (entry["last_sent"] is None or _iso(entry["last_sent"])):
        return "last_sent: expected an ISO date and time"
    sent, failed = entry.get("sent", {}), entry.get("failed", {})
    if not isinstance(sent, dict) or not all(isinstance(c, str) and (t is None or _iso(t)) for c, t in sent.items()):
        return "sent: expected {channel: ISO date and time}"
    if not isinstance(failed, dict) or not all(isinstance(c, str) and isinstance(w, str) for c, w in failed.items()):
        return "failed: expected {channel: text}"
    return None


def _iso(value: object) -> bool:
    if not isinstance(value, str) or len(value) > 64:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _load_state(path: Path) -> _State:
    """The state of `path`; one that cannot be read is moved aside (`UNREADABLE`) and the state starts afresh,
    with the problem recorded (the watchdog alerts about it: state_problem). Only an OS error moving it raises."""
    state, problem = _read_state(path)
    if problem is None:
        return state
    aside = path.with_name(f"{path.name}{UNREADABLE}{datetime.now():%Y%m%d-%H%M%S}")
    try:
        os.replace(path, aside)  # a link or a FIFO is moved as it is, never opened
    except OSError as exc:
        raise NotifyError(f"alert state file {path} is unreadable ({problem.what}) and cannot be set aside "
                          f"({exc.strerror or exc}); move it away to start afresh") from None
    state.problem, state.set_aside = problem, aside
    return state


def state_problem(path: str | os.PathLike[str]) -> Problem | None:
    """What is wrong with the alert state at `path`, for the watchdog's alert: the file cannot be read (notify sets
    it aside and starts afresh), an earlier unreadable one is still set aside beside it (the alert lasts until it
    is deleted), or its lock cannot be used. None when all is well. Reads only; takes no lock."""
    path = Path(path)
    _, problem = _read_state(path)
    if problem is not None:
        return problem
    aside = sorted(path.parent.glob(f"{glob.escape(path.name)}{UNREADABLE}*")) if path.parent.is_dir() else []
    if aside:
        more = f" (and {len(aside) - 1} more)" if len(aside) > 1 else ""
        return Problem(str(path), 0, f"was unreadable and was set aside as {aside[-1]}{more}: the alert cooldowns "
                                     "started afresh; look at it, then delete it")
    lock = path.with_name(path.name + ".lock")
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        return Problem(str(lock), 0, f"is {kind_of(lock)}, not a plain file: the alert state is used without its "
                                     "lock (remove it)")
    return None


def open_alerts(path: str | os.PathLike[str]) -> tuple[list[tuple[str, dict]], Problem | None]:
    """The conditions the alert state at `path` holds open (the watchdog's and the hourly jobs'), as (condition,
    entry with `since` and `message`), the newest first, and what makes the file unreadable. Reads only."""
    state, problem = _read_state(Path(path))
    entries = [*state.active.items(), *state.jobs.items()]
    return sorted(entries, key=lambda ce: str(ce[1].get("since", "")), reverse=True), problem


def _save_state(path: Path, state: _State) -> None:
    """Write the state atomically (written beside it, fsynced, renamed), mode 0600 (it holds error texts), every
    message scrubbed once more."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for entry in [*state.active.values(), *state.jobs.values()]:
        if isinstance(entry.get("message"), str):
            entry["message"] = scrub(entry["message"])
        failed = entry.get("failed", {})
        for channel in failed:
            failed[channel] = scrub(str(failed[channel]))
    text = json.dumps({"version": 2, "active": state.active, "finished": state.finished, "jobs": state.jobs},
                      indent=1, sort_keys=True) + "\n"
    write_atomically(path, text.encode("utf-8"), mode=0o600)


@contextmanager
def _state_file(path: Path) -> Iterator[_State]:
    """The state of `path`, saved when the block ends (also when it raises), under an exclusive flock
    on `<path>.lock` so the watchdog and the hourly jobs of one run never lose each other's updates.
    Hold it for reading and writing the state only: never across a message being sent.

    The lock file stays (removing it would let a waiter and a newcomer hold two locks at once).
    Where the filesystem has no flock, or the lock file is not a plain file (state_problem reports it), the
    state is used unlocked: the save is still an atomic rename, so two writers at once can only drop one
    update (one email too many), never corrupt it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError:
        fd = None  # a link, a FIFO or a folder where the lock belongs: unlocked (see above)
    if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        fd = None
    with os.fdopen(fd, "a") if fd is not None else contextlib.nullcontext() as lock:
        if lock is not None:
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
           experiment: str | None = None, cooldown_minutes: float = 60.0, log_path: str | None = None,
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
    current = {prefix + a.condition: a for a in report.alerts}
    wanted = outbox.names
    stamp = now.isoformat()
    unknown = any(a.condition == "slurm-error" for a in report.alerts)
    path = Path(state_path)
    outgoing: list[_Outgoing] = []
    with _state_file(path) as state:  # decide, under the lock
        for key, alert in current.items():
            _record(state.active, key, alert.message, now)
        due = {c: tuple(k for k in current if _due(state.active[k], c, now, cooldown_minutes)) for c in wanted}
        for keys, on in _groups(due):
            alerts = [current[k] for k in keys]
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
            told = _told(state, report.job_name)
            on = tuple(c for c in outbox.names if told.get(c) != report.finished_at)
            if on:
                outgoing.append(_Outgoing("finished", (), (), on, *alert_text.finished_email(experiment, report)))
    sent_out = [(o, *_send(outbox, o.subject, o.body, o.on, now, env)) for o in outgoing]  # no lock held
    notices: list[Notice] = []
    with _state_file(path) as state:  # record what went out, in the state as it is now
        for o, message_id, sent, failed in sent_out:
            if o.kind == "alert":
                for key in o.keys:
                    entry = _record(state.active, key, current[key].message, now)
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
    return notices


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
               experiment: str, command: str, cooldown_minutes: float = 60.0, now: datetime | None = None,
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
