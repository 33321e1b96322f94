"""One run, one trainer: the lock that whatever trains or rewrites a run folder holds, and who holds it.

Two trainings of one run folder corrupt it (one reads `latest` while the other writes it, both save over the
same checkpoints, the ledger credits each with the other's progress). So the run is held with flock(2) (kept
across NFS and GPFS clients, which carry flock as a POSIX lock; Lustre needs its `flock` mount option) by every
process that writes it, for as long as it lives:
- `<run>/.bsops-run.lock`, exclusive, by its owner: `bsops launch --local` for the whole launch, and with it each
  of its tasks' job scripts, which inherit the launcher's very descriptor (one lock, held while any of them
  lives: a launcher killed with kill -9 leaves it held by its task); each array task on Slurm, in the job
  script, from before `bsops task begin` to its end (flock(1)); `bsops rollback` while it moves `latest` back;
- `<run>/.bsops-run.trainers.lock`, shared, by each trainer for its whole life (`python -m
  bigscience_ops.run.lock --trainer LOCK ...` takes it and becomes the trainer: `trainer_argv`), so that the run
  is never free while a trainer of it lives, even one whose job script, torchrun and launcher are all gone.
Whoever comes to hold a run (a launch, an array task, a rollback) takes the owner's lock, then makes sure no
trainer holds the trainers' lock; either held, it refuses in one line naming the holder: the owner's line (what
it is, its pid or Slurm job id, its host, since when) and the processes of this host that hold the run (their
pids and names). The owner's line is written into the lock file once held; it is read back as untrusted input
(bounded, one line, control characters shown escaped).

A lock is released when the last process holding it ends, however it ends (kill -9 included): nothing is ever
left locked by the dead. `in_use` and `holder` tell whether a run is held without taking it for long.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.errors import BsopsError

LOCK_NAME = ".bsops-run.lock"
TRAINERS_NAME = ".bsops-run.trainers.lock"
"""The lock every trainer of the run holds shared (beside LOCK_NAME; the job script names it the same way)."""
HELD_ENV = "BSOPS_RUN_LOCK_HELD"
"""Set by a local launch in its tasks' environment: the number of the descriptor of the run's lock that the job
script inherits from its launcher (held already: the script takes no lock of its own, and keeps this one held)."""
TRAINER_FLAG = "--trainer"
_MAX_LINE = 300
_WAIT_S = 2.0  # a moment: a `holder` probe holds a lock for a read, a leaving trainer's workers a little longer
_PROBE_WAIT_S = 0.5  # another's probe of the trainers' lock holds it for an instant
_TRAINER_WAIT_S = 30.0
_SHOWN_PIDS = 16
_PID_IN_LINE = re.compile(r"\(pid (\d+) on ([^)\s]+)\)")


class RunInUse(BsopsError):
    """Another launch, array task, rollback or trainer holds the run folder."""


def lock_path(output: Path) -> Path:
    return Path(output) / LOCK_NAME


def trainers_path(output: Path) -> Path:
    return Path(output) / TRAINERS_NAME


def describe_self(what: str) -> str:
    """The holder line of this process: what it is, its pid and host, and since when (local time)."""
    return f"{what} (pid {os.getpid()} on {socket.gethostname()}) since {time.strftime('%Y-%m-%d %H:%M:%S')}"


@dataclass(frozen=True)
class Holding:
    """Who holds a run folder now."""

    line: str | None
    """The owner's line (`bsops launch --local (pid 4711 on n1) since ...`), None when no owner holds it."""
    pids: tuple[int, ...] = ()
    """The processes of this host that hold the run (the owner's lock or the trainers'), in pid order."""
    trainers: tuple[int, ...] = ()
    """Of those, the trainers: the ones holding the trainers' lock whose parent does not (not their data workers)."""
    workers: tuple[int, ...] = ()
    """Of those, the others holding the trainers' lock: the trainers' data workers (forks of a trainer)."""
    trainers_held: bool = False
    """Whether a trainer of the run (of any host) holds the trainers' lock."""
    host: str = ""
    names: tuple[tuple[int, str], ...] = ()
    """(pid, command name) of each of `pids`, for the messages."""

    @property
    def owner_pid(self) -> int | None:
        """The pid the owner's line names, when it names one of this host."""
        found = _PID_IN_LINE.search(self.line or "")
        return int(found.group(1)) if found and found.group(2) == self.host else None

    @property
    def owner_gone(self) -> bool:
        """The owner's line names a process of this host that holds the run no longer (a launcher killed while its
        task goes on)."""
        pid = self.owner_pid
        return pid is not None and pid not in self.pids

    def processes(self) -> str:
        """`4711 bash, 4712 python3 (trainer) (+3 more)`: this host's processes holding the run, its trainers always
        among those shown (up to 16 in all)."""
        named = dict(self.names)
        first = [*self.trainers, *(p for p in self.pids if p not in self.trainers)][:_SHOWN_PIDS]
        role = {**{pid: " (trainer)" for pid in self.trainers}, **{pid: " (a trainer's worker)" for pid in self.workers}}
        shown = ", ".join(f"{pid} {named.get(pid, '?')}{role.get(pid, '')}" for pid in sorted(first))
        more = f" (+{len(self.pids) - len(first)} more)" if len(self.pids) > len(first) else ""
        return shown + more

    def __str__(self) -> str:
        parts = [self.line] if self.line else ["trainers left running without their task"]
        if self.line and self.owner_gone:
            parts.append(f"(pid {self.owner_pid} has ended; its task's processes hold the run)")
        if self.pids:
            parts.append(f"[processes of the run on {self.host}: {self.processes()}]")
        elif self.trainers_held:
            parts.append("[its trainers run on another host]")
        return " ".join(parts)


def _read_holder(handle) -> str:
    handle.seek(0)
    raw = handle.read(_MAX_LINE + 1)
    text = raw.decode("utf-8", errors="replace").split("\n", 1)[0].strip()
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)[:_MAX_LINE]
    return shown or "a process that has not written its line yet"


def _lock(handle, kind: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def _open(path: Path, flags: int) -> int:
    """A descriptor of the lock file `path` (a plain file, never through a link); RunInUse naming what is there."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as exc:  # a link (ELOOP), a folder, a file of another user
        raise RunInUse(f"the run's lock file {path} cannot be opened ({exc.strerror}): a plain file is expected "
                       "there; remove what is in its place") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device in its place
        os.close(fd)
        raise RunInUse(f"the run's lock file {path} is not a plain file; remove what is in its place")
    return fd


def _refusal(output: Path, holding: Holding) -> RunInUse:
    if holding.line is None:
        pids = " ".join(map(str, holding.trainers))  # never a data worker: that would fail its trainer
        stop = f" (or stop them: kill -USR1 {pids}, and they save and exit)" if pids else ""
        return RunInUse(f"the run folder {output} is in use by {holding}: a run has one trainer at a time; wait "
                        f"for them to end{stop} and run the command again")
    return RunInUse(f"the run folder {output} is in use by {holding}; wait for it to end (or stop it) and run the "
                    "command again")


@contextlib.contextmanager
def hold(output: Path, what: str) -> Iterator[int]:
    """Hold the run folder `output` (made if missing) while inside: its owner's lock, taken once no trainer of the
    run is left. Yields the lock's descriptor (a local launch hands it to its tasks' job scripts); raises RunInUse
    naming the holder and this host's processes that hold the run."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open(path, os.O_RDWR | os.O_CREAT)
    with os.fdopen(fd, "r+b", buffering=0) as handle:
        if not _lock(handle, fcntl.LOCK_EX, wait_s=_WAIT_S):
            raise _refusal(output, _holding(output, _read_holder(handle)))
        if _trainers_held(output, wait_s=_PROBE_WAIT_S):
            fcntl.flock(handle, fcntl.LOCK_UN)
            raise _refusal(output, _holding(output, None))
        handle.truncate(0)
        handle.seek(0)
        handle.write((describe_self(what) + "\n").encode())
        try:
            yield handle.fileno()
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)  # the lock itself goes with the last descriptor of it


def _trainers_held(output: Path, wait_s: float = 0.0) -> bool:
    """Whether a trainer of the run holds the trainers' lock (an exclusive probe, released at once). RunInUse when
    something else is in the lock's place (taking the run refuses it, as the owner's lock)."""
    if _absent(trainers_path(output)):
        return False
    fd = _open(trainers_path(output), os.O_RDONLY)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if not _lock(handle, fcntl.LOCK_EX, wait_s=wait_s):
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _absent(path: Path) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def in_use(output: Path) -> Holding | None:
    """Who holds the run folder now (its owner, its trainers, this host's processes holding it), or None."""
    line = None
    try:
        fd = _open(lock_path(output), os.O_RDONLY)
    except RunInUse:
        fd = None  # none there, or not a plain file (taking it would refuse)
    if fd is not None:
        with os.fdopen(fd, "rb", buffering=0) as handle:
            if not _lock(handle, fcntl.LOCK_SH, wait_s=0.0):
                line = _read_holder(handle)
            else:
                fcntl.flock(handle, fcntl.LOCK_UN)
    try:
        trainers = _trainers_held(output)
    except RunInUse:
        trainers = False  # not a lock any trainer holds: taking the run says what is in its place
    if line is None and not trainers:
        return None
    return _holding(output, line, trainers)


def holder(output: Path) -> str | None:
    """Who holds the run folder's lock now, in words (`in_use`), or None (the run is free, or has no lock)."""
    found = in_use(output)
    return None if found is None else str(found)


def _holding(output: Path, line: str | None, trainers: bool | None = None) -> Holding:
    files = {"owner": lock_path(output), "trainers": trainers_path(output)}
    held = processes_holding(files)
    pids = tuple(sorted({p for found in held.values() for p in found}))
    training = held.get("trainers", set())
    workers = {pid for pid in training if _parent(pid) in training}
    return Holding(line, pids, tuple(sorted(training - workers)), tuple(sorted(workers)),
                   bool(training) if trainers is None else trainers, socket.gethostname(),
                   tuple((pid, _name(pid)) for pid in pids))


def processes_holding(files: dict[str, Path]) -> dict[str, set[int]]:
    """The processes of this host (other than this one) with a descriptor open on each of `files` (key -> pids),
    from /proc (none where there is no /proc, or of other users where /proc hides them)."""
    targets = {}
    for key, path in files.items():
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            targets[(st.st_dev, st.st_ino)] = key
    found: dict[str, set[int]] = {}
    if not targets:
        return found
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()]
    except OSError:
        return found
    for entry in entries:
        fds = f"/proc/{entry}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue  # ended, or another user's
        for name in names:
            try:
                st = os.stat(f"{fds}/{name}")
            except OSError:
                continue
            key = targets.get((st.st_dev, st.st_ino))
            if key is not None:
                found.setdefault(key, set()).add(int(entry))
    return found


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            name = f.read(64).strip()
    except OSError:
        return "?"
    return "".join(c if c.isprintable() and not c.isspace() else "?" for c in name) or "?"


# ------------------------------------------------------------------------------------------ a trainer's hold

def trainer_argv(lock: str, python_args: Sequence[str]) -> list[str]:
    """The arguments of `python` that hold the run's trainers' lock, then run `python_args` in the same process
    (`-m bigscience_ops.trainer ...`): what torchrun starts for each rank."""
    return ["-m", __name__, TRAINER_FLAG, lock, *python_args]


def hold_as_trainer(lock: Path, wait_s: float = _TRAINER_WAIT_S) -> int:
    """Take the trainers' lock beside the run's lock `lock` (shared with the run's other trainers) on a descriptor
    that stays open across exec, and return it: the process holds the run until it ends. RunInUse when it cannot
    be had within `wait_s` (someone is taking the run over: a rollback, a launch making sure no trainer is left)."""
    path = Path(lock).with_name(TRAINERS_NAME)
    fd = _open(path, os.O_RDWR | os.O_CREAT)
    try:
        held = _lock(fd, fcntl.LOCK_SH, wait_s)
    except OSError as exc:  # a file system without flock: as the job script's own lock, no training
        os.close(fd)
        raise RunInUse(f"the run's trainers' lock {path} cannot be taken ({exc.strerror}): the run's folder must "
                       "be on a file system with flock") from None
    if not held:
        os.close(fd)
        raise RunInUse(f"the run's trainers' lock {path} is held by a process taking the run over (a rollback, or a "
                       f"launch checking that no trainer is left) for over {wait_s:g} s; this trainer does not start")
    os.set_inheritable(fd, True)  # kept open for the life of the process, across exec
    return fd


def main(argv: Sequence[str]) -> int:
    """`python -m bigscience_ops.run.lock --trainer LOCK PYTHON_ARGS...`: hold the trainers' lock, then become
    `python PYTHON_ARGS...` (exec: the same process, the lock held until it ends)."""
    if len(argv) < 3 or argv[0] != TRAINER_FLAG:
        print(f"usage: python -m {__name__} {TRAINER_FLAG} RUN_LOCK PYTHON_ARGS...; got {list(argv)!r}",
              file=sys.stderr)
        return 2
    try:
        hold_as_trainer(Path(argv[1]))
    except RunInUse as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    os.execv(sys.executable, [sys.executable, "-u", *argv[2:]])  # unbuffered, as torchrun starts each rank
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
