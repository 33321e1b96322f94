"""The watchdog's decisions that mutation testing found untested (scripts/mutation.py): each test here fails on a
mutant of ops/watch/ that every other test let through. Real run folders; the tests read the facts in a status
line or an alert (pids, ids, iterations, conditions), not its sentences."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bigscience_ops import slurm
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.tell import alert_state
from bigscience_ops.ops.tell.notify import default_state_path
from bigscience_ops.ops.watch import lifecycle, local_run, status
from bigscience_ops.run import ledger
from bigscience_ops.run import lock as run_lock
from bigscience_ops.run.lock import Holding
from tests.fixtures_smtp import plain_outbox
from tests.fixtures_status import seed_job
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


# --------------------------------------------------------------------------- stalls

def _progress(**changes) -> status.LogProgress:
    return dataclasses.replace(status.LogProgress(True, "iteration 5/ 100 | lm loss: 3.0", NOW - timedelta(hours=3)),
                               **changes)


def test_a_stall_is_counted_from_the_later_of_the_tasks_start_and_the_last_line(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    facts = status.stall_facts(_progress(), log, NOW - timedelta(hours=4), NOW, 60)
    assert facts["limit"] == 60 and str(log) in facts["what"] and "5/ 100" in facts["what"]
    assert "3" in facts["span"] and "4" not in facts["span"]
    assert status.stall_facts(_progress(), log, NOW - timedelta(minutes=30), NOW, 60) is None  # the task is young
    # exactly the limit is not a stall; a minute more is
    assert status.stall_facts(_progress(seen_after=NOW - timedelta(minutes=60)), log, None, NOW, 60) is None
    assert status.stall_facts(_progress(seen_after=NOW - timedelta(minutes=61)), log, None, NOW, 60) is not None
    # no iteration line yet: only the task's start counts, not when the log was last written
    no_line = _progress(last_iteration=None, seen_after=NOW - timedelta(minutes=10))
    assert status.stall_facts(no_line, log, NOW - timedelta(hours=2), NOW, 60) is not None
    assert status.stall_facts(no_line, log, None, NOW, 60) is None
    searched = status.stall_facts(dataclasses.replace(no_line, searched=64 << 20), None, NOW - timedelta(hours=2),
                                  NOW, 60)
    assert "64" in searched["what"] and "None" not in searched["what"]
    broken = status.stall_facts(_progress(problem="a FIFO in its place"), log, None, NOW, 60)
    assert "a FIFO in its place" in broken["what"] and str(log) in broken["what"]
    missing = status.stall_facts(status.LogProgress(False), log, NOW - timedelta(hours=2), NOW, 60)
    assert str(log) in missing["what"] and missing["what"] != broken["what"]


def test_a_local_run_whose_log_stands_still_is_stalled(run, tmp_path: Path) -> None:
    holding = Holding("bsops launch --local (pid 4711 on n7) since 2026-11-22T06:00:00", pids=(4711,), host="n7",
                      names=((4711, "bash"),))
    kw = dict(now=NOW, stall_minutes=60)
    [alert] = local_run.evaluate("watched-job", holding, run, progress=_progress(), **kw).alerts
    assert alert.condition == "stalled" and "5/ 100" in alert.message
    assert local_run.evaluate("watched-job", holding, run, now=NOW, progress=_progress()).alerts == ()
    log = tmp_path / "main_log.txt"
    log.write_text(" iteration        5/     100 | consumed samples: 40 | lm loss: 3.0E+00 |\n")
    old = (NOW - timedelta(hours=3)).timestamp()
    os.utime(log, (old, old))
    [alert] = local_run.evaluate("watched-job", holding, run, log_path=log, **kw).alerts
    assert alert.condition == "stalled" and str(log) in alert.message
    # the task began an hour ago (its ledger record): a stall counts from then, under the limit
    task = ledger.Attempt("4242", "n7", 0, None, None, started=(NOW - timedelta(minutes=30)).timestamp())
    young = dataclasses.replace(run, last_task=task)
    assert local_run.evaluate("watched-job", holding, young, log_path=log, **kw).alerts == ()
    ended = dataclasses.replace(task, ended=(NOW - timedelta(minutes=20)).timestamp())
    [alert] = local_run.evaluate("watched-job", holding, dataclasses.replace(run, last_task=ended), log_path=log,
                                 **kw).alerts
    assert alert.condition == "stalled"
    line = local_run.evaluate("watched-job", holding, young, log_path=log, **kw).lines[0]
    assert "4242" in line and "4242" not in local_run.evaluate("watched-job", holding, dataclasses.replace(
        run, last_task=ended), log_path=log, **kw).lines[0]


def test_check_asks_who_holds_the_run_folder(run) -> None:
    report = local_run.check("watched-job", run, now=NOW, contact="someone@example.org")
    assert report.alerts == () and len(report.lines) == 1 and "watched-job" in report.lines[0]
    with run_lock.hold(run.experiment.paths.output, "bsops launch --local"):
        [line] = local_run.check("watched-job", run, now=NOW).lines
    assert str(os.getpid()) in line


# --------------------------------------------------------------------------- the run's own records of its jobs

def test_the_array_ids_a_run_recorded_come_from_its_sbatch_records_within_their_size(tmp_path: Path) -> None:
    assert status.array_id("720000_[1-10%1]") == "720000" and status.array_id("720001_4+1") == "720001"
    assert status.array_id(" 720002 ") == "720002"
    for name, data in {"a": b'{"job_id": 700}', "b": b'{"job_id": "701_3"}', "c": b'{"job_id": true}',
                       "d": b'{"job_id": "x"}'}.items():
        (tmp_path / "launches" / name).mkdir(parents=True)
        (tmp_path / "launches" / name / "sbatch.json").write_bytes(data)
    (tmp_path / "launches" / "e").mkdir()
    (tmp_path / "launches" / "e" / "sbatch.json").write_bytes(
        b'{"job_id": 702}' + b" " * (status.SBATCH_RECORD_BYTES - 15))  # exactly the most read
    (tmp_path / "launches" / "f").mkdir()
    (tmp_path / "launches" / "f" / "sbatch.json").write_bytes(
        b'{"job_id": 703}' + b" " * (status.SBATCH_RECORD_BYTES - 14))  # one byte more: not read
    assert status.recorded_job_ids(tmp_path) == frozenset({"700", "701", "702"})


# --------------------------------------------------------------------------- jobs that can never start

def _never(array: str, reason: str) -> slurm.Job:
    return seed_job(job_id=f"{array}_[1-5%1]", array_job_id=array, array_task="1-5%1", state="PENDING",
                    reason=reason, nodes="", elapsed_s=0, start_time=None)


def _more(headline: str) -> int | None:
    found = re.findall(r"\(\+(\d+)\b", headline)
    return int(found[0]) if found else None


def test_jobs_that_can_never_start_are_counted_and_a_queued_training_is_not_launched_again() -> None:
    now = datetime(2021, 8, 16, 22, 8, 1)
    one = status.evaluate("tr1-13B-round3", [_never("720000", "PartitionDown")], now=now, contact="pager@example.org")
    [alert] = one.alerts
    assert _more(alert.headline) is None and "720000" in alert.headline and "launch" in alert.headline
    assert "pager@example.org" in alert.message
    three = status.evaluate("tr1-13B-round3", [_never(a, "PartitionDown") for a in ("720000", "720001", "720002")],
                            now=now)
    assert [_more(a.headline) for a in three.alerts] == [2]
    behind = status.evaluate("tr1-13B-round3", [seed_job(), _never("720000", "DependencyNeverSatisfied")], now=now)
    [alert] = behind.alerts
    assert "launch" not in alert.headline and "launch" not in alert.advice.split("`scancel 720000`")[1]
    held = status.evaluate("tr1-13B-round3", [_never("720000", "JobHeldAdmin"), _never("720001", "JobHeldUser")],
                           now=now)
    [alert] = held.alerts
    assert _more(alert.headline) == 1 and "JobHeldAdmin" in alert.advice and "scontrol release 720000" in alert.advice


def test_a_local_runs_alert_names_the_contact(run) -> None:
    holding = Holding("bsops launch --local (pid 4711 on n7) since 2026-11-22T06:00:00", pids=(4711,), host="n7")
    [alert] = local_run.evaluate("watched-job", holding, run, now=NOW, stall_minutes=60, progress=_progress(),
                                 contact="pager@example.org").alerts
    assert "pager@example.org" in alert.message and alert.headline


def test_every_alert_of_a_watchdog_run_names_its_contact(trainings: Path, tmp_path: Path) -> None:
    """A run launched here that stopped before its end, with a torn ledger line and a checkpoint a resume set aside:
    each is an alert, and each says whom to alert."""
    from bigscience_ops.checkpoints import set_aside
    from bigscience_ops.config.loading import to_dict
    from bigscience_ops.ops.watch import watchdog

    (trainings / "local.yaml").write_text(tiny_yaml(tmp_path / "local"))
    exp = load_experiment("local", trainings)
    out, checkpoints = Path(exp.paths.output), Path(exp.paths.checkpoints)
    out.mkdir(parents=True)
    (out / "experiment.json").write_text(json.dumps(to_dict(exp)))
    began = (NOW - timedelta(hours=2)).timestamp()
    for record in (ledger.TaskRecord("begin", "local-1", "n1", 0, began),
                   ledger.TaskRecord("end", "local-1", "n1", 0, began + 60, 1)):
        ledger.append(out / ledger.LEDGER_NAME, record)
    with open(out / ledger.LEDGER_NAME, "a") as torn:
        torn.write('{"kind": "begin", "job_id": \n')
    (checkpoints / "global_step10").mkdir(parents=True)
    set_aside.set_aside(checkpoints, checkpoints / "global_step10", "no manifest", now=began)
    settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=Path(exp.paths.logs) / "main_log.txt",
                                      contact="pager@example.org", experiment="local",
                                      state_path=tmp_path / "state.json")
    (checkpoints / "global_step20").mkdir(parents=True)
    set_aside.set_aside(checkpoints, checkpoints / "global_step20", "layer01 is missing", now=began + 1)
    result = watchdog.watch(settings, run=lifecycle.run_state(exp), now=NOW)
    kinds = {a.kind for a in result.report.alerts}
    assert {"local-stopped", "run-file-ledger", "checkpoint-set-aside"} <= kinds, result.lines
    assert all("pager@example.org" in a.message for a in result.report.alerts)
    assert result.exit_code == status.EXIT_ALERT and result.notices == ()
    aside = [a for a in result.report.alerts if a.kind == "checkpoint-set-aside"]
    assert len({a.condition for a in aside}) == 2 and all(a.headline for a in aside)
    [twenty] = [a for a in aside if "global_step20" in a.message]
    assert "layer01 is missing" in twenty.message and "20" in twenty.headline
    assert (datetime.fromtimestamp(began + 1).strftime("%Y-%m-%d %H:%M:%S")) in twenty.message


def test_the_watchdogs_mail_names_the_log_and_keeps_the_cooldown(trainings: Path, tmp_path: Path,
                                                                 plain_server) -> None:
    from bigscience_ops.config.loading import to_dict
    from bigscience_ops.ops.watch import watchdog
    from tests.fixtures_smtp import plain_outbox

    inbox, port = plain_server
    (trainings / "mailed.yaml").write_text(tiny_yaml(tmp_path / "mailed"))
    exp = load_experiment("mailed", trainings)
    out = Path(exp.paths.output)
    out.mkdir(parents=True)
    (out / "experiment.json").write_text(json.dumps(to_dict(exp)))
    began = (NOW - timedelta(hours=2)).timestamp()
    for record in (ledger.TaskRecord("begin", "local-1", "n1", 0, began),
                   ledger.TaskRecord("end", "local-1", "n1", 0, began + 60, 1)):
        ledger.append(out / ledger.LEDGER_NAME, record)
    log = Path(exp.paths.logs) / "main_log.txt"
    settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=log, experiment="mailed", outbox=plain_outbox(port),
                                      cooldown_minutes=30, state_path=tmp_path / "state.json")
    first = watchdog.watch(settings, run=lifecycle.run_state(exp), now=NOW)
    assert [n.kind for n in first.notices] == ["alert"] and len(inbox.messages) == 1
    assert str(log) in inbox.messages[0].get_content()
    assert watchdog.watch(settings, run=lifecycle.run_state(exp), now=NOW + timedelta(minutes=20)).notices == ()
    again = watchdog.watch(settings, run=lifecycle.run_state(exp), now=NOW + timedelta(minutes=31))
    assert [n.kind for n in again.notices] == ["alert"] and len(inbox.messages) == 2


def test_where_a_run_stands_when_latest_cannot_be_followed(run, tmp_path: Path) -> None:
    from bigscience_ops.checkpoints import layout
    from tests.fixtures_runs import commit_checkpoint

    checkpoints = Path(run.experiment.paths.checkpoints)
    checkpoints.mkdir(parents=True)
    layout.write_latest(checkpoints, "global_step30")  # names a folder that is not there, nothing saved
    state = lifecycle.run_state(run.experiment)
    [problem] = state.problems
    assert (problem.file, problem.line) == (str(checkpoints / layout.LATEST), 0) and state.iteration == 30
    assert "global_step30" in problem.what and str(checkpoints / layout.LATEST) not in problem.what
    for step in (10, 20):
        folder = checkpoints / f"global_step{step}"
        folder.mkdir()
        (folder / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(folder)
    (checkpoints / layout.LATEST).write_text("garbage")
    state = lifecycle.run_state(run.experiment)
    [problem] = state.problems
    assert state.iteration == 20 and "global_step20" in problem.what and problem.line == 0
    layout.write_latest(checkpoints, "global_step20")
    assert lifecycle.run_state(run.experiment).problems == () and lifecycle.run_state(run.experiment).iteration == 20


# --------------------------------------------------------------------------- one watchdog run, every part of it

JOB = "watched-job"
CONTACT = "pager@example.org"


def _local(run: lifecycle.RunState, **changes) -> lifecycle.RunState:
    """`run` launched here (watched through its processes: no Slurm), with `changes`."""
    return dataclasses.replace(run, local=True, **changes)


def _watch(run: lifecycle.RunState, env: dict[str, str] | None = None, **settings):
    from bigscience_ops.ops.watch import watchdog

    return watchdog.watch(watchdog.WatchSettings(JOB, **{"contact": CONTACT, **settings}), run=run, now=NOW, env=env)


def _of(result, kind: str) -> list:
    return [a for a in result.report.alerts if a.kind == kind]


def test_the_users_to_watch_are_a_tuple_and_one_name_is_one_user() -> None:
    from bigscience_ops.ops.watch import watchdog

    assert watchdog.WatchSettings(JOB, users="alice").users == ("alice",)
    assert watchdog.WatchSettings(JOB, users=["alice", "bob"]).users == ("alice", "bob")
    assert watchdog.WatchSettings(JOB, users=("alice", "bob")).users == ("alice", "bob")
    assert watchdog.WatchSettings(JOB).users == ()


def test_a_queue_watch_asks_slurm_for_the_users_the_group_and_the_timeout_it_was_given() -> None:
    import grp
    import pwd

    from bigscience_ops.ops.watch import watchdog

    asked: list[dict] = []

    def query(**kw) -> list:
        asked.append(kw)
        return []

    group = grp.getgrgid(os.getgid()).gr_name
    me = pwd.getpwuid(os.getuid()).pw_name  # its primary group is `group`: one of the group's users
    settings = watchdog.WatchSettings(JOB, users=("alice",), group=group, timeout=7.5, contact=CONTACT)
    result = watchdog.watch(settings, query=query, now=NOW)
    [kw] = asked
    assert kw["timeout"] == 7.5 and "alice" in kw["users"] and me in kw["users"]
    [alert] = result.report.alerts
    assert alert.kind == "not-scheduled" and CONTACT in alert.message and JOB in alert.message


def _stale_log(folder: Path) -> Path:
    log = folder / "main_log.txt"
    log.write_text(" iteration        5/     100 | consumed samples: 40 | lm loss: 3.0E+00 |\n")
    old = (NOW - timedelta(hours=3)).timestamp()
    os.utime(log, (old, old))
    return log


def test_a_local_run_that_is_held_but_makes_no_progress_is_stalled_through_the_watchdog(run, tmp_path: Path) -> None:
    log = _stale_log(tmp_path)
    with run_lock.hold(run.experiment.paths.output, "bsops launch --local"):
        [alert] = _watch(_local(run), log_path=log, stall_minutes=60).report.alerts
        assert alert.kind == "stalled" and str(log) in alert.message and CONTACT in alert.message
        assert JOB in alert.message
        assert _watch(_local(run), log_path=log, stall_minutes=240).report.alerts == ()  # within the limit
        [alert] = local_run.check(JOB, run, now=NOW, log_path=log, stall_minutes=60).alerts
        assert alert.kind == "stalled" and str(log) in alert.message
        assert local_run.check(JOB, run, now=NOW, log_path=log, stall_minutes=240).alerts == ()


def test_a_local_run_without_its_experiment_is_said_stopped_and_names_its_job(run) -> None:
    bare = lifecycle.RunState(3, 100, None)
    report = local_run.check(JOB, bare, now=NOW)
    [alert] = report.alerts
    assert report.job_name == JOB and alert.kind == "not-scheduled" and JOB in alert.message
    stopped = local_run.evaluate(JOB, None, _local(run, launched=True), now=NOW, contact=CONTACT)
    [alert] = stopped.alerts
    assert stopped.job_name == JOB and alert.kind == "local-stopped" and JOB in alert.message
    assert CONTACT in alert.message


def test_a_local_runs_line_names_this_hosts_processes_only(run) -> None:
    trainers = Holding(None, pids=(4713,), trainers=(4713,), trainers_held=True, host="n7",
                       names=((4713, "python3"),))
    [line] = local_run.evaluate(JOB, trainers, run, now=NOW).lines
    assert "4713" in line and "n7" in line
    elsewhere = Holding(None, trainers_held=True, host="n7")  # held by trainers of another host: none of n7's
    [line] = local_run.evaluate(JOB, elsewhere, run, now=NOW).lines
    assert "n7" not in line and "None" not in line
    owned = Holding("bsops launch --local (pid 99 on n8) since 2026-11-22T09:00:00", host="n7")
    [line] = local_run.evaluate(JOB, owned, run, now=NOW).lines
    assert "n7" not in line and "pid 99 on n8" in line and "None" not in line


# --------------------------------------------------------------------------- run files that cannot be read

def _problems(file: Path, count: int, **first) -> tuple:
    from bigscience_ops.untrusted import Problem

    head = Problem(str(file), **{"line": 3, "what": "cut short", "held": "'{\"kind'", **first})
    return (head, *(Problem(str(file), 0, f"problem number {n}") for n in range(1, count)))


def test_a_run_files_alert_names_each_problems_line_and_excerpt_and_counts_the_rest(run) -> None:
    ledger_file = Path(run.experiment.paths.output) / ledger.LEDGER_NAME
    [alert] = _of(_watch(_local(run, problems=_problems(ledger_file, 6))), "run-file-ledger")
    assert str(ledger_file) in alert.message and JOB in alert.message and CONTACT in alert.message
    assert re.search(r"\bline 3\b", alert.message) and not re.search(r"\bline 0\b", alert.message)
    assert "cut short" in alert.message and "{" in alert.message and "kind" in alert.message  # the excerpt
    assert alert.message.count("held") == 1  # only the problem that held something
    assert all(f"problem number {n}" in alert.message for n in range(1, 5))
    assert "problem number 5" not in alert.message and _more(alert.message) == 1
    [five] = _of(_watch(_local(run, problems=_problems(ledger_file, 5))), "run-file-ledger")
    assert "problem number 4" in five.message and _more(five.message) is None
    [whole] = _of(_watch(_local(run, problems=_problems(ledger_file, 1, line=0, held=""))), "run-file-ledger")
    assert not re.search(r"\bline \d", whole.message) and "held" not in whole.message


# --------------------------------------------------------------------------- checkpoints set aside

def test_each_checkpoint_set_aside_is_its_own_event_keyed_by_its_tag_and_time(run) -> None:
    records = (set_aside_record(1_700_000_000.0, "global_step10", "/aside/one", "no manifest"),
               set_aside_record(1_700_000_100.9, "Odd-Tag-1_x", "/aside/two", "layer01 is missing"))
    aside = _of(_watch(_local(run, set_aside=records)), "checkpoint-set-aside")
    assert [a.condition for a in aside] == ["checkpoint-set-aside:global_step10@1700000000",
                                            "checkpoint-set-aside:Odd?Tag?1_x@1700000100"]
    ten, odd = aside
    assert "10" in ten.headline and "Odd-Tag-1_x" in odd.message and "/aside/two" in odd.message
    assert all(CONTACT in a.message and JOB in a.message for a in aside)


def set_aside_record(time: float, tag: str, folder: str, reason: str):
    from bigscience_ops.checkpoints.set_aside import SetAside

    return SetAside(time, tag, folder, reason)


# --------------------------------------------------------------------------- where a run stands, from its folder

def test_a_latest_that_names_nothing_leaves_the_run_at_its_newest_save_else_at_zero(run, tmp_path: Path) -> None:
    from bigscience_ops.checkpoints import layout
    from tests.fixtures_runs import commit_checkpoint

    checkpoints = Path(run.experiment.paths.checkpoints)
    checkpoints.mkdir(parents=True)
    (checkpoints / layout.LATEST).write_text("garbage")  # reads as no step at all
    assert lifecycle.run_state(run.experiment).iteration == 0
    (checkpoints / layout.LATEST).unlink()
    (checkpoints / layout.LATEST).symlink_to(tmp_path / "elsewhere")  # cannot even be read for its step
    state = lifecycle.run_state(run.experiment)
    [problem] = state.problems
    assert state.iteration == 0 and "None" not in problem.what and "global_step" not in problem.what.split(";")[-1]
    for step in (10, 20):
        (checkpoints / f"global_step{step}").mkdir()
        (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(checkpoints / f"global_step{step}")
    state = lifecycle.run_state(run.experiment)
    [problem] = state.problems
    assert state.iteration == 20 and "global_step20" in problem.what and "None" not in problem.what
    # `latest` names a folder that is not a complete checkpoint: the error names it (no file to cut off its words)
    (checkpoints / "global_step30").mkdir()
    (checkpoints / layout.LATEST).unlink()
    (checkpoints / layout.LATEST).write_text("global_step30")
    [problem] = lifecycle.run_state(run.experiment).problems
    assert "global_step30" in problem.what and str(checkpoints) not in problem.what


def test_a_ledger_of_only_unreadable_lines_is_a_launched_run_and_the_timeout_is_kept(run) -> None:
    output = Path(run.experiment.paths.output)
    (output / ledger.LEDGER_NAME).write_text('{"kind": "begin", "job_id": \n')
    state = lifecycle.run_state(run.experiment, timeout=4.5)
    assert state.launched and state.last_task is None and len(state.problems) == 1 and state.timeout == 4.5


def test_a_backup_store_that_cannot_be_found_is_a_problem_of_the_whole_store(trainings: Path, tmp_path: Path) -> None:
    from bigscience_ops.checkpoints import layout

    (trainings / "kept.yaml").write_text(tiny_yaml(tmp_path / "kept", 'backup: {dest: "%s"}\n' % (tmp_path / "store")))
    exp = load_experiment("kept", trainings)
    checkpoints = Path(exp.paths.checkpoints)
    checkpoints.mkdir(parents=True)
    (checkpoints / layout.RUN_ID).write_text("garbage")
    [problem] = lifecycle.run_state(exp).problems
    assert (problem.file, problem.line) == (str(tmp_path / "store"), 0)
    assert str(checkpoints / layout.RUN_ID) in problem.what and "garbage" in problem.what


SACCT_RECORD = "300_2|TIMEOUT|0:0\n300_2.batch|CANCELLED|0:15\n"


def _stand_in(folder: Path, name: str, body: str) -> None:
    """`folder/name`, a Python program standing in for a Slurm command at the subprocess edge."""
    import sys

    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!{sys.executable}\n{body}")
    (folder / name).chmod(0o755)


def _ended(run: lifecycle.RunState, job_id: str, exit_code: int | None = 1, **changes) -> str | None:
    task = ledger.Attempt(job_id, "n1", 0, None, exit_code, started=NOW.timestamp())
    return dataclasses.replace(run, last_task=task, **changes).ended


def test_how_a_task_ended_asks_sacct_within_the_timeout_and_never_for_a_local_id(run, tmp_path: Path,
                                                                                 monkeypatch) -> None:
    bin_dir, asked = tmp_path / "bin", tmp_path / "asked"
    _stand_in(bin_dir, "sacct", f"import sys, time\nopen({str(asked)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                                "if '--jobs=300_3' in sys.argv: time.sleep(1.5)\n"
                                f"if '--jobs=300_2' in sys.argv or '--jobs=300_3' in sys.argv: "
                                f"print({SACCT_RECORD!r}.replace('300_2', sys.argv[-1][7:]), end='')\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert _ended(run, "300_2") == "TIMEOUT (exit code 0:0, from sacct)"
    assert _ended(run, "300_1") == "task 300_1 ended with exit code 1"  # sacct has no record of it
    assert _ended(run, "300_3", timeout=0.3) == "task 300_3 ended with exit code 1"  # sacct too slow: not waited for
    asked.unlink()
    assert "sacct" not in _ended(run, "local-1") and not asked.exists()


STEPD = "slurmstepd: error: *** JOB {id} ON n1 CANCELLED AT {at}{why} ***"


def test_how_a_task_ended_is_read_from_the_end_of_its_output_file(run, tmp_path: Path, monkeypatch) -> None:
    """No accounting (the run launched here: sacct is never asked): the task's output file in the logs folder."""
    logs = Path(run.experiment.paths.logs)
    logs.mkdir(parents=True, exist_ok=True)
    here = dataclasses.replace(run, local=True)

    def ended(job_id: str, text: bytes, exit_code: int | None = 1) -> str:
        (logs / f"{run.experiment.slurm.job_name}-{job_id}.out").write_bytes(text)
        found = _ended(here, job_id, exit_code)
        assert found is not None and "None" not in found
        return found

    assert "CANCELLED" not in _ended(here, "1_1") and "None" not in _ended(here, "1_1")  # no output file
    first = STEPD.format(id="1_2", at="2026-11-22T08:00:00", why="").split(": ")[-1].encode()  # at its first byte
    assert re.search(r"CANCELLED at 2026-11-22T08:00:00\b", ended("1_2", first))  # no reason given
    two = "\n".join([STEPD.format(id="1_3", at="2026-11-22T07:00:00", why=""), "requeued",
                     STEPD.format(id="1_3", at="2026-11-22T09:00:00", why=" DUE TO TIME LIMIT")]).encode()
    found = ended("1_3", b"\xff\xfe not utf-8\n" + two, exit_code=None)
    assert "DUE TO TIME LIMIT" in found and "09:00:00" in found and "07:00:00" not in found  # the last one
    tail = b"x" * 70_000 + b"\n" + STEPD.format(id="1_4", at="2026-11-22T10:00:00", why="").encode()
    assert "10:00:00" in ended("1_4", tail)  # its last line whole, the file longer than what is read
    (logs / f"{run.experiment.slurm.job_name}-sub").mkdir()
    (logs / f"{run.experiment.slurm.job_name}-sub" / "5.out").write_bytes(first)
    assert "CANCELLED" not in _ended(here, "sub/5")  # an id that is no plain name: no file outside the folder read


# --------------------------------------------------------------------------- what the watchdog checks besides the run

def test_cron_chains_the_watchdog_cannot_check_are_an_alert_naming_why_and_whom(run, tmp_path: Path,
                                                                              monkeypatch) -> None:
    cron = tmp_path / "cron"
    cron.mkdir()
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    [alert] = _of(_watch(_local(run), cron_dir=cron), "cron-chain")
    assert str(cron) in alert.message and "no-such-slurm" in alert.message and CONTACT in alert.message
    # squeue slower than the watchdog's timeout: not waited for, and said
    monkeypatch.delenv("SLURM_CONF")
    _stand_in(tmp_path / "bin", "squeue", "import time\ntime.sleep(3)\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    [alert] = _of(_watch(_local(run), cron_dir=cron, timeout=0.3), "cron-chain")
    assert str(cron) in alert.message


def _line(iteration: int, *, loss: float = 3.0, skipped: int = 0) -> str:
    from bigscience_ops.run.iterations import IterationStats, iteration_line

    return iteration_line(IterationStats(iteration, 100, iteration * 8, iteration * 8 * 128, 1000.0, 1e-4, 8, loss,
                                         1.0, 1.0, 100.0, skipped, 0, 10.0, 1.0))


def test_training_health_alerts_use_the_settings_given_the_runs_name_and_a_bounded_tail(run, tmp_path: Path) -> None:
    from bigscience_ops.schema import HealthConfig

    log = tmp_path / "main_log.txt"
    log.write_text(f"{_line(1)}\n{_line(2, loss=float('nan'))}\n")
    [nan] = _of(_watch(_local(run), log_path=log, health=HealthConfig()), "health-nan")
    assert CONTACT in nan.message and f"bsops samples {run.experiment.name} --iteration 2" in nan.advice
    named = _of(_watch(_local(run), log_path=log, health=HealthConfig(), experiment="other"), "health-nan")
    assert "bsops samples other --iteration 2" in named[0].advice
    log.write_text(f"{_line(1)}\n{_line(2, skipped=1)}\n")  # skipped steps: an alert only as the settings say
    eager = HealthConfig(skipped_lines=1, initial_search=0)
    [skipped] = _of(_watch(_local(run), log_path=log, health=eager), "health-skipped")
    assert CONTACT in skipped.message
    assert not any(a.kind.startswith("health") for a in _watch(_local(run), log_path=log,
                                                                 health=HealthConfig()).report.alerts)
    # (window + recent) * 4 lines are read back: a NaN further up is history, not now
    short = HealthConfig(window=2, recent=1)
    for filler, found in ((11, 1), (12, 0)):
        log.write_text(f"{_line(2, loss=float('nan'))}\n" + "a line between iterations\n" * filler)
        assert len(_of(_watch(_local(run), log_path=log, health=short), "health-nan")) == found


def test_a_log_the_health_check_cannot_read_is_an_alert_naming_it_and_why(run, tmp_path: Path) -> None:
    from bigscience_ops.ops.tell.quoting import quote_untrusted
    from bigscience_ops.run import log as runlog
    from bigscience_ops.schema import HealthConfig

    log = tmp_path / "main_log.txt"
    (tmp_path / "real.txt").write_text("")
    log.symlink_to(tmp_path / "real.txt")
    with pytest.raises(runlog.LogError) as raised:
        runlog.tail(log, 10)
    why = quote_untrusted(str(raised.value), 400, mark=False)
    [alert] = _of(_watch(_local(run), log_path=log, health=HealthConfig()), "health-unreadable")
    assert why in alert.message and str(log) in alert.message.replace(why, "") and CONTACT in alert.message


# --------------------------------------------------------------------------- evaluation results

def _evaluated(run: lifecycle.RunState, **eval_changes) -> lifecycle.RunState:
    from tests.fixtures_runs import commit_checkpoint
    from tests.evaluate.test_ops_evaluate_results import write_results

    exp = run.experiment
    checkpoints, output = Path(exp.paths.checkpoints), Path(exp.paths.output)
    for step in (100, 200):
        (checkpoints / f"global_step{step}").mkdir(parents=True)
        (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(checkpoints / f"global_step{step}")
    write_results(output, {100: {"smoke_choice/acc": 0.50}, 200: {"smoke_choice/acc": 0.40}})
    exp = dataclasses.replace(exp, eval=dataclasses.replace(exp.eval, **eval_changes))
    return _local(run, experiment=exp)


def test_an_eval_drop_is_an_alert_per_metric_with_the_runs_rollback(run) -> None:
    evaluated = _evaluated(run, alert_drop={"smoke_choice/acc": 0.05})
    [drop] = _of(_watch(evaluated), "eval-drop")
    name = run.experiment.name
    assert drop.condition == "eval-drop:smoke_choice/acc" and CONTACT in drop.message
    assert "smoke_choice/acc" in drop.message and "0.4" in drop.message and "None" not in drop.message
    assert f"bsops samples {name} --iteration N" in drop.advice and "EXP" not in drop.advice
    [named] = _of(_watch(evaluated, experiment="other"), "eval-drop")
    assert "bsops samples other --iteration N" in named.advice


def test_eval_result_files_that_cannot_be_read_are_named_and_counted(run) -> None:
    evaluated = _evaluated(run, tasks=["lambada_openai"])  # evaluated, no drop alerted on: still read
    output = Path(run.experiment.paths.output)
    torn = [output / "eval" / f"global_step{step}.json" for step in (310, 320, 330, 340, 350, 360)]
    for file in torn:
        file.write_text('{"results": {"x": ')
    [alert] = _of(_watch(evaluated), "eval-result-file")
    assert JOB in alert.message and CONTACT in alert.message and _more(alert.message) == 1
    assert sum(str(file) in alert.message for file in torn) == 5
    assert run.experiment.name in alert.advice and "EXP" not in alert.advice
    torn[-1].unlink()
    [alert] = _of(_watch(evaluated), "eval-result-file")
    assert _more(alert.message) is None and all(str(file) in alert.message for file in torn[:5])
    exp = evaluated.experiment
    idle = dataclasses.replace(evaluated, experiment=dataclasses.replace(exp, eval=dataclasses.replace(exp.eval,
                                                                                                        tasks=[], sources={})))
    assert _of(_watch(idle), "eval-result-file") == []  # evaluates nothing and alerts on no drop: not read


# --------------------------------------------------------------------------- the channels, the alert state, the lines

HOOK = "BSOPS_KILLS_WATCH_HOOK"


def test_each_channel_is_told_with_the_env_given_and_an_event_one_channel_missed_is_told_again(
        run, tmp_path: Path, plain_server, webhook_server, cert) -> None:
    """Email and a webhook whose URL is only in the `env` handed to the watchdog (never os.environ): without it the
    webhook fails and says so, each line naming where its message went; given it, the checkpoint set aside that the
    webhook missed is told there too, once."""
    from tests.fixtures_smtp import plain_outbox

    inbox, port = plain_server
    outbox = plain_outbox(port, webhook_env=HOOK, ca_file=cert[0])
    assert HOOK not in os.environ
    log, state = tmp_path / "main_log.txt", tmp_path / "alerts" / "state.json"
    log.write_text("")
    aside = _local(run, set_aside=(set_aside_record(1_700_000_000.0, "global_step10", "/aside/one", "no manifest"),))
    first = _watch(aside, log_path=log, outbox=outbox, state_path=state, env={})
    assert [(n.channels, n.error is None) for n in first.notices] == [(("email",), True), (("webhook",), False)]
    assert len(inbox.messages) == 1 and webhook_server.posts == [] and HOOK in first.email_error
    assert all(line.startswith(first.report.stamp) for line in first.lines)
    email, hook = outbox.destinations(["email"]), outbox.destinations(["webhook"])
    [sent] = [line for line in first.lines if first.notices[0].message_id in line and email in line]
    [failed] = [line for line in first.lines if hook in line]
    assert hook not in sent and email not in failed and HOOK in failed
    assert state.is_file() and not (tmp_path / ".bsops-alerts.json").exists()  # the state where it was asked to be
    assert (tmp_path / "watchdog.log").read_text().splitlines() == list(first.lines)
    told_once = _dry_watch(aside, tmp_path, log_path=log, outbox=outbox, state_path=state,
                           env={HOOK: webhook_server.url})
    [again] = _of(told_once, "checkpoint-set-aside")  # told by email only: the webhook would still be told
    assert CONTACT in again.message
    second = _watch(aside, log_path=log, outbox=outbox, state_path=state, env={HOOK: webhook_server.url})
    assert _of(second, "checkpoint-set-aside") and len(webhook_server.posts) == 1 and len(inbox.messages) == 1
    assert second.email_error is None and second.exit_code == 1
    told_everywhere = _dry_watch(aside, tmp_path, log_path=log, outbox=outbox, state_path=state,
                                 env={HOOK: webhook_server.url})
    assert _of(told_everywhere, "checkpoint-set-aside") == []  # the dry run reads what the state says was told
    third = _watch(aside, log_path=log, outbox=outbox, state_path=state, env={HOOK: webhook_server.url})
    assert _of(third, "checkpoint-set-aside") == []  # told on every channel
    assert len(webhook_server.posts) == 1 and len(inbox.messages) == 1


def _dry_watch(run: lifecycle.RunState, folder: Path, **settings):
    """`bsops status --dry-run`: what the watchdog would say, with nothing sent, logged or written (the folder's
    files, the alert state among them, are as they were)."""
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    result = _watch(run, dry_run=True, **settings)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert result.notices == () and result.email_error is None
    assert result.lines == result.report.lines and result.lines
    return result


def test_a_dry_run_without_channels_tells_each_checkpoint_set_aside(run, tmp_path: Path) -> None:
    aside = _local(run, set_aside=(set_aside_record(1_700_000_000.0, "global_step10", "/aside/one", "no manifest"),))
    [alert] = _of(_dry_watch(aside, tmp_path, state_path=tmp_path / "state.json"), "checkpoint-set-aside")
    assert CONTACT in alert.message and "/aside/one" in alert.message


def test_a_dry_run_without_a_run_folder_asks_the_queue_and_reads_no_state(tmp_path: Path) -> None:
    from bigscience_ops.ops.watch import watchdog

    settings = watchdog.WatchSettings(JOB, contact=CONTACT, dry_run=True, state_path=tmp_path / "state.json")
    result = watchdog.watch(settings, run=None, now=NOW, env={}, query=lambda **kw: [])
    assert result.notices == () and result.lines == result.report.lines and not list(tmp_path.iterdir())
    assert [a.kind for a in result.report.alerts] == ["not-scheduled"], result.report.alerts


def test_a_mail_without_a_log_names_none(run, tmp_path: Path, plain_server) -> None:
    from tests.fixtures_smtp import plain_outbox

    inbox, port = plain_server
    result = _watch(_local(run, launched=True), outbox=plain_outbox(port), state_path=tmp_path / "state.json")
    assert [n.kind for n in result.notices] == ["alert"]
    [mail] = inbox.messages
    assert "None" not in mail.get_content()


def _empty_log(tmp_path: Path) -> Path:
    """logs/main_log.txt of a run that has written nothing yet (the alert state and watchdog.log go beside it)."""
    log = tmp_path / "logs" / "main_log.txt"
    log.parent.mkdir()
    log.write_text("")
    return log


def test_files_the_watchdog_cannot_write_beside_the_log_go_to_the_state_folder_of_the_env_given(
        run, tmp_path: Path, plain_server) -> None:
    inbox, port = plain_server
    log = _empty_log(tmp_path)
    env = {"XDG_STATE_HOME": str(tmp_path / "given-xdg")}
    usual = default_state_path(log)
    away_state, away_log = alert_state.elsewhere(usual, JOB, env)
    (log.parent / "watchdog.log").mkdir()  # no watchdog.log can be written beside the log
    result = _watch(_local(run, launched=True), log_path=log, outbox=plain_outbox(port), env=env)
    [moved] = _of(result, "watch-files-moved")
    assert str(usual) in moved.message and JOB in moved.message and CONTACT in moved.message
    assert str(away_state.parent) in moved.message
    assert away_state.is_file() and away_log.read_text().splitlines() == list(result.lines)
    assert len(inbox.messages) == 1


def test_an_alert_state_that_cannot_be_replaced_beside_the_log_moves_to_the_env_given(run, tmp_path: Path,
                                                                                      plain_server, webhook_server,
                                                                                      cert) -> None:
    """The log's folder is writable but the state's new copy cannot be put there (a folder where it goes): nothing
    sent yet, the state moves to the state folder of `env` with its lines, and that is an alert of its own."""
    inbox, port = plain_server
    log = _empty_log(tmp_path)
    env = {"XDG_STATE_HOME": str(tmp_path / "given-xdg"), HOOK: webhook_server.url}
    usual = default_state_path(log)
    usual.with_name(f".{usual.name}.{os.getpid()}.tmp").mkdir()  # where write_atomically puts the new copy
    away_state, away_log = alert_state.elsewhere(usual, JOB, env)
    outbox = plain_outbox(port, webhook_env=HOOK, ca_file=cert[0])
    result = _watch(_local(run, launched=True), log_path=log, outbox=outbox, env=env)
    [moved] = _of(result, "watch-files-moved")
    assert str(usual) in moved.message and CONTACT in moved.message and result.email_error is None
    assert [(n.kind, n.channels) for n in result.notices] == [("alert", ("email", "webhook"))]
    assert len(inbox.messages) == 1 and len(webhook_server.posts) == 1
    assert away_state.is_file() and away_log.read_text().splitlines() == list(result.lines)
    assert not (log.parent / "watchdog.log").exists() or (log.parent / "watchdog.log").read_text() == ""


@pytest.mark.parametrize("beside", ["unwritable", "its state not"])
def test_an_alert_state_that_cannot_be_written_anywhere_is_the_error_naming_it(run, tmp_path: Path, plain_server,
                                                                              beside: str) -> None:
    inbox, port = plain_server
    log = _empty_log(tmp_path)
    env = {"XDG_STATE_HOME": str(tmp_path / "given-xdg")}
    usual = default_state_path(log)
    away_state, _ = alert_state.elsewhere(usual, JOB, env)
    away_state.parent.mkdir(parents=True)
    away_state.with_name(f".{away_state.name}.{os.getpid()}.tmp").mkdir()
    if beside == "unwritable":
        (log.parent / "watchdog.log").mkdir()
    else:
        usual.with_name(f".{usual.name}.{os.getpid()}.tmp").mkdir()
    result = _watch(_local(run, launched=True), log_path=log, outbox=plain_outbox(port), env=env)
    assert str(away_state) in result.email_error and result.exit_code == 2 and inbox.messages == []
    [line] = [line for line in result.lines if str(away_state) in line]
    assert line.startswith(result.report.stamp)


def test_an_alert_state_that_cannot_be_read_nor_set_aside_is_the_error_naming_it(run, tmp_path: Path,
                                                                                 plain_server) -> None:
    from bigscience_ops.ops.tell import alert_state
    from tests.fixtures_smtp import plain_outbox

    inbox, port = plain_server
    state = tmp_path / "state.json"
    state.write_bytes(b"{not json")
    now = datetime.now()
    for second in range(300):  # every name it would be set aside as, for the next minutes
        (tmp_path / f"{state.name}{alert_state.UNREADABLE}{now + timedelta(seconds=second):%Y%m%d-%H%M%S}").mkdir()
    result = _watch(_local(run, launched=True), outbox=plain_outbox(port), state_path=state)
    [unreadable] = _of(result, "alert-state")
    assert str(state) in unreadable.message and CONTACT in unreadable.message
    assert str(state) in result.email_error and result.exit_code == 2 and inbox.messages == []


def test_a_local_runs_line_says_when_its_launcher_has_ended(run) -> None:
    line = "bsops launch --local (pid 4711 on n7) since 2026-11-22T09:00:00"
    gone = Holding(line, pids=(4712, 4713), trainers=(4713,), host="n7", names=((4712, "tee"), (4713, "python3")))
    [said] = local_run.evaluate(JOB, gone, run, now=NOW).lines
    assert said.count("4711") == 2  # in the launcher's own line, and said gone
    there = Holding(line, pids=(4712, 4713), trainers=(4713,), host="n8")  # the launcher is of another host
    [said] = local_run.evaluate(JOB, there, run, now=NOW).lines
    assert said.count("4711") == 1


def test_a_latest_naming_step_zero_that_is_not_there_leaves_the_run_at_zero(run) -> None:
    from bigscience_ops.checkpoints import layout

    checkpoints = Path(run.experiment.paths.checkpoints)
    checkpoints.mkdir(parents=True)
    layout.write_latest(checkpoints, "global_step0")  # a warm start's step, its folder gone
    state = lifecycle.run_state(run.experiment)
    assert state.iteration == 0 and len(state.problems) == 1 and not state.warm_start
