"""The status watchdog's decisions that mutation testing found untested (scripts/mutation.py, ops/watch/status.py):
each test here fails on a mutant that every other test let through. The tests read the facts of a status line or an
alert (ids, who must act, which job to cancel, the log named, the contact), not its sentences."""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.watch import lifecycle, status
from bigscience_ops.run import ledger
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_status import ITERATION, seed_job

NOW = datetime(2026, 11, 22, 10, 0, 0)
NAME = "tr1-13B-round3"
BLOCKED = "ReqNodeNotAvail, UnavailableNodes:n[1-2]"


def _pending(job_id: str, reason: str, **changes: object) -> slurm.Job:
    array = job_id.split("_", 1)[0]
    return seed_job(job_id=job_id, array_job_id=array, array_task="1-5%1", state="PENDING", reason=reason, nodes="",
                    elapsed_s=0, start_time=None, **changes)


def _ids(line: str) -> set[str]:
    return set(re.findall(r"\d+", line))


# --------------------------------------------------------------------------- one job's verdict

def test_a_jobs_verdict_names_its_state_who_holds_it_and_what_it_depends_on() -> None:
    # an active job that is not RUNNING is not said to run; one without a start time is told all the same
    completing = status.describe_job(seed_job(state="COMPLETING"), NOW)
    assert completing.kind == "active" and "running" not in completing.text.lower()
    assert "completing" in completing.text.lower()
    unknown_start = status.describe_job(seed_job(start_time=None), NOW)
    assert unknown_start.kind == "active" and "711114_4" in unknown_start.text
    # a held job: an administrator must release it only when the administrator held it
    admin = status.describe_job(_pending("720000_[1-5%1]", "JobHeldAdmin"), NOW)
    user = status.describe_job(_pending("720000_[1-5%1]", "JobHeldUser"), NOW)
    assert (admin.kind, user.kind) == ("never", "never")
    assert "administrator" in admin.text and "administrator" not in user.text
    # the dependency is named when the reason is the dependency's, and only then
    broken = status.describe_job(_pending("720000_[1-5%1]", "DependencyNeverSatisfied", dependency="afterok:700_*"),
                                 NOW)
    assert broken.kind == "never" and "afterok:700" in broken.text
    down = status.describe_job(_pending("720000_[1-5%1]", "PartitionDown", dependency="afterok:700_*"), NOW)
    assert down.kind == "never" and "afterok" not in down.text and "700" not in _ids(down.text)
    nothing = status.describe_job(_pending("720000_[1-5%1]", "DependencyNeverSatisfied"), NOW)
    assert "None" not in nothing.text
    # waiting with no start time known: its id and reason
    waiting = status.describe_job(_pending("720000_[1-5%1]", "Priority"), NOW)
    assert waiting.kind == "waiting" and "720000" in waiting.text and "Priority" in waiting.text


def test_the_status_lines_come_active_then_waiting_then_never_then_other() -> None:
    never = _pending("720000_[1-5%1]", "PartitionDown")
    waiting = _pending("720001_[1-5%1]", "Priority")
    other = seed_job(job_id="720002_1", array_job_id="720002", state="SUSPENDED", reason="None")
    report = status.evaluate(NAME, [other, never, waiting, seed_job()], now=NOW)
    firsts = [next(a for a in ("711114", "720000", "720001", "720002") if a in _ids(line))
              for line in report.lines[:4]]
    assert firsts == ["711114", "720001", "720000", "720002"]


# --------------------------------------------------------------------------- jobs of another run

def test_a_look_alike_line_names_the_three_newest_arrays_the_run_recorded() -> None:
    other = seed_job(job_id="900001_1", array_job_id="900001", user="someone", state="PENDING", reason="Priority")
    report = status.evaluate(NAME, [other, seed_job(job_id="80_1", array_job_id="80")], now=NOW,
                             job_ids={"9", "80", "81_2", "800"})
    [line] = [line for line in report.lines if "900001" in _ids(line)]
    assert _ids(line) & {"9", "80", "81", "800"} == {"80", "81", "800"}  # by length, then by digits


def test_an_array_id_is_what_comes_before_the_first_separator() -> None:
    assert status.array_id("720003_2_1") == "720003"
    assert status.array_id("720004+1+0") == "720004"
    assert status.array_id("720005_1+2+3") == "720005"


# --------------------------------------------------------------------------- what to do with a job that never starts

def test_a_held_array_is_released_by_whoever_held_it_and_a_lone_broken_one_is_launched_again() -> None:
    [admin] = status.evaluate(NAME, [_pending("720000_[1-5%1]", "JobHeldAdmin")], now=NOW).alerts
    [user] = status.evaluate(NAME, [_pending("720000_[1-5%1]", "JobHeldUser")], now=NOW).alerts
    assert "administrator" in admin.advice and "administrator" not in user.advice
    assert "scontrol release 720000" in admin.advice and "scontrol release 720000" in user.advice
    [alone] = status.evaluate(NAME, [_pending("720000_[1-5%1]", "PartitionDown")], now=NOW).alerts
    assert "launch" in alone.advice.split("`scancel 720000`")[1]


# --------------------------------------------------------------------------- two trainings at once

def test_the_overlap_alert_names_the_job_started_last_whatever_its_id() -> None:
    early = seed_job(job_id="711114_4", start_time=datetime(2021, 8, 16, 3, 0, 0))
    late = seed_job(job_id="711114_2", start_time=datetime(2021, 8, 16, 5, 0, 0))
    middle = seed_job(job_id="711114_3", start_time=datetime(2021, 8, 16, 4, 0, 0))
    [alert] = status.evaluate(NAME, [early, late, middle], now=NOW).alerts
    assert alert.condition == "overlap"
    assert "711114_2" in alert.headline and "711114_4" not in alert.headline and "711114_3" not in alert.headline
    assert all(j in alert.message for j in ("711114_2", "711114_3", "711114_4"))
    assert re.search(r"\b3\b", alert.message) and "None" not in alert.message


# --------------------------------------------------------------------------- stalls

def _stale(tmp_path: Path) -> Path:
    log = tmp_path / "main_log.txt"
    log.write_text(ITERATION + "\n")
    old = (NOW - timedelta(hours=3)).timestamp()
    os.utime(log, (old, old))
    return log


def test_a_stall_is_checked_from_a_progress_given_or_the_log_named(tmp_path: Path) -> None:
    progress = status.LogProgress(True, ITERATION.strip(), NOW - timedelta(hours=3))
    [given] = status.evaluate(NAME, [seed_job()], now=NOW, progress=progress, stall_minutes=60).alerts
    assert given.condition == "stalled"
    log = _stale(tmp_path)
    [named] = status.evaluate(NAME, [seed_job()], now=NOW, log_path=log, stall_minutes=60).alerts
    assert named.condition == "stalled" and str(log) in named.message and "168000" in named.message
    # a running task with no start time: the log alone dates the stall
    [unstarted] = status.evaluate(NAME, [seed_job(start_time=None)], now=NOW, log_path=log, stall_minutes=60).alerts
    assert unstarted.condition == "stalled"
    facts = status.stall_facts(progress, log, None, NOW, 60)
    assert set(facts) == {"headline", "what", "span", "limit"} and "3" in facts["headline"]


def test_the_log_read_says_whether_it_exists_where_it_stands_and_how_far_it_was_searched(tmp_path: Path) -> None:
    assert status.read_progress(tmp_path / "missing.txt") == status.LogProgress(exists=False)
    (tmp_path / "a-file").write_text("")
    below_a_file = status.read_progress(tmp_path / "a-file" / "main_log.txt")  # ENOTDIR: not "missing"
    assert below_a_file.exists is True and below_a_file.problem and below_a_file.last_iteration is None
    # the earliest stamp after the last iteration line dates it, stamps written with a T too
    log = tmp_path / "main_log.txt"
    log.write_text(ITERATION + "\n[2026-11-22T09:30:00] watchdog: checked\n[2026-11-22 09:45:00] again\n")
    os.utime(log, (NOW.timestamp(), NOW.timestamp()))
    assert status.read_progress(log) == status.LogProgress(True, ITERATION.strip(), datetime(2026, 11, 22, 9, 30))
    # no iteration line: how much was searched, only when the log is larger than that
    plain = tmp_path / "plain.txt"
    plain.write_text("starting\n" * 10)
    size = plain.stat().st_size
    assert status.read_progress(plain) == status.LogProgress(True)
    assert status.read_progress(plain, max_bytes=size).searched is None
    assert status.read_progress(plain, max_bytes=size - 1).searched == size - 1


# --------------------------------------------------------------------------- tasks blocked on nodes

def test_a_task_blocked_on_nodes_alerts_past_the_limit_counted_from_the_last_task_end() -> None:
    def blocked_for(minutes: float, run: lifecycle.RunState | None = None):
        job = _pending("720000_[1-5%1]", BLOCKED, submit_time=NOW - timedelta(minutes=minutes))
        return [a.condition for a in status.evaluate(NAME, [job], now=NOW, run=run, blocked_minutes=120).alerts]

    assert blocked_for(120) == [] and blocked_for(121) == ["pending-blocked"]  # exactly the limit is not past it
    task = ledger.Attempt("719999_1", "n1", 0, 10, 0, started=(NOW - timedelta(hours=5)).timestamp(),
                          ended=(NOW - timedelta(minutes=30)).timestamp())
    run = lifecycle.RunState(10, 100, task)
    assert blocked_for(180, run) == []  # submitted 3 h ago, but the task before it ended 30 min ago
    job = _pending("720000_[1-5%1]", BLOCKED, submit_time=NOW - timedelta(hours=3))
    [line] = status.evaluate(NAME, [job], now=NOW, run=run).lines  # the line says since when it certainly waited
    assert slurm.format_duration(30 * 60) in line and slurm.format_duration(3 * 3600) not in line


# --------------------------------------------------------------------------- nothing queued

def test_nothing_queued_is_told_for_a_run_state_without_its_experiment() -> None:
    finished = status.evaluate(NAME, [], now=NOW, run=lifecycle.RunState(100, 100, None))
    assert finished.finished_at == 100 and finished.alerts == ()
    assert finished.lines[-1].startswith(finished.stamp + " ") and "100" in _ids(finished.lines[-1])
    stopped = status.evaluate(NAME, [], now=NOW, run=lifecycle.RunState(40, 100, None, kill_switch="/runs/x/STOP"))
    assert stopped.alerts == () and "/runs/x/STOP" in stopped.lines[-1]
    [alert] = status.evaluate(NAME, [], now=NOW, run=lifecycle.RunState(40, 100, None)).alerts
    assert alert.condition == "not-scheduled" and "40" in _ids(alert.headline)


# --------------------------------------------------------------------------- check: the query, the run's settings

def test_check_names_the_contact_and_the_job_whether_slurm_answers_or_not() -> None:
    def failing(**_: object) -> list[slurm.Job]:
        raise slurm.SlurmError("squeue: error: slurm_load_jobs: Unable to contact slurm controller")

    broken = status.check(NAME, query=failing, now=NOW, contact="pager@example.org")
    assert broken.exit_code == status.EXIT_ERROR and broken.job_name == NAME
    [alert] = broken.alerts
    assert alert.condition == "slurm-error" and "pager@example.org" in alert.message
    empty = status.check(NAME, query=lambda **_: [], now=NOW, contact="pager@example.org")
    assert [a.condition for a in empty.alerts] == ["not-scheduled"] and "pager@example.org" in empty.alerts[0].message


def test_check_takes_the_blocked_limit_from_the_runs_experiment(trainings: Path, tmp_path: Path) -> None:
    (trainings / "blocked.yaml").write_text(tiny_yaml(tmp_path / "run", "alerts: {blocked_minutes: 30}\n"))
    exp = load_experiment("blocked", trainings)
    run = lifecycle.run_state(exp)
    job = _pending("720000_[1-5%1]", BLOCKED, name=exp.slurm.job_name, submit_time=NOW - timedelta(minutes=60))
    report = status.check(exp.slurm.job_name, query=lambda **_: [job], now=NOW, run=run)
    assert [a.condition for a in report.alerts] == ["pending-blocked"]  # the default (120 min) would say nothing
    assert status.check(exp.slurm.job_name, query=lambda **_: [job], now=NOW).alerts == ()

