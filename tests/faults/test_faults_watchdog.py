"""Faults the watchdog must tell of, never die of or stay quiet about (issue 47, "the watchdog never dies silent").

- The run's log folder read-only (a real read-only bind mount): `bsops status` still prints its ALERT lines, mails
  them and exits 1; its alert state and lines are kept in the user's state folder, which the alert names, and move
  back once the folder can be written.
- A training array whose next task pends on drained and down nodes (squeue's real answer, recorded on a second
  cluster: tests/assets/slurm/record_drained.py, replayed at the subprocess edge): waiting, healthy, until
  alerts.blocked_minutes have passed, then one alert naming the reason (the clock injected, and under faketime).
- Checkpoints the trainer set aside (checkpoints/set_aside.py, on real folders): one alert each, told once and
  never again, not every cooldown; a torn line of set-aside.jsonl is a run file the watchdog cannot read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops import slurm
from bigscience_ops.checkpoints import set_aside
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.tell import alert_state
from bigscience_ops.ops.watch import lifecycle, watchdog
from bigscience_ops.run import ledger
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_slurm import RECORDED, recorded_terminator, replay_squeue
from tests.fixtures_smtp import alerts_yaml, plain_outbox
from tests.fixtures_status import seed_job

BSOPS = str(Path(sys.executable).with_name("bsops"))
DRAINED = json.loads((RECORDED / "drained_ids.json").read_text())
TRAINING = "rec-drained-training"  # the recorded array's job name


def alerts_of(inbox) -> list:
    return [m for m in inbox.messages if m["Subject"].startswith("[ALERT]")]


# --- a read-only log folder -------------------------------------------------------------------------------------

def _read_only(folder: Path) -> str | None:
    """Make `folder` read-only with a bind mount onto itself; why not where mount cannot (not root, no
    CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return f"a read-only bind mount needs root and mount(8) (uid {os.geteuid()})"
    done = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"mount --bind failed here: {done.stderr.strip()}"
    again = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True, text=True,
                           timeout=30)
    if again.returncode != 0:
        subprocess.run(["umount", str(folder)], capture_output=True, timeout=30)
        return f"mount -o remount,bind,ro failed here: {again.stderr.strip()}"
    return None


def test_a_read_only_log_folder_still_gives_the_alert_line_and_the_mail(tmp_path: Path, trainings: Path,
                                                                        plain_server, monkeypatch) -> None:
    inbox, port = plain_server
    monkeypatch.setenv("PATH", f"{replay_squeue(tmp_path / 'bin', 'squeue.txt')}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (trainings / "ro.yaml").write_text(tiny_yaml(tmp_path / "run", alerts_yaml(port)))
    exp = load_experiment("ro", trainings)
    logs = Path(exp.paths.logs)
    logs.mkdir(parents=True)
    ledger.mark_launch(Path(exp.paths.output), "4242")  # launched, and nothing of it queued: an alert
    argv = ["status", "ro", "--trainings-dir", str(trainings)]
    why = _read_only(logs)
    if why is not None:
        pytest.skip(why)
    try:
        assert not os.access(logs, os.W_OK)
        first = CliRunner().invoke(main, argv)
        assert first.exit_code == 1 and "Traceback" not in first.output, first.output
        assert "***ALERT: ro is not RUNNING or SCHEDULED" in first.output
        state, log = alert_state.elsewhere(logs / ".bsops-alerts.json", "ro")
        assert state.parent == tmp_path / "state" / "bsops" and str(state.parent) in first.output
        [mail] = inbox.messages
        assert str(state.parent) in mail.get_content() and "not RUNNING or SCHEDULED" in mail.get_content()
        assert state.is_file() and "ro is not RUNNING" in log.read_text()
        second = CliRunner().invoke(main, argv)
        assert second.exit_code == 1 and len(inbox.messages) == 1  # the cooldown, kept elsewhere
    finally:
        subprocess.run(["umount", str(logs)], capture_output=True, timeout=30)
    third = CliRunner().invoke(main, argv)  # writable again: the state moves back, the moved files' alert recovers
    assert third.exit_code == 1 and (logs / ".bsops-alerts.json").is_file() and not state.exists()
    assert len(alerts_of(inbox)) == 1 and len(inbox.messages) == 2, [m["Subject"] for m in inbox.messages]
    assert "recover" in inbox.messages[1]["Subject"].lower()


def test_an_alert_state_that_cannot_be_replaced_is_kept_elsewhere_and_said(tmp_path: Path, plain_server,
                                                                           monkeypatch) -> None:
    """A file it cannot write: a folder where the state's lock belongs is passed over (unlocked), but one where the
    state's new copy is written beside it is not: the state goes to the user's state folder and the alert says so."""
    inbox, port = plain_server
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    log = tmp_path / "logs" / "main_log.txt"
    log.parent.mkdir()
    log.write_text("")
    (log.parent / f"..bsops-alerts.json.{os.getpid()}.tmp").mkdir()  # write_atomically's new file: a folder
    job = seed_job()
    settings = watchdog.WatchSettings(job.name, log_path=log, outbox=plain_outbox(port))
    result = watchdog.watch(settings, query=lambda **_: [], now=datetime(2026, 11, 22, 3, 42))
    assert {a.kind for a in result.report.alerts} == {"not-scheduled", "watch-files-moved"}, result.lines
    assert result.exit_code == 1 and len(inbox.messages) == 1, result.lines
    state, _ = alert_state.elsewhere(log.parent / ".bsops-alerts.json", job.name)
    assert state.is_file() and str(state.parent) in inbox.messages[0].get_content()


# --- a task pending on drained nodes ------------------------------------------------------------------------------

@pytest.fixture
def drained(tmp_path: Path, trainings: Path, plain_server, monkeypatch):
    """A run of the recorded array (its launch and task 1 in the ledger, as the array's first task left them),
    the recording replayed as squeue: (experiment, inbox, the time task 1 ended)."""
    inbox, port = plain_server
    monkeypatch.setenv("PATH", f"{replay_squeue(tmp_path / 'bin', 'squeue-drained.txt')}:{os.environ['PATH']}")
    (trainings / "drained.yaml").write_text(tiny_yaml(tmp_path / "run", f"slurm: {{job_name: {TRAINING}}}\n",
                                                      alerts_yaml(port)))
    exp = load_experiment("drained", trainings)
    jobs = slurm.parse_squeue((RECORDED / "squeue-drained.txt").read_text(), recorded_terminator())
    [array] = [j for j in jobs if j.name == TRAINING]
    ended = array.submit_time + timedelta(minutes=10)  # task 1 ran ten minutes, then its nodes went
    out = Path(exp.paths.output)
    for record in (ledger.TaskRecord("launch", DRAINED["array"], "", 0, array.submit_time.timestamp()),
                   ledger.TaskRecord("begin", f"{DRAINED['array']}_1", "n1", 0, array.submit_time.timestamp()),
                   ledger.TaskRecord("end", f"{DRAINED['array']}_1", "n1", 0, ended.timestamp(), 1)):
        ledger.append(out / ledger.LEDGER_NAME, record)
    return exp, inbox, ended


def test_a_task_pending_on_drained_nodes_alerts_once_past_the_limit(drained) -> None:
    exp, inbox, ended = drained
    settings = watchdog.WatchSettings(TRAINING, log_path=Path(exp.paths.logs) / "main_log.txt",
                                      outbox=plain_outbox(exp.alerts.smtp_port), experiment="drained",
                                      cooldown_minutes=exp.alerts.cooldown_minutes)
    limit = timedelta(minutes=exp.alerts.blocked_minutes)

    def watch(at: datetime) -> watchdog.WatchResult:
        return watchdog.watch(settings, run=lifecycle.run_state(exp), now=at)

    early = watch(ended + limit - timedelta(minutes=1))
    assert early.exit_code == 0 and early.report.alerts == (), early.lines
    assert "waiting on nodes that only an administrator brings back" in early.lines[0]
    late = watch(ended + limit + timedelta(minutes=1))
    assert [a.kind for a in late.report.alerts] == ["pending-blocked"] and late.exit_code == 1, late.lines
    assert "Nodes required for job are DOWN, DRAINED" in late.report.alerts[0].message
    assert "has waited 2:01:00 (limit 120 min)" in late.report.alerts[0].message  # from task 1's end
    hours = watch(ended + timedelta(hours=3))
    assert hours.exit_code == 1 and len(inbox.messages) == 1  # once, within the cooldown
    assert inbox.messages[0]["Subject"].startswith(f"[ALERT] drained: ask the admins for nodes: array "
                                                   f"{DRAINED['array']} has waited")
    assert "DRAINED" in inbox.messages[0].get_content()


@pytest.mark.skipif(shutil.which("faketime") is None, reason="faketime (Debian's libfaketime) is not installed")
def test_bsops_status_under_faketime_alerts_on_the_drained_nodes(drained, tmp_path: Path) -> None:
    """The same, through `bsops status` in a process of its own whose clock is frozen 3 h after task 1 ended."""
    exp, inbox, ended = drained
    trainings = Path(exp.paths.output).parent / "trainings"
    at = (ended + timedelta(hours=3)).strftime("%Y-%m-%d %H:%M:%S")
    proc = subprocess.run(["faketime", "-f", at, BSOPS, "status", "drained", "--trainings-dir", str(trainings)],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"[{at}] ***ALERT: {TRAINING} has waited 3:00:00 (limit 120 min) on nodes" in proc.stdout, proc.stdout
    assert len(inbox.messages) == 1


# --- checkpoints set aside ----------------------------------------------------------------------------------------

def _checkpoint(checkpoints: Path, step: int) -> Path:
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"\0" * 64)
    return folder


def test_each_checkpoint_set_aside_is_told_once(tmp_path: Path, trainings: Path, plain_server) -> None:
    inbox, port = plain_server
    (trainings / "aside.yaml").write_text(tiny_yaml(tmp_path / "run", f"slurm: {{job_name: aside}}\n"))
    exp = load_experiment("aside", trainings)
    checkpoints = Path(exp.paths.checkpoints)
    first = set_aside.set_aside(checkpoints, _checkpoint(checkpoints, 40),
                                "mp_rank_01_model_states.pt: 4.9 of 29.4 MB (cut short)", now=1795000000)
    settings = watchdog.WatchSettings("aside", log_path=Path(exp.paths.logs) / "main_log.txt",
                                      outbox=plain_outbox(port))
    running = [seed_job(name="aside")]
    at = datetime(2026, 11, 22, 12, 0)

    def watch(when: datetime) -> watchdog.WatchResult:
        return watchdog.watch(settings, run=lifecycle.run_state(exp), now=when, query=lambda **_: running)

    told = watch(at)
    [alert] = told.report.alerts
    assert alert.kind == "checkpoint-set-aside" and told.exit_code == 1
    assert "global_step40" in alert.message and first.folder in alert.message and "4.9 of 29.4 MB" in alert.message
    assert alert.headline == "look at checkpoint 40 set aside: it could not be resumed from"
    [mail] = inbox.messages
    assert first.folder in mail.get_content()
    again = watch(at + timedelta(hours=5))  # past the cooldown: an event, told once, not a condition
    assert again.exit_code == 0 and again.report.alerts == () and len(inbox.messages) == 1, again.lines
    second = set_aside.set_aside(checkpoints, _checkpoint(checkpoints, 60), "no manifest: the save did not commit",
                                 now=1795003600)
    third = watch(at + timedelta(hours=6))
    assert [a.kind for a in third.report.alerts] == ["checkpoint-set-aside"] and len(inbox.messages) == 2
    assert second.folder in inbox.messages[1].get_content() and first.folder not in third.report.alerts[0].message
    assert "recover" not in " ".join(m["Subject"].lower() for m in inbox.messages)  # no recovery for an event
    with open(checkpoints / set_aside.RECORD, "ab") as f:  # a node died writing a third record
        f.write(b'{"time": 1795007200, "tag": "global_st')
    torn = watch(at + timedelta(hours=7))
    assert [a.kind for a in torn.report.alerts] == ["run-file-set-aside"], torn.lines
    assert str(checkpoints / set_aside.RECORD) in torn.report.alerts[0].message
