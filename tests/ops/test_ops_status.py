"""Watchdog decisions in bigscience_ops.ops.watch.status, over recorded squeue output and real log files."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bigscience_ops import slurm
from bigscience_ops.ops.watch import status
from tests.fixtures_slurm import recorded_squeue, replay_squeue
from tests.fixtures_status import ITERATION, seed_job

ASSETS = Path(__file__).parents[1] / "assets" / "slurm"
LONG_NAME = "tr1-13B-round3-a-job-name-longer-than-forty-characters"
NOW = datetime(2026, 11, 22, 3, 42, 0)  # just after the recording was made


@pytest.fixture(scope="module")
def jobs() -> list[slurm.Job]:
    return recorded_squeue("squeue.txt")


@pytest.fixture(scope="module")
def ids() -> dict[str, str]:
    return json.loads((ASSETS / "ids.json").read_text())


def test_running_line_has_the_seed_shape() -> None:
    report = status.evaluate("tr1-13B-round3", [seed_job()], now=datetime(2021, 8, 16, 22, 8, 1))
    assert report.exit_code == status.EXIT_HEALTHY and report.alerts == ()
    assert report.lines == ("[2021-08-16 22:08:01] tr1-13B-round3 is running for 18:15:59 since "
                            "2021-08-16T03:52:02 (711114_4 on 'gpu_p13' partition (r7i4n[1-7],r7i7n[1-8],r8i0n0))",)


def test_missing_job_gives_the_seed_alert(jobs: list[slurm.Job]) -> None:
    report = status.evaluate("tr1-13B-round3", jobs, now=NOW)
    assert report.exit_code == status.EXIT_ALERT
    assert [a.condition for a in report.alerts] == ["not-scheduled"]
    assert report.lines == ("[2026-11-22 03:42:00] ***ALERT: tr1-13B-round3 is not RUNNING or SCHEDULED! "
                            "Alert someone at the on-call person***",)
    other = status.evaluate("x", [], now=NOW, contact="the on-call list")
    assert other.alerts[0].message.endswith("Alert someone at the on-call list***")


def test_long_named_array_running_and_waiting(jobs: list[slurm.Job], ids: dict[str, str]) -> None:
    report = status.evaluate(LONG_NAME, jobs, now=NOW)
    assert report.exit_code == 0 and len(report.lines) == 3
    running, *waiting = report.lines
    assert f"{LONG_NAME} is running for 0:00:01 since 2026-11-22T03:41:51 ({ids['array']}_1 on 'bsops'" in running
    assert any("previous job array task" in line and f"{ids['array']}_[2-5%1]" in line for line in waiting)
    assert any("dependency" in line and f"{ids['chained_array']}_[1-5%1]" in line for line in waiting)
    # A prefix of the name is a different job: names are compared whole, never cut to a width.
    assert status.evaluate(LONG_NAME[:40], jobs, now=NOW).exit_code == status.EXIT_ALERT


@pytest.mark.parametrize(("name", "words"), [
    ("rec-dependency", "waiting for its dependency"),
    ("rec-begin", "scheduled to start in 1:59:50 (at 2026-11-22T05:41:50; reason: BeginTime)"),
    ("rec-resources", "scheduled to start in 0:04:51"),
    ("rec-priority", "reason: Priority"),
    ("rec name with spaces | and a pipe", "scheduled to start in 0:59:50"),
])
def test_scheduled_jobs_are_healthy(jobs: list[slurm.Job], name: str, words: str) -> None:
    report = status.evaluate(name, jobs, now=NOW)
    assert report.exit_code == status.EXIT_HEALTHY, report.lines
    assert len(report.lines) == 1 and words in report.lines[0]
    assert report.lines[0].startswith(f"[2026-11-22 03:42:00] {name} ")


@pytest.mark.parametrize(("name", "key", "reason", "headline"), [
    ("rec-held-admin", "held_admin", "JobHeldAdmin", "release held array {id} (scontrol release {id})"),
    ("rec-held-user", "held_user", "JobHeldUser", "release held array {id} (scontrol release {id})"),
    ("rec-never-satisfied", "never", "DependencyNeverSatisfied", "cancel array {id} and launch again (scancel {id})"),
    ("rec-partition-down", "partition_down", "PartitionDown", "cancel array {id} and launch again (scancel {id})"),
])
def test_never_starting_jobs_alert(jobs: list[slurm.Job], ids: dict[str, str], name: str, key: str, reason: str,
                                   headline: str) -> None:
    """A job that will never start is the alert, and its headline says what to do with it: launching again
    ("not running or scheduled") beside a held array would queue a second one, so that alert is left out."""
    report = status.evaluate(name, jobs, now=NOW)
    assert report.exit_code == status.EXIT_ALERT
    [alert] = report.alerts
    assert alert.condition == "never-starts" and alert.headline.startswith(headline.format(id=ids[key]))
    assert reason in report.lines[0] and headline.split(" (")[1].format(id=ids[key]).rstrip(")") in report.lines[0]
    assert report.lines[1].endswith(f"{ids[key]} ({reason})! Alert someone at the on-call person***")
    if reason.startswith("JobHeld"):
        assert "launch" not in alert.headline and "do not launch again" in alert.advice


def test_a_broken_chain_behind_a_running_task_still_alerts() -> None:
    chained = seed_job(job_id="720000_[1-5%1]", array_job_id="720000", array_task="1-5%1", state="PENDING",
                       reason="DependencyNeverSatisfied", dependency="afterok:711114_4(failed)", nodes="",
                       elapsed_s=0, start_time=None)
    report = status.evaluate("tr1-13B-round3", [seed_job(), chained], now=datetime(2021, 8, 16, 22, 8, 1))
    assert [a.condition for a in report.alerts] == ["never-starts"]
    assert "720000_[1-5%1] (DependencyNeverSatisfied)" in report.alerts[0].message


def test_two_running_trainings_alert_overlap() -> None:
    other = seed_job(job_id="720001", array_job_id="720001", array_task=None)
    report = status.evaluate("tr1-13B-round3", [seed_job(), other], now=datetime(2021, 8, 16, 22, 8, 1))
    assert [a.condition for a in report.alerts] == ["overlap"]


def test_other_states_are_not_scheduled() -> None:
    report = status.evaluate("tr1-13B-round3", [seed_job(state="SUSPENDED")], now=datetime(2021, 8, 17))
    assert [a.condition for a in report.alerts] == ["not-scheduled"]
    assert "state SUSPENDED" in report.lines[0]


# --- stall detection on real files ---------------------------------------------------------------

def write_log(path: Path, lines: list[str], mtime: datetime) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    os.utime(path, (mtime.timestamp(), mtime.timestamp()))
    return path


def running_since(minutes: float) -> slurm.Job:
    return seed_job(start_time=NOW - timedelta(minutes=minutes), elapsed_s=int(minutes * 60))


def test_recent_iteration_is_healthy(tmp_path: Path) -> None:
    log = write_log(tmp_path / "main_log.txt", ["loading", ITERATION], NOW - timedelta(minutes=10))
    report = status.evaluate("tr1-13B-round3", [running_since(600)], now=NOW, log_path=log, stall_minutes=30)
    assert report.exit_code == status.EXIT_HEALTHY


def test_watchdog_lines_after_the_last_iteration_date_the_stall(tmp_path: Path) -> None:
    # The watchdog's own lines are appended to the same log, so the mtime is recent; the first
    # stamped line after the last iteration proves no progress since then.
    earlier = NOW - timedelta(hours=2)
    lines = [ITERATION, f"[{earlier:%Y-%m-%d %H:%M:%S}] tr1-13B-round3 is running for 9:00:00 ...",
             "a traceback line with no stamp",
             f"[{NOW - timedelta(hours=1):%Y-%m-%d %H:%M:%S}] tr1-13B-round3 is running for 10:00:00 ..."]
    log = write_log(tmp_path / "main_log.txt", lines, NOW - timedelta(minutes=1))
    progress = status.read_progress(log)
    assert progress.last_iteration == ITERATION.strip() and progress.seen_after == earlier
    report = status.evaluate("tr1-13B-round3", [running_since(600)], now=NOW, log_path=log, stall_minutes=60)
    assert [a.condition for a in report.alerts] == ["stalled"]
    assert "for 2:00:00 (limit 60 min)" in report.alerts[0].message
    assert report.exit_code == status.EXIT_ALERT


def test_a_new_task_is_not_stalled_by_the_previous_tasks_gap(tmp_path: Path) -> None:
    log = write_log(tmp_path / "main_log.txt", [ITERATION], NOW - timedelta(hours=5))
    fresh = status.evaluate("tr1-13B-round3", [running_since(5)], now=NOW, log_path=log, stall_minutes=30)
    assert fresh.exit_code == status.EXIT_HEALTHY
    hung = status.evaluate("tr1-13B-round3", [running_since(45)], now=NOW, log_path=log, stall_minutes=30)
    assert [a.condition for a in hung.alerts] == ["stalled"] and "0:45:00" in hung.alerts[0].message


def test_missing_log_or_no_iteration_yet(tmp_path: Path) -> None:
    gone = status.evaluate("tr1-13B-round3", [running_since(90)], now=NOW,
                           log_path=tmp_path / "nope.txt", stall_minutes=60)
    assert [a.condition for a in gone.alerts] == ["stalled"] and "does not exist" in gone.alerts[0].message
    log = write_log(tmp_path / "main_log.txt", ["building indices"], NOW)
    empty = status.evaluate("tr1-13B-round3", [running_since(90)], now=NOW, log_path=log, stall_minutes=60)
    assert "has no iteration line" in empty.alerts[0].message
    young = status.evaluate("tr1-13B-round3", [running_since(10)], now=NOW, log_path=log, stall_minutes=60)
    assert young.exit_code == status.EXIT_HEALTHY


def test_last_iteration_found_far_back_in_a_big_log(tmp_path: Path) -> None:
    stamp = NOW - timedelta(hours=3)
    filler = [f"[{stamp:%Y-%m-%d %H:%M:%S},123] [INFO] [stage] evaluating batch {i}" for i in range(20000)]
    log = write_log(tmp_path / "main_log.txt", [ITERATION.replace("168000", "1"), ITERATION, *filler], NOW)
    assert log.stat().st_size > 1 << 20
    progress = status.read_progress(log)
    assert progress.last_iteration == ITERATION.strip() and progress.seen_after == stamp


def test_pending_jobs_are_not_checked_for_stalls(tmp_path: Path) -> None:
    waiting = seed_job(state="PENDING", reason="Priority", start_time=None, nodes="")
    report = status.evaluate("tr1-13B-round3", [waiting], now=NOW, log_path=tmp_path / "nope", stall_minutes=1)
    assert report.exit_code == status.EXIT_HEALTHY


# --- check(): the query, and a failing query ----------------------------------------------------

def test_check_asks_for_the_groups_users_and_evaluates() -> None:
    asked = {}

    def query(*, users: list[str], timeout: float) -> list[slurm.Job]:
        asked.update(users=users, timeout=timeout)
        return [seed_job()]

    report = status.check("tr1-13B-round3", group="root", users=["stas"], query=query, timeout=7,
                          now=datetime(2021, 8, 16, 22, 8, 1))
    assert report.exit_code == 0 and "root" in asked["users"] and "stas" in asked["users"]
    assert asked["timeout"] == 7


def test_a_slurm_that_cannot_be_asked_is_an_alert_with_exit_code_2(monkeypatch: pytest.MonkeyPatch) -> None:
    # Real squeue with a configuration it cannot read retries for a minute; the timeout ends it.
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    report = status.check("tr1-13B-round3", timeout=1, now=NOW)
    assert report.exit_code == status.EXIT_ERROR
    assert [a.condition for a in report.alerts] == ["slurm-error"]
    assert report.lines[0].startswith("[2026-11-22 03:42:00] ***ALERT: cannot query Slurm for tr1-13B-round3")
    assert "squeue" in report.lines[0] and "\n" not in report.lines[0]


def test_an_unknown_group_is_reported_not_raised() -> None:
    report = status.check("x", group="no-such-group-bsops", query=lambda **_: [], now=NOW)
    assert report.exit_code == status.EXIT_ERROR and "no-such-group-bsops" in report.alerts[0].message


def test_append_to_log_feeds_the_next_stall_check(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "main_log.txt"
    status.append_to_log(log, [ITERATION])
    earlier = NOW - timedelta(hours=2)
    status.append_to_log(log, status.evaluate("tr1-13B-round3", [running_since(600)], now=earlier).lines)
    status.append_to_log(log, ["[2026-11-22 03:00:00] another line"])
    text = log.read_text()
    assert text.count("\n") == 3 and text.startswith(ITERATION)
    assert status.read_progress(log).seen_after == earlier


def test_a_queue_with_hostile_names_still_shows_the_training_and_counts_what_it_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs named with U+2028, U+0085, U+001E, a real newline or a forged RUNNING record of tr1-13B (recorded
    on the test cluster, replayed by a stand-in squeue) neither blind the watchdog nor pass unnoticed: the
    training's real job is judged (held: it will never start), the forged one is not believed, and the
    entries skipped are counted in the output."""
    monkeypatch.setenv("PATH", f"{replay_squeue(tmp_path, 'squeue-hostile-names.txt')}:{os.environ['PATH']}")
    report = status.check("tr1-13B", now=NOW)
    conditions = {a.condition for a in report.alerts}
    assert "never-starts" in conditions and "slurm-error" not in conditions, report.lines
    assert not [line for line in report.lines if "is running" in line], report.lines  # the forged RUNNING record
    assert report.lines[-1].startswith("[2026-11-22 03:42:00] 10 squeue entries did not parse and were skipped: ")


# --- a log that ends badly: read within a bound, and said -----------------------------------------------------

def test_a_log_ending_in_nul_bytes_is_searched_within_a_bound_and_said(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    with open(log, "wb") as f:
        f.write((ITERATION + "\n").encode())
        f.truncate(1 << 40)  # a terabyte of NUL bytes after the last iteration line (sparse: no disk)
    os.utime(log, (NOW.timestamp(), NOW.timestamp()))
    progress = status.read_progress(log)
    assert progress.last_iteration is None and progress.searched == status.PROGRESS_BYTES
    report = status.evaluate("tr1-13B-round3", [running_since(90)], now=NOW, progress=progress, log_path=log,
                             stall_minutes=60)
    assert [a.condition for a in report.alerts] == ["stalled"]
    assert f"no iteration line in its last {status.PROGRESS_BYTES >> 20} MiB" in report.alerts[0].message
    small = status.read_progress(log, max_bytes=1 << 20)
    assert small.searched == 1 << 20 and small.last_iteration is None


def test_the_last_iteration_is_found_before_a_line_without_end(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes((ITERATION + "\n").encode() + b"x" * (3 << 20))
    assert status.read_progress(log).last_iteration == ITERATION.strip()
    log.write_bytes(b"\0" * 100 + ITERATION.encode())  # NULs before the line, no line break after it
    assert status.read_progress(log).last_iteration == ITERATION.strip()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_log_that_is_no_file_is_a_stall_that_names_it(tmp_path: Path, kind: str) -> None:
    log = tmp_path / "main_log.txt"
    os.mkfifo(log) if kind == "fifo" else log.mkdir()
    progress = status.read_progress(log)
    assert progress.exists and progress.problem is not None and "not a log file" in progress.problem
    report = status.evaluate("tr1-13B-round3", [running_since(90)], now=NOW, log_path=log, stall_minutes=60)
    assert [a.condition for a in report.alerts] == ["stalled"] and "cannot be read" in report.alerts[0].message


def test_a_stamp_that_is_no_date_is_passed_over(tmp_path: Path) -> None:
    log = write_log(tmp_path / "main_log.txt", [ITERATION, "[2021-13-45 99:99:99] not a date",
                                                "[2026-11-22 01:00:00] a real one"], NOW)
    assert status.read_progress(log).seen_after == datetime(2026, 11, 22, 1, 0, 0)


def test_watchdog_log_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "watchdog.log")
    with pytest.raises(status.runlog.LogError, match="cannot write"):
        status.append_to_log(tmp_path / "watchdog.log", ["line"])
    (tmp_path / "folder.log").mkdir()
    with pytest.raises(status.runlog.LogError, match="cannot write"):
        status.append_to_log(tmp_path / "folder.log", ["line"])


# --- the run's own jobs and look-alikes ------------------------------------------------------------------------

def test_a_job_of_the_name_that_the_run_never_submitted_is_a_look_alike() -> None:
    """A RUNNING job of the right name whose array the run never submitted is a job of another run: it is named
    so, and the run (nothing of it queued) is not scheduled."""
    other = seed_job(job_id="900001_1", array_job_id="900001", user="someone")
    report = status.evaluate("tr1-13B-round3", [other], now=NOW, job_ids={"711114"})
    assert [a.condition for a in report.alerts] == ["not-scheduled"]
    assert "is a job of another run with this name" in report.lines[0] and "900001" in report.lines[0]
    assert not [line for line in report.lines if "is running for" in line]
    ours = status.evaluate("tr1-13B-round3", [other, seed_job()], now=NOW, job_ids={"711114_3", "650000"})
    assert ours.exit_code == status.EXIT_HEALTHY and "is running for" in ours.lines[0]
    assert "another run" in ours.lines[1]
    assert status.evaluate("tr1-13B-round3", [other], now=NOW).exit_code == status.EXIT_HEALTHY  # no ids: by name


def test_array_ids_of_every_form() -> None:
    assert [status.array_id(i) for i in ("711114_4", "682842_[2-5%1]", "5+1", "712", " 9 ")] == [
        "711114", "682842", "5", "712", "9"]


def test_recorded_job_ids_come_from_the_ledger_and_the_launch_records(tmp_path: Path) -> None:
    from bigscience_ops.run import ledger

    assert status.recorded_job_ids(tmp_path) is None  # nothing recorded: by name alone
    ledger.mark_launch(tmp_path, "1000")
    ledger.mark_resize(tmp_path, "1000", 4, 300, "1001")
    with open(tmp_path / ledger.LEDGER_NAME, "a") as f:
        f.write('{"event": "begin", "job_id": "1002_3", "nodes": "n1", "iteration": 5, "time": 1.0}\n')
        f.write('{"event": "begin", "job_id": "local-77", "nodes": "", "iteration": 5, "time": 1.0}\n')
        f.write("torn line\n")
    for name, content in (("a", {"job_id": "1003"}), ("b", {"job_id": None, "error": "sbatch failed"}),
                          ("c", ["not", "an", "object"])):
        (tmp_path / "launches" / name).mkdir(parents=True)
        (tmp_path / "launches" / name / "sbatch.json").write_text(json.dumps(content))
    (tmp_path / "launches" / "d").mkdir()
    os.mkfifo(tmp_path / "launches" / "d" / "sbatch.json")  # never waited on
    assert status.recorded_job_ids(tmp_path) == {"1000", "1001", "1002", "1003"}


def test_check_tells_the_runs_jobs_from_look_alikes_by_what_its_folder_recorded(trainings: Path,
                                                                                tmp_path: Path) -> None:
    from bigscience_ops.run import ledger
    from bigscience_ops.config.loading import load_experiment
    from bigscience_ops.ops.watch import lifecycle
    from tests.fixtures_experiments import tiny_yaml

    (trainings / "x-backup.yaml").write_text(tiny_yaml(tmp_path / "run"))
    exp = load_experiment("x-backup", trainings)
    ledger.mark_launch(Path(exp.paths.output), "5000")
    run = lifecycle.run_state(exp)
    mine = seed_job(name="x-backup", job_id="5000_1", array_job_id="5000")
    theirs = seed_job(name="x-backup", job_id="6000_1", array_job_id="6000")
    hourly = seed_job(name=slurm.hourly_job_name("x", "backup"), job_id="7000", array_job_id="7000", array_task=None)
    gone = status.check("x-backup", query=lambda **_: [theirs, hourly], now=NOW, run=run)
    assert [a.condition for a in gone.alerts] == ["not-scheduled"] and "another run" in gone.lines[0]
    alive = status.check("x-backup", query=lambda **_: [theirs, mine, hourly], now=NOW, run=run)
    assert alive.exit_code == status.EXIT_HEALTHY
    given = status.evaluate("x-backup", [theirs], now=NOW, run=run, job_ids={"6000"})
    assert given.exit_code == status.EXIT_HEALTHY  # the caller's ids win over the folder's


def test_the_watchdog_says_it_cannot_write_its_log_and_still_reports(tmp_path: Path, monkeypatch) -> None:
    """A FIFO in watchdog.log's place: the check stands, the alert says where its lines go meanwhile (the user's state
    folder), and they go there."""
    from bigscience_ops.ops.tell import alert_state
    from bigscience_ops.ops.watch import watchdog

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    log = tmp_path / "main_log.txt"
    log.write_text("")
    os.mkfifo(tmp_path / "watchdog.log")
    job = seed_job()
    result = watchdog.watch(watchdog.WatchSettings(job.name, log_path=log), query=lambda **_: [job], now=NOW)
    assert [a.condition for a in result.report.alerts] == ["watch-files-moved"] and result.exit_code == 1
    assert str(tmp_path / "watchdog.log") in result.report.alerts[0].message
    _, elsewhere = alert_state.elsewhere(tmp_path / ".bsops-alerts.json", job.name)
    assert elsewhere.parent == tmp_path / "state" / "bsops" and elsewhere.read_text().splitlines() == list(result.lines)


def test_tasks_pending_on_drained_or_down_nodes_alert_once_they_have_waited_past_the_limit() -> None:
    """squeue's real reasons for nodes only an administrator brings back (recorded on a second cluster with a node
    drained and one down: record_drained.py) are waiting, healthy, until `blocked_minutes` after submission."""
    from bigscience_ops.slurm.output import blocked

    jobs = recorded_squeue("squeue-drained.txt")
    assert [blocked(j.reason) for j in jobs] == [True, True, True], [j.reason for j in jobs]
    assert not any(blocked(j.reason) for j in recorded_squeue("squeue.txt"))  # Resources, Priority, held, down...
    name, submitted = "rec-drained-training", jobs[0].submit_time
    fresh = status.evaluate(name, jobs, now=submitted + timedelta(minutes=90), blocked_minutes=120)
    assert fresh.exit_code == status.EXIT_HEALTHY and fresh.alerts == ()
    assert "waiting on nodes that only an administrator brings back, for 1:30:00 (reason: Nodes required" in \
        fresh.lines[0]
    old = status.evaluate(name, jobs, now=submitted + timedelta(hours=3), blocked_minutes=120)
    [alert] = old.alerts
    assert alert.condition == "pending-blocked" and "1_[2-3%1] (Nodes required for job are DOWN, DRAINED" in \
        alert.message and "has waited 3:00:00 (limit 120 min)" in alert.message
    assert status.evaluate(name, jobs, now=submitted + timedelta(hours=3)).alerts == ()  # no limit given: none
