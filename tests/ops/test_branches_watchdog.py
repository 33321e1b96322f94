"""The watchdog's alerts about its own failures, and the alert state's branches no other test runs (issue 51).

Each check runs `watchdog.watch` on a run folder of real files, launched here (so the run's processes, not a Slurm
queue, say it is not running: an alert to send), mailing a real SMTP server on loopback:
- the alert state unreadable and impossible to set aside; its lock a link, a FIFO or a folder;
- the alert state or watchdog.log impossible to write beside the log and in the user's state folder;
- the cron chains impossible to check (SLURM_CONF names no file), the log unreadable for the health check;
- the backup store's manifests or the run id it is found by unreadable;
and the alert state's reader over hostile files, its lock, and where it moves.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import layout
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.alerts import EXIT_ERROR
from bigscience_ops.ops.tell import alert_state
from bigscience_ops.ops.tell.message import NotifyError
from bigscience_ops.ops.watch import lifecycle, watchdog
from bigscience_ops.schema import Experiment, HealthConfig
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_smtp import plain_outbox


@dataclasses.dataclass
class Run:
    exp: Experiment
    log: Path
    state: Path
    settings: watchdog.WatchSettings

    def watch(self, **changes) -> watchdog.WatchResult:
        run = dataclasses.replace(lifecycle.run_state(self.exp), local=True)
        return watchdog.watch(dataclasses.replace(self.settings, **changes), run=run)


@pytest.fixture
def run(trainings: Path, tmp_path: Path, plain_server, monkeypatch) -> Run:
    """A run launched here that stopped at iteration 0 (nothing holds it): an alert each watch, mailed to the plain
    server; the user's state folder in tmp_path."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    _, port = plain_server
    (trainings / "wd.yaml").write_text(tiny_yaml(tmp_path / "run", 'backup: {dest: "%s"}\n' % (tmp_path / "store")))
    exp = load_experiment("wd", trainings)
    log = Path(exp.paths.logs) / "main_log.txt"
    log.parent.mkdir(parents=True)
    log.write_text("")
    from bigscience_ops.run import ledger

    ledger.mark_launch(Path(exp.paths.output), "local-1")
    settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=log, outbox=plain_outbox(port))
    return Run(exp, log, log.parent / ".bsops-alerts.json", settings)


def _kinds(result: watchdog.WatchResult) -> set[str]:
    return {a.kind for a in result.report.alerts}


def _alert(result: watchdog.WatchResult, kind: str):
    [found] = [a for a in result.report.alerts if a.kind == kind]
    return found


def test_a_plain_run_is_one_alert_mailed(run: Run, plain_server) -> None:
    inbox, _ = plain_server
    result = run.watch()
    assert _kinds(result) == {"local-stopped"} and result.exit_code == 1 and len(inbox.messages) == 1
    assert json.loads(run.state.read_text())["active"]


# --- the alert state --------------------------------------------------------------------------------------------------

def test_an_unreadable_alert_state_that_cannot_be_set_aside_is_said_and_kept(run: Run, plain_server) -> None:
    """It cannot be moved aside (a folder holds each name it would take for the next minutes): the watchdog says so
    in its lines and exit code, and leaves the file as it was for a person to look at."""
    inbox, _ = plain_server
    run.state.write_bytes(b"{not json")
    now = datetime.now()
    for second in range(300):
        (run.state.parent / f"{run.state.name}{alert_state.UNREADABLE}"
                             f"{now + timedelta(seconds=second):%Y%m%d-%H%M%S}").mkdir()
    result = run.watch()
    assert _kinds(result) == {"local-stopped", "alert-state"}
    assert str(run.state) in _alert(result, "alert-state").message
    assert result.exit_code == EXIT_ERROR and result.email_error and inbox.messages == []
    assert run.state.read_bytes() == b"{not json"
    with pytest.raises(NotifyError, match=str(run.state)):
        alert_state.load_state(run.state)


@pytest.mark.parametrize("kind", ["link", "FIFO", "folder"])
def test_an_alert_state_lock_that_is_no_plain_file_is_said_and_passed_over(run: Run, plain_server, tmp_path: Path,
                                                                         kind: str) -> None:
    inbox, _ = plain_server
    lock = run.state.with_name(run.state.name + ".lock")
    if kind == "link":
        (tmp_path / "elsewhere").write_text("")
        lock.symlink_to(tmp_path / "elsewhere")
    elif kind == "FIFO":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    result = run.watch()
    assert _kinds(result) == {"local-stopped", "alert-state"} and result.exit_code == 1
    assert str(lock) in _alert(result, "alert-state").message
    assert len(inbox.messages) == 1 and json.loads(run.state.read_text())["active"]  # told, and remembered unlocked
    mode = os.lstat(lock).st_mode
    assert {"link": stat.S_ISLNK, "FIFO": stat.S_ISFIFO, "folder": stat.S_ISDIR}[kind](mode)  # left as it was
    assert kind != "link" or (tmp_path / "elsewhere").read_text() == ""  # nothing written through the link


def _tmp_of(state: Path) -> Path:
    """The name write_atomically writes `state` through (beside it, then renamed)."""
    return state.with_name(f".{state.name}.{os.getpid()}.tmp")


@pytest.mark.parametrize("usual", ["writable, its state not", "unwritable"])
def test_an_alert_state_that_cannot_be_written_anywhere_is_said(run: Run, plain_server, usual: str) -> None:
    """Neither beside the log nor in the user's state folder can the state be replaced (a folder where its new copy
    goes): nothing is sent on the strength of a state that cannot record it, and the run says so (exit 2)."""
    inbox, _ = plain_server
    away, _ = alert_state.elsewhere(run.state, run.settings.job_name)
    away.parent.mkdir(parents=True)
    _tmp_of(away).mkdir()
    if usual == "unwritable":
        (run.log.parent / "watchdog.log").mkdir()
    else:
        _tmp_of(run.state).mkdir()
    result = run.watch()
    assert "watch-files-moved" in _kinds(result) and result.exit_code == EXIT_ERROR and result.email_error
    assert inbox.messages == [] and not away.exists()


def test_watchdog_log_that_cannot_be_written_in_the_state_folder_is_a_line(run: Run, plain_server) -> None:
    inbox, _ = plain_server
    (run.log.parent / "watchdog.log").mkdir()  # beside the log: no watchdog.log can be written
    away_state, away_log = alert_state.elsewhere(run.state, run.settings.job_name)
    away_log.mkdir(parents=True)  # nor in the user's state folder
    result = run.watch()
    assert _kinds(result) == {"local-stopped", "watch-files-moved"} and result.exit_code == 1
    assert len(inbox.messages) == 1 and away_state.is_file()
    assert str(away_log) in result.lines[-1] and not any(str(away_log) in line for line in result.lines[:-1])


def test_without_a_log_the_watchdog_keeps_no_lines(run: Run, tmp_path: Path) -> None:
    result = run.watch(log_path=None, outbox=None)
    assert _kinds(result) == {"local-stopped"} and not (run.log.parent / "watchdog.log").exists()


# --- what the watchdog checks besides the run ---------------------------------------------------------------------------

def test_cron_chains_that_cannot_be_checked_are_an_alert(run: Run, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    cron = tmp_path / "cron"
    cron.mkdir()
    result = run.watch(cron_dir=cron, outbox=None)
    assert _kinds(result) == {"local-stopped", "cron-chain"} and str(cron) in _alert(result, "cron-chain").message


def test_a_log_the_health_check_cannot_read_is_an_alert(run: Run, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.txt"
    real.write_text("")
    run.log.unlink()
    run.log.symlink_to(real)  # is_file() follows it; the log is never read through a link
    result = run.watch(health=HealthConfig(), outbox=None)
    assert "health-unreadable" in _kinds(result) and str(run.log) in _alert(result, "health-unreadable").message


def _store_of(exp: Experiment) -> Path:
    from bigscience_ops.ops.keep import store as backup_store

    return backup_store.run_store(Path(exp.backup.dest), exp.name, layout.run_id(Path(exp.paths.checkpoints)))


def test_backup_store_files_that_cannot_be_read_are_an_alert(run: Run, plain_server) -> None:
    inbox, _ = plain_server
    checkpoints = Path(run.exp.paths.checkpoints)
    assert lifecycle.run_state(run.exp).problems == ()  # no run id yet: no store of this run to read
    layout.new_run_id(checkpoints)
    store = _store_of(run.exp)
    store.mkdir(parents=True)
    (store / "global_step10.manifest.json").write_text("[1, 2]")
    result = run.watch()
    assert _kinds(result) == {"local-stopped", "run-file-backup"}
    assert str(store / "global_step10.manifest.json") in _alert(result, "run-file-backup").message
    assert len(inbox.messages) == 1
    (checkpoints / layout.RUN_ID).write_text("garbage")  # the store cannot even be found
    [problem] = [p for p in lifecycle.run_state(run.exp).problems if p.file == run.exp.backup.dest]
    result = run.watch(outbox=None)
    assert str(run.exp.backup.dest) in _alert(result, "run-file-backup").message


def test_latest_naming_a_save_that_did_not_finish_is_a_problem_and_the_newest_save_stands(run: Run) -> None:
    from tests.fixtures_runs import complete_checkpoint

    complete_checkpoint(run.exp, 10)
    checkpoints = Path(run.exp.paths.checkpoints)
    (checkpoints / "global_step20").mkdir()
    (checkpoints / "global_step20" / layout.META).write_text(json.dumps({"iteration": 20, layout.COMMIT_KEY: "x"}))
    layout.write_latest(checkpoints, "global_step20")
    state = lifecycle.run_state(run.exp)
    assert state.iteration == 10 and [p.file for p in state.problems] == [str(checkpoints / layout.LATEST)]
    (checkpoints / "global_step0").mkdir()
    (checkpoints / "global_step0" / layout.META).write_text("[]")  # unreadable as a record
    layout.write_latest(checkpoints, "global_step0")
    assert lifecycle._warm_start(layout.latest_checkpoint(checkpoints)) is False


# --- the alert state's reader, lock and places ------------------------------------------------------------------------

ISO = "2026-11-22T10:00:00"


@pytest.mark.parametrize("raw", [
    {"active": []},
    {"active": {"k": []}},
    {"active": {"k": {"since": "yesterday"}}},
    {"active": {"k": {"since": ISO, "message": 3}}},
    {"active": {"k": {"since": ISO, "last_sent": "soon"}}},
    {"active": {"k": {"since": ISO, "sent": {"email": "soon"}}}},
    {"jobs": {"k": {"since": ISO, "failed": {"email": 3}}}},
    {"events": []},
    {"events": {"k": []}},
    {"events": {"k": {"message": 3}}},
    {"events": {"k": {"sent": {"email": None}}}},
    {"events": {"k": {"failed": []}}},
    {"finished": {"job": {"email": -1}}},
    {"active": {"k": {"since": "x" * 100}}},
], ids=lambda raw: json.dumps(raw)[:40])
def test_an_alert_state_of_the_wrong_shape_is_unreadable(tmp_path: Path, raw) -> None:
    path = tmp_path / ".bsops-alerts.json"
    path.write_text(json.dumps(raw))
    state, problem = alert_state.read_state(path)
    assert state == alert_state.State() and problem is not None and problem.file == str(path)


def test_a_state_from_before_channels_is_read_as_each_channels(tmp_path: Path) -> None:
    path = tmp_path / ".bsops-alerts.json"
    path.write_text(json.dumps({"active": {"j::c": {"since": ISO, "message": "m", "last_sent": ISO}},
                                "jobs": {"backup": {"since": ISO, "message": "m", "last_sent": None}},
                                "finished": {"j": 12}}))
    state, problem = alert_state.read_state(path)
    assert problem is None and state.active["j::c"]["sent"] == {c: ISO for c in alert_state.NAMES}
    assert state.jobs["backup"]["sent"] == {} and state.finished == {"j": 12}


def test_every_unreadable_state_set_aside_is_counted_until_deleted(tmp_path: Path) -> None:
    path = tmp_path / ".bsops-alerts.json"
    for name in ("20261122-100000", "20261122-110000"):
        (tmp_path / f"{path.name}{alert_state.UNREADABLE}{name}").write_text("{")
    problem = alert_state.state_problem(path)
    assert problem.file == str(path) and f"{alert_state.UNREADABLE}20261122-110000" in problem.what
    assert alert_state.state_problem(tmp_path / "missing-folder" / ".bsops-alerts.json") is None


def test_a_watchdog_log_that_is_a_fifo_someone_reads_is_unwritable(tmp_path: Path) -> None:
    log = tmp_path / "watchdog.log"
    os.mkfifo(log)
    reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)  # a writer's open then succeeds: a FIFO, not a file
    try:
        why = alert_state.unwritable(tmp_path, (log,))
    finally:
        os.close(reader)
    assert why is not None and why.startswith(str(log))
    (tmp_path / "a-file").write_text("")
    assert alert_state.unwritable(tmp_path / "a-file" / "below", ()).startswith(str(tmp_path / "a-file" / "below"))


def test_a_state_kept_elsewhere_moves_back_only_when_newer_and_readable(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    usual = tmp_path / "logs" / ".bsops-alerts.json"
    usual.parent.mkdir()
    away, _ = alert_state.elsewhere(usual, "...", env)
    assert away.name.startswith("run-")  # a name of dots only gives no file name
    away.parent.mkdir(parents=True)
    os.mkfifo(away)  # cannot be read: left where it is, never waited on
    assert alert_state.place(usual, None, "...", env).state == usual and stat.S_ISFIFO(os.lstat(away).st_mode)
    away.unlink()
    away.write_text('{"active": {}}')
    usual.write_text('{"finished": {"j": 3}}')
    os.utime(away, (1, 1))  # older than the state beside the log: dropped, not moved back
    assert alert_state.place(usual, None, "...", env).state == usual
    assert not away.exists() and json.loads(usual.read_text()) == {"finished": {"j": 3}}


def test_no_folder_for_its_files_anywhere_is_said_not_a_crash(run: Run, plain_server, tmp_path: Path,
                                                              monkeypatch) -> None:
    """Beside the log watchdog.log is a folder, and the user's state folder cannot even be made (a file holds its
    parent's name): the watchdog still answers, with its ALERT lines and exit 2, instead of a traceback."""
    inbox, _ = plain_server
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "not-a-folder"))
    (run.log.parent / "watchdog.log").mkdir()
    result = run.watch()
    assert _kinds(result) == {"local-stopped", "watch-files-moved", "alert-state"}  # no state can be read there
    assert result.exit_code == EXIT_ERROR and result.email_error and inbox.messages == []
    assert str(tmp_path / "not-a-folder") in result.lines[-1]  # the lines could not be kept either: said
