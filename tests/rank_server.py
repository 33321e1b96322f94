"""Test ranks forked from one process that has imported torch, torch._dynamo and DeepSpeed already.

Each rank of `python -m bigscience_ops.trainer` spends about 3.5 s of CPU importing those before it trains a
few tiny steps, and the suite starts about a hundred. Run as a script, this module imports them once and then
forks each rank it is asked for: the child takes the rank's environment, folder, arguments and output files as
the interpreter would at its start, runs the module as __main__ and exits as the interpreter does (threads
joined, atexit handlers run, the exit status of SystemExit or 1 after a traceback, a signal's death for an
unhandled SIGINT; `random` and numpy's global generator seeded from the OS). fixtures_trainer.ranks sends only
what a fork starts as a fresh interpreter would: the same values of what is read while starting or importing
(START_KEYS). Every rank of a server shares its string hash seed; the job-script tests start theirs fresh
through torchrun.

One request a line on stdin, one reply a line on stdout, in JSON:
    {"start": {"argv": ["-m", MODULE, ...], "env": {...}, "cwd": DIR, "out": PATH, "err": PATH}} -> {"pid": PID}
    {"poll": PID} -> {"status": RETURNCODE or null}   (as Popen.returncode: -N killed by signal N; once, when it ends)
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import sys
import threading
import traceback

PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "deepspeed", "numpy",
           "deepspeed.runtime.zero.muon.muon_optimizer")
"""What every rank imports. The last is what DeepSpeed's bf16 optimizer imports when it is built: its torch.compile
decorators import torch._inductor, 1.3 s of CPU for each bf16 rank (a bf16 launch: 1.6 s started fresh, 0.6 forked)."""
START_KEYS = ("PYTHON", "TORCH", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "DS_ACCELERATOR")
"""Environment read while the interpreter starts and the server imports PRELOAD (by prefix): the interpreter's,
torch's, its thread runtimes' and DeepSpeed's, which picks its accelerator then. OMP_NUM_THREADS is set in the
child (torch.set_num_threads)."""
READ_LATER = ("OMP_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR", "KMP_DUPLICATE_LIB_OK")
"""START_KEYS that do not make a fork differ from a fresh start: OMP_NUM_THREADS (set in the child), inductor's cache
folder (read when something is compiled) and KMP_DUPLICATE_LIB_OK (read when a second OpenMP runtime loads, which a
fork of the server never does). A test's process that runs transformers or lm-eval sets the last two; before, every
later launch of that worker then started fresh interpreters, 10-20 s each."""


def same_start(env: dict[str, str], server_env: dict[str, str]) -> bool:
    """Whether a process started with `env` starts as a fork of a server started with `server_env` does."""
    keys = {k for k in (*env, *server_env) if k.startswith(START_KEYS) and k not in READ_LATER}
    return all(env.get(k) == server_env.get(k) for k in keys)


def _exit_status(exc: SystemExit) -> int:
    """What the interpreter exits with for an uncaught SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _run(request: dict) -> None:
    """In the forked child: become `python ARGV` and never return."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    if "OMP_NUM_THREADS" in os.environ:  # read by the OpenMP runtime when the server loaded it
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    import numpy

    numpy.random.seed()  # from the OS, as at a fresh import (`random` reseeds itself in a forked child)
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = _exit_status(exc)
    except KeyboardInterrupt as exc:
        _print_traceback(exc)
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:  # noqa: BLE001 - what the interpreter does with any other uncaught exception
        _print_traceback(exc)
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at the interpreter's exit
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code)


def _print_traceback(exc: BaseException) -> None:
    """The traceback the interpreter prints, which starts in the program: without this module's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def main() -> None:
    for name in PRELOAD:
        __import__(name)
    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a library's print in the server never lands in the replies
    for line in requests:
        request = json.loads(line)
        if "start" in request:
            pid = os.fork()
            if pid == 0:
                replies.close()
                _run(request["start"])
            replies.write(json.dumps({"pid": pid}) + "\n")
        else:
            done, status = os.waitpid(request["poll"], os.WNOHANG)
            replies.write(json.dumps({"status": _returncode(status) if done else None}) + "\n")


if __name__ == "__main__":
    main()
