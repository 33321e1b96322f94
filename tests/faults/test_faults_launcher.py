"""Fault: `bsops launch --local` killed with kill -9 while its task trains (issue 47, "one run, one trainer").

Its task's job script, srun, torchrun and trainers are left running without it. The run stays held by them (the
job script holds the launcher's very lock, each trainer the trainers' lock), so a relaunch is refused naming them;
the job script hears that its launcher is gone (SIGHUP) and its trainers save and exit; the same command then
resumes from that save and finishes the run, whose iteration lines are an uninterrupted run's. `bsops status`
says running (naming the processes) while they live, alerts once when the run stopped before its end, and says
finished at the end: a local run's processes are read, never the Slurm queue.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.run import lock as run_lock
from tests.fixtures_experiments import processes_mentioning, shrunk_tiny_yaml, small_trainings
from tests.fixtures_matrix import iteration_lines
from tests.fixtures_slurm import wait_until
from tests.fixtures_smtp import alerts_yaml

BSOPS = str(Path(sys.executable).with_name("bsops"))
def status(trainings: Path, run: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["status", "small", "--trainings-dir", str(trainings), "--run", str(run)])
    return result.exit_code, result.output


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_launcher_killed_leaves_the_run_held_until_its_trainers_saved_and_the_same_command_finishes_it(
        tmp_path: Path, plain_server) -> None:
    inbox, port = plain_server
    experiment = shrunk_tiny_yaml("launcher fault", 1, alerts_yaml(port)).replace(
        "exit_interval: 15", "exit_interval: null")  # one task: the relaunch finishes the run
    assert "exit_interval: null" in experiment
    trainings = small_trainings(tmp_path / "trainings", experiment)
    run, whole = tmp_path / "run", tmp_path / "whole"
    argv = [BSOPS, "launch", "small", "--local", "--trainings-dir", str(trainings), "--out"]
    # The uninterrupted run of the same experiment, beside the faulted one.
    reference = subprocess.Popen([*argv, str(whole)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    first = subprocess.Popen([*argv, str(run)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    left: list[int] = []
    try:
        assert first.stdout is not None
        for line in first.stdout:
            if line.lstrip().startswith("iteration"):  # its trainers train
                break
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        left = processes_mentioning(str(run))
        signal_all(left, signal.SIGSTOP)  # the moment held: what is left of the task, frozen as it was
        holding = run_lock.processes_holding({"t": run_lock.trainers_path(run)}).get("t", set())
        trainers = sorted(pid for pid in holding if not _comm(pid).startswith("pt_data_worker"))  # not their workers
        assert len(trainers) == 2 and holding <= set(left), (trainers, holding, left)  # 2 "nodes", PP=2

        refused = subprocess.run([*argv, str(run)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and ": started" not in refused.stdout, refused.stdout + refused.stderr
        assert refused.stderr.startswith(f"error: the run folder {run} is in use by bsops launch --local (pid "
                                         f"{first.pid} on ")
        named = re.findall(r"(\d+) \S+ \(trainer\)", refused.stderr)
        assert sorted(map(int, named)) == trainers, refused.stderr
        code, said = status(trainings, run)
        assert code == 0 and "is running" in said and f"its launcher (pid {first.pid}) has ended" in said, said
        assert all(str(pid) in said for pid in trainers) and "Slurm" not in said, said
        assert inbox.messages == []

        signal_all(left, signal.SIGCONT)  # the task heard its launcher end: its trainers save and exit
        wait_until("the orphaned task to end", lambda: not processes_mentioning(str(run)), timeout=180)
    finally:
        signal_all(left, signal.SIGCONT)
        if first.poll() is None:
            first.kill()
    saved = run_lock.in_use(run)
    assert saved is None
    code, said = status(trainings, run)
    assert code == 1 and "is not running here (launched with bsops launch --local)" in said, said
    assert "task " in said and "ended with exit code 0" in said  # it saved and recorded its end
    assert status(trainings, run)[0] == 1 and len(inbox.messages) == 1  # once, within the cooldown
    assert inbox.messages[0]["Subject"].startswith("[ALERT] small: launch it again (bsops launch small --local)")

    again = subprocess.run([*argv, str(run)], cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "> resumed from" in (run / "logs" / "main_log.txt").read_text()
    code, said = status(trainings, run)
    assert code == 0 and "training finished at iteration 28" in said, said
    alerts = [m for m in inbox.messages if m["Subject"].startswith("[ALERT]")]
    assert len(alerts) == 1, [m["Subject"] for m in inbox.messages]

    assert reference.wait(timeout=400) == 0, reference.stderr.read() if reference.stderr else ""
    # Every field of each iteration line but the timings, the last one logged for each (the relaunch logs again
    # the iterations after the save it resumed from).
    lines, expected = (iteration_lines((folder / "logs" / "main_log.txt").read_text()) for folder in (run, whole))
    assert sorted(expected) == list(range(1, 29)) and lines == expected
