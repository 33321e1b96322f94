"""Checkpoint backup on real checkpoints of the tiny trainer: weights only, manifests, kill -9, retention."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import layout, retention
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.schema import Experiment
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.ops.keep import backup
from bigscience_ops.ops.keep import store as backup_store
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_slurm import wait_until
from tests.fixtures_trainer import concurrently, run_ok, small_experiment, write_run
from tests.fixtures_smtp import T0, alerts_yaml
from tests.fixtures_runs import commit_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, tuple[Experiment, Path]]:
    """Two short PP=2 runs, ZeRO-0 and ZeRO-1, each saving global_step10 and the final global_step18 (side by side)."""
    folders = {stage: tmp_path_factory.mktemp(f"zero{stage}") for stage in (0, 1)}

    def train(stage: int) -> tuple[Experiment, Path]:
        exp = small_experiment(folders[stage], parallel=dict(zero_stage=stage), train=dict(samples=120))
        write_run(exp, folders[stage])
        run_ok(folders[stage], 2)
        return exp, folders[stage]

    return concurrently({stage: lambda stage=stage: train(stage) for stage in folders})


def _scratch_copy(exp: Experiment, run: Path, tmp: Path, **policy) -> Experiment:
    """The run's checkpoints copied to tmp (tests delete from scratch), with a backup policy."""
    shutil.copytree(run / "checkpoints", tmp / "checkpoints")
    paths = dataclasses.replace(exp.paths, checkpoints=str(tmp / "checkpoints"))
    return dataclasses.replace(exp, paths=paths, backup=dataclasses.replace(exp.backup, dest=str(tmp / "store"), **policy))


def _run_store(exp: Experiment) -> Path:
    """The experiment's run's part of its backup store."""
    return backup_store.run_store(Path(exp.backup.dest), exp.name, layout.run_id(Path(exp.paths.checkpoints)))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stored_in(exp: Experiment, store: Path) -> Experiment:
    """`exp` backing up to `store` (what `bsops backup --to STORE` sets)."""
    return dataclasses.replace(exp, backup=dataclasses.replace(exp.backup, dest=str(store)))


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1])
def test_weights_only_copy_and_the_final_checkpoint_whole(runs, tmp_path: Path, stage: int) -> None:
    import torch

    exp, run = runs[stage]
    src = run / "checkpoints"
    assert [c.step for c in layout.complete_checkpoints(src)] == [10, 18] and run_schedule(exp).train_iters == 18
    report = backup.run_backup(backup.settings(_stored_in(exp, tmp_path / "store")))
    assert report.backed_up == ["global_step10", "global_step18"] and report.deleted == []
    store = report.store
    assert store == tmp_path / "store" / exp.name / layout.run_id(src)  # the run's own part of the store
    assert (tmp_path / "store" / backup_store.STORE_MARKER).is_file()

    optimizer_files = [f for f in layout.Checkpoint("global_step10", 10, src / "global_step10").files()
                       if layout.is_optimizer_file(f)]
    assert bool(optimizer_files) == (stage == 1)  # ZeRO-1 writes optimizer partitions, ZeRO-0 none
    copied = sorted(p.relative_to(store / "global_step10").as_posix() for p in (store / "global_step10").rglob("*"))
    assert not [f for f in copied if layout.is_optimizer_file(f)]
    for name in copied:
        if layout.is_model_states_file(name):
            state = torch.load(store / "global_step10" / name, weights_only=False)
            assert state["optimizer"] is None and state["global_steps"] == 10
            if stage == 0:
                assert torch.load(src / "global_step10" / name, weights_only=False)["optimizer"] is not None
        else:
            assert _sha(store / "global_step10" / name) == _sha(src / "global_step10" / name), name
    assert os.path.getsize(store / "global_step10" / "mp_rank_00_model_states.pt") < \
        os.path.getsize(src / "global_step10" / "mp_rank_00_model_states.pt") or stage == 1

    # The final checkpoint keeps everything, optimizer state included, byte for byte.
    final = layout.Checkpoint("global_step18", 18, src / "global_step18")
    manifest = backup_store.read_manifest(store, "global_step18")
    assert manifest["kind"] == "whole" and sorted(manifest["files"]) == final.files()
    assert all(manifest["files"][f]["sha256"] == _sha(final.path / f) for f in final.files())
    assert backup_store.verify(store, "global_step10") == [] and backup_store.verify(store, "global_step18") == []

    # A second run has nothing to do; a corrupted byte is caught by verify.
    assert backup.run_backup(backup.settings(_stored_in(exp, tmp_path / "store"))).backed_up == []
    victim = store / "global_step10" / "layer_01-model_states.pt"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert [line for line in backup_store.verify(store, "global_step10") if "layer_01" in line]


@pytest.mark.slow
def test_keep_optimizer_every_and_tar(runs, tmp_path: Path) -> None:
    exp, run = runs[1]
    exp = _scratch_copy(exp, run, tmp_path, keep_optimizer_every=10, tar=True)
    report = backup.run_backup(backup.settings(exp))
    store = report.store
    assert report.backed_up == ["global_step10", "global_step18"]
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) == [
        "global_step10.manifest.json", "global_step10.tar", "global_step18.manifest.json", "global_step18.tar"]
    assert backup_store.read_manifest(store, "global_step10")["kind"] == "whole"
    assert backup_store.verify(store, "global_step10") == []
    assert list((store / backup_store.PARTIAL).iterdir()) == []


_KILLED_BACKUP = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from bigscience_ops.config.loading import from_dict
from bigscience_ops.ops.keep import backup
from bigscience_ops.ops.keep import store as backup_store
exp = from_dict(json.loads(Path({exp!r}).read_text()))
original, calls = backup._copy_file, []
def copy_then_hang(src, dst, advance, saved=None):
    calls.append(src)
    if len(calls) == 3:  # half a file written, then the process is killed here
        dst.with_name("." + dst.name + ".tmp").write_bytes(b"partial")
        Path({marker!r}).touch()
        time.sleep(600)
    return original(src, dst, advance, saved)
backup._copy_file = copy_then_hang
backup.run_backup(backup.settings(exp))
"""


@pytest.mark.slow
def test_kill_9_during_a_backup_then_rerun_completes_and_verifies(runs, tmp_path: Path) -> None:
    from bigscience_ops.config.loading import to_dict

    exp, run = runs[0]
    exp = _scratch_copy(exp, run, tmp_path)
    (tmp_path / "exp.json").write_text(json.dumps(to_dict(exp)))
    marker = tmp_path / "hanging"
    code = _KILLED_BACKUP.format(repo=str(REPO), exp=str(tmp_path / "exp.json"), marker=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    try:
        wait_until("the backup to be half-way through a checkpoint", marker.exists, timeout=120)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    store = _run_store(exp)
    staging = store / backup_store.PARTIAL / "global_step10"
    assert staging.is_dir() and not backup_store.read_manifest(store, "global_step10")
    assert len((staging / backup_store.JOURNAL).read_text().splitlines()) == 2

    report = backup.run_backup(backup.settings(exp))
    assert report.resumed == ["global_step10"] and report.backed_up == ["global_step10", "global_step18"]
    for tag in report.backed_up:
        assert backup_store.verify(store, tag) == []
    assert not list((store / "global_step10").glob(".*"))  # no journal or half-written file left
    assert list((store / backup_store.PARTIAL).iterdir()) == []


@pytest.mark.slow
def test_retention_keeps_latest_and_anything_not_verified(runs, tmp_path: Path) -> None:
    exp, run = runs[0]
    exp = _scratch_copy(exp, run, tmp_path, keep_last=1)
    scratch, store = Path(exp.paths.checkpoints), _run_store(exp)
    (scratch / "global_step12").mkdir()  # a save in progress: newer than latest, never copied nor deleted
    (scratch / "global_step12" / "layer_00-model_states.pt").write_bytes(b"half")

    dry = backup.run_backup(backup.settings(exp), dry_run=True)
    assert [p.ckpt.tag for p in dry.planned] == ["global_step10", "global_step18"] and not store.exists()
    assert dry.retention.delete == [] and dry.deleted == []  # nothing verified yet: nothing may go
    assert not store.exists() and not (tmp_path / "store").exists()  # a dry run writes nothing

    # Backed up, then global_step10's backup is lost: retention keeps it on scratch.
    keep_all = dataclasses.replace(exp, backup=dataclasses.replace(exp.backup, keep_last=None))
    assert backup.run_backup(backup.settings(keep_all)).deleted == []
    backup_store.manifest_path(store, "global_step10").unlink()
    decision = backup._retention(exp.backup, scratch, store, dry_run=True)[0]
    assert decision.delete == [] and "verified" in decision.keep[10]

    # Copied again and verified, but `latest` names it: still kept.
    (scratch / "latest").write_text("global_step10")
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10"] and report.deleted == [] and report.retention.keep[10] == "latest"

    (scratch / "latest").write_text("global_step18")
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == [] and report.deleted == ["global_step10"]
    assert sorted(p.name for p in scratch.iterdir()) == [layout.RUN_ID, "global_step12", "global_step18", "latest"]
    assert backup_store.verify(store, "global_step10") == []


def test_retention_decision() -> None:
    steps = [10, 20, 30, 40, 50]
    decision = retention.decide(steps, latest_step=50, verified={10, 20, 40, 50}, keep_last=2, keep_every=20)
    assert decision.delete == [10]
    assert set(decision.keep) == {20, 30, 40, 50} and "verified" in decision.keep[30]
    assert retention.decide(steps, 50, set(steps), keep_last=None, keep_every=None).delete == []
    # After a rollback (`latest` moved back) nothing after it goes, and keep_last counts up to it.
    rolled = retention.decide(steps, 30, set(steps), keep_last=1, keep_every=None)
    assert rolled.delete == [10, 20] and rolled.keep[30] == "latest" and "rollback" in rolled.keep[50]
    assert retention.decide(steps, None, set(steps), keep_last=1, keep_every=None).delete == []


def test_retention_deletes_a_checkpoints_universal_copy_with_it(tmp_path: Path) -> None:
    for tag in ("global_step10", "global_step10_universal", "global_step20", "global_step20_universal"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "f").write_text(tag)
    checkpoints = layout.list_checkpoints(tmp_path)
    assert [c.tag for c in checkpoints] == ["global_step10", "global_step20"]
    decision = retention.decide([10, 20], latest_step=20, verified={10, 20}, keep_last=1, keep_every=None)
    applied = retention.apply(checkpoints, decision, lambda c: True)
    assert applied.deleted == ["global_step10", "global_step10_universal"] and applied.refused == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step20", "global_step20_universal"]


def test_backup_alert_waits_out_the_cooldown_and_a_recovery_follows(trainings: Path, tmp_path: Path, plain_server,
                                                                      monkeypatch) -> None:
    """`bsops backup --alert` (what the hourly job runs) goes through notify_job as hub-sync does."""
    from click.testing import CliRunner

    from bigscience_ops.cli import main
    from bigscience_ops.ops.tell import notify

    inbox, port = plain_server
    run = tmp_path / "run"
    (trainings / "saved.yaml").write_text(
        tiny_yaml(run, f"backup: {{dest: {json.dumps(str(tmp_path / 'store'))}}}\n", alerts_yaml(port, 90)))
    clock = [T0]
    monkeypatch.setattr(notify, "_now", lambda: clock[0])

    def backup_at(minutes: int):
        clock[0] = T0 + timedelta(minutes=minutes)
        return CliRunner().invoke(main, ["backup", "saved", "--alert", "--trainings-dir", str(trainings)])

    failed = [backup_at(m) for m in (0, 60, 89)]  # no checkpoints folder yet: nothing to back up
    assert [r.exit_code for r in failed] == [2, 2, 2] and len(inbox.messages) == 1
    assert inbox.messages[0]["Subject"] == "[bsops] saved: backup failed"
    assert "does not exist: nothing to back up" in inbox.messages[0].get_content()
    assert "repeats at most every 90 minutes" in inbox.messages[0].get_content()
    assert "alert email was held back" in failed[1].stderr and "alert email sent" in failed[0].stderr
    assert backup_at(90).exit_code == 2 and len(inbox.messages) == 2

    step = run / "checkpoints" / "global_step5"
    step.mkdir(parents=True)
    (step / "layer_00-model_states.pt").write_bytes(os.urandom(4000))
    (step / "bsops.json").write_text(json.dumps({"iteration": 5}))
    commit_checkpoint(step)
    (run / "checkpoints" / "latest").write_text("global_step5")
    worked = backup_at(125)
    assert worked.exit_code == 0, worked.output
    assert backup_store.verify(_run_store(load_experiment("saved", trainings)), "global_step5") == []
    assert len(inbox.messages) == 3 and inbox.messages[2]["Subject"] == "[RECOVERED] saved: backup works again"
    assert "for 2 h 05 min" in inbox.messages[2].get_content() and "recovery email sent" in worked.stderr
    assert backup_at(185).exit_code == 0 and len(inbox.messages) == 3
    assert (run / "logs" / ".bsops-alerts.json").is_file()  # the watchdog's state file, beside main_log.txt
