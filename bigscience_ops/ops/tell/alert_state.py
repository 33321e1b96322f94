"""The alert state and where it is kept: one small JSON file per run, `.bsops-alerts.json` beside the run's
main_log.txt, which the watchdog and the hourly jobs share (each read-modify-write holds an flock on
`<state>.lock`; notify.py decides what it records).

It records, per condition (`active`: the watchdog's, `jobs`: the hourly jobs' failures) and per channel, when the
condition was first seen, its latest message, when each channel last sent it and why its last try failed; per job,
the final iteration each channel announced (`finished`); and each event told (`events`: a checkpoint set aside),
which is told once and never again. The file is untrusted input when read (a plain file of at most STATE_LIMIT,
each entry checked): one that cannot be read is set aside and the state starts afresh, alerted on. Written whole
(write, fsync, rename), mode 0600, every message scrubbed of credentials.

Where it is kept (`place`): beside the log while that folder can be written; otherwise (a read-only or full file
system, no permission, something else in a file's place) in the user's state folder, $XDG_STATE_HOME/bsops or
~/.local/state/bsops, as `<name>-<hash>.alerts.json` beside `<name>-<hash>.watchdog.log` (the hash is of the place
it belongs to), and the watchdog says so in an alert; once the log's folder can be written again, the state moves
back. The watchdog never goes silent because it cannot write its own files.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from bigscience_ops.data import locks
from bigscience_ops.ops.tell.channels import NAMES
from bigscience_ops.ops.tell.message import NotifyError
from bigscience_ops.redact import scrub
from bigscience_ops.untrusted import MAX_STEP, Problem, RecordFileError, excerpt, kind_of, read_small, write_atomically


class StateUnwritable(NotifyError):
    """The alert state could not be written (nothing was sent on the strength of it): `place` finds another."""

    def __init__(self, path: Path, exc: OSError) -> None:
        self.path, self.why = Path(path), exc.strerror or str(exc)
        super().__init__(f"the alert state {path} cannot be written ({self.why})")


@dataclass
class State:
    active: dict[str, dict] = field(default_factory=dict)  # watchdog condition ("job::condition") -> entry
    finished: dict[str, dict | int] = field(default_factory=dict)  # job name -> channel -> final iteration announced
    jobs: dict[str, dict] = field(default_factory=dict)  # failing hourly job ("hub-sync", "backup") -> entry
    events: dict[str, dict] = field(default_factory=dict)  # an event told ("job::kind:subject") -> message, sent
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


def read_state(path: Path) -> tuple[State, Problem | None]:
    """The state in `path` (a fresh one when there is none), or a fresh one and what makes the file unreadable:
    not a plain file (a link is never followed, a FIFO never blocked on), too big, not JSON, or an entry of the
    wrong shape (a time that is no ISO time, a message that is no text)."""
    try:
        data = read_small(path, STATE_LIMIT)
    except RecordFileError as exc:
        return State(), Problem(str(path), 0, exc.what)
    if data is None:
        return State(), None
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return State(), Problem(str(path), 0, "not the JSON bsops writes", excerpt(data))
    why = _state_problem(raw)
    if why is not None:
        return State(), Problem(str(path), 0, why)
    state = State(active=dict(raw.get("active", {})), finished=dict(raw.get("finished", {})),
                  jobs=dict(raw.get("jobs", {})), events=dict(raw.get("events", {})))
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
    events = raw.get("events", {})
    if not isinstance(events, dict):
        return "events: expected an object of events told"
    for key, entry in events.items():
        why = _event_problem(entry)
        if why is not None:
            return f"events {excerpt(key)}: {why}"
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


def _event_problem(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return "expected an object"
    if not isinstance(entry.get("message", ""), str):
        return "message: expected text"
    sent, failed = entry.get("sent", {}), entry.get("failed", {})
    if not isinstance(sent, dict) or not all(isinstance(c, str) and _iso(t) for c, t in sent.items()):
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


def load_state(path: Path) -> State:
    """The state of `path`; one that cannot be read is moved aside (`UNREADABLE`) and the state starts afresh,
    with the problem recorded (the watchdog alerts about it: state_problem). Only an OS error moving it raises."""
    state, problem = read_state(path)
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
    _, problem = read_state(path)
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
    state, problem = read_state(Path(path))
    entries = [*state.active.items(), *state.jobs.items()]
    return sorted(entries, key=lambda ce: str(ce[1].get("since", "")), reverse=True), problem


def save_state(path: Path, state: State) -> None:
    """Write the state atomically (written beside it, fsynced, renamed), mode 0600 (it holds error texts), every
    message scrubbed once more."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for entry in [*state.active.values(), *state.jobs.values(), *state.events.values()]:
        if isinstance(entry.get("message"), str):
            entry["message"] = scrub(entry["message"])
        failed = entry.get("failed", {})
        for channel in failed:
            failed[channel] = scrub(str(failed[channel]))
    text = json.dumps({"version": 2, "active": state.active, "finished": state.finished, "jobs": state.jobs,
                       "events": state.events}, indent=1, sort_keys=True) + "\n"
    write_atomically(path, text.encode("utf-8"), mode=0o600)


@contextmanager
def state_file(path: Path) -> Iterator[State]:
    """The state of `path`, saved when the block ends (also when it raises), under an exclusive flock
    on `<path>.lock` so the watchdog and the hourly jobs of one run never lose each other's updates.
    Hold it for reading and writing the state only: never across a message being sent.

    The lock file stays (removing it would let a waiter and a newcomer hold two locks at once).
    Where the filesystem has no flock, or the lock file is not a plain file (state_problem reports it), the
    state is used unlocked: the save is still an atomic rename, so two writers at once can only drop one
    update (one email too many), never corrupt it.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # no folder for it (a file holds its name): the watchdog says so, never dies of it
        raise StateUnwritable(path, exc) from None
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
        state = load_state(path)
        try:
            yield state
        finally:
            try:
                save_state(path, state)  # closing the file releases the flock
            except OSError as exc:
                raise StateUnwritable(path, exc) from None




# --- where the state (and the watchdog's log) is kept ----------------------------------------------------------

STATE_FOLDER_ENV = "XDG_STATE_HOME"


@dataclass(frozen=True)
class Place:
    """Where one watchdog run keeps its alert state and appends its lines."""

    state: Path
    log: Path | None
    """watchdog.log to append to (None: the caller keeps no log)."""
    moved: str | None = None
    """Why the usual place (beside the run's log) cannot be written; None when the state is kept there."""
    usual: Path | None = None
    """The usual place of the state when `moved`."""


def user_state_folder(env: Mapping[str, str] | None = None) -> Path:
    """The user's state folder for bsops: $XDG_STATE_HOME/bsops (an absolute path, as the XDG spec wants), else
    ~/.local/state/bsops."""
    env = os.environ if env is None else env
    base = env.get(STATE_FOLDER_ENV, "")
    return (Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "state") / "bsops"


def elsewhere(state: Path, name: str, env: Mapping[str, str] | None = None) -> tuple[Path, Path]:
    """(state, log) in the user's state folder for the run whose usual alert state is `state`: named after `name`
    (the job) and a hash of the usual place, so two runs of one name never share one."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:60].lstrip(".") or "run"
    digest = hashlib.sha256(str(Path(state).absolute()).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    folder = user_state_folder(env)
    return folder / f"{slug}-{digest}.alerts.json", folder / f"{slug}-{digest}.watchdog.log"


def unwritable(folder: Path, files: tuple[Path, ...] = ()) -> str | None:
    """Why the watchdog cannot write in `folder` (made if missing): a file it cannot create there, or one of
    `files` (appended to in place: watchdog.log) that it cannot open for appending. None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".bsops-probe.{os.getpid()}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"\n")
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        return f"{folder}: {exc.strerror or exc}"
    for path in files:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)  # as the first line written there makes it
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o644)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return f"{path}: {kind_of(path)}, not a plain file"
        finally:
            os.close(fd)
    return None


def place(state: Path, log: Path | None, name: str, env: Mapping[str, str] | None = None,
          why: str | None = None) -> Place:
    """Where to keep the alert state `state` (and append to `log`): there while its folder (and `log`) can be
    written, and then a state left in the user's state folder meanwhile moves back; else (or with `why`: it could
    not be written after all) in the user's state folder (`elsewhere`), with why."""
    state = Path(state)
    away_state, away_log = elsewhere(state, name, env)
    why = why or unwritable(state.parent, (log,) if log is not None else ())
    if why is None:
        _move_back(away_state, state)
        return Place(state, log)
    return Place(away_state, away_log if log is not None else None, why, state)


def _move_back(away: Path, state: Path) -> None:
    """A state kept in the user's state folder while the usual place could not be written goes back there (when it
    is newer than what is there), so the cooldowns and what was told carry on."""
    try:
        data = read_small(away, STATE_LIMIT)
    except RecordFileError:
        return
    if data is None:
        return
    with contextlib.suppress(OSError):
        if not state.exists() or os.lstat(away).st_mtime >= os.lstat(state).st_mtime:
            write_atomically(state, data, mode=0o600)
        away.unlink()
