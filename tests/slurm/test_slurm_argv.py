"""slurm/argv.py: every Slurm command line bsops runs (squeue, sbatch, scontrol, sacct, sinfo, scancel), each
value checked: exact argv lists for every option, and the values each builder refuses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from bigscience_ops import slurm

def test_sbatch_argv() -> None:
    argv = slurm.sbatch_argv("run/tr1 13B.slurm", slurm.SbatchOptions(
        job_name="tr1-13B", array_tasks=5, after_any=["711114"], begin="now+2hours", exclude=["r7i5n2", "r7i5n6"],
        time_limit="20:00:00", partition="gpu_p13"))
    assert argv == ["sbatch", "--parsable", "--job-name=tr1-13B", "--array=1-5%1",
                    "--dependency=afterany:711114", "--begin=now+2hours", "--partition=gpu_p13",
                    "--time=20:00:00", "--exclude=r7i5n2,r7i5n6", "run/tr1 13B.slurm"]
    test_only = slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(test_only=True, hold=True, after_ok=["1", "2"]))
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
        slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(**kwargs))


def test_squeue_scontrol_scancel_argv() -> None:
    argv = slurm.squeue_argv(users=["stas", "teven"], name="tr1-13B")
    assert argv == ["squeue", "--noheader", "--user=stas,teven", "--name=tr1-13B"]
    assert slurm.scontrol_show_job_argv("711114_4") == ["scontrol", "--oneliner", "show", "job", "711114_4"]
    assert slurm.scancel_argv(["12"], signal="USR1", batch_only=True) == [
        "scancel", "--signal=USR1", "--batch", "12"]
    with pytest.raises(ValueError, match="at least one"):
        slurm.scancel_argv([])




# --- squeue ------------------------------------------------------------------------------------------------

def test_squeue_argv_with_each_filter() -> None:
    assert slurm.squeue_argv() == ["squeue", "--noheader"]  # every user's jobs
    assert slurm.squeue_argv(job_ids=["711114", "711114_4"]) == ["squeue", "--noheader", "--jobs=711114,711114_4"]
    assert slurm.squeue_argv(users=["stas"], name="tr1-13B", job_ids=["712"]) == [
        "squeue", "--noheader", "--user=stas", "--name=tr1-13B", "--jobs=712"]


@pytest.mark.parametrize("kwargs", [
    {"users": "stas"}, {"users": ["stas,teven"]}, {"users": [""]}, {"users": ["a\nb"]},
    {"name": ""}, {"name": "a,b"}, {"name": "tr1\n--user=root"},
    {"job_ids": "712"}, {"job_ids": ["712,713"]}, {"job_ids": ["712\n713"]},
])
def test_squeue_argv_refuses(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        slurm.squeue_argv(**kwargs)


def test_squeue_env_carries_the_format_and_refuses_a_guessable_terminator() -> None:
    terminator = "f" * 32
    assert slurm.squeue_env(terminator) == {"SQUEUE_FORMAT": slurm.squeue_format(terminator)}
    with pytest.raises(ValueError):
        slurm.squeue_env("short")


# --- sbatch ------------------------------------------------------------------------------------------------

def test_sbatch_argv_puts_extra_options_before_the_script_and_its_arguments_after() -> None:
    argv = slurm.sbatch_argv(Path("/scratch/run/tr8-104B.slurm"), slurm.SbatchOptions(
        job_name="tr8,104B", after_any=["1", "2"], after_ok=["3"],
        extra=["--output=/scratch/logs/%x-%A_%a.out", "--chdir=/scratch"]), script_args=["--resume", 5])
    assert argv == ["sbatch", "--parsable", "--job-name=tr8,104B", "--dependency=afterany:1:2,afterok:3",
                    "--output=/scratch/logs/%x-%A_%a.out", "--chdir=/scratch", "/scratch/run/tr8-104B.slurm",
                    "--resume", "5"]
    assert slurm.sbatch_argv("x.slurm") == ["sbatch", "--parsable", "x.slurm"]
    assert slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(test_only=True)) == ["sbatch", "--test-only", "x.slurm"]


@pytest.mark.parametrize("limit", ["5", "5:30", "20:00:00", "2-0", "1-02:30", "1-02:30:00"])
def test_sbatch_argv_passes_every_time_format_as_written(limit: str) -> None:
    assert slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(time_limit=limit)) == ["sbatch", "--parsable", f"--time={limit}", "x.slurm"]


def test_sbatch_argv_array_runs_one_task_at_a_time() -> None:
    assert slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(array_tasks=1))[2] == "--array=1-1%1"
    assert slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(array_tasks=40))[2] == "--array=1-40%1"


@pytest.mark.parametrize("kwargs", [
    {"array_tasks": -1}, {"array_tasks": 2.0}, {"array_tasks": "3"}, {"array_tasks": False},
    {"after_ok": ["711114_4"]}, {"after_ok": ["711114_[1-5]"]}, {"after_ok": "711114"}, {"after_any": ["afterok:1"]},
    {"after_any": [""]}, {"begin": ""}, {"begin": "now,later"}, {"partition": "a,b"}, {"partition": "a\nb"},
    {"exclude": "r7i5n2"}, {"exclude": ["r7i5n2,r7i5n6"]}, {"time_limit": "0"}, {"time_limit": "1:60:00"},
    {"job_name": ""},
])
def test_sbatch_argv_refuses_every_value_slurm_would_misread(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(**kwargs))


@pytest.fixture
def paris_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone set to Paris' (summer time included), and put back afterwards."""
    monkeypatch.setenv("TZ", "CET-1CEST,M3.5.0,M10.5.0/3")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_begin_arg_is_local_wall_clock_time(paris_clock: None) -> None:
    summer = datetime(2021, 8, 16, 1, 52, 2, 999999, tzinfo=timezone.utc)
    assert slurm.begin_arg(summer) == "2021-08-16T03:52:02"  # CEST: UTC+2, no fraction of a second
    assert slurm.begin_arg(datetime(2021, 1, 16, 1, 0, tzinfo=timezone.utc)) == "2021-01-16T02:00:00"  # CET: UTC+1
    assert slurm.begin_arg(datetime(2021, 8, 16, 12, 0, tzinfo=timezone(timedelta(hours=-4)))) == "2021-08-16T18:00:00"
    assert slurm.begin_arg(datetime(2021, 8, 16, 3, 52, 2)) == "2021-08-16T03:52:02"  # naive: already local
    # what sbatch is given reads back as the local time Slurm prints (parse_timestamp)
    assert slurm.parse_timestamp(slurm.begin_arg(summer)) == datetime(2021, 8, 16, 3, 52, 2)
    assert slurm.sbatch_argv("x.slurm", slurm.SbatchOptions(begin=slurm.begin_arg(summer)))[2] == "--begin=2021-08-16T03:52:02"


# --- scontrol, sacct, sinfo, scancel ---------------------------------------------------------------------------

def test_the_query_argvs() -> None:
    assert slurm.scontrol_show_job_argv("712") == ["scontrol", "--oneliner", "show", "job", "712"]
    assert slurm.scontrol_show_config_argv() == ["scontrol", "show", "config"]
    assert slurm.sinfo_partitions_argv() == ["sinfo", "--noheader", "--format=%P"]
    assert slurm.sacct_argv("100_3") == ["sacct", "--noheader", "--parsable2", "--format=JobID,State,ExitCode",
                                         "--jobs=100_3"]


@pytest.mark.parametrize("job_id", ["", "712,713", "712\n713"])
def test_scontrol_show_job_argv_refuses_anything_but_one_id(job_id: str) -> None:
    with pytest.raises(ValueError):
        slurm.scontrol_show_job_argv(job_id)


def test_scancel_argv_signals_or_cancels() -> None:
    assert slurm.scancel_argv(["711114", "712"]) == ["scancel", "711114", "712"]
    assert slurm.scancel_argv(["712"], signal="USR1") == ["scancel", "--signal=USR1", "712"]
    assert slurm.scancel_argv(["712"], batch_only=True) == ["scancel", "--batch", "712"]


@pytest.mark.parametrize(("job_ids", "signal"), [
    ("712", None), (["712,713"], None), ([""], None), (["712"], ""), (["712"], "USR1,TERM"), (["712"], "USR1\n"),
])
def test_scancel_argv_refuses(job_ids: list[str] | str, signal: str | None) -> None:
    with pytest.raises(ValueError):
        slurm.scancel_argv(job_ids, signal=signal)


# --- one value ---------------------------------------------------------------------------------------------

def test_checked_item_passes_one_value_as_text() -> None:
    assert slurm.checked_item("partition", "gpu_p13") == "gpu_p13"
    assert slurm.checked_item("job_id", 712) == "712"  # type: ignore[arg-type]
    assert slurm.checked_item("job_name", "a,b", comma=True) == "a,b"
    assert slurm.checked_item("name", "a b #c") == "a b #c"  # argv reaches no shell: spaces and '#' are text


@pytest.mark.parametrize(("value", "comma"), [("", False), ("", True), ("a,b", False), ("a\nb", False),
                                              ("a\nb", True), ("\n", True)])
def test_checked_item_refuses(value: str, comma: bool) -> None:
    with pytest.raises(ValueError):
        slurm.checked_item("what", value, comma=comma)
