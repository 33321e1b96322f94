"""The rendered training job on the real cluster: the warning signal and scancel reach every trainer,
which saves and exits; one failing node ends the whole job; a spent failure budget cancels the array."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bigscience_ops import slurm
from bigscience_ops.run import ledger
from bigscience_ops.launch import cluster as submit
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.schema import Experiment
from tests.fixtures_experiments import SHRUNK_MODEL, tiny_yaml
from tests.fixtures_slurm import SlurmCluster, wait_until
from tests.fixtures_smtp import alerts_yaml
from tests.fixtures_runs import commit_checkpoint

pytestmark = pytest.mark.slurm


def experiment(trainings: Path, run: Path, cluster: SlurmCluster, name: str, yaml: str) -> Experiment:
    (trainings / f"{name}.yaml").write_text(tiny_yaml(run, yaml))
    exp = load_experiment(name, trainings)
    assert exp.slurm.job_name.startswith(cluster.prefix)
    return exp


def torchrun_shim(folder: Path, body: str) -> str:
    """A torchrun on the job's PATH that stands in for a trainer that fails (what a real cluster
    cannot produce on demand); returns the env_setup line that puts it first."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "torchrun").write_text("#!/bin/bash\n" + body)
    (folder / "torchrun").chmod(0o755)
    return f"export PATH={folder}:$PATH"


def launch(exp: Experiment, cluster: SlurmCluster) -> str:
    job_id = submit.submit(submit.plan_launch(exp)).job_id
    cluster.submitted.append(job_id)
    return job_id


def attempts(exp: Experiment) -> list[ledger.Attempt]:
    return ledger.attempts(ledger.read(Path(exp.paths.output) / ledger.LEDGER_NAME))


@pytest.mark.slow
def test_the_warning_signal_and_scancel_both_let_the_trainers_save_and_the_next_task_resumes(
        slurm_cluster: SlurmCluster, trainings: Path, tmp_path: Path) -> None:
    exp = experiment(trainings, tmp_path / "run", slurm_cluster, "sig",
                     f"slurm: {{job_name: {slurm_cluster.prefix}-sig, partition: {slurm_cluster.partition}, "
                     f"array: 2, time: '10'}}\n"
                     "train: {samples: 100_000}\nlogging: {log_interval: 1, eval_interval: 100_000}\n"
                     "checkpoint: {save_interval: 100_000, exit_interval: 100_000}\n" + SHRUNK_MODEL)
    job_id = launch(exp, slurm_cluster)
    main_log = Path(exp.paths.logs) / "main_log.txt"

    def iterations_from(start: int) -> int:
        lines = re.findall(r"^\s*iteration\s+(\d+)/", main_log.read_text(), re.M) if main_log.exists() else []
        return sum(int(i) > start for i in lines)

    def saved_on_signal() -> list[int]:
        return [int(i) for i in re.findall(r"> signal received: saved and exiting at iteration (\d+)", main_log.read_text())]

    wait_until("the third iteration line", lambda: iterations_from(0) >= 3, timeout=240, interval=0.5)
    # What Slurm does --signal=B:USR1@N seconds before the time limit: signal the batch shell only.
    slurm.run(slurm.scancel_argv([f"{job_id}_1"], signal="USR1", batch_only=True), timeout=30)
    wait_until("array task 1 to end", lambda: [a for a in attempts(exp) if a.ended], timeout=180, interval=0.5)
    [stopped] = saved_on_signal()
    first = attempts(exp)[0]
    assert first.exit_code == 0 and first.start_iteration == 0 and first.end_iteration == stopped >= 3

    # Task 2 resumes there; a plain scancel (SIGTERM to every process of the job, SIGKILL after KillWait)
    # lets its trainers save too, and the job script outlives the SIGTERM to record the task's end.
    wait_until("task 2 to train on", lambda: iterations_from(stopped) >= 3, timeout=240, interval=0.5)
    assert attempts(exp)[1].start_iteration == stopped
    slurm.run(slurm.scancel_argv([job_id]), timeout=30)
    wait_until("the job to end", lambda: not slurm_cluster.jobs(job_id), timeout=180, interval=0.5)
    [_, cancelled] = saved_on_signal()
    assert cancelled > stopped and ledger.latest_iteration(Path(exp.paths.checkpoints)) == cancelled
    second = attempts(exp)[1]
    assert second.ended is not None and second.end_iteration == cancelled and second.progressed, second
    assert "SIGTERM received (job cancelled or out of time" in main_log.read_text()


def test_one_failing_node_ends_the_job_and_counts_against_the_budget(
        slurm_cluster: SlurmCluster, trainings: Path, tmp_path: Path) -> None:
    # Node rank 1 fails at once; node rank 0 would otherwise wait in a collective until the time limit.
    setup = torchrun_shim(tmp_path / "shims", 'if [[ $2 == 1 ]]; then echo "rank 1 failed" >&2; exit 3; fi\n'
                                              "exec sleep 300\n")
    exp = experiment(trainings, tmp_path / "run", slurm_cluster, "onefails",
                     f"slurm: {{job_name: {slurm_cluster.prefix}-onefails, partition: {slurm_cluster.partition}, "
                     f"array: 1, time: '10', env_setup: [{json.dumps(setup)}]}}\n")
    job_id = launch(exp, slurm_cluster)
    wait_until("the job to end", lambda: not slurm_cluster.jobs(job_id), timeout=90, interval=0.5)
    [attempt] = attempts(exp)
    assert attempt.exit_code not in (0, None) and not attempt.progressed
    # srun's own report of the failing task reaches the run's log. (The task's last stderr line may not:
    # --kill-on-bad-exit can end the step before slurmstepd has forwarded it, as seen in CI.)
    assert re.search(r"srun: error: \S+: task 1: Exited with exit code 3",
                     (Path(exp.paths.logs) / "main_log.txt").read_text())


def test_a_spent_failure_budget_cancels_the_rest_of_the_array_and_alerts_once(
        slurm_cluster: SlurmCluster, trainings: Path, tmp_path: Path, plain_server) -> None:
    inbox, port = plain_server
    setup = torchrun_shim(tmp_path / "shims", "exit 1\n")
    exp = experiment(trainings, tmp_path / "run", slurm_cluster, "loop",
                     f"slurm: {{job_name: {slurm_cluster.prefix}-loop, partition: {slurm_cluster.partition}, "
                     f"array: 5, time: '10', failure_budget: 2, env_setup: [{json.dumps(setup)}]}}\n"
                     + alerts_yaml(port))
    job_id = launch(exp, slurm_cluster)
    wait_until("the array to leave the queue", lambda: not slurm_cluster.jobs(job_id), timeout=120, interval=0.5)
    # Each task failed: its launchers exit 1, or srun's --kill-on-bad-exit ends the slower one first (143).
    tasks = attempts(exp)
    assert [a.job_id for a in tasks] == [f"{job_id}_1", f"{job_id}_2"]
    assert all(a.exit_code in (1, 143) and not a.progressed for a in tasks), tasks
    assert ledger.stopped(ledger.read(Path(exp.paths.output) / ledger.LEDGER_NAME))
    [mail] = inbox.messages
    assert "crash loop" in mail["Subject"] and f"scancel {job_id}" in mail.get_content()
    # Tasks 4 and 5 never started: no output file, nothing waiting for nodes.
    outputs = sorted(p.name for p in Path(exp.paths.logs).glob("*.out"))
    assert outputs == [f"{exp.slurm.job_name}-{job_id}_{i}.out" for i in (1, 2, 3)], outputs


@pytest.mark.slow
def test_leftover_tasks_of_a_finished_training_end_at_once_and_cancel_the_rest(
        slurm_cluster: SlurmCluster, trainings: Path, tmp_path: Path, plain_server) -> None:
    inbox, port = plain_server
    setup = torchrun_shim(tmp_path / "shims", "echo trained >> \"$LOGS_PATH/trained\"; exit 1\n")
    exp = experiment(trainings, tmp_path / "run", slurm_cluster, "done",
                     f"slurm: {{job_name: {slurm_cluster.prefix}-done, partition: {slurm_cluster.partition}, "
                     f"array: 4, time: '10', failure_budget: 1, env_setup: [{json.dumps(setup)}]}}\n"
                     + alerts_yaml(port))
    from bigscience_ops.schedule.run import run_schedule

    final = run_schedule(exp).train_iters
    checkpoints = Path(exp.paths.checkpoints)
    (checkpoints / f"global_step{final}").mkdir(parents=True)
    (checkpoints / f"global_step{final}" / "bsops.json").write_text(json.dumps({"iteration": final}))
    commit_checkpoint(checkpoints / f"global_step{final}")
    (checkpoints / "latest").write_text(f"global_step{final}")
    job_id = launch(exp, slurm_cluster)
    wait_until("the array to leave the queue", lambda: not slurm_cluster.jobs(job_id), timeout=120, interval=0.5)
    log = (Path(exp.paths.logs) / "main_log.txt").read_text()
    assert f"not training: the training finished at iteration {final}" in log
    assert f"cancelled the pending tasks of array {job_id} ({job_id}_[2-4" in log
    # One task ran (and used no trainer), the others never started; no begin recorded, so no crash loop.
    assert sorted(p.name for p in Path(exp.paths.logs).glob("*.out")) == [f"{exp.slurm.job_name}-{job_id}_1.out"]
    assert attempts(exp) == [] and not (Path(exp.paths.logs) / "trained").exists()
    assert inbox.messages == []


def test_a_task_that_stops_on_the_kill_switch_cancels_the_rest_of_the_array(
        slurm_cluster: SlurmCluster, trainings: Path, tmp_path: Path, plain_server) -> None:
    inbox, port = plain_server
    switch = tmp_path / "kill-switch"
    # The trainer finds the switch someone touched, saves and exits 0 (what a real cluster cannot time on demand).
    setup = torchrun_shim(tmp_path / "shims", f"touch {switch}; exit 0\n")
    exp = experiment(trainings, tmp_path / "run", slurm_cluster, "halt",
                     f"slurm: {{job_name: {slurm_cluster.prefix}-halt, partition: {slurm_cluster.partition}, "
                     f"array: 4, time: '10', failure_budget: 1, env_setup: [{json.dumps(setup)}]}}\n"
                     f"checkpoint: {{kill_switch_path: {switch}}}\n" + alerts_yaml(port))
    job_id = launch(exp, slurm_cluster)
    wait_until("the array to leave the queue", lambda: not slurm_cluster.jobs(job_id), timeout=120, interval=0.5)
    log = (Path(exp.paths.logs) / "main_log.txt").read_text()
    assert f"the run is stopped by its kill switch: cancelled the pending tasks of array {job_id} ({job_id}_[2-4" in log
    assert sorted(p.name for p in Path(exp.paths.logs).glob("*.out")) == [f"{exp.slurm.job_name}-{job_id}_1.out"]
    [task] = attempts(exp)
    assert task.exit_code == 0 and inbox.messages == []
