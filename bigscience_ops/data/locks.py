"""One builder at a time for files several processes may ask for at once (index files, the corpus).

flock where the filesystem has it; elsewhere (some network filesystems answer ENOLCK or
EOPNOTSUPP) an O_EXCL lock file holding host and pid, removed when done and taken over when its
owner is gone or it is older than STALE_LOCK_S. The builders write temporary files and rename them
into place, so even two builders at once would only waste work, never leave a partial file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

STALE_LOCK_S = 6 * 3600  # a fallback lock file this old is taken over
POLL_S = 1.0

_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def try_flock(f) -> bool:
    """Take an exclusive flock (waiting for it); False when the filesystem does not support flock."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno in _NO_FLOCK:
            return False
        raise
    return True


def _owner_gone(lock: Path) -> bool:
    try:
        host, pid = lock.read_text().split()
        age = time.time() - lock.stat().st_mtime
    except (OSError, ValueError):
        return False  # being written or just removed: look again
    if age > STALE_LOCK_S:
        return True
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@contextmanager
def _exclusive_file(lock: Path, done: Callable[[], bool]) -> Iterator[bool]:
    """O_EXCL lock file; yields False when `done()` became true while waiting (nothing to build)."""
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if done():
                yield False
                return
            if _owner_gone(lock):
                lock.unlink(missing_ok=True)
                continue
            time.sleep(POLL_S)
            continue
        try:
            os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        try:
            yield True
        finally:
            lock.unlink(missing_ok=True)
        return


@contextmanager
def build_lock(lock: Path, done: Callable[[], bool]) -> Iterator[bool]:
    """Exclusive right to build; yields whether to build (False: another process finished meanwhile)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{lock}.flock", "a") as f:
        if try_flock(f):
            try:
                yield not done()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
                Path(f"{lock}.flock").unlink(missing_ok=True)
            return
    Path(f"{lock}.flock").unlink(missing_ok=True)
    with _exclusive_file(lock, done) as mine:
        yield mine and not done()
