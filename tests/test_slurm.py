"""Parsers and argv builders of bigscience_ops.slurm, on real output recorded from Slurm 22.05.

The recordings are in tests/assets/slurm/ (re-record: see its README.md).
"""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime
from pathlib import Path

import pytest

from bigscience_ops import slurm
from bigscience_ops.errors import BsopsError
from bigscience_ops.slurm import SQUEUE_DELIMITER as D
from tests.fixtures_slurm import RECORDED as ASSETS
from tests.fixtures_slurm import SlurmCluster, recorded_squeue, recorded_terminator, wait_until

LONG_NAME = "tr1-13B-round3-a-job-name-longer-than-forty-characters"
T = "0123456789abcdef0123456789abcdef"
"""The record terminator of the hand-written squeue outputs below (a real query draws its own)."""


def squeue_text(*records: list[str], terminator: str = T) -> str:
    """What squeue prints for these records: each ended by the delimiter, the terminator and a newline."""
    return "".join(D.join([*fields, terminator]) + "\n" for fields in records)


def fields(job: str, name: str, **changed: str) -> list[str]:
    """Pending job `job`'s fields in SQUEUE_FIELDS order (name last), with some `changed`."""
    values = {"job_id": job, "array_job_id": job, "array_task": "N/A", "own_id": job, "user": "u",
              "state": "PENDING", "reason": "Priority", "partition": "p", "num_nodes": "1", "nodes": "",
              "elapsed": "0:00", "time_limit": "1:00", "start_time": "N/A", "submit_time": "2026-01-01T00:00:00",
              "dependency": "(null)", "name": name, **changed}
    return [values[key] for key, _ in slurm.SQUEUE_FIELDS]


@pytest.fixture(scope="module")
def recorded() -> list[slurm.Job]:
    return recorded_squeue("squeue.txt")


@pytest.fixture(scope="module")
def ids() -> dict[str, str]:
    return json.loads((ASSETS / "ids.json").read_text())


def test_recording_matches_the_current_squeue_format() -> None:
    # A changed SQUEUE_FIELDS needs a new recording: tests/assets/slurm/README.md says how.
    assert (ASSETS / "squeue.format").read_text() == slurm.squeue_format(recorded_terminator())
    assert not recorded_squeue("squeue.txt").unparsed


def test_every_pending_reason_is_parsed(recorded: list[slurm.Job], ids: dict[str, str]) -> None:
    by_id = {j.job_id: j for j in recorded}
    expect = {
        "dependency": "Dependency", "begin": "BeginTime", "held_user": "JobHeldUser",
        "held_admin": "JobHeldAdmin", "partition_down": "PartitionDown", "resources": "Resources",
        "priority": "Priority", "never": "DependencyNeverSatisfied",
    }
    for key, reason in expect.items():
        job = by_id[ids[key]]
        assert (job.state, job.reason) == ("PENDING", reason), key
    assert by_id[ids["partition_down"]].partition == "bsops-down"
    assert by_id[ids["never"]].dependency == f"afterok:{ids['failed']}(failed)"
    assert by_id[ids["begin"]].start_time is not None and by_id[ids["never"]].start_time is None


def test_array_ids_and_long_names(recorded: list[slurm.Job], ids: dict[str, str]) -> None:
    array = [j for j in recorded if j.array_job_id == ids["array"]]
    running = [j for j in array if j.state == "RUNNING"]
    rest = [j for j in array if j.state == "PENDING"]
    assert len(running) == 1 and len(rest) == 1
    assert running[0].job_id == f"{ids['array']}_1" and running[0].array_task == "1"
    assert running[0].nodes and running[0].num_nodes == 1 and running[0].reason == "None"
    assert rest[0].job_id == f"{ids['array']}_[2-5%1]" and rest[0].array_task == "2-5%1"
    assert rest[0].reason == "JobArrayTaskLimit"
    chained = next(j for j in recorded if j.array_job_id == ids["chained_array"])
    assert chained.job_id == f"{ids['chained_array']}_[1-5%1]"
    assert chained.reason == "Dependency" and chained.dependency == f"afterany:{ids['array']}_*(unfulfilled)"
    assert {j.name for j in array} == {LONG_NAME} and len(LONG_NAME) > 40
    assert chained.name == LONG_NAME


def test_names_with_spaces_and_pipes_survive(recorded: list[slurm.Job], ids: dict[str, str]) -> None:
    odd = next(j for j in recorded if j.job_id == ids["odd_name"])
    assert odd.name == "rec name with spaces | and a pipe"


def test_times_and_limits(recorded: list[slurm.Job]) -> None:
    for job in recorded:
        assert job.time_limit_min == 5
        assert isinstance(job.submit_time, datetime)
        assert job.elapsed_s >= 0


def test_lines_shaped_like_the_seed_report() -> None:
    # Values from the tr1-13B on-call report (Jean Zay): a long-running task of a bigger array.
    nodes = "r7i4n[1-7],r7i7n[1-8],r8i0n0,r8i5n[3-8]"
    line = ["711114_4", "711114", "4", "711200", "stas", "RUNNING", "None", "gpu_p13", "48", nodes,
            "18:15:59", "20:00:00", "2021-08-16T03:52:02", "2021-08-12T10:00:00", "(null)", "tr1-13B-round3"]
    pending = ["682842_[1-5%1]", "682842", "1-5%1", "682842", "stas", "PENDING", "Dependency", "gpu_p13", "48",
               "", "0:00", "UNLIMITED", "N/A", "2021-08-16T20:00:00", "afterany:711114_*(unfulfilled)",
               "tr1-13B-round3"]
    running, waiting = slurm.parse_squeue(squeue_text(line, pending), T)
    assert (running.job_id, running.array_job_id, running.array_task) == ("711114_4", "711114", "4")
    assert running.elapsed_s == 18 * 3600 + 15 * 60 + 59 and running.nodes == nodes
    assert running.start_time == datetime(2021, 8, 16, 3, 52, 2) and running.time_limit_min == 1200
    assert waiting.job_id == "682842_[1-5%1]" and waiting.time_limit_min is None


def test_a_name_can_never_make_a_record() -> None:
    """A name holding a newline and a whole record (the old line format, or with a guessed terminator)
    stays inside its own job's record: that job is skipped and counted, its neighbours are kept."""
    forged = D.join(fields("999", "tr1-13B", user="victim", state="RUNNING", reason="None", nodes="n1"))
    hostile = [f"x\n{forged}\n", f"y\n{forged}{D}{'f' * 32}\nz"]
    text = squeue_text(fields("5", "before"), *(fields(str(6 + i), name) for i, name in enumerate(hostile)),
                       fields("9", "after"))
    jobs = slurm.parse_squeue(text, T)
    assert [(j.job_id, j.name) for j in jobs] == [("5", "before"), ("9", "after")]
    assert jobs.unparsed == tuple(f"job {6 + i} of u named {name}" for i, name in enumerate(hostile))


@pytest.mark.parametrize("name", ["a\u2028b", "c\u2029d", "e\x85f", "g\x1eh", "i\x0bj", "k\x0cl", "m\nn",
                                  f"odd{D}name", "tab\there", "\x9bcsi"])
def test_a_name_with_a_control_character_or_line_break_is_skipped_and_counted(name: str) -> None:
    jobs = slurm.parse_squeue(squeue_text(fields("5", name), fields("6", "tr1-13B")), T)
    assert [j.name for j in jobs] == ["tr1-13B"] and jobs.unparsed == (f"job 5 of u named {name}",)
    assert slurm.unparsed_note(jobs).startswith("1 squeue entry did not parse and was skipped: 'job 5 of u")


def test_names_with_spaces_pipes_and_any_printable_text_are_kept() -> None:
    names = ["rec name with spaces | and a pipe", "caf\u00e9 \u2014 \u6587\u5b57", "#SBATCH --x", "'\"\\$(x)"]
    jobs = slurm.parse_squeue(squeue_text(*(fields(str(i), n) for i, n in enumerate(names))), T)
    assert [j.name for j in jobs] == names and not jobs.unparsed


def test_records_that_do_not_parse_are_skipped_and_counted() -> None:
    """A record whose fields are not squeue's, a header, or a cut-off tail is set aside; it never hides the others."""
    assert slurm.parse_squeue("JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)\n", T).unparsed == (
        "JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)\n",)
    bad, good = fields("5", "n", num_nodes="one"), fields("6", "fine")
    jobs = slurm.parse_squeue(squeue_text(bad, good), T)
    assert [j.name for j in jobs] == ["fine"] and jobs.unparsed == (D.join(bad),)
    assert slurm.unparsed_note(jobs).startswith("1 squeue entry did not parse")
    assert slurm.unparsed_note(slurm.parse_squeue(squeue_text(good), T)) is None
    for changed in ({"own_id": "5x"}, {"num_nodes": "1x"}, {"job_id": "5\n6"}, {"state": "running"},
                    {"array_job_id": ""}):
        assert not slurm.parse_squeue(squeue_text(fields("5", "n", **changed)), T), changed
    cut = squeue_text(good) + D.join(fields("7", "cut"))[:40]
    assert [j.name for j in slurm.parse_squeue(cut, T)] == ["fine"]
    assert len(slurm.parse_squeue(cut, T).unparsed) == 1
    assert not slurm.parse_squeue(squeue_text(good), "f" * 32)  # another query's terminator: nothing is a record


def test_recorded_queue_with_hostile_names() -> None:
    """tests/assets/slurm/squeue-hostile-names.txt, recorded on the test cluster by record_hostile_names.py:
    jobs named with U+2028, U+2029, U+0085, U+001E, VT, FF, a real newline, the field delimiter, and two
    jobs of another user whose names hold a forged RUNNING record of tr1-13B. Only the real tr1-13B job
    is a record; the ten others are skipped and counted."""
    jobs = recorded_squeue("squeue-hostile-names.txt")
    assert [(j.name, j.user, j.state, j.reason) for j in jobs] == [("tr1-13B", "root", "PENDING", "JobHeldUser")]
    assert len(jobs.unparsed) == 10
    assert sum(line.startswith("job ") and " of nobody named " in line for line in jobs.unparsed) == 2
    assert slurm.unparsed_note(jobs).startswith("10 squeue entries did not parse and were skipped: ")
    assert issubclass(slurm.SlurmError, BsopsError)


def test_the_format_ends_each_record_with_a_terminator_that_is_never_in_argv() -> None:
    one, two = slurm.new_terminator(), slurm.new_terminator()
    assert one != two and len(one) == 32
    assert slurm.squeue_format(one).endswith(D + one) and slurm.squeue_format(one).startswith("%i" + D)
    assert slurm.squeue_env(one) == {"SQUEUE_FORMAT": slurm.squeue_format(one)}
    assert not any(one in arg or "--format" in arg for arg in slurm.squeue_argv(users=["u"], name="n"))
    for weak in ("", "abc", "x" * 32, "\n" + "a" * 32):
        with pytest.raises(ValueError, match="terminator"):
            slurm.squeue_format(weak)


@pytest.mark.parametrize(("text", "seconds"), [
    ("0:00", 0), ("0:05", 5), ("59:59", 3599), ("18:15:59", 65759), ("1-02:03:04", 93784),
    ("12-00:00:00", 12 * 86400),
])
def test_durations_round_trip(text: str, seconds: int) -> None:
    assert slurm.parse_duration(text) == seconds
    assert slurm.parse_duration(slurm.format_duration(seconds)) == seconds


def test_duration_errors_and_negative_waits() -> None:
    with pytest.raises(ValueError, match="duration"):
        slurm.parse_duration("soon")
    assert slurm.format_duration(-5) == "0:00:00"
    assert slurm.format_duration(65759) == "18:15:59"


def test_sbatch_answers() -> None:
    assert slurm.parse_sbatch_parsable("712\n") == "712"
    assert slurm.parse_sbatch_parsable("712;jeanzay\n") == "712"
    with pytest.raises(slurm.SlurmError, match="expected a job id"):
        slurm.parse_sbatch_parsable("sbatch: error: Batch job submission failed\n")
    answer = slurm.parse_sbatch_test_only((ASSETS / "sbatch_test_only.stderr").read_text())
    assert answer.partition == "bsops" and answer.processors == 1 and answer.nodes
    assert isinstance(answer.start_time, datetime)
    with pytest.raises(slurm.SlurmError, match="to start at"):
        slurm.parse_sbatch_test_only("sbatch: error: invalid partition specified: nope\n")


def test_scontrol_show_job(ids: dict[str, str]) -> None:
    records = slurm.parse_scontrol_show_job((ASSETS / "scontrol_show_job.txt").read_text())
    array = [r for r in records if r.get("ArrayJobId") == ids["array"]]
    assert {r["JobName"] for r in array} == {LONG_NAME}
    assert {r["JobState"] for r in array} == {"PENDING", "RUNNING"}
    pending = next(r for r in array if r["JobState"] == "PENDING")
    assert pending["ArrayTaskId"] == "2-5%1" and pending["Reason"] == "JobArrayTaskLimit"
    never = next(r for r in records if r["JobId"] == ids["never"])
    assert never["Reason"] == "DependencyNeverSatisfied"
    assert never["Dependency"] == f"afterok:{ids['failed']}(failed)"
    assert never["TRES"].startswith("cpu=1")  # values containing '=' stay whole
    assert "Invalid job id" in (ASSETS / "scontrol_unknown_job.stderr").read_text()


def test_sbatch_argv() -> None:
    argv = slurm.sbatch_argv("run/tr1 13B.slurm", job_name="tr1-13B", array_tasks=5, after_any=["711114"],
                             begin="now+2hours", exclude=["r7i5n2", "r7i5n6"], time_limit="20:00:00",
                             partition="gpu_p13")
    assert argv == ["sbatch", "--parsable", "--job-name=tr1-13B", "--array=1-5%1",
                    "--dependency=afterany:711114", "--begin=now+2hours", "--partition=gpu_p13",
                    "--time=20:00:00", "--exclude=r7i5n2,r7i5n6", "run/tr1 13B.slurm"]
    test_only = slurm.sbatch_argv("x.slurm", test_only=True, hold=True, after_ok=["1", "2"])
    assert test_only == ["sbatch", "--test-only", "--dependency=afterok:1:2", "--hold", "x.slurm"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"after_any": ["711114_4"]}, "'711114'"),
    ({"after_any": "711114"}, "list"),
    ({"array_tasks": 0}, ">= 1"),
    ({"array_tasks": True}, ">= 1"),
    ({"time_limit": "forever"}, "not one of"),
    ({"job_name": "a\nb"}, "newlines"),
])
def test_sbatch_argv_refuses(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slurm.sbatch_argv("x.slurm", **kwargs)


def test_squeue_scontrol_scancel_argv() -> None:
    argv = slurm.squeue_argv(users=["stas", "teven"], name="tr1-13B")
    assert argv == ["squeue", "--noheader", "--user=stas,teven", "--name=tr1-13B"]
    assert slurm.scontrol_show_job_argv("711114_4") == ["scontrol", "--oneliner", "show", "job", "711114_4"]
    assert slurm.scancel_argv(["12"], signal="USR1", batch_only=True) == [
        "scancel", "--signal=USR1", "--batch", "12"]
    with pytest.raises(ValueError, match="at least one"):
        slurm.scancel_argv([])


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
