"""trainer/stopping.py: why training stops. The end, the exit interval, a node phase boundary, the kill switch
file, SIGUSR1/SIGTERM and the exit duration measured from the Slurm job start, each alone and in the order they
are checked. Fast: a one-process gloo group (the `single_rank_group` fixture) stands for the ranks' all-reduce."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bigscience_ops.schedule.nodes import Phase
from bigscience_ops.schema import CheckpointConfig
from bigscience_ops.trainer import stopping
from bigscience_ops.trainer.stopping import Stopper

CPU = torch.device("cpu")
RULES = (("exit interval ", "exit interval"), ("node schedule: ", "node phase"), ("kill switch ", "kill switch"),
         ("signal received", "signal"), ("exit duration ", "exit duration"))


def rule(reason: str | None) -> str | None:
    """Which rule a stop reason names: the trainer logs the reason, whose first words name the rule."""
    if reason is None:
        return None
    if reason == stopping.FINISHED:
        return "end"
    [name] = [name for prefix, name in RULES if reason.startswith(prefix)]
    return name


def make_stopper(tmp_path: Path, *, exit_interval: int | None = None, minutes: int = 60, started_min_ago: float = 0,
                 phase_at: int | None = None, train_iters: int = 20, kill_switch: bool = True) -> Stopper:
    ck = CheckpointConfig(exit_interval=exit_interval, exit_duration_in_mins=minutes,
                          kill_switch_path=str(tmp_path / "kill-switch") if kill_switch else None)
    phase = None if phase_at is None else Phase(1, 2, first_step=8, start_samples=phase_at,
                                                field="slurm.node_schedule[1].nodes")
    return Stopper(ck, train_iters=train_iters, next_phase=phase, job_start=time.time() - started_min_ago * 60,
                   device=CPU)


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    """SIGUSR1 and SIGTERM's handlers put back after a test that installs its own."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_stop_reasons_in_order(tmp_path, single_rank_group):
    switch = tmp_path / "kill-switch"
    ck = CheckpointConfig(exit_interval=5, exit_duration_in_mins=60, kill_switch_path=str(switch))
    phase = Phase(1, 2, first_step=8, start_samples=70, field="slurm.node_schedule[1].nodes")
    now = time.time()
    stopper = Stopper(ck, train_iters=20, next_phase=phase, job_start=now, device=torch.device("cpu"))
    assert stopper.reason(20, 200, stepped=True) == stopping.FINISHED
    assert stopper.reason(20, 200, stepped=False) == stopping.FINISHED  # resumed at the end: nothing to train
    assert stopper.reason(4, 40, stepped=True) is None
    assert stopper.reason(5, 40, stepped=False) is None  # exit interval and phase: only after a step of this task
    assert stopper.reason(5, 40, stepped=True).startswith("exit interval 5")
    assert stopper.reason(7, 70, stepped=True).startswith("node schedule: phase 1")
    stopper.job_start = now - 61 * 60  # the job started 61 minutes ago
    assert stopper.reason(6, 60, stepped=False) is None  # at least one step per task
    assert stopper.reason(6, 60, stepped=True).startswith("exit duration of 60 min")
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stopper.reason(6, 60, stepped=False) == "signal received: saved and exiting"
    switch.touch()
    assert stopper.reason(6, 60, stepped=True).startswith(f"kill switch {switch}")


def test_the_end_comes_before_every_other_rule(tmp_path: Path, single_rank_group: None) -> None:
    stopper = make_stopper(tmp_path, exit_interval=5, started_min_ago=120, phase_at=100)
    (tmp_path / "kill-switch").touch()
    os.kill(os.getpid(), signal.SIGTERM)
    for iteration in (20, 25):  # at the last step, and resumed past it (train_iters lowered)
        for stepped in (True, False):
            assert stopper.reason(iteration, 1000, stepped=stepped) == stopping.FINISHED
    assert rule(stopper.reason(19, 1000, stepped=True)) == "node phase"  # one step before the end, the rest apply


def test_the_exit_interval_stops_at_its_multiples_after_a_step(tmp_path: Path, single_rank_group: None) -> None:
    stopper = make_stopper(tmp_path, exit_interval=5)
    assert [i for i in range(1, 20) if rule(stopper.reason(i, 0, stepped=True)) == "exit interval"] == [5, 10, 15]
    assert [i for i in range(1, 20) if stopper.reason(i, 0, stepped=False)] == []  # a task resumed at step 10 trains
    unset = make_stopper(tmp_path)
    assert [i for i in range(1, 20) if unset.reason(i, 0, stepped=True)] == []


def test_a_node_phase_boundary_stops_the_step_that_reaches_it(tmp_path: Path, single_rank_group: None) -> None:
    stopper = make_stopper(tmp_path, phase_at=70)
    assert stopper.reason(6, 69, stepped=True) is None
    assert rule(stopper.reason(7, 70, stepped=True)) == "node phase"
    assert rule(stopper.reason(8, 75, stepped=True)) == "node phase"  # a rampup step may jump past the boundary
    assert stopper.reason(8, 75, stepped=False) is None  # the task that starts in the new phase trains
    last_phase = make_stopper(tmp_path)
    assert last_phase.reason(19, 10**9, stepped=True) is None


def test_the_kill_switch_stops_even_before_the_first_step(tmp_path: Path, single_rank_group: None) -> None:
    stopper = make_stopper(tmp_path)
    switch = tmp_path / "kill-switch"
    assert stopping.kill_switch_path(stopper.checkpoint) == switch
    assert stopper.reason(3, 30, stepped=False) is None
    switch.touch()
    assert rule(stopper.reason(3, 30, stepped=False)) == "kill switch"
    assert rule(stopper.reason(4, 40, stepped=True)) == "kill switch"
    assert str(switch) in stopper.reason(4, 40, stepped=True)  # the log names the file to remove
    switch.unlink()
    assert stopper.reason(4, 40, stepped=True) is None  # removed: the run trains on


def test_without_a_kill_switch_path_no_file_stops_training(tmp_path: Path, single_rank_group: None) -> None:
    stopper = make_stopper(tmp_path, kill_switch=False)
    assert stopping.kill_switch_path(stopper.checkpoint) is None and stopper.kill_switch is None
    (tmp_path / "kill-switch").touch()
    assert stopper.reason(4, 40, stepped=True) is None


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_slurms_warning_and_sigterm_stop_at_the_next_check(tmp_path: Path, single_rank_group: None,
                                                           sig: signal.Signals) -> None:
    stopper = make_stopper(tmp_path)
    assert stopper.reason(3, 30, stepped=True) is None
    os.kill(os.getpid(), sig)
    assert stopper.signals.received == sig
    assert rule(stopper.reason(3, 30, stepped=False)) == "signal"
    assert rule(stopper.reason(4, 40, stepped=True)) == "signal"  # it stays received: the run saves and exits


def test_the_exit_duration_counts_from_the_job_start(tmp_path: Path, single_rank_group: None) -> None:
    """The job started before this task's trainer (module loads, data, resume): its start is what counts."""
    assert make_stopper(tmp_path, minutes=60, started_min_ago=59).reason(3, 30, stepped=True) is None
    late = make_stopper(tmp_path, minutes=60, started_min_ago=61)
    assert rule(late.reason(3, 30, stepped=True)) == "exit duration"
    assert late.reason(3, 30, stepped=False) is None  # a task always trains one step
    assert rule(make_stopper(tmp_path, minutes=1, started_min_ago=1.1).reason(1, 1, stepped=True)) == "exit duration"


def test_when_several_rules_are_due_the_first_in_order_names_the_stop(tmp_path: Path, single_rank_group: None) -> None:
    stopper = make_stopper(tmp_path, exit_interval=5, phase_at=50, started_min_ago=120)
    (tmp_path / "kill-switch").touch()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert rule(stopper.reason(5, 50, stepped=True)) == "exit interval"
    assert rule(stopper.reason(6, 50, stepped=True)) == "node phase"
    assert rule(stopper.reason(6, 40, stepped=True)) == "kill switch"
    (tmp_path / "kill-switch").unlink()
    assert rule(stopper.reason(6, 40, stepped=True)) == "signal"
    stopper.signals.received = None
    assert rule(stopper.reason(6, 40, stepped=True)) == "exit duration"


def test_any_rank_keeps_each_flag_apart(single_rank_group: None) -> None:
    assert stopping.any_rank(CPU, True, False, True) == [True, False, True]
    assert stopping.any_rank(CPU, False) == [False]


def test_signals_record_the_last_signal_received(restored_handlers: None) -> None:
    signals = stopping.Signals()
    assert signals.received is None
    os.kill(os.getpid(), signal.SIGUSR1)
    assert signals.received == signal.SIGUSR1
    os.kill(os.getpid(), signal.SIGTERM)
    assert signals.received == signal.SIGTERM
