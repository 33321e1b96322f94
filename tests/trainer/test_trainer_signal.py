"""SIGUSR1 (Slurm's warning before the time limit) makes a running trainer save and exit cleanly; SIGUSR2 makes it
write where each of its threads is and train on."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from bigscience_ops.run.ledger import latest_iteration
from tests.fixtures_trainer import REPO, TORCHRUN, small_experiment, write_run

pytestmark = pytest.mark.slow


def test_sigusr1_saves_at_the_current_iteration_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "run"
    exp = small_experiment(out, parallel=dict(pipeline=1, zero_stage=0), train=dict(samples=100_000),
                           checkpoint=dict(save_interval=10_000),
                           logging=dict(log_interval=1, eval_interval=10_000))
    write_run(exp, out)
    argv = [TORCHRUN, "--standalone", "--nproc_per_node", "1", "-m", "bigscience_ops.trainer",
            "--experiment", str(out / "experiment.json"), "--deepspeed-config", str(out / "ds_config.json"),
            "--synthetic-data"]
    env = {k: v for k, v in os.environ.items() if k != "BSOPS_JOB_START_EPOCH"}
    env.update(DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise AssertionError(f"the trainer exited {proc.returncode} early:\n" + "".join(lines[-40:]))
            lines.append(line)
            if re.match(r"\s*iteration\s+3/", line):
                break
        else:
            raise AssertionError("no iteration line within 180 s:\n" + "".join(lines[-30:]))
        [worker] = [p.pid for p in psutil.Process(proc.pid).children()]
        deadline = time.monotonic() + 120
        for _ in range(3):  # on-call's look at a hung rank, as often as they like: its stacks, and it trains on
            os.kill(worker, signal.SIGUSR2)
            in_main = False  # read on to the end of the main thread's stack
            while not (in_main and line == "\n"):
                assert time.monotonic() < deadline, "no stacks within 120 s:\n" + "".join(lines[-40:])
                line = proc.stdout.readline()
                assert line, "the trainer ended before it wrote its stacks:\n" + "".join(lines[-40:])
                lines.append(line)
                in_main = in_main or "(MainThread), most recent call first:" in line
        os.kill(worker, signal.SIGUSR1)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + rest
    assert proc.returncode == 0, output[-3000:]
    stacks = re.findall(r"Thread 0x[0-9a-f]+ \(MainThread\), most recent call first:\n(?:  File .*\n)*?"
                        r"  File \".*bigscience_ops/trainer/train\.py\", line \d+ in main\n", output)
    assert len(stacks) == 3, output[-3000:]
    match = re.search(r"> signal received: saved and exiting at iteration (\d+)", output)
    assert match, output[-3000:]
    stopped = int(match.group(1))
    assert 3 <= stopped < 100
    assert latest_iteration(out / "checkpoints") == stopped
