"""Slurm commands and the task environment of bigscience_ops.slurm (the parsers of real output:
test_slurm_output.py; the argv builders: test_slurm_argv.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bigscience_ops import slurm
from tests.fixtures_slurm import RECORDED as ASSETS
from tests.fixtures_slurm import SlurmCluster, wait_until


def test_run_refuses_other_commands_and_bad_timeouts() -> None:
    with pytest.raises(ValueError, match="runs only"):
        slurm.run(["rm", "-rf", "/"])
    with pytest.raises(ValueError, match="positive"):
        slurm.run(["sinfo"], timeout=0)


def _fake_bin(tmp_path: Path, name: str, body: str) -> Path:
    """A stand-in Slurm client at the subprocess edge, for failures a healthy cluster cannot show."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def test_run_errors_carry_argv_code_and_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = (ASSETS / "scontrol_unknown_job.stderr").read_text()
    bindir = _fake_bin(tmp_path, "scontrol", f"printf '%s' '{stderr}' >&2; exit 1")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(slurm.SlurmCommandError) as info:
        slurm.show_job("99999999")
    err = info.value
    assert err.argv == ["scontrol", "--oneliner", "show", "job", "99999999"]
    assert err.returncode == 1 and "Invalid job id" in err.stderr
    assert str(err) == "scontrol failed (exited with code 1): Invalid job id specified"  # one human line
    assert "scontrol --oneliner show job 99999999" in err.detail() and "code: 1" in err.detail()


def test_run_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = _fake_bin(tmp_path, "squeue", "exec sleep 30")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(slurm.SlurmCommandError, match="did not answer within 0.5 s") as info:
        slurm.query_jobs(timeout=0.5)
    assert info.value.returncode is None and info.value.argv[0] == "squeue"


def test_missing_client_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slurm.SlurmCommandError, match="squeue is not on PATH"):
        slurm.query_jobs(timeout=5)


def test_squeue_error_with_exit_code_zero_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Real squeue 22.05 exits 0 for an unknown --user and prints only this on stderr.
    bindir = _fake_bin(tmp_path, "squeue", "echo 'squeue: error: Invalid user: nosuch' >&2; exit 0")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(slurm.SlurmCommandError, match="Invalid user: nosuch"):
        slurm.query_jobs(users=["nosuch"], timeout=5)


def test_group_users() -> None:
    assert "root" in slurm.group_users("root")
    with pytest.raises(slurm.SlurmError, match="does not exist"):
        slurm.group_users("no-such-group-bsops")


# ----------------------------------------------------------------------------- Slurm commands run with a pinned environment, and group members come from NSS one group at a time.


GETENT = """#!/bin/bash
case "$1 ${2-}" in
  "group six") echo "six:*:1234:alice,bob" ;;
  "group ") printf 'root:x:0:\\n' ;;
  "passwd ") printf 'root:x:0:0:root:/root:/bin/bash\\ncarol:x:1001:1234:Carol:/home/carol:/bin/bash\\n' ;;
  group*) exit 2 ;;
  *) exit 1 ;;
esac
"""


@pytest.fixture
def getent_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shim = tmp_path / "bin" / "getent"
    shim.parent.mkdir()
    shim.write_text(GETENT)
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    return shim


def test_group_members_come_from_getent_group(getent_shim: Path) -> None:
    assert slurm.group_users("six") == ["alice", "bob", "carol"]


def test_an_unknown_group_is_named(getent_shim: Path) -> None:
    with pytest.raises(slurm.SlurmError, match="'nobody-here'"):
        slurm.group_users("nobody-here")


def test_pinned_env_drops_user_formats_and_pins_the_time_format() -> None:
    env = slurm.pinned_env({"PATH": "/bin", "SLURM_CONF": "/x.conf", "SLURM_TIME_FORMAT": "relative",
                            "SQUEUE_FORMAT": "%i", "SQUEUE_FORMAT2": "jobid", "SQUEUE_SORT": "-t",
                            "SACCT_FORMAT": "jobid", "SINFO_FORMAT": "%N", "SCANCEL_INTERACTIVE": "1"})
    assert env == {"PATH": "/bin", "SLURM_CONF": "/x.conf", "SLURM_TIME_FORMAT": "standard"}
    assert slurm.pinned_env({"SQUEUE_FORMAT": "%i"}, {"SQUEUE_FORMAT": "%A"})["SQUEUE_FORMAT"] == "%A"


@pytest.mark.slurm
def test_queries_ignore_the_callers_slurm_settings(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sleeper = slurm_cluster.script(tmp_path, "sleep.sh", "sleep 60")
    job_id = slurm_cluster.submit(sleeper, name=f"{slurm_cluster.prefix}-env")
    wait_until("the job running", lambda: [j for j in slurm_cluster.jobs(job_id) if j.state == "RUNNING"])
    # A user's shell settings that change what squeue and scontrol print or select.
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    monkeypatch.setenv("SQUEUE_FORMAT", "%i %j")
    monkeypatch.setenv("SQUEUE_FORMAT2", "jobid,name")
    monkeypatch.setenv("SQUEUE_STATES", "PENDING")
    monkeypatch.setenv("SQUEUE_SORT", "-i")
    [job] = [j for j in slurm.query_jobs(timeout=30) if j.array_job_id == job_id]
    assert job.state == "RUNNING" and job.start_time is not None and job.submit_time is not None
    [shown] = slurm.show_job(job_id, timeout=30)
    assert slurm.parse_timestamp(shown["StartTime"]) == job.start_time
    slurm.cancel([job_id], timeout=30)


@pytest.mark.slurm
def test_a_job_never_inherits_a_local_launchs_port_or_ids(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch hands the submitting shell's environment to the job: a shell where `bsops launch --local` variables
    are set would give every job of the cluster the same rendezvous port (the job script takes BSOPS_MASTER_PORT)."""
    monkeypatch.setenv("BSOPS_MASTER_PORT", "23456")
    monkeypatch.setenv(slurm.LOCAL_LAUNCH, "1")
    monkeypatch.setenv("BSOPS_TEST_KEPT", "yes")
    seen = tmp_path / "env.txt"
    job_id = slurm_cluster.submit(slurm_cluster.script(tmp_path, "env.sh", f"env > {seen}.part && mv {seen}.part {seen}"),
                                  name=f"{slurm_cluster.prefix}-localenv")
    wait_until("the job's environment written", seen.exists)
    names = {line.partition("=")[0] for line in seen.read_text().split("\n")}
    assert "BSOPS_TEST_KEPT" in names and "SLURM_JOB_ID" in names, job_id
    assert not names & {"BSOPS_MASTER_PORT", slurm.LOCAL_LAUNCH}


# --- the task environment, read and written --------------------------------------------------------

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


def test_the_package_face_names_every_public_function_of_its_modules() -> None:
    """Callers use slurm.NAME: a name in __all__ that the face does not import fails only where that
    caller runs (a real cluster), so both directions are checked here."""
    import importlib
    import inspect

    missing = [name for name in slurm.__all__ if not hasattr(slurm, name)]
    assert missing == []
    unlisted = []
    for module in ("argv", "commands", "errors", "output", "script", "taskenv"):
        mod = importlib.import_module(f"bigscience_ops.slurm.{module}")
        for name, value in vars(mod).items():
            defined_here = getattr(value, "__module__", None) == mod.__name__
            if not name.startswith("_") and defined_here and (inspect.isfunction(value) or inspect.isclass(value)):
                if name not in slurm.__all__:
                    unlisted.append(f"{module}.{name}")
    assert unlisted == []
