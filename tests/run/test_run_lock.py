"""run_lock.py and the job script's lock: one launch per run folder, the second refused naming the holder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bigscience_ops.launch import render as rendering
from bigscience_ops.run import lock as run_lock
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.plan import make_plan
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_render import install_shims

HOLD = ("import sys, time; from bigscience_ops.run import lock as run_lock\n"
        "with run_lock.hold(sys.argv[1], 'bsops launch --local'):\n"
        "    print('held', flush=True); time.sleep(60)\n")


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The run folder tmp_path/run held by another process (as a running local launch holds it) for the whole test:
    a second holder here waits a tenth of lock.py's moment before it is refused (that wait is for a probe's instant,
    which this holder never gives back)."""
    monkeypatch.setattr(run_lock, "_WAIT_S", 0.2)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield run, proc.pid
    proc.kill()
    proc.wait()


def test_a_second_holder_is_refused_naming_the_first(held) -> None:
    run, pid = held
    assert f"pid {pid} on " in (run_lock.holder(run) or "")
    with pytest.raises(run_lock.RunInUse) as refused:
        with run_lock.hold(run, "bsops rollback"):
            pass
    assert f"bsops launch --local (pid {pid} on " in str(refused.value) and " since " in str(refused.value)


def test_the_lock_goes_with_its_holder_however_it_ends(held) -> None:
    run, pid = held
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert run_lock.holder(run) is None
    with run_lock.hold(run, "bsops rollback"):
        assert "bsops rollback (pid" in (run_lock.holder(run) or "")  # seen from another open of the file
    assert run_lock.holder(run) is None


def test_a_link_or_a_pipe_in_the_locks_place_is_refused_and_never_written(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("data\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / run_lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(run_lock.RunInUse, match="plain file"):
        with run_lock.hold(run, "x"):
            pass
    assert target.read_text() == "data\n"
    (run / run_lock.LOCK_NAME).unlink()
    os.mkfifo(run / run_lock.LOCK_NAME)
    with pytest.raises(run_lock.RunInUse, match="not a plain file"):
        with run_lock.hold(run, "x"):
            pass
    assert run_lock.holder(run) is None


@pytest.mark.slow  # waits out real timeouts: the whole suite runs it, the fast lane does not
def test_a_task_of_the_job_script_does_not_train_while_the_run_is_held(tmp_path: Path, trainings: Path, held) -> None:
    """The array task on Slurm: its script finds the run in use by the local launch and ends before the trainer."""
    run, pid = held
    (trainings / "busy.yaml").write_text(tiny_yaml(run))
    exp = load_experiment("busy", trainings)
    script = rendering.write(rendering.render(exp, tmp_path / "r", make_plan(exp)), tmp_path / "r")
    env = install_shims(tmp_path)
    env["BSOPS_LOCAL_LAUNCH"] = "1"  # made-up Slurm ids: nothing to scancel
    ended = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert ended.returncode == 1
    assert not (tmp_path / "argv.jsonl").exists(), "the trainer must not start"
    log = (run / "logs" / "main_log.txt").read_text()
    assert f"not training: the run folder is in use by bsops launch --local (pid {pid} on " in log
    assert "begins at iteration" not in log  # `bsops task begin` never ran: no ledger record


def test_a_task_holds_the_run_until_it_ends(tmp_path: Path, trainings: Path) -> None:
    """While a task's trainer runs, a rollback (or another launch) of the run is refused naming the job."""
    run = tmp_path / "run"
    (trainings / "own.yaml").write_text(tiny_yaml(run))
    exp = load_experiment("own", trainings)
    script = rendering.write(rendering.render(exp, tmp_path / "r", make_plan(exp)), tmp_path / "r")
    env = install_shims(tmp_path)
    env.update(BSOPS_LOCAL_LAUNCH="1", SLURM_ARRAY_JOB_ID="600", SLURM_ARRAY_TASK_ID="2")
    probe = (f"from bigscience_ops.run import lock as run_lock; import pathlib; "
             f"pathlib.Path({str(tmp_path / 'seen')!r}).write_text(run_lock.holder({str(run)!r}) or 'free')")
    torchrun = tmp_path / "shims" / "torchrun"  # the trainer: looks at the lock while the task holds it
    torchrun.write_text(torchrun.read_text().replace("exit 0", f"{sys.executable} -c \"{probe}\"\nexit 0"))
    assert subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=120).returncode == 0
    assert (tmp_path / "seen").read_text().startswith("Slurm job 600_2 (pid ")
    assert run_lock.holder(run) is None


def test_a_slurm_launch_is_refused_while_a_local_launch_holds_the_run(trainings: Path, held) -> None:
    from bigscience_ops.launch import cluster as submit

    run, pid = held
    (trainings / "busy.yaml").write_text(tiny_yaml(run))
    exp = load_experiment("busy", trainings)
    with pytest.raises(run_lock.RunInUse, match=f"pid {pid} on "):
        submit.plan_launch(exp)
    assert not (run / "launches").exists()


def test_a_rollback_is_refused_while_the_run_trains(trainings: Path, held) -> None:
    from click.testing import CliRunner

    from bigscience_ops.cli import main

    run, pid = held
    (trainings / "busy.yaml").write_text(tiny_yaml(run))
    result = CliRunner().invoke(main, ["rollback", "busy", "--step", "10", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and f"in use by bsops launch --local (pid {pid} on " in result.output


TRAINER = "import time; print('training', flush=True); time.sleep(60)"


@pytest.fixture
def trainer(tmp_path: Path):
    """A process that holds the run tmp_path/run as a trainer does (`python -m bigscience_ops.run.lock --trainer
    LOCK -c ...`: the trainers' lock taken, then the same process becomes the "trainer"), with no owner: a trainer
    whose job script, torchrun and launcher are gone."""
    run = tmp_path / "run"
    run.mkdir()
    argv = [sys.executable, *run_lock.trainer_argv(str(run_lock.lock_path(run)), ["-c", TRAINER])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "training"
    yield run, proc.pid
    proc.kill()
    proc.wait()


def test_a_trainer_left_without_its_task_holds_the_run_and_is_named(trainer) -> None:
    run, pid = trainer
    held = run_lock.in_use(run)
    assert held is not None and held.line is None and held.trainers_held and held.trainers == (pid,)
    assert f"{pid} python" in (run_lock.holder(run) or "") and "(trainer)" in (run_lock.holder(run) or "")
    with pytest.raises(run_lock.RunInUse) as refused:
        with run_lock.hold(run, "bsops launch --local"):
            pass
    assert f"{pid} python" in str(refused.value) and f"kill -USR1 {pid}" in str(refused.value)
    assert (run / run_lock.LOCK_NAME).read_bytes() == b""  # the refused one wrote no holder line
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert run_lock.in_use(run) is None
    with run_lock.hold(run, "bsops launch --local"):
        pass


def test_trainers_share_their_lock_and_a_taker_of_the_run_keeps_them_from_starting(tmp_path: Path, trainer) -> None:
    run, pid = trainer
    second = subprocess.run([sys.executable, *run_lock.trainer_argv(str(run_lock.lock_path(run)),
                                                                     ["-c", "print('second')"])],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and second.stdout == "second\n"  # shared: trainers of one task run side by side
    with pytest.raises(run_lock.RunInUse):
        run_lock.hold_as_trainer(tmp_path / "no-such-folder" / run_lock.LOCK_NAME, wait_s=0)
    assert run_lock.main(["--trainer"]) == 2


def test_a_launchers_lock_handed_to_its_task_is_held_by_the_task_after_the_launcher(tmp_path: Path,
                                                                                  trainings: Path) -> None:
    """The local launch's way: the task's job script inherits the launcher's lock (its descriptor's number in
    HELD_ENV) and trains under it; the run stays held while the script runs, by the same lock, with no line of its
    own; a probe from elsewhere sees the launcher's line."""
    run = tmp_path / "run"
    (trainings / "own.yaml").write_text(tiny_yaml(run))
    exp = load_experiment("own", trainings)
    script = rendering.write(rendering.render(exp, tmp_path / "r", make_plan(exp)), tmp_path / "r")
    assert f'/{run_lock.TRAINERS_NAME}"' in script.read_text()  # the job script names the trainers' lock as lock.py
    env = install_shims(tmp_path)
    probe = (f"from bigscience_ops.run import lock as run_lock; import pathlib; "
             f"pathlib.Path({str(tmp_path / 'seen')!r}).write_text(run_lock.holder({str(run)!r}) or 'free')")
    torchrun = tmp_path / "shims" / "torchrun"
    torchrun.write_text(torchrun.read_text().replace("exit 0", f"{sys.executable} -c \"{probe}\"\nexit 0"))
    with run_lock.hold(run, "bsops launch --local") as fd:
        env.update(BSOPS_LOCAL_LAUNCH="1", SLURM_ARRAY_JOB_ID="600", SLURM_ARRAY_TASK_ID="2",
                   **{run_lock.HELD_ENV: str(fd)})
        ended = subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=120, pass_fds=(fd,))
    assert ended.returncode == 0, ended.stdout.decode()[-2000:]
    assert (tmp_path / "seen").read_text().startswith(f"bsops launch --local (pid {os.getpid()} on ")
    argv = json.loads((tmp_path / "argv.jsonl").read_text())
    assert argv[argv.index("-m") + 1:argv.index("-m") + 4] == ["bigscience_ops.run.lock", run_lock.TRAINER_FLAG,
                                                              str(run_lock.lock_path(run))]
    assert run_lock.holder(run) is None


@pytest.mark.slow  # waits out the script's 10 s for a last task's trainers to leave
def test_a_task_does_not_train_beside_trainers_left_without_their_task(tmp_path: Path, trainings: Path,
                                                                      trainer) -> None:
    run, pid = trainer
    (trainings / "busy.yaml").write_text(tiny_yaml(run))
    exp = load_experiment("busy", trainings)
    script = rendering.write(rendering.render(exp, tmp_path / "r", make_plan(exp)), tmp_path / "r")
    env = install_shims(tmp_path)
    env["BSOPS_LOCAL_LAUNCH"] = "1"
    ended = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert ended.returncode == 1 and not (tmp_path / "argv.jsonl").exists()
    log = (run / "logs" / "main_log.txt").read_text()
    assert "not training: trainers of the run still run without their task" in log
