"""slurm/taskenv.py: `TaskEnv`, the one reader of a task's SLURM_* variables (and, for a local launch, their
writer): what it reads, what it writes back, and the task id squeue names."""

from __future__ import annotations

import pytest

from bigscience_ops import slurm

@pytest.mark.parametrize("task", [
    slurm.TaskEnv(),
    slurm.TaskEnv(job_id="812", array_job_id="800", array_task_id="12", array_task_min="1", array_task_max="40",
                  node_list="r7i4n[1-7],r8i0n0", num_nodes=8, job_name="tr8-104B", submit_dir="/scratch/run",
                  cpus_per_task="40"),
    slurm.TaskEnv(job_id="9", node_list="localhost,127.0.0.1", num_nodes=2, local=True),
])
def test_task_env_written_is_read_back_equal(task: slurm.TaskEnv) -> None:
    written = task.to_env()
    assert all(key.startswith("SLURM_") or key == slurm.LOCAL_LAUNCH for key in written)
    assert slurm.TaskEnv.from_env(written) == task


def test_task_env_writes_back_what_a_job_was_given() -> None:
    given = {"SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1230", "SLURM_ARRAY_TASK_ID": "4",
             "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "8", "SLURM_JOB_NODELIST": "n[1-2]",
             "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_JOB_NAME": "tiny", "SLURM_SUBMIT_DIR": "/w",
             "SLURM_CPUS_PER_TASK": "4"}
    assert slurm.TaskEnv.from_env({**given, "SLURM_PROCID": "0", "HOME": "/root"}).to_env() == given


def test_the_task_id_is_squeues_name_for_it() -> None:
    """What an array task's SLURM_* variables say (recorded: job 33 is task 1 of array 22)."""
    task = slurm.TaskEnv.from_env({"SLURM_JOB_ID": "33", "SLURM_ARRAY_JOB_ID": "22", "SLURM_ARRAY_TASK_ID": "1"})
    assert task.task_id == "22_1" and task.job_id == "33"
    assert slurm.TaskEnv.from_env({"SLURM_JOB_ID": "712"}).task_id == "712"
    assert slurm.TaskEnv.from_env({}).task_id is None


def test_outside_slurm_nothing_is_set() -> None:
    assert slurm.TaskEnv.from_env({"HOME": "/root", "PATH": "/bin"}) == slurm.TaskEnv()
    assert slurm.TaskEnv().to_env() == {}


@pytest.mark.parametrize(("given", "nodes"), [
    ({"SLURM_JOB_NUM_NODES": "4", "SLURM_NNODES": "2"}, 4),
    ({"SLURM_NNODES": "2"}, 2),
    ({"SLURM_JOB_NUM_NODES": "", "SLURM_NNODES": "3"}, 3),
    ({"SLURM_JOB_NUM_NODES": " 4 "}, 4),
    ({"SLURM_JOB_NUM_NODES": "four", "SLURM_NNODES": "2"}, 2),
    ({"SLURM_JOB_NUM_NODES": "-1"}, None),
    ({"SLURM_JOB_NUM_NODES": "2.5"}, None),
    ({}, None),
])
def test_the_node_count_is_the_first_whole_number(given: dict[str, str], nodes: int | None) -> None:
    assert slurm.TaskEnv.from_env(given).num_nodes == nodes


def test_only_a_set_local_launch_variable_makes_the_ids_made_up() -> None:
    assert slurm.TaskEnv.from_env({slurm.LOCAL_LAUNCH: "1"}).local
    assert not slurm.TaskEnv.from_env({slurm.LOCAL_LAUNCH: ""}).local
    assert not slurm.TaskEnv.from_env({"SLURM_JOB_ID": "9"}).local


def test_this_processs_environment_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "r7i4n[1-7],r8i0n0")
    task = slurm.TaskEnv.from_env()
    assert (task.job_id, task.node_list, task.task_id) == ("4242", "r7i4n[1-7],r8i0n0", "4242")
