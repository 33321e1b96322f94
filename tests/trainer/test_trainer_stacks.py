"""SIGUSR2 writes every thread's stack and the process runs on (trainer/stacks.py), also while its main
thread waits in C code that released the GIL, as a rank waits in a collective."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap

from tests.fixtures_trainer import REPO

CHILD = textwrap.dedent("""
    import ctypes, sys, threading
    from bigscience_ops.trainer.stacks import serve_stack_dumps

    serve_stack_dumps()

    def spin_in_python(stop):
        while not stop.is_set():
            sum(range(100))

    stop = threading.Event()
    threading.Thread(target=spin_in_python, args=(stop,), name="spinner").start()
    print("ready", flush=True)
    got = ctypes.CDLL(None).read(0, ctypes.create_string_buffer(1), 1)  # in C without the GIL until stdin
    stop.set()
    print("read", got, flush=True)  # -1 if a signal had interrupted it
""")
READ_LINE = next(i for i, line in enumerate(CHILD.splitlines(), 1) if ".read(0," in line)


class Dumps:
    """The child's stderr, read one dump at a time: a dump ends after the blank lines of two threads."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pending = fd, ""

    def next(self, timeout: float = 60) -> str:
        while self.pending.count("\n\n") < 2:
            if not select.select([self.fd], [], [], timeout)[0]:
                raise AssertionError(f"no whole dump within {timeout} s:\n{self.pending}")
            chunk = os.read(self.fd, 65536).decode()
            assert chunk, "stderr ended before a whole dump:\n" + self.pending
            self.pending += chunk
        first = self.pending.index("\n\n") + 2
        end = self.pending.index("\n\n", first) + 2
        dump, self.pending = self.pending[:end], self.pending[end:]
        return dump


def test_each_sigusr2_writes_every_threads_stack_and_the_process_runs_on() -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    dumps = Dumps(proc.stderr.fileno())
    try:
        assert proc.stdout.readline() == "ready\n"
        # One dump per signal, until one finds the main thread waiting in read(2) (it may still be printing).
        for sent in range(1, 101):
            proc.send_signal(signal.SIGUSR2)
            dump = dumps.next()
            assert "(MainThread), most recent call first:" in dump and "(spinner), most recent call first:" in dump
            assert "in spin_in_python" in dump
            assert "bsops-stacks" not in dump  # the thread writing them is left out
            if f"line {READ_LINE} in <module>" in dump:
                break
        else:
            raise AssertionError(f"no dump of {sent} found the main thread in its read:\n{dump}")
        out, err = proc.communicate("x", timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == "read 1\n"  # the signals never reached the main thread
