"""A job run on this machine, and the one way bsops stops one: its whole process tree, never a part of it.

A local job (a training array task's job script, the eval ranks under torchrun, an hourly job script run here) is
started in a process group of its own (`start`), so that it is stopped as one. Its launchers start processes in
sessions of their own (torchrun's ranks, the trainers under the srun shim), which a signal to the group misses:
`stop_tree` sends SIGTERM to the group, waits until the group and every process found below it have ended, and
SIGKILLs what is left after the grace time. No process of the job is left when it returns.

`LocalJob` is the handle of such a job, as `jobs.SlurmJob` is of one in the queue: running or gone, and stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

RUNNING, GONE = "running", "gone"


def start(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
          stdout: IO | int | None = None, stderr: IO | int | None = None, text: bool = False,
          pass_fds: Sequence[int] = (), parent_death: signal.Signals | None = None) -> subprocess.Popen:
    """Start `argv` in a session (and process group) of its own, so that `stop_tree` stops all of it. `pass_fds`:
    descriptors it inherits (a lock it holds with this process, and after it). `parent_death`: the signal it gets
    when this process ends, however it ends (Linux's PR_SET_PDEATHSIG; nothing elsewhere): a job that must not go
    on unwatched (a local launch's task) hears that its launcher was killed."""
    preexec = _parent_death_signal(parent_death) if parent_death is not None else None
    return subprocess.Popen(list(argv), env=None if env is None else dict(env), cwd=cwd, stdout=stdout,
                            stderr=stderr, start_new_session=True, pass_fds=tuple(pass_fds), preexec_fn=preexec,
                            **({"text": True, "errors": "replace"} if text else {}))


PR_SET_PDEATHSIG = 1


def _parent_death_signal(sig: signal.Signals) -> Callable[[], None] | None:
    """What the child runs before exec to get `sig` when its parent ends (None where libc has no prctl). Should the
    parent have ended already (between fork and prctl), the child gets the signal at once."""
    import ctypes
    import ctypes.util

    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def stop_tree(proc: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM the process group of `proc` (its launchers pass it on), wait until the group and every process that
    was below `proc` have ended, and SIGKILL whatever of either is left after `grace_s`. The pids below are taken
    first: once a launcher has ended, the processes it started are no longer below it."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # the group has ended: what was below it may not have
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader; init reaps the rest of the group as it ends
        if not _group_alive(proc.pid) and not any(alive(pid) for pid in below):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in below:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10  # SIGKILL is delivered, not waited for: until none is left
    while any(alive(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """The pids below `pid` (from /proc's parent links; none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # not a process, or one that has just ended
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


@contextlib.contextmanager
def raising_on(signals: Sequence[signal.Signals], error: Callable[[signal.Signals], BaseException]) -> Iterator[None]:
    """Inside: each of `signals` raises `error(signal)`, so that a job is stopped with bsops instead of left running
    without it. A signal ignored already (SIGHUP under nohup) stays ignored; only the main thread sets handlers."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raised(signum: int, frame: object) -> None:
        raise error(signal.Signals(signum))

    before = {s: signal.signal(s, raised) for s in signals if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@dataclass(frozen=True)
class LocalJob:
    """The handle of a job running on this machine: its id (the process group's), running or gone, and stop."""

    proc: subprocess.Popen
    name: str = ""
    log: Path | None = None
    """Where its output goes, when the starter sent it to a file."""

    @property
    def job_id(self) -> str:
        return str(self.proc.pid)

    def state(self) -> str:
        """RUNNING while its leader or any process of its group runs, else GONE."""
        return RUNNING if self.proc.poll() is None or _group_alive(self.proc.pid) else GONE

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, grace_s: float = 60) -> None:
        stop_tree(self.proc, grace_s)

    def cancel(self, grace_s: float = 60) -> None:
        """As Slurm's scancel does: the whole group is asked to stop, then killed after `grace_s` (`stop`)."""
        self.stop(grace_s)
