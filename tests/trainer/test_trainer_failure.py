"""One failing rank ends the whole job promptly: every process exits, the launch fails, the error is in main_log.txt.

The run goes through the real job script (`bsops launch --local`: srun shim, one torchrun per
"node", PP=2 over the two nodes). BSOPS_FAIL_AT makes rank 1 raise before iteration 5. Before the
fix, the failed rank waited in the final `dist.barrier()` its peer could never reach, and the job
hung until the 30-minute collective timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bigscience_ops.run import ledger
from bigscience_ops.trainer.faults import FaultSwitchError, Faults, corrupt_at, fail_at
from tests.fixtures_experiments import processes_mentioning, shrunk_tiny_yaml, small_trainings

BSOPS = str(Path(sys.executable).with_name("bsops"))

SMALL = shrunk_tiny_yaml("failure", 1, "slurm: {array: 1}\n")


@pytest.mark.slow
def test_one_failing_rank_ends_the_job_with_its_error_in_main_log(tmp_path: Path) -> None:
    trainings = small_trainings(tmp_path / "trainings", SMALL)
    run = tmp_path / "failing-run"
    env = {**os.environ, "BSOPS_FAIL_AT": "1:5"}
    env.pop("BSOPS_JOB_START_EPOCH", None)
    # The whole launch (start-up, 4 iterations, the failure) takes about 15 s. A rank waiting for its failed peer
    # would wait out the collective timeout (30 minutes): the run's timeout (10) is the hang detector, no speed test.
    proc = subprocess.run([BSOPS, "launch", "small", "--local", "--trainings-dir", str(trainings), "--out", str(run)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc.stdout[-3000:]
    deadline = time.monotonic() + 20  # processes being reaped right now get a moment
    while processes_mentioning(str(run)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not processes_mentioning(str(run)), "training processes outlived the failed job"

    log = (run / "logs" / "main_log.txt").read_text()
    # rank 1 reports its own error; the iterations before the fault were trained and logged
    assert "InjectedFault" in log and "rank 1/2" in log, log[-3000:]
    trained = [line for line in log.splitlines() if line.lstrip().startswith("iteration ")]
    assert len(trained) == 4, trained

    # The job script recorded the nonzero exit, and the task made no progress: it counts against the budget.
    history = ledger.attempts(ledger.read(run / ledger.LEDGER_NAME))
    assert len(history) == 1
    assert history[0].exit_code not in (None, 0) and not history[0].progressed


def test_fail_at_parses_rank_and_iteration() -> None:
    assert fail_at({}) is None
    assert fail_at({"BSOPS_FAIL_AT": "1:5"}) == (1, 5)
    for bad in ("1", "a:b", "1:0", "1:2:3", "-1:4"):
        with pytest.raises(FaultSwitchError, match="RANK:ITERATION"):
            fail_at({"BSOPS_FAIL_AT": bad})


def test_corrupt_at_parses_iterations() -> None:
    assert corrupt_at({}) == frozenset() and corrupt_at({"BSOPS_CORRUPT_AT": "40, 90"}) == {40, 90}
    for bad in ("0", "a", "4:5", "-3", "1,,2"):
        with pytest.raises(FaultSwitchError, match="BSOPS_CORRUPT_AT: got"):
            corrupt_at({"BSOPS_CORRUPT_AT": bad})


def test_the_other_switches_parse_iterations_ranges_and_values() -> None:
    env = {"BSOPS_NAN_AT": "20", "BSOPS_SCALE_GRAD_AT": "24-26:inf, 30:1e3", "BSOPS_SLOW_AT": "35-36:1.5",
           "BSOPS_RECORD_TOKENS_AT": "3,12-13"}
    f = Faults.from_env(env)
    assert f.nan == {20} and f.record_tokens == {3, 12, 13} and f.slow == {35: 1.5, 36: 1.5}
    assert f.scale_grad == {24: float("inf"), 25: float("inf"), 26: float("inf"), 30: 1000.0}
    assert Faults.from_env({}) == Faults()
    for name, bad in [("BSOPS_SCALE_GRAD_AT", "30"), ("BSOPS_SCALE_GRAD_AT", "30:x"), ("BSOPS_SLOW_AT", "5-3:1"),
                      ("BSOPS_SLOW_AT", "4:-1"), ("BSOPS_RECORD_TOKENS_AT", "0"), ("BSOPS_NAN_AT", "2-")]:
        with pytest.raises(FaultSwitchError, match=f"{name}: got"):
            Faults.from_env({name: bad})
