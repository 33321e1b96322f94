"""`kill -USR2 PID` on a trainer: the Python stack of each of its threads on stderr, and the rank trains on.

faulthandler's handler for this reads every thread's frames without the GIL, from whichever thread
the kernel chose, while the others run on: under load a rank died of it (SIGSEGV). Here the process
blocks SIGUSR2 before it starts any other thread (threads inherit the mask) and one Python thread
takes it with sigwait, then writes the stacks holding the GIL, so no frame changes while it reads.
It needs nothing of the main thread: a rank waiting in a collective or on a data worker (waits that
release the GIL) is answered at once; one stuck in C code that holds the GIL answers when it gets
the GIL back.

No torch here: `serve_stack_dumps` runs before torch is imported, which starts a thread of its own.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback

SIGNAL = signal.SIGUSR2
STDERR = 2


def serve_stack_dumps() -> None:
    """From now on SIGUSR2 writes this process's thread stacks to stderr. Call from the main thread,
    before other threads start."""
    # A thread started earlier still takes the signal: then the main thread writes them at its next
    # Python instruction instead of the default action, which would end the process.
    signal.signal(SIGNAL, lambda signum, frame: _write_stacks(skip=None))
    signal.pthread_sigmask(signal.SIG_BLOCK, {SIGNAL})
    threading.Thread(target=_serve, name="bsops-stacks", daemon=True).start()


def _serve() -> None:
    while True:
        signal.sigwait({SIGNAL})
        _write_stacks(skip=threading.get_ident())


def _write_stacks(skip: int | None) -> None:
    """Each thread's stack but `skip`'s, most recent call first, in faulthandler's layout."""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        lines.append(f"Thread 0x{ident:016x} ({names.get(ident, 'not started by threading')}), most recent call first:")
        lines += [f'  File "{f.f_code.co_filename}", line {lineno} in {f.f_code.co_name}'
                  for f, lineno in traceback.walk_stack(frame)]
        lines.append("")
    # One write(2) for the whole dump: a text stream writes it in 8 KB pieces, and the main thread may
    # print between them, or end the process before the last.
    data = memoryview(("\n".join(lines) + "\n").encode(errors="backslashreplace"))
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        while data:
            data = data[os.write(STDERR, data):]
    except (OSError, ValueError):  # a closed stderr: a look at the stacks must never end the training
        pass
