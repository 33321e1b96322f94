"""The test launcher's forked ranks (rank_server.py) end as fresh interpreters end: what the trainer tests read of
a launch (exit status, output, tracebacks) must not depend on how its ranks were started."""

from __future__ import annotations

import pytest

from tests.fixtures_trainer import ranks

pytestmark = pytest.mark.slow

PROGRAMS = {
    "exit": "import os, sys; sys.stdout.write(f\"rank {os.environ['RANK']} {sys.argv}\\n\"); sys.exit(3)",  # one write
    "unbuffered": "import os; print('written at once'); os._exit(0)",  # PYTHONUNBUFFERED=1, as torchrun's ranks
    "error": "print('before'); raise ValueError('the message')",
    "signal": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "threads and atexit": ("import atexit, threading, time; atexit.register(print, 'atexit');"
                           "threading.Thread(target=lambda: (time.sleep(0.5), print('thread'))).start()"),
    "threads": "import torch; print(torch.get_num_threads())",
    "random": "import numpy; print(numpy.random.randint(2**31))",  # numpy keeps its state over a fork
}


def run_all() -> dict[str, tuple[int, list[str], list[str]]]:
    """Each program's exit status, stdout lines (sorted: two ranks print for "exit") and last stderr lines."""
    procs = {name: ranks(["-c", code, "an-argument"], 2 if name == "exit" else 1) for name, code in PROGRAMS.items()}
    return {name: (p.returncode, sorted(p.stdout.split("\n")), p.stderr.split("\n")[-4:]) for name, p in procs.items()}


def test_forked_ranks_end_as_fresh_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    forked = run_all()
    forked_again = ranks(["-c", PROGRAMS["random"]], 1).stdout
    monkeypatch.setenv("BSOPS_TEST_FRESH_RANKS", "1")
    fresh = run_all()
    assert {k: v for k, v in forked.items() if k != "random"} == {k: v for k, v in fresh.items() if k != "random"}
    assert forked["exit"][:2] == (3, ["", "rank 0 ['-c', 'an-argument']", "rank 1 ['-c', 'an-argument']"])
    assert forked["error"] == (1, ["", "before"], ["Traceback (most recent call last):",
                                                 '  File "<string>", line 1, in <module>', "ValueError: the message", ""])
    assert forked["signal"][0] == -15 and forked["unbuffered"][1] == ["", "written at once"]
    assert forked["threads and atexit"][:2] == (0, ["", "atexit", "thread"])
    assert forked["threads"][1][1].isdigit()  # the interpreter's own count: OMP_NUM_THREADS is unset
    # Each fork draws its own numbers, as each fresh interpreter does.
    assert forked["random"][0] == 0 and forked["random"][1] != sorted(forked_again.split("\n"))


def test_a_launch_that_changes_the_interpreters_start_gets_a_fresh_one(tmp_path) -> None:
    (tmp_path / "probe_module.py").write_text("import sys; print(sys.path[1])\n")
    proc = ranks(["-m", "probe_module"], 1, env={"PYTHONPATH": str(tmp_path)})
    assert (proc.returncode, proc.stdout) == (0, f"{tmp_path}\n"), proc.stderr
