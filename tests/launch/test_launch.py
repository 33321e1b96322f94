"""`bsops launch EXP --local`: the rendered job array run here on the bundled corpus, task after task."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.launch import local as launch
from bigscience_ops.run import ledger
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.config.loading import Overrides, apply_overrides
from bigscience_ops.plan import make_plan
from bigscience_ops.ops.keep import chronicle
from bigscience_ops.views import runinfo
from tests.fixtures_experiments import processes_mentioning, shrunk_tiny_yaml, small_trainings
from tests.fixtures_slurm import wait_until
from tests.fixtures_trainer import checkpoint_steps, scalars

BSOPS = str(Path(sys.executable).with_name("bsops"))

# tiny's scripts, data and PP=2 x 2 "nodes", shrunk to seconds: 2 array tasks, the first exits at step 15.
SMALL = shrunk_tiny_yaml("launch", 5)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_launch_tiny_local_runs_the_array_and_resumes(tmp_path, monkeypatch):
    trainings = small_trainings(tmp_path / "trainings", SMALL)
    run = tmp_path / "run dir"  # a space: every path in the script must be quoted
    argv = [BSOPS, "launch", "small", "--local", "--trainings-dir", str(trainings), "--out", str(run)]
    first = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A second launch of the same run while the first trains: refused in one line naming the first, nothing written.
    wait_until("the first launch to train", lambda: "iteration" in _text(run / "logs" / "main_log.txt"), timeout=300,
               interval=0.5)
    second = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2 and ": started" not in second.stdout, second.stdout + second.stderr
    assert second.stderr.startswith(f"error: the run folder {run} is in use by bsops launch --local (pid {first.pid} on ")
    assert len(second.stderr.strip().splitlines()) == 1
    out, err = first.communicate(timeout=400)
    proc = subprocess.CompletedProcess(argv, first.returncode, out, err)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"run folder: {run}" in proc.stdout
    assert proc.stdout.count(": started, output in") == 2
    # Each task's end in one line, as it ends: why it stopped, then the end of the training.
    assert re.search(r"^array task 1/2: iterations 0 → 15 of 28 in \d+ s: exit interval 15 reached: saved and "
                     r"exiting$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^array task 2/2: finished: iteration 28/28 \(iterations 15 → 28 of 28 in \d+ s\)$",
                     proc.stdout, re.M), proc.stdout
    # Progress while it runs (a log: plain lines, each task's first, at most one per 30 s, its last), and the resume.
    progress = re.findall(r"^iteration (\d+)/28 \(\d+%\) \| lm loss \S+ \| \S+ (?:it/s|s/it), \S+ tokens/s \| ETA ",
                          proc.stdout, re.M)
    assert {"5", "15", "20", "25"} <= set(progress), proc.stdout
    assert "> resumed from" in proc.stdout
    assert (run / "small.slurm").is_file() and (run / "experiment.json").is_file()
    # 200 samples with the rampup: 28 steps; task 1 exits at 15, task 2 resumes and finishes
    assert checkpoint_steps(run) == [10, 15, 20, 28]
    log = (run / "logs" / "main_log.txt").read_text()
    assert "resumed from" in log and "global_step15" in log
    assert len(list((run / "logs").glob("small-*_1.out"))) == 1 and len(list((run / "logs").glob("small-*_2.out"))) == 1
    losses = scalars(run / "tensorboard", "lm loss")
    assert sorted(losses) == list(range(1, 29))
    assert losses[28] < losses[1] - 0.5
    # `bsops info`'s reading of the finished run agrees with the checkpoints, the ledger and TensorBoard.
    exp = apply_overrides(load_experiment("small", trainings), Overrides(out=run))
    # tiny's save shape (save_interval, an exit_interval ending task 1, the final save): the plan's storage is
    # what the run wrote, `du -b` of its checkpoints, within 5%, at the plan's count of saves.
    storage = make_plan(exp).storage
    assert storage.saves == 4 and storage.exit_saves == 1
    written = sum(f.stat().st_size for f in (run / "checkpoints").glob("global_step*/*"))
    assert written == pytest.approx(storage.written, rel=0.05)
    info = runinfo.run_info(exp)
    assert info.latest == 28 and info.checkpoints == [10, 15, 20, 28] and not info.problems
    assert [(t.start_iteration, t.end_iteration, t.exit_code) for t in info.tasks] == [(0, 15, 0), (15, 28, 0)]
    assert all(t.started <= t.ended for t in info.tasks)
    last = info.last
    # The last line logged (every log_interval steps) carries the mean loss of its interval's steps.
    interval = range(last.iteration - exp.logging.log_interval + 1, last.iteration + 1)
    assert last.train_iters == 28 and last.lm_loss == pytest.approx(sum(losses[k] for k in interval) / len(interval),
                                                                     rel=1e-5)
    text = runinfo.info_text(info)
    assert "iteration 28/28 (100.0%): finished" in text and "final step 28" in text and "2 recorded" in text
    assert f"last line:   iteration {last.iteration}, lm loss" in text  # 25: logged every 5, 28 is its exit save
    # The chronicle of the same run: both tasks, what each saved and why it stopped.
    story = chronicle.markdown(exp)
    assert "iterations 0 → 15, exit 0" in story and "iterations 15 → 28, exit 0" in story
    assert "checkpoints saved at iterations 10, 15" in story and "checkpoints saved at iterations 20, 28" in story
    assert "health:" not in story
    # The launch is in the user's runs index: `bsops runs` from another folder lists it, finished, and `bsops info`
    # names the run by its folder (a --out run has no other name).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the commands below run in this process, from another folder
    runs = CliRunner().invoke(main, ["runs", "--json"])
    [row] = json.loads(runs.stdout)["runs"]
    assert (row["experiment"], row["folder"], row["state"], row["job"]) == ("small", str(run), "finished", "local")
    shown = CliRunner().invoke(main, ["info", str(run)])
    assert shown.exit_code == 0 and f"run folder: {run} (named on the command line" in shown.stdout, shown.output
    # The YAML moves on after the training (another seed): samples, info and plot show the run as it trained, each
    # with one line saying the file differs, and the data folder is left as it was.
    data_dir = Path(exp.data.blend[0].prefix).parent
    listing = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in data_dir.iterdir())
    by_run = ["--run", str(run), "--trainings-dir", str(trainings)]
    sampled = ["samples", "small", *by_run, "--iteration", "3", "--json", "--no-text"]
    trained = CliRunner().invoke(main, sampled)
    assert trained.exit_code == 0 and "differs" not in trained.stderr, trained.output
    yaml = trainings / "small.yaml"
    yaml.write_text(yaml.read_text().replace("train: {samples: 200}", "train: {samples: 200, seed: 4321}"))
    note = "now differs from the run's record in train.seed (1234 -> 4321); showing the run as recorded"
    for argv in (sampled, ["info", "small", *by_run], ["plot", "small", *by_run, "--out", "c.png"]):
        moved = CliRunner().invoke(main, argv)
        assert moved.exit_code == 0 and moved.stderr.count(note) == 1, moved.output
    assert moved.stdout.startswith(f"run folder: {run}") and (elsewhere / "c.png").is_file()
    assert CliRunner().invoke(main, sampled).stdout == trained.stdout
    assert sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in data_dir.iterdir()) == listing


@pytest.mark.slow
def test_local_launch_sizes_each_task_by_its_node_phase(tmp_path):
    """1 "node", then 2 once the rampup 4, 8 is over: task 2 runs the script rendered for 2 nodes. One process a
    node (PP=1: DP 1, then 2), the fewest that change size: each costs a fresh interpreter's start and exit. The
    cluster's node-phase test (test_cluster_launch_phases.py) moves PP=2 from 2 processes to 4."""
    trainings = small_trainings(tmp_path / "trainings", SMALL.replace("increment: 2", "increment: 4").replace(
        "exit_interval: 15", "exit_interval: null") + """
parallel: {pipeline: 1, zero_stage: 1}
slurm: {gpus_per_node: 1, node_schedule: [{nodes: 1}, {nodes: 2, from_iteration: 12}]}
""")
    run = tmp_path / "run"
    proc = subprocess.run([BSOPS, "launch", "small", "--local", "--trainings-dir", str(trainings), "--out", str(run),
                           "train.seed=7"], cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "(1 node(s))" in proc.stdout and "(2 node(s))" in proc.stdout
    # The command line's train.seed=7 (the file's is 1234): recorded, value and assignment, and what the trainer ran;
    # --out is the assignment paths.output=RUN, recorded as one.
    assigned = ["train.seed=7", f'paths.output="{run}"']
    recorded = json.loads((run / "experiment.json").read_text())
    assert (recorded["train"]["seed"], recorded["overrides"]) == (7, assigned)
    assert f"overrides (command line): train.seed=7 'paths.output=\"{run}\"'\n" in proc.stdout
    trained = json.loads(max((run / "checkpoints").glob("global_step*/bsops.json"), key=lambda p: p.stat().st_mtime)
                         .read_text())["experiment"]
    assert (trained["train"]["seed"], trained["overrides"]) == (7, assigned)
    steps = checkpoint_steps_only(run)
    assert 12 in steps and steps[-1] == max(scalars(run / "tensorboard", "lm loss"))
    assert "--nodes=2" in (run / "small.slurm").read_text()
    log = (run / "logs" / "main_log.txt").read_text()
    assert "node schedule: phase 1 (2 nodes from step 13" in log and "global_step12" in log


def checkpoint_steps_only(run: Path) -> list[int]:
    """global_stepN checkpoints, not the universal copies beside them."""
    return sorted(int(p.name.removeprefix("global_step")) for p in (run / "checkpoints").glob("global_step*")
                  if p.name.removeprefix("global_step").isdigit())


@pytest.mark.slow
def test_a_rendezvous_port_taken_by_another_program_fails_the_task_at_once(tmp_path, monkeypatch):
    """Two "nodes": the first one's torchrun cannot listen on the port and exits; the srun shim then ends the
    second one, which had connected to the other program and would wait on it until the task's timeout."""
    trainings = small_trainings(tmp_path / "trainings", SMALL)
    with socket.socket() as other:  # a program that accepts connections and never answers
        other.bind(("", 0))
        other.listen(8)
        monkeypatch.setattr(launch, "free_port", lambda: other.getsockname()[1])
        exp = load_experiment("small", trainings)
        with pytest.raises(launch.LaunchError, match=r"^array task 1/1: failed with exit code 1 after \d+ s: .*EADDRINUSE.*; read "
                                                     r".*small-\d+_1\.out \(every task's lines: "):
            launch.launch_local(apply_overrides(exp, Overrides(out=tmp_path / "run", array=1)), timeout_s=300)
    output = next((tmp_path / "run" / "logs").glob("small-*_1.out")).read_text()
    assert "EADDRINUSE" in output
    assert "srun: error: task 0: exited 1; terminating the other tasks (--kill-on-bad-exit)" in output


def test_the_rendezvous_port_is_free_and_below_the_kernels_own_range():
    low, high = launch._ephemeral_ports()
    assert launch.PORTS_FROM < low <= high
    ports = {launch.free_port() for _ in range(20)}
    assert all(launch.PORTS_FROM <= port < low for port in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("", ports.pop()))  # free: it binds


def test_ephemeral_range_falls_back_to_linuxs_default_when_unreadable(tmp_path):
    (tmp_path / "range").write_text("40000\t50000\n")
    assert launch._ephemeral_ports(tmp_path / "range") == (40000, 50000)
    assert launch._ephemeral_ports(tmp_path / "missing") == (32768, 60999)


def _srun_shim(tmp_path: Path) -> Path:
    shim = tmp_path / "srun"
    launch._write_shim(shim, launch.SRUN)
    return shim


def test_the_srun_shim_ends_the_other_nodes_when_one_fails_with_kill_on_bad_exit(tmp_path):
    body = 'if [ "$SLURM_PROCID" = 1 ]; then echo "node 1 failed" >&2; exit 3; fi; exec sleep 600'
    proc = subprocess.run([str(_srun_shim(tmp_path)), "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                           "bash", "-c", body], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr  # the failed node's code, not the SIGTERM of the one ended for it
    assert "node 1 failed" in proc.stderr
    assert "srun: error: task 1: exited 3; terminating the other tasks (--kill-on-bad-exit)" in proc.stderr


def test_the_srun_shim_without_kill_on_bad_exit_waits_for_every_node(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    body = f'if [ "$SLURM_PROCID" = 1 ]; then exit 3; fi; sleep 1; touch {marks}/node-$SLURM_PROCID'
    proc = subprocess.run([str(_srun_shim(tmp_path)), "-N", "2", "bash", "-c", body], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3 and [p.name for p in marks.iterdir()] == ["node-0"]
    assert "terminating" not in proc.stderr


# A node's command as the job script runs it: itself ignoring SIGUSR1 (trap "" USR1; exec torchrun), its
# "trainer" in a session of its own (as torchrun starts them) saving on SIGUSR1 once it is ready.
TRAINER_LIKE = """
import os, signal, subprocess, sys, time
marks, rank = sys.argv[1], os.environ["SLURM_PROCID"]
if sys.argv[2:] == ["child"]:
    signal.signal(signal.SIGUSR1, lambda *_: (open(f"{marks}/saved-{rank}", "w").close(), sys.exit(0)))
    open(f"{marks}/ready-{rank}", "w").close()
    while True:
        time.sleep(60)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
sys.exit(subprocess.run([sys.executable, __file__, marks, "child"], start_new_session=True).returncode)
"""


def test_the_srun_shim_hands_sigusr1_to_every_process_of_the_step(tmp_path):
    """As srun: the job script passes Slurm's warning on to srun, and srun to every process of the step, the
    trainers that torchrun started in sessions of their own too (bsops' graceful local stop relies on it)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "node.py"
    script.write_text(TRAINER_LIKE)
    err = tmp_path / "stderr"
    with open(err, "w") as sink:
        proc = subprocess.Popen([str(_srun_shim(tmp_path)), "--nodes=2", "--kill-on-bad-exit=1", sys.executable,
                                 str(script), str(marks)], stderr=sink)
    try:
        wait_until("both nodes' trainers to be ready",
                   lambda: len(list(marks.glob("ready-*"))) == 2 or proc.poll() is not None)
        assert sorted(p.name for p in marks.iterdir()) == ["ready-0", "ready-1"], err.read_text()
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=60) == 0, err.read_text()
    finally:
        proc.kill()
        for pid in processes_mentioning(str(marks)):
            os.kill(pid, signal.SIGKILL)  # only where the test fails
    assert sorted(p.name for p in marks.glob("saved-*")) == ["saved-0", "saved-1"]


def _script_with_usr1_trap(trap: str, ready: Path) -> subprocess.Popen:
    """A job script stand-in that takes SIGUSR1 as `trap` says, once `ready` exists (as bsops sends it only
    once the trainers train)."""
    proc = subprocess.Popen(["bash", "-c", f"trap {trap} USR1; touch {ready}; while :; do sleep 1; done"],
                            start_new_session=True)
    wait_until(f"the script to set its trap ({ready})", ready.exists)
    return proc


@pytest.mark.slow  # waits out real timeouts: the whole suite runs it, the fast lane does not
def test_a_task_asked_to_save_is_waited_for_and_a_second_stop_ends_the_wait(tmp_path):
    """bsops waits for trainers that save, and stops waiting at a second Ctrl-C or SIGTERM (a save that hangs)."""
    saving = _script_with_usr1_trap("'exit 0'", tmp_path / "saving")
    lines: list[str] = []
    assert launch._save_first(saving, lines.append, save_s=120) is True
    assert lines and lines[0].startswith("stopping: the trainers save and exit first (up to 120 s;")

    def closed_terminal(line: str) -> None:
        raise OSError(5, "Input/output error")  # what writing to a terminal that hung up (SIGHUP) gives

    saving = _script_with_usr1_trap("'exit 0'", tmp_path / "saving-unheard")
    assert launch._save_first(saving, closed_terminal, save_s=120) is True
    hanging = _script_with_usr1_trap("''", tmp_path / "hanging")
    second_stop = threading.Timer(1, os.kill, (os.getpid(), signal.SIGTERM))
    second_stop.start()
    try:
        start = time.monotonic()
        assert launch._save_first(hanging, lines.append, save_s=3600) is False
        # A hang detector, not a speed test: the second stop ends the wait after its 1 s; a wait it did not end
        # would last save_s, an hour.
        assert time.monotonic() - start < 60
    finally:
        second_stop.join()
        launch._stop(hanging)
    assert hanging.poll() is not None


def test_a_failing_bsops_takes_its_running_task_down_with_it(tmp_path):
    """bsops' own output closed (`bsops launch ... | head`) or any error of its own: the task is stopped, not left
    training unwatched."""
    script = tmp_path / "task.sh"
    script.write_text(f'echo $$ > {tmp_path}/pid; while :; do echo "iteration 1/ 9 |"; sleep 1; done\n')

    def closed_output(line: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        launch._run_task(script, dict(os.environ), tmp_path / "task.out", closed_output, 120, "array task 1",
                         tmp_path / "checkpoints", save_s=120)
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow
def test_ctrl_c_on_a_local_launch_stops_the_task_and_its_trainers_after_their_save(tmp_path):
    """Left running without bsops, a task would train on unwatched, and the next launch would train the same run
    at the same time: bsops stops it and returns once none of its processes is left. Its trainers save first,
    as at Slurm's warning signal, so the next launch resumes where this one stopped; bsops says which iteration
    they saved, as `latest` names it and the ledger's end record says (SIGTERM and SIGHUP take the same path)."""
    proc, out, err, run, _ = _stopped_while_training(tmp_path, "stop", lambda proc, run: proc.send_signal(signal.SIGINT))
    assert proc.returncode == 130, out[-3000:] + err  # as a shell's command stopped by Ctrl-C
    assert "Aborted!" not in err and "Traceback" not in err and "error:" not in err, err
    assert processes_mentioning(str(run / "experiment.json")) == []
    # Saved at the iteration it stopped at, the run unfinished (about 2,500 iterations).
    [saved] = checkpoint_steps(run)
    assert 1 <= saved < 2000, out + err
    assert ledger.latest_iteration(run / "checkpoints") == saved
    assert re.fullmatch(rf"array task 1/\d+: stopped by Ctrl-C: the trainers saved iteration {saved}; run the same "
                        rf"command again to resume from it \(see .*\.out\)\n", err), err
    end = ledger.read(run / ledger.LEDGER_NAME)[-1]
    assert (end.event, end.iteration, end.exit_code) == ("end", saved, 0)
    assert "stopping (Ctrl-C): the trainers save and exit first" in out
    main_log = (run / "logs" / "main_log.txt").read_text()
    assert "SIGUSR1 received (stop asked by bsops launch --local: Ctrl-C): passing" in main_log, main_log[-3000:]
    assert "time limit near" not in main_log
    assert f"> signal received: saved and exiting at iteration {saved}\n" in main_log, main_log[-3000:]


@pytest.mark.slow
def test_a_kill_switch_touched_during_a_local_launch_stops_it_after_the_save(tmp_path):
    """The task saves and exits 0 on the switch; no further task starts, and a new launch is refused."""
    proc, out, err, run, argv = _stopped_while_training(tmp_path, "halt", lambda proc, run: (run / "kill-switch").touch())
    assert proc.returncode == 0, err
    assert f"the kill switch {run / 'kill-switch'} exists: no further task is started" in out
    assert "array task 2/" not in out and "training not finished" in out
    [saved] = checkpoint_steps(run)
    assert re.search(rf"^array task 1/\d+: iterations 0 → {saved} of \d+ in .*: kill switch {re.escape(str(run))}"
                     rf"/kill-switch found: saved and exiting$", out, re.M), out
    assert f"> kill switch {run / 'kill-switch'} found: saved and exiting at iteration {saved}" in (
        run / "logs" / "main_log.txt").read_text()
    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and f"error: the kill switch {run / 'kill-switch'} exists" in again.stderr


def _stopped_while_training(tmp_path, purpose, stop):
    """`bsops launch --local` of a long shrunk run, `stop(proc, run)` once its trainers train; returns the finished
    process, its stdout and stderr, the run folder and the argv. Long enough, and with no scheduled save or exit,
    that its one checkpoint can only be the stop's: bsops relays the first iteration line late under load, and
    the trainers train on meanwhile."""
    shrunk = shrunk_tiny_yaml(purpose, 1)
    long = (shrunk.replace("train: {samples: 200}", "train: {samples: 20000}")
            .replace("save_interval: 10, exit_interval: 15", "save_interval: 10000, exit_interval: 10000"))
    assert long.count("10000") == 2 and "samples: 20000}" in long
    trainings = small_trainings(tmp_path / "trainings", long)
    run = tmp_path / "run"
    argv = [BSOPS, "launch", "small", "--local", "--trainings-dir", str(trainings), "--out", str(run)]
    # SIGINT as a terminal's Ctrl-C sends it, even where pytest runs as a background job: such a job inherits SIGINT
    # ignored, and Python keeps an ignored SIGINT ignored (the Ctrl-C test then waited for the whole run).
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.lstrip().startswith("iteration"):  # the trainers are training
                break
        stop(proc, run)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in processes_mentioning(str(run / "experiment.json")):
            os.kill(pid, signal.SIGKILL)  # only where the test fails: nothing of the run may outlive it
    return proc, out, err, run, argv
