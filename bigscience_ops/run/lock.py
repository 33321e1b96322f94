"""One launch per run folder: the lock a local launch, each array task and a rollback hold on the run.

Two trainings of one run folder corrupt it (one reads `latest` while the other writes it, both save
over the same checkpoints, the ledger credits each with the other's progress). So whatever trains
or rewrites a run holds `<run>/.bsops-run.lock`, an flock(2) on the file (kept across NFS and GPFS
clients, which carry flock as a POSIX lock; Lustre needs its `flock` mount option):
- `bsops launch --local` for the whole launch (its tasks' job scripts then take no lock of their own);
- each array task on Slurm, in the job script, from before `bsops task begin` to its end (flock(1));
- `bsops rollback` while it moves `latest` back.
A second one refuses in one line naming the holder: what it is (a pid or a Slurm job id, its host)
and since when. The holder's line is written into the file once the lock is held; it is read back
as untrusted input (bounded, one line, control characters shown escaped).

The lock is released when its holder's process ends, however it ends (kill -9 included): nothing
is ever left locked. `holder` tells whether a run is in use without taking the lock for long.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from bigscience_ops.errors import BsopsError

LOCK_NAME = ".bsops-run.lock"
HELD_ENV = "BSOPS_RUN_LOCK_HELD"
"""Set (to the run folder) in the environment of a local launch's tasks: their launcher holds the lock."""
_MAX_LINE = 300


class RunInUse(BsopsError):
    """Another launch, array task or rollback holds the run folder."""


def lock_path(output: Path) -> Path:
    return Path(output) / LOCK_NAME


def describe_self(what: str) -> str:
    """The holder line of this process: what it is, its pid and host, and since when (local time)."""
    return f"{what} (pid {os.getpid()} on {socket.gethostname()}) since {time.strftime('%Y-%m-%d %H:%M:%S')}"


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


@contextlib.contextmanager
def hold(output: Path, what: str) -> Iterator[None]:
    """Hold the run folder `output` (made if missing) while inside; raises RunInUse naming the holder."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as exc:  # a link (ELOOP), a folder, a file of another user
        raise RunInUse(f"the run's lock file {path} cannot be opened ({exc.strerror}): a plain file is expected "
                       "there; remove what is in its place") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device in its place
        os.close(fd)
        raise RunInUse(f"the run's lock file {path} is not a plain file; remove what is in its place")
    with os.fdopen(fd, "r+b", buffering=0) as handle:
        if not _lock(handle, fcntl.LOCK_EX, wait_s=2.0):  # a moment: a `holder` probe holds it for a read
            raise RunInUse(f"the run folder {output} is in use by {_read_holder(handle)}; wait for it to end "
                           f"(or stop it) and run the command again")
        handle.truncate(0)
        handle.seek(0)
        handle.write((describe_self(what) + "\n").encode())
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)  # the lock itself goes with the descriptor


def holder(output: Path) -> str | None:
    """Who holds the run folder's lock now, or None (the lock is free, or the folder has none)."""
    path = lock_path(output)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if not _lock(handle, fcntl.LOCK_SH, wait_s=0.0):
            return _read_holder(handle)
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None
