"""Backups that never unpickle and never delete what they did not copy, on real folders.

Checkpoints here are folders as the trainer lays them out (layer files, bsops.json, `latest`, the run
id); the model-states rewrite of real trainer checkpoints is in tests/ops/test_ops_backup.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.checkpoints import layout, retention
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.keep import backup
from bigscience_ops.ops.keep import store as backup_store
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_smtp import alerts_yaml
from tests.fixtures_runs import commit_checkpoint


def _save(checkpoints: Path, step: int, *, latest: bool = True, payload: bytes | None = None) -> Path:
    """A complete checkpoint folder as the trainer writes it (weights-only copies read these files as bytes)."""
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "layer_00-model_states.pt").write_bytes(payload or os.urandom(3000))
    (folder / "layer_01-model_states.pt").write_bytes(os.urandom(2000))
    (folder / layout.META).write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)
    if latest:
        (checkpoints / layout.LATEST).write_text(f"global_step{step}")
    return folder


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def make(trainings: Path, tmp_path: Path):
    """make(name, **backup) -> the experiment `name` with its run under tmp_path/name and a backup policy."""
    def _make(name: str, **policy):
        values = {"dest": str(tmp_path / "store"), **policy}
        (trainings / f"{name}.yaml").write_text(tiny_yaml(tmp_path / name, f"backup: {json.dumps(values)}\n"))
        exp = load_experiment(name, trainings)
        layout.new_run_id(Path(exp.paths.checkpoints))
        return exp
    return _make


def test_experiments_sharing_a_store_never_count_each_others_copies(make, tmp_path: Path) -> None:
    first, second = make("first", keep_last=1), make("second", keep_last=1)
    for exp in (first, second):
        for step in (10, 20):
            _save(Path(exp.paths.checkpoints), step)
    report = backup.run_backup(backup.settings(first))
    assert report.backed_up == ["global_step10", "global_step20"] and report.deleted == ["global_step10"]
    # The second experiment's global_step10 has the same tag: it is copied, not taken as backed up.
    dry = backup.run_backup(backup.settings(second), dry_run=True)
    assert [p.ckpt.tag for p in dry.planned] == ["global_step10", "global_step20"] and dry.retention.delete == []
    report = backup.run_backup(backup.settings(second))
    assert report.backed_up == ["global_step10", "global_step20"] and report.deleted == ["global_step10"]
    assert first.name in str(report.store) or second.name in str(report.store)
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [backup_store.STORE_MARKER, "first", "second"]


def test_a_run_restarted_from_scratch_keeps_its_checkpoints_until_they_are_copied(make) -> None:
    exp = make("restarted", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    for step in (10, 20):
        _save(scratch, step)
    old = backup.run_backup(backup.settings(exp))
    assert old.deleted == ["global_step10"]
    old_copy = _tree(old.store)
    # Started again from scratch in the same folder: a new run id, new checkpoints with the old tags.
    shutil.rmtree(scratch)
    layout.new_run_id(scratch)
    for step in (10, 20, 30):
        _save(scratch, step)
    dry = backup.run_backup(backup.settings(exp), dry_run=True)
    assert [p.ckpt.tag for p in dry.planned] == ["global_step10", "global_step20", "global_step30"]
    assert dry.retention.delete == []
    new = backup.run_backup(backup.settings(exp))
    assert new.store != old.store and new.backed_up == ["global_step10", "global_step20", "global_step30"]
    assert new.deleted == ["global_step10", "global_step20"] and _tree(old.store) == old_copy


def test_a_checkpoint_saved_again_under_its_tag_is_a_new_copy(make) -> None:
    exp = make("resaved", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    _save(scratch, 10)
    _save(scratch, 20)
    first = backup.run_backup(backup.settings(exp))
    assert first.backed_up == ["global_step10", "global_step20"]
    # A rollback to 10 and a new global_step20 (other weights, same run id): its copy is a new entry.
    shutil.rmtree(scratch / "global_step20")
    _save(scratch, 20)
    _save(scratch, 30)
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step20", "global_step30"]
    assert backup_store.entries(report.store) == ["global_step10", "global_step20", "global_step20.2", "global_step30"]
    assert backup_store.read_manifest(report.store, "global_step20.2")["tag"] == "global_step20"
    assert report.deleted == ["global_step20"] and backup_store.verify(report.store, "global_step20.2") == []


def test_after_a_rollback_nothing_newer_than_latest_is_deleted(make) -> None:
    exp = make("rolled", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    for step in (10, 20, 30):
        _save(scratch, step)
    assert backup.run_backup(backup.settings(exp)).deleted == ["global_step10", "global_step20"]
    (scratch / layout.LATEST).write_text("global_step30")
    _save(scratch, 40)
    _save(scratch, 50)
    (scratch / layout.LATEST).write_text("global_step30")  # rolled back: 40 and 50 set aside
    report = backup.run_backup(backup.settings(exp))
    assert report.deleted == [] and "rollback" in report.retention.keep[40] and "rollback" in report.retention.keep[50]
    assert sorted(c.step for c in layout.list_checkpoints(scratch)) == [30, 40, 50]


def test_a_copy_damaged_in_the_store_does_not_let_its_source_go(make) -> None:
    exp = make("damaged", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    _save(scratch, 10)
    report = backup.run_backup(backup.settings(exp))
    victim = report.store / "global_step10" / "layer_00-model_states.pt"
    data = bytearray(victim.read_bytes())
    data[7] ^= 0xFF  # same size: only a re-read finds it
    victim.write_bytes(bytes(data))
    _save(scratch, 20)
    report = backup.run_backup(backup.settings(exp))
    assert report.retention.delete == [10] and report.deleted == []  # chosen, but its copy failed the re-read
    assert (scratch / "global_step10").is_dir()


def test_to_another_runs_checkpoint_folder_is_refused_and_nothing_changes(make, trainings: Path) -> None:
    mine, theirs = make("mine"), make("theirs")
    _save(Path(mine.paths.checkpoints), 10)
    for step in (10, 20):
        _save(Path(theirs.paths.checkpoints), step)
    before = _tree(Path(theirs.paths.checkpoints))
    result = CliRunner().invoke(main, ["backup", "mine", "--to", theirs.paths.checkpoints,
                                       "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and "not a bsops backup store" in result.output and "Traceback" not in result.output
    assert _tree(Path(theirs.paths.checkpoints)) == before


class _Crafted:
    """A pickle that would create `marker` when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["crafted", "corrupt"])
def test_model_states_are_never_unpickled_and_a_bad_one_is_reported(make, trainings: Path, tmp_path: Path,
                                                                    kind: str, plain_server) -> None:
    inbox, port = plain_server
    marker = tmp_path / "owned"
    (trainings / "victim.yaml").write_text(tiny_yaml(tmp_path / "victim", f"backup: {json.dumps({'dest': str(tmp_path / 'store')})}\n",
                                                     alerts_yaml(port)))
    exp = load_experiment("victim", trainings)
    scratch = Path(exp.paths.checkpoints)
    layout.new_run_id(scratch)
    bad = _save(scratch, 10, latest=False)
    if kind == "crafted":  # torch.save's own format, as a real model-states file
        import torch

        torch.save({"module": None, "optimizer": _Crafted(marker)}, bad / "mp_rank_00_model_states.pt")
    else:
        (bad / "mp_rank_00_model_states.pt").write_bytes(os.urandom(500))
    commit_checkpoint(bad)  # as a trainer would have committed it: the manifest cannot tell, the loader must
    _save(scratch, 20)  # the final step of a longer run: copied weights-only too, and fine
    result = CliRunner().invoke(main, ["backup", "victim", "--alert", "--trainings-dir", str(trainings)])
    assert not marker.exists(), "a checkpoint file was unpickled"
    assert result.exit_code == 2 and "Traceback" not in result.output
    [error] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "global_step10" in error and "restricted loader" in error and error.startswith("error: 1 checkpoint(s) not backed up (the rest was done): ")
    assert "global_step20: weights only" in result.output  # the other checkpoint was backed up
    assert len(inbox.messages) == 1 and "restricted loader" in inbox.messages[0].get_content()
    assert (scratch / "global_step10").is_dir()


@pytest.mark.parametrize("what, expected", [
    ("file", "is a file"),
    ("inside", "inside the checkpoints folder"),
    ("holder", "holds the checkpoints folder"),
    ("foreign", "not a bsops backup store"),
])
def test_destinations_that_are_not_a_store_are_refused(make, tmp_path: Path, what: str, expected: str) -> None:
    exp = make("dests")
    scratch = Path(exp.paths.checkpoints)
    _save(scratch, 10)
    dest = {"file": tmp_path / "a-file", "inside": scratch / "store", "holder": scratch.parent,
            "foreign": tmp_path / "foreign"}[what]
    if what == "file":
        dest.write_text("x")
    if what == "foreign":
        dest.mkdir()
        (dest / "notes.txt").write_text("mine")
    with pytest.raises(backup_store.BackupError, match=expected):
        backup.run_backup(backup.settings(dataclasses.replace(exp, backup=dataclasses.replace(exp.backup,
                                                                                           dest=str(dest)))))
    assert [c.step for c in layout.list_checkpoints(scratch)] == [10]


def test_a_symbolic_link_in_a_checkpoint_is_never_followed(make, tmp_path: Path) -> None:
    exp = make("linked", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a checkpoint")
    (_save(scratch, 10, latest=False) / "extra.pt").symlink_to(secret)
    _save(scratch, 20)
    report = backup.run_backup(backup.settings(exp))
    assert list(report.failed) == ["global_step10"] and "symbolic link" in report.failed["global_step10"]
    assert report.backed_up == ["global_step20"] and report.deleted == []
    assert not any("secret" in p.name or p.is_symlink() for p in report.store.rglob("*"))
    assert secret.read_text() == "not a checkpoint" and (scratch / "global_step10").is_dir()


# --------------------------------------------------------------------------- universal copies

def _universal(scratch: Path, step: int) -> Path:
    """global_stepN_universal as universal.py leaves it (its own layout; never backed up)."""
    folder = scratch / f"global_step{step}_universal"
    (folder / "zero" / "word_embeddings.weight").mkdir(parents=True)
    (folder / "zero" / "word_embeddings.weight" / "fp32.pt").write_bytes(os.urandom(500))
    return folder


def test_a_universal_copy_goes_only_right_after_its_checkpoint_and_only_under_its_verified_copy(make) -> None:
    exp = make("universal", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    for step in (10, 20, 30):
        _save(scratch, step)
        _universal(scratch, step)
    orphan = _universal(scratch, 5)  # its checkpoint is gone already: nothing can tell it is covered
    report = backup.run_backup(backup.settings(exp))
    assert report.deleted == ["global_step10", "global_step10_universal", "global_step20", "global_step20_universal"]
    assert sorted(p.name for p in scratch.glob("global_step*")) == [
        "global_step30", "global_step30_universal", "global_step5_universal"]
    assert orphan.is_dir() and not report.failed
    # A checkpoint whose copy fails the re-read keeps its universal copy too.
    _save(scratch, 40)
    _universal(scratch, 40)
    victim = report.store / "global_step30" / "layer_00-model_states.pt"
    victim.write_bytes(bytes(b ^ 0xFF for b in victim.read_bytes()))
    again = backup.run_backup(backup.settings(exp))
    assert again.retention.delete == [30] and again.deleted == []
    assert (scratch / "global_step30").is_dir() and (scratch / "global_step30_universal").is_dir()


def test_a_universal_copy_that_is_a_link_is_refused_by_its_path_and_never_followed(make, trainings: Path,
                                                                                     tmp_path: Path) -> None:
    exp = make("linkeduniversal", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    (elsewhere / "keep" / "data.pt").write_text("not ours")
    _save(scratch, 10)
    (scratch / "global_step10_universal").symlink_to(elsewhere)
    _save(scratch, 20)
    result = CliRunner().invoke(main, ["backup", "linkeduniversal", "--trainings-dir", str(trainings)])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert f"{scratch / 'global_step10_universal'} is a symbolic link to {str(elsewhere)!r}" in errors[0]
    assert errors[0].startswith("error: 1 left on scratch by retention (the rest was done): ")  # not a failed copy
    assert "scratch retention: deleted global_step10" in result.output  # its checkpoint had a verified copy
    assert (scratch / "global_step10_universal").is_symlink() and not (scratch / "global_step10").exists()
    assert (elsewhere / "keep" / "data.pt").read_text() == "not ours"


def test_a_checkpoint_folder_that_is_a_link_is_neither_copied_nor_deleted(make, tmp_path: Path) -> None:
    exp = make("linkedfolder", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    real = _save(tmp_path / "other-filesystem", 10, latest=False)
    (scratch / "global_step10").symlink_to(real)
    _save(scratch, 20)
    report = backup.run_backup(backup.settings(exp))
    assert list(report.failed) == ["global_step10"] and f"{scratch / 'global_step10'} is a symbolic link" in \
        report.failed["global_step10"]
    assert report.backed_up == ["global_step20"] and report.deleted == []
    assert (scratch / "global_step10").is_symlink() and sorted(p.name for p in real.iterdir()) == [
        "bsops.json", "layer_00-model_states.pt", "layer_01-model_states.pt", "manifest.json"]


# --------------------------------------------------------------------------- the hostile table

def _truncated_model_states(folder: Path) -> None:
    import torch

    torch.save({"module": None, "optimizer": {"state": {}}}, folder / "mp_rank_00_model_states.pt")
    data = (folder / "mp_rank_00_model_states.pt").read_bytes()
    (folder / "mp_rank_00_model_states.pt").write_bytes(data[: len(data) // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _crafted_model_states(folder: Path) -> None:
    import torch

    torch.save({"optimizer": _Crafted(folder.parent.parent / "owned")}, folder / "mp_rank_00_model_states.pt")


COMMITTED = {"crafted pickle", "random bytes as model states", "truncated model states"}
"""Hostile files the checkpoint's manifest lists (a trainer wrote them); the others were put there after the save."""
HOSTILE = {
    # checkpoint files, committed in the manifest (COMMITTED) or changed after it
    "crafted pickle after the save": (lambda c, t: _crafted_model_states(c / "global_step10"), "its manifest"),
    "a layer file cut short after the save": (lambda c, t: os.truncate(c / "global_step10" / "layer_00-model_states.pt",
                                                                        100), "is 100 bytes, its manifest says 3000"),
    "a byte flipped after the save": (lambda c, t: _flip(c / "global_step10" / "layer_01-model_states.pt"),
                                      "does not match its checkpoint's manifest"),
    "the manifest is a link": (lambda c, t: ((c / "global_step10" / "manifest.json").unlink(),
                                             (c / "global_step10" / "manifest.json").symlink_to(t / "outside.txt")),
                               "never read through a link"),
    "the manifest is garbage": (lambda c, t: (c / "global_step10" / "manifest.json").write_text("{\"files\": 7}"),
                                "manifest.json: format"),
    "crafted pickle": (lambda c, t: _crafted_model_states(c / "global_step10"), "restricted loader"),
    "random bytes as model states": (lambda c, t: (c / "global_step10" / "mp_rank_00_model_states.pt").write_bytes(
        os.urandom(700)), "restricted loader"),
    "truncated model states": (lambda c, t: _truncated_model_states(c / "global_step10"), "restricted loader"),
    "link to a file outside": (lambda c, t: (c / "global_step10" / "x.pt").symlink_to(t / "outside.txt"),
                               "symbolic link"),
    "link to a folder outside": (lambda c, t: (c / "global_step10" / "sub").symlink_to(t), "symbolic link"),
    "the checkpoint folder is a link": (lambda c, t: (shutil.move(c / "global_step10", t / "moved"),
                                                      (c / "global_step10").symlink_to(t / "moved")), "symbolic link"),
    # the checkpoint folder's own files
    "latest names a path": (lambda c, t: (c / "latest").write_text("../../etc"), "latest: got '../../etc'"),
    "latest with a newline": (lambda c, t: (c / "latest").write_text("global_step10\nglobal_step20"), "latest: got"),
    "latest not utf-8": (lambda c, t: (c / "latest").write_bytes(b"\xff\xfe"), "latest: unreadable"),
    "latest is a FIFO": (lambda c, t: ((c / "latest").unlink(), os.mkfifo(c / "latest")), "not a plain file"),
    "latest names a Unicode-digit tag": (lambda c, t: (c / "latest").write_text("global_step\uff11\uff10"),
                                         "latest: got"),
    "run id is a link": (lambda c, t: ((c / layout.RUN_ID).unlink(), (c / layout.RUN_ID).symlink_to(t / "outside.txt")),
                         "not a plain file"),
    "run id junk": (lambda c, t: (c / layout.RUN_ID).write_text("$(reboot)"), "bsops-run-id: got"),
    # destinations
    "dest is a file": (lambda c, t: (t / "store").write_text("x"), "is a file"),
    "dest holds other files": (lambda c, t: ((t / "store").mkdir(), (t / "store" / "a.txt").write_text("x")),
                               "not a bsops backup store"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_checkpoints_and_stores_give_one_clear_line_and_delete_nothing(case: str, trainings: Path,
                                                                              tmp_path: Path) -> None:
    (trainings / "h.yaml").write_text(tiny_yaml(tmp_path / "h", "backup: " + json.dumps(
        {"dest": str(tmp_path / "store"), "keep_last": 1}) + "\n"))
    exp = load_experiment("h", trainings)
    checkpoints = Path(exp.paths.checkpoints)
    layout.new_run_id(checkpoints)
    (tmp_path / "outside.txt").write_text("not a checkpoint")
    _save(checkpoints, 10, latest=False)
    _save(checkpoints, 20)
    make, expected = HOSTILE[case]
    make(checkpoints, tmp_path)
    if case in COMMITTED:  # written by the trainer before its manifest: the restricted loader is what refuses it
        commit_checkpoint(checkpoints / "global_step10")
    before = {p.relative_to(checkpoints).as_posix() for p in checkpoints.rglob("*")}
    result = CliRunner().invoke(main, ["backup", "h", "--trainings-dir", str(trainings)])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert expected in errors[0], errors[0]
    assert {p.relative_to(checkpoints).as_posix() for p in checkpoints.rglob("*")} == before  # nothing deleted
    assert not (tmp_path / "owned").exists() and (tmp_path / "outside.txt").read_text() == "not a checkpoint"


# --------------------------------------------------------------------------- manifests that are not this backup's

FOREIGN_MANIFESTS = {
    "kind is HTML": lambda m: m.update(kind="<img src=x onerror=alert(1)>"),
    "step a string": lambda m: m.update(step="10"),
    "files of the wrong shape": lambda m: m.update(files={"layer_00-model_states.pt": [1, 2]}),
    "a sha256 that is no digest": lambda m: [e.update(sha256="z" * 64) for e in m["files"].values()],
    "verified in the year 10000": lambda m: m.update(verified_at="10000-01-01T00:00:00"),
    "source_files NaN": lambda m: m.update(source_files={"a": [float("nan"), 1]}),
}


@pytest.mark.parametrize("case", sorted(FOREIGN_MANIFESTS))
def test_a_manifest_that_is_not_this_backups_is_no_copy_and_is_reported(case: str, make) -> None:
    """A damaged or forged manifest never stands in for a copy: the checkpoint is copied again (tag.2) and only that
    new, verified copy lets retention delete it; every reader names the manifest instead of failing on it."""
    exp = make("forged", keep_last=None)
    scratch = Path(exp.paths.checkpoints)
    _save(scratch, 10)
    first = backup.run_backup(backup.settings(exp))
    assert first.backed_up == ["global_step10"]
    path = backup_store.manifest_path(first.store, "global_step10")
    manifest = json.loads(path.read_text())
    FOREIGN_MANIFESTS[case](manifest)
    path.write_text(json.dumps(manifest))
    assert backup_store.read_manifest(first.store, "global_step10") is None
    [problem] = backup_store.manifests(first.store).problems
    assert problem.file == str(path)
    assert backup_store.find_copy(first.store, layout.list_checkpoints(scratch)[0], backup.fingerprint(
        layout.list_checkpoints(scratch)[0])) is None
    again = backup.run_backup(backup.settings(exp))
    assert again.backed_up == ["global_step10"] and backup_store.entries(again.store) == ["global_step10", "global_step10.2"]
    assert backup_store.verify(again.store, "global_step10.2") == [] and (scratch / "global_step10").is_dir()
    assert backup_store.store_problems(again.store) == [problem]


# --------------------------------------------------------------------------- the newest resumable state is never lost

def _optimizer(folder: Path) -> None:
    """An optimizer partition in a checkpoint: a weights-only copy leaves it out."""
    (folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(os.urandom(1500))


def _resumable(checkpoints: Path, step: int) -> Path:
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    _optimizer(folder)
    return _save(checkpoints, step)


def test_a_save_cut_short_never_lets_retention_take_the_state_the_run_resumes_from(make, plain_server,
                                                                                  trainings: Path) -> None:
    """The fault round's loss: `latest` named a cut-short global_step40, backup (keep_last 1) refused it and deleted
    global_step20, whose only copy was weights-only. Now 40 is not complete (no manifest), 20 is where the run
    resumes from and the newest resumable state: kept, and 40 is neither copied nor deleted."""
    exp = make("cut", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    for step in (10, 20):
        _resumable(scratch, step)
    (scratch / "global_step40").mkdir()
    (scratch / "global_step40" / "layer_00-model_states.pt").write_bytes(b"4.9 of 29.4 MB")
    (scratch / layout.LATEST).write_text("global_step40")
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10", "global_step20"] and report.incomplete == ["global_step40"]
    assert report.deleted == ["global_step10"] and report.retention.keep[20]
    assert (scratch / "global_step20").is_dir() and (scratch / "global_step40" / "layer_00-model_states.pt").is_file()


def test_a_weights_only_copy_never_makes_the_newest_resumable_checkpoint_deletable(make) -> None:
    """A committed newest checkpoint whose byte flipped after the save is where `latest` points, but the run will set
    it aside and resume from global_step20: 20 stays while its copy is weights-only, and goes once a whole copy (its
    optimizer state included) is verified in the store."""
    exp = make("flipped", keep_last=1)
    scratch = Path(exp.paths.checkpoints)
    for step in (10, 20, 30):
        _resumable(scratch, step)
    _flip(scratch / "global_step30" / "layer_01-model_states.pt")
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10", "global_step20"] and list(report.failed) == ["global_step30"]
    assert "layer_01-model_states.pt does not match its checkpoint's manifest" in report.failed["global_step30"]
    assert report.deleted == ["global_step10"]
    assert report.retention.keep[20] == retention.UNCOPIED_RESUMABLE and "kept for inspection" in report.retention.keep[30]
    whole = dataclasses.replace(exp, backup=dataclasses.replace(exp.backup, keep_optimizer_every=20))
    shutil.rmtree(report.store / "global_step20")  # its weights-only copy goes; the next backup copies it whole
    backup_store.manifest_path(report.store, "global_step20").unlink()
    again = backup.run_backup(backup.settings(whole))
    assert again.backed_up == ["global_step20"] and again.deleted == ["global_step20"]
    assert backup_store.read_manifest(again.store, "global_step20")["kind"] == "whole"
    assert "manifest.json" in backup_store.read_manifest(again.store, "global_step20")["files"]  # restored, it is committed
    assert (scratch / "global_step30").is_dir()


def test_a_truncated_file_in_the_newest_checkpoint_fails_the_backup_names_it_and_alerts_with_the_deletions(
        trainings: Path, tmp_path: Path, plain_server) -> None:
    """The fault round: a truncated layer file in the newest checkpoint was 'whole ... verified', exit 0, no mail,
    and retention deleted 20, 40 and 60. Now: not copied, the file named, exit 2, one mail that lists what
    retention deleted, and the newest resumable checkpoint (40) stays."""
    inbox, port = plain_server
    policy = json.dumps({"dest": str(tmp_path / "store"), "keep_last": 1})
    (trainings / "trunc.yaml").write_text(tiny_yaml(tmp_path / "trunc", f"backup: {policy}\n", alerts_yaml(port)))
    exp = load_experiment("trunc", trainings)
    scratch = Path(exp.paths.checkpoints)
    layout.new_run_id(scratch)
    for step in (20, 40, 60):
        _resumable(scratch, step)
    os.truncate(scratch / "global_step60" / "layer_00-model_states.pt", 1000)
    result = CliRunner().invoke(main, ["backup", "trunc", "--alert", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    [error] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "global_step60" in error and "layer_00-model_states.pt is 1000 bytes, its manifest says 3000" in error
    assert "deleted from scratch by retention: global_step20" in error
    [mail] = inbox.messages
    assert "layer_00-model_states.pt" in mail.get_content() and "global_step20" in mail.get_content()
    assert sorted(c.tag for c in layout.list_checkpoints(scratch)) == ["global_step40", "global_step60"]
