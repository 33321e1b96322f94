"""slurm/commands.py: the one place that runs Slurm's clients (a pinned environment, a timeout always) and the
queries built on it. Failures a healthy cluster cannot show come from stand-ins at the subprocess edge that answer
with recorded real output (tests/assets/slurm/); the tests marked `slurm` run against the real test cluster."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from bigscience_ops import slurm
from tests.fixtures_slurm import RECORDED as ASSETS
from tests.fixtures_slurm import SlurmCluster, replay_squeue, wait_until

LONG_NAME = "tr1-13B-round3-a-job-name-longer-than-forty-characters"
"""The recorded array's name (tests/assets/slurm/squeue.txt)."""


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


@pytest.mark.parametrize("printed", [
    "hello from the site squeue wrapper",  # garbage, no record at all
    "JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)",  # a header: the format was not ours
    "712\x1f712\x1fN/A\x1f712\x1fu\x1fRUNNING",  # a record cut short, no terminator
])
def test_squeue_output_that_does_not_parse_is_an_error_not_an_empty_queue(printed: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper that exits 0 with output that is not squeue's records: the queue is unknown (SlurmOutputError,
    which carries the output), never read as "no job"."""
    bindir = _fake_bin(tmp_path, "squeue", f"printf '%s\\n' '{printed}'; exit 0")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(slurm.SlurmOutputError) as info:
        slurm.query_jobs(timeout=5)
    assert info.value.output.strip() == printed and isinstance(info.value, slurm.SlurmError)


def test_group_users() -> None:
    assert "root" in slurm.group_users("root")
    with pytest.raises(slurm.SlurmError, match="does not exist"):
        slurm.group_users("no-such-group-bsops")


# --- Slurm commands run with a pinned environment, and group members come from NSS one group at a time -------


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


# --- stand-ins answering with recorded output -----------------------------------------------------------------

def _on_path(monkeypatch: pytest.MonkeyPatch, bindir: Path) -> None:
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def _recording_bin(tmp_path: Path, name: str, answer: Path | None = None, code: int = 0) -> Path:
    """A stand-in `name` that appends its argv to tmp_path/NAME.argv (a line a call), prints `answer`, exits `code`."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    shown = f"cat '{answer}'" if answer else "true"
    return _fake_bin(bindir, name, f"echo \"$*\" >> '{tmp_path / name}.argv'\n{shown}\nexit {code}")


def _calls(tmp_path: Path, name: str) -> list[str]:
    file = tmp_path / f"{name}.argv"
    return file.read_text().splitlines() if file.exists() else []


def test_submit_needs_a_parsable_argv_and_runs_nothing_without_one(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _on_path(monkeypatch, _recording_bin(tmp_path, "sbatch"))
    with pytest.raises(ValueError):
        slurm.submit(["sbatch", "x.slurm"])
    assert _calls(tmp_path, "sbatch") == []


def test_submit_returns_the_id_sbatch_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answer = tmp_path / "answer.txt"
    answer.write_text("712;jeanzay\n")
    _on_path(monkeypatch, _recording_bin(tmp_path, "sbatch", answer))
    assert slurm.submit(slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(job_name="tr1-13B")), timeout=10) == "712"
    assert _calls(tmp_path, "sbatch") == ["--parsable --job-name=tr1-13B x.slurm"]


def test_a_missing_slurm_conf_stops_every_command_before_it_runs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _on_path(monkeypatch, _recording_bin(tmp_path, "sinfo"))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    for call in (lambda: slurm.run(["sinfo"], timeout=10), lambda: slurm.run_unchecked(["sinfo"], timeout=10)):
        with pytest.raises(slurm.SlurmCommandError) as info:
            call()
        assert info.value.returncode is None and info.value.argv == ["sinfo"]
    assert _calls(tmp_path, "sinfo") == []
    assert slurm.run(["sinfo"], timeout=10, env={**os.environ, "SLURM_CONF": ""}).returncode == 0  # unset: runs
    assert _calls(tmp_path, "sinfo") == [""]


def test_a_command_sees_the_pinned_environment_and_this_commands_settings(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = _fake_bin(tmp_path, "squeue", "env")
    _on_path(monkeypatch, bindir)
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    monkeypatch.setenv("SQUEUE_SORT", "-t")
    monkeypatch.setenv("BSOPS_MASTER_PORT", "23456")
    monkeypatch.setenv("BSOPS_TEST_KEPT", "yes")
    env = dict(line.split("=", 1) for line in slurm.run(["squeue"], timeout=10, settings={"SQUEUE_FORMAT": "%i"})
               .stdout.splitlines() if "=" in line)
    assert env["SLURM_TIME_FORMAT"] == "standard" and env["SQUEUE_FORMAT"] == "%i" and env["BSOPS_TEST_KEPT"] == "yes"
    assert "SQUEUE_SORT" not in env and "BSOPS_MASTER_PORT" not in env


def test_run_unchecked_hands_back_the_exit_code_and_feeds_stdin(tmp_path: Path) -> None:
    scrontab = _fake_bin(tmp_path, "scrontab", "cat; echo \"args: $*\" >&2; exit 1") / "scrontab"
    proc = slurm.run_unchecked([str(scrontab), "-"], timeout=10, input="#SCRON -t 1\n@hourly true\n")
    assert proc.returncode == 1 and proc.stdout == "#SCRON -t 1\n@hourly true\n" and proc.stderr == "args: -\n"
    with pytest.raises(ValueError):
        slurm.run_unchecked(["/bin/rm", "-rf", str(tmp_path)])
    with pytest.raises(ValueError):
        slurm.run_unchecked(["scrontab", "-l"], timeout=0)
    assert scrontab.exists()


def test_run_unchecked_raises_only_when_the_command_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sleep = shutil.which("sleep")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slurm.SlurmCommandError) as info:
        slurm.run_unchecked(["scrontab", "-l"], timeout=5)
    assert info.value.returncode is None and info.value.argv == ["scrontab", "-l"]
    slow = _fake_bin(tmp_path, "scrontab", f"exec {sleep} 30") / "scrontab"
    with pytest.raises(slurm.SlurmCommandError):
        slurm.run_unchecked([str(slow), "-l"], timeout=0.5)


def test_job_accounting_is_the_jobs_own_record_not_a_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = tmp_path / "steps.txt"  # sacct(1)'s --parsable2 layout for an array task and its steps
    steps.write_text("100_3|TIMEOUT|0:0\n100_3.batch|CANCELLED|0:15\n100_3.extern|COMPLETED|0:0\n")
    _on_path(monkeypatch, _recording_bin(tmp_path, "sacct", steps))
    assert slurm.job_accounting("100_3", timeout=10) == slurm.SacctRecord("100_3", "TIMEOUT", "0:0")
    assert slurm.job_accounting("100_3.batch", timeout=10) == slurm.SacctRecord("100_3.batch", "CANCELLED", "0:15")
    assert slurm.job_accounting("100_4", timeout=10) is None
    asked = ("100_3", "100_3.batch", "100_4")
    assert _calls(tmp_path, "sacct") == [" ".join(slurm.sacct_argv(job)[1:]) for job in asked]


def test_job_accounting_of_recorded_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = json.loads((ASSETS / "sacct_ids.json").read_text())
    _on_path(monkeypatch, _recording_bin(tmp_path, "sacct", ASSETS / "sacct_completion.txt"))
    assert slurm.job_accounting(ids["failed"], timeout=10) == slurm.SacctRecord(ids["failed"], "FAILED", "3:0")
    assert slurm.job_accounting(ids["timeout"], timeout=10).state == "TIMEOUT"


def test_job_accounting_fails_where_the_cluster_keeps_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disabled = tmp_path / "disabled.txt"
    disabled.write_text("Slurm accounting storage is disabled\n")  # what sacct 22.05 says there, exit code 1
    _on_path(monkeypatch, _recording_bin(tmp_path, "sacct", disabled, code=1))
    with pytest.raises(slurm.SlurmCommandError) as info:
        slurm.job_accounting("100_3", timeout=10)
    assert info.value.returncode == 1


def test_cluster_needs_from_the_recorded_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = _recording_bin(tmp_path, "sinfo", ASSETS / "sinfo_partitions.txt")
    _recording_bin(tmp_path, "scontrol", ASSETS / "scontrol_show_config.txt")
    _on_path(monkeypatch, bindir)
    assert slurm.cluster_needs(timeout=10) == (False, False)
    assert _calls(tmp_path, "sinfo") == ["--noheader --format=%P"] and _calls(tmp_path, "scontrol") == ["show config"]
    no_default = tmp_path / "no-default.txt"
    no_default.write_text((ASSETS / "sinfo_partitions.txt").read_text().replace("*", ""))
    enforcing = tmp_path / "enforcing.txt"
    enforcing.write_text((ASSETS / "scontrol_show_config.txt").read_text().replace(
        "AccountingStorageEnforce = none", "AccountingStorageEnforce = associations,limits,qos"))
    _recording_bin(tmp_path, "sinfo", no_default)
    _recording_bin(tmp_path, "scontrol", enforcing)
    assert slurm.cluster_needs(timeout=10) == (True, True)


def test_cancel_pending_cancels_only_the_waiting_tasks_of_that_named_array(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    replay_squeue(tmp_path / "bin", "squeue.txt")
    _on_path(monkeypatch, _recording_bin(tmp_path, "scancel"))
    assert slurm.cancel_pending("22", "someone-else") == []
    assert slurm.cancel_pending("23", LONG_NAME) == []  # job 23 holds another name
    assert _calls(tmp_path, "scancel") == []
    assert slurm.cancel_pending("22", LONG_NAME) == ["22_[2-5%1]"]  # not the running 22_1
    assert _calls(tmp_path, "scancel") == ["--state=PENDING 22"]


def test_cancel_array_cancels_the_whole_named_array(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replay_squeue(tmp_path / "bin", "squeue.txt")
    _on_path(monkeypatch, _recording_bin(tmp_path, "scancel"))
    assert slurm.cancel_array("22", "rec-dependency") == []
    assert _calls(tmp_path, "scancel") == []
    assert sorted(slurm.cancel_array("22", LONG_NAME)) == ["22_1", "22_[2-5%1]"]
    assert _calls(tmp_path, "scancel") == ["22"]
