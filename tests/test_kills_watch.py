"""The watchdog's decisions that mutation testing found untested (scripts/mutation.py): each test here fails on a
mutant of ops/watch/ that every other test let through. Real run folders; the tests read the facts in a status
line or an alert (pids, ids, iterations, conditions), not its sentences."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from bigscience_ops.config import load_experiment
from bigscience_ops.ops.watch import lifecycle, local_run
from bigscience_ops.run.lock import Holding
from tests.fixtures_experiments import tiny_yaml

NOW = datetime(2026, 11, 22, 10, 0, 0)


@pytest.fixture
def run(trainings: Path, tmp_path: Path) -> lifecycle.RunState:
    (trainings / "watched.yaml").write_text(tiny_yaml(tmp_path / "watched"))
    exp = load_experiment("watched", trainings)
    (tmp_path / "watched").mkdir()
    return lifecycle.run_state(exp)


def test_a_local_run_held_by_its_launcher_names_its_processes_and_where_it_stands(run) -> None:
    holding = Holding("bsops launch --local (pid 4711 on n7) since 2026-11-22T09:00:00", pids=(4711, 4712, 4713),
                      trainers=(4713,), host="n7", names=((4711, "bash"), (4712, "tee"), (4713, "python3")))
    report = local_run.evaluate("watched-job", holding, run, now=NOW)
    assert report.alerts == () and report.finished_at is None and len(report.lines) == 1
    [line] = report.lines
    assert line.startswith(report.stamp) and "watched-job" in line
    assert all(str(pid) in line for pid in (4711, 4712, 4713)) and "n7" in line
    assert f"{run.iteration} of {run.train_iters}" in line
    # its launcher gone (pid 4711 no longer among the holders): said in the same line
    gone = Holding(holding.line, pids=(4712, 4713), trainers=(4713,), host="n7", names=holding.names)
    [line] = local_run.evaluate("watched-job", gone, run, now=NOW).lines
    assert "4711" in line and "4712" in line
    # trainers left without their task, on another host: no pid to name
    [line] = local_run.evaluate("watched-job", Holding(None, trainers_held=True), run, now=NOW).lines
    assert "4711" not in line and "n7" not in line and str(run.train_iters) in line


def test_a_local_run_nobody_holds_and_never_launched_is_healthy_and_says_so(run) -> None:
    report = local_run.evaluate("watched-job", None, run, now=NOW)
    assert not run.launched and report.alerts == () and report.healthy and report.finished_at is None
    [line] = report.lines
    assert line.startswith(report.stamp) and "watched-job" in line
