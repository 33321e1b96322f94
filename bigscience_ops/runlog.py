"""The run's main_log.txt: find it, read its last lines, follow what is appended.

The log lives in the run folder (paths.logs/main_log.txt) on the cluster; elsewhere it is read
from the logs repo's clone that hub-sync keeps (<run>/hub/logs/, see ops/keep/hubsync.py) or from any
clone of that repo. `follow` polls (no inotify: it also works on network file systems) and
survives the file being rotated (renamed away, a new one created) or truncated: it then starts
again from the new file's first line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bigscience_ops.errors import BsopsError

LOG_NAME = "main_log.txt"
_BLOCK = 64 * 1024


class LogError(BsopsError):
    """The log cannot be found or read: names the paths tried."""


def log_candidates(exp, from_clone: Path | None = None) -> list[Path]:
    """Where the main log may be, in order: the run folder, then the synced clone (or `from_clone`)."""
    if from_clone is not None:
        clones = [Path(from_clone)]
        first: list[Path] = []
    else:
        clones = [Path(exp.paths.output) / "hub" / "logs"] if exp.paths.output else []
        first = [Path(exp.paths.logs) / LOG_NAME] if exp.paths.logs else []
    return first + [p for clone in clones for p in (clone / LOG_NAME, clone / "logs" / LOG_NAME)]


def find_log(exp, from_clone: Path | None = None) -> Path:
    """The first existing main_log.txt of `log_candidates`."""
    candidates = log_candidates(exp, from_clone)
    for path in candidates:
        if path.is_file():
            return path
    tried = ", ".join(str(p) for p in candidates) or "none (the experiment has no paths.logs)"
    raise LogError(f"no {LOG_NAME} for {exp.name!r}; looked at: {tried}. Has the run started, or has hub-sync "
                   "cloned its logs repo? (a clone elsewhere: --from-clone DIR)")


def tail(path: Path, n: int) -> tuple[list[str], int]:
    """The last `n` complete lines of `path` and the byte offset just past them (where following starts)."""
    if n < 0:
        raise LogError(f"line count: got {n}; allowed: 0 or more")
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            data = b""
            pos = end
            while pos > 0 and data.count(b"\n") <= n:
                step = min(_BLOCK, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except OSError as exc:
        raise LogError(f"cannot read {path}: {exc.strerror}") from None
    complete_end = data.rfind(b"\n") + 1  # a partial last line is left for `follow`
    lines = data[:complete_end].split(b"\n")[:-1]
    if pos > 0:
        lines = lines[1:]  # the first piece may be the middle of a line
    chosen = lines[-n:] if n else []
    return [_decode(line) for line in chosen], end - (len(data) - complete_end)


def follow(path: Path, offset: int = 0, interval: float = 1.0, stop: Callable[[], bool] | None = None,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """Yield each complete line appended to `path` after byte `offset`, polling every `interval` seconds.

    When the file is replaced (another inode) or shrinks, reading starts again at the new file's
    beginning. A missing file is waited for. Ends when `stop()` returns true (checked while idle).
    """
    path = Path(path)
    f = None
    identity = None
    pending = b""
    try:
        while True:
            if f is None:
                try:
                    f = open(path, "rb")
                except FileNotFoundError:
                    f = None
                else:
                    st = os.fstat(f.fileno())
                    identity = (st.st_dev, st.st_ino)
                    f.seek(min(offset, st.st_size))
            chunk = f.read(_BLOCK) if f is not None else b""
            if chunk:
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    yield _decode(line)
                continue
            if f is not None and _replaced(path, identity, f.tell()):
                f.close()
                f, offset, pending = None, 0, b""
                continue
            if stop is not None and stop():
                return
            sleep(interval)
    finally:
        if f is not None:
            f.close()


def _replaced(path: Path, identity: tuple[int, int] | None, position: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return True
    return (st.st_dev, st.st_ino) != identity or st.st_size < position


def _decode(line: bytes) -> str:
    return line.rstrip(b"\r").decode("utf-8", errors="replace")
