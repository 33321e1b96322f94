"""Backup and retention branches no other test runs (issue 51), on real checkpoint folders and real stores.

- A copy that lost a file or holds another, and a tar copy damaged in the store: `verify` names each file;
- an interrupted copy whose staged file was damaged in the store (its journal vouching for it): the copy differs from
  its source, nothing of it is kept, and the next run copies it again; a copy moved into place without its manifest
  is finished; a model-states file changed after its save is never rewritten into the store;
- a fresh tar that fails its re-read (the store's disk corrupts what was just written);
- what changes between retention's decision and a deletion (a rollback moving the resume point back, a link put into
  a checkpoint, a file gone from its copy): the checks right before each deletion keep what is no longer safe to go;
- evaluation results of checkpoints retention deleted still count through their copies in the store.

The two faults that cannot be made with files alone (a disk corrupting a tar as it lands, an event between two
statements) are injected at the one call they happen around (os.replace, retention.apply), which still runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import layout, retention
from bigscience_ops.checkpoints.layout import Checkpoint
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.evaluate import results
from bigscience_ops.ops.keep import backup, evaluated
from bigscience_ops.ops.keep import store as backup_store
from bigscience_ops.schema import Experiment
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import commit_checkpoint


def _experiment(trainings: Path, run: Path, name: str = "br", **policy) -> Experiment:
    """`name` (base tiny) with its run in `run`, a store beside it and backup policy `policy`; the run named."""
    values = {"dest": str(run.parent / f"{name}-store"), **policy}
    (trainings / f"{name}.yaml").write_text(tiny_yaml(run, f"backup: {json.dumps(values)}\n"))
    exp = load_experiment(name, trainings)
    layout.new_run_id(Path(exp.paths.checkpoints))
    return exp


def _save(exp: Experiment, step: int, *, model_states: bool = False) -> Path:
    """A complete checkpoint as the trainer lays it out (random weights), committed, and `latest` naming it."""
    checkpoints = Path(exp.paths.checkpoints)
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "layer_00-model_states.pt").write_bytes(os.urandom(3000))
    (folder / "layer_01-model_states.pt").write_bytes(os.urandom(2000))
    if model_states:
        (folder / "mp_rank_00_model_states.pt").write_bytes(os.urandom(1000))
    (folder / layout.META).write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)
    layout.write_latest(checkpoints, folder.name)
    return folder


def _with(exp: Experiment, **policy) -> Experiment:
    return dataclasses.replace(exp, backup=dataclasses.replace(exp.backup, **policy))


def _flip(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _steps(exp: Experiment) -> list[int]:
    return [c.step for c in layout.list_checkpoints(Path(exp.paths.checkpoints))]


# --- a copy in the store that is not what was copied ---------------------------------------------------------------

def test_a_copy_missing_a_file_or_holding_another_fails_its_re_read(trainings: Path, tmp_path: Path) -> None:
    exp = _experiment(trainings, tmp_path / "run")
    _save(exp, 10)
    store = backup.run_backup(backup.settings(exp)).store
    assert backup_store.verify(store, "global_step10") == [] and backup_store.is_backed_up(store, "global_step10")
    copy = store / "global_step10"
    listed = list(json.loads(backup_store.manifest_path(store, "global_step10").read_text())["files"])
    first, last = listed[0], listed[-1]  # one gone, and one past it damaged: both named, not the first alone
    (copy / first).unlink()
    (copy / last).write_bytes((copy / last).read_bytes() + b"x")
    (copy / "stray.pt").write_bytes(b"x")
    bad = backup_store.verify(store, "global_step10")
    assert len(bad) == 3 and len(listed) > 2
    assert bad[0] == f"{copy / first}: missing" and bad[1].startswith(f"{copy / last}: size ")
    assert bad[2].startswith(str(copy / "stray.pt"))
    assert not backup_store.is_backed_up(store, "global_step10")
    [none] = backup_store.verify(store, "global_step99")
    assert none.startswith(str(backup_store.manifest_path(store, "global_step99")))
    assert not backup_store.is_backed_up(store, "global_step99")


def _cut_after_first_member(tar: Path) -> None:
    with tarfile.open(tar) as archive:
        first = archive.next()
        end = first.offset_data + -(-first.size // 512) * 512
    tar.write_bytes(tar.read_bytes()[:end])


def _append_folder_member(tar: Path) -> None:
    with tarfile.open(tar, "a") as archive:
        member = tarfile.TarInfo("extra-folder")
        member.type = tarfile.DIRTYPE
        archive.addfile(member)


def _flip_first_member(tar: Path) -> None:
    with tarfile.open(tar) as archive:
        offset = archive.next().offset_data
    _flip(tar, offset + 10)


def _garbage_header(tar: Path) -> None:
    data = bytearray(tar.read_bytes())
    data[148:156] = b"garbage!"  # the first header's checksum field
    tar.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, found, count", [
    (_flip_first_member, {"member differs"}, lambda members: 1),
    (_cut_after_first_member, {"missing"}, lambda members: members - 1),
    (_garbage_header, {"unreadable"}, lambda members: 1),
    (_append_folder_member, set(), lambda members: 0),  # a folder in the tar is no file of the copy: passed over
], ids=["a member's bytes flipped", "cut after its first member", "a garbage header", "a folder member added"])
def test_a_tar_copy_damaged_in_the_store_fails_its_re_read(trainings: Path, tmp_path: Path, damage, found,
                                                           count) -> None:
    exp = _experiment(trainings, tmp_path / "run", tar=True)
    _save(exp, 10)
    store = backup.run_backup(backup.settings(exp)).store
    tar = store / "global_step10.tar"
    assert backup_store.verify(store, "global_step10") == []
    with tarfile.open(tar) as archive:
        members = [m.name for m in archive]
    damage(tar)
    bad = backup_store.verify(store, "global_step10")
    kinds = set()
    for line in bad:
        if line.startswith(f"{tar}: "):
            kinds.add("unreadable")
        elif line.startswith(f"{tar}:{members[0]}"):
            kinds.add("member differs")
        else:
            assert any(line.startswith(f"{tar}:{m}") for m in members[1:]), line
            kinds.add("missing")
    assert kinds == found and len(bad) == count(len(members))


# --- an interrupted copy resumed from the store ---------------------------------------------------------------------

def _staged(exp: Experiment, step: int, entry: str | None = None) -> Path:
    """The store's folder of an interrupted copy of global_step`step` (its fingerprint as the copy left it)."""
    ckpt = Checkpoint(f"global_step{step}", step, Path(exp.paths.checkpoints) / f"global_step{step}")
    store = backup_store.run_store(backup_store.open_store(Path(exp.backup.dest)), exp.name, layout.run_id(ckpt.path.parent))
    staging = store / backup_store.PARTIAL / (entry or ckpt.tag)
    staging.mkdir(parents=True)
    (staging / backup_store.SOURCE).write_text(json.dumps({"tag": ckpt.tag, "source_files": backup.fingerprint(ckpt)}))
    return staging


@pytest.mark.parametrize("journal", ["the source's bytes", "the damaged bytes"])
def test_an_interrupted_copy_damaged_in_the_store_is_dropped_and_copied_again(trainings: Path, tmp_path: Path,
                                                                            journal: str) -> None:
    """The journal vouches for a staged file whose bytes were damaged since (same size): the re-read after the copy
    finds it differs from what was read from scratch (sha256) or, journaled as it is now, from the checkpoint's own
    manifest (xxh3_128); nothing of the copy is kept, and the next run copies the checkpoint whole again."""
    exp = _experiment(trainings, tmp_path / "run", keep_last=1)
    source = _save(exp, 10) / "layer_00-model_states.pt"
    staging = _staged(exp, 10)
    damaged = bytearray(source.read_bytes())
    damaged[5] ^= 0xFF
    (staging / source.name).write_bytes(bytes(damaged))
    (staging / f".{source.name}.tmp").write_bytes(b"half a file a kill left")
    vouched = source.read_bytes() if journal == "the source's bytes" else bytes(damaged)
    (staging / backup_store.JOURNAL).write_text(json.dumps({"path": source.name, "size": len(vouched),
                                                      "sha256": _sha(vouched)}) + "\n")
    report = backup.run_backup(backup.settings(exp))
    assert list(report.failed) == ["global_step10"] and str(staging / source.name) in report.failed["global_step10"]
    assert not staging.exists() and backup_store.entries(report.store) == [] and report.deleted == []
    assert _steps(exp) == [10]
    again = backup.run_backup(backup.settings(exp))
    assert again.backed_up == ["global_step10"] and again.failed == {} and again.resumed == []
    assert backup_store.verify(again.store, "global_step10") == []
    assert (again.store / "global_step10" / source.name).read_bytes() == source.read_bytes()


def test_a_copy_moved_into_place_without_its_manifest_is_finished(trainings: Path, tmp_path: Path) -> None:
    """Killed between moving the copy into place and writing its manifest, beside a staged folder of the same copy:
    the folder goes back to staging (replacing the staged one), is finished, and only then counts."""
    exp = _experiment(trainings, tmp_path / "run")
    folder = _save(exp, 10)
    staging = _staged(exp, 10)
    final = staging.parent.parent / "global_step10"
    shutil.copytree(folder, final)
    (final / "manifest.json").unlink()  # a weights-only copy: the checkpoint's manifest is not part of it
    (final / "layer_01-model_states.pt").write_bytes(b"cut short")  # never vouched for: copied again
    report = backup.run_backup(backup.settings(exp))
    assert report.resumed == ["global_step10"] and report.backed_up == ["global_step10"]
    assert backup_store.verify(report.store, "global_step10") == [] and list((report.store / backup_store.PARTIAL).iterdir()) == []
    assert (final / "layer_01-model_states.pt").read_bytes() == (folder / "layer_01-model_states.pt").read_bytes()


def test_a_staged_copy_whose_record_cannot_be_read_is_not_taken_for_this_checkpoints(trainings: Path,
                                                                                   tmp_path: Path) -> None:
    exp = _experiment(trainings, tmp_path / "run")
    _save(exp, 10)
    staging = _staged(exp, 10)
    (staging / backup_store.SOURCE).write_bytes(b"{not json")
    (staging.parent / "global_step10.9").symlink_to(staging)  # a link among the staged folders: passed over
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10"]
    assert backup_store.entries(report.store) == ["global_step10.2"]  # its name is taken by the unreadable one
    assert backup_store.read_manifest(report.store, "global_step10.2")["tag"] == "global_step10"


def test_a_model_states_file_changed_after_its_save_is_not_rewritten_into_the_store(trainings: Path,
                                                                                   tmp_path: Path) -> None:
    """Weights-only copies rewrite mp_rank_*_model_states.pt without the optimizer: the file is checked against the
    checkpoint's manifest (content, not only size) before torch reads it; one changed since is refused."""
    exp = _experiment(trainings, tmp_path / "run")
    folder = _save(exp, 10, model_states=True)
    _flip(folder / "mp_rank_00_model_states.pt", 7)
    report = backup.run_backup(backup.settings(exp))
    assert list(report.failed) == ["global_step10"] and str(folder / "mp_rank_00_model_states.pt") in \
        report.failed["global_step10"]
    assert backup_store.entries(report.store) == [] and list((report.store / backup_store.PARTIAL).iterdir()) == []


def test_a_fresh_tar_that_fails_its_re_read_is_not_a_copy(trainings: Path, tmp_path: Path, monkeypatch) -> None:
    """The store's disk corrupts the tar as it lands (one byte of the first member): the re-read of the fresh tar
    catches it, nothing is recorded as copied, the damaged tar and the staged files are removed, and the next run
    (a sound disk) makes the copy under its own name."""
    exp = _experiment(trainings, tmp_path / "run", tar=True, keep_last=1)
    _save(exp, 10)
    real = os.replace

    def corrupting(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        if str(dst).endswith(".tar"):
            _flip_first_member(Path(dst))

    monkeypatch.setattr(backup.os, "replace", corrupting)
    report = backup.run_backup(backup.settings(exp))
    monkeypatch.setattr(backup.os, "replace", real)
    assert list(report.failed) == ["global_step10"]
    assert str(report.store / "global_step10.tar") in report.failed["global_step10"]
    assert backup_store.entries(report.store) == [] and not (report.store / "global_step10.tar").exists()
    assert list((report.store / backup_store.PARTIAL).iterdir()) == []
    again = backup.run_backup(backup.settings(exp))
    assert again.backed_up == ["global_step10"] and backup_store.entries(again.store) == ["global_step10"]
    assert backup_store.verify(again.store, "global_step10") == []


# --- between retention's decision and a deletion ---------------------------------------------------------------------

def _rollback_to_20(exp: Experiment, store: Path) -> None:
    layout.write_latest(Path(exp.paths.checkpoints), "global_step20")


def _link_into_10(exp: Experiment, store: Path) -> None:
    (Path(exp.paths.checkpoints) / "global_step10" / "elsewhere").symlink_to(store)


def _file_gone_from_20s_copy(exp: Experiment, store: Path) -> None:
    (store / "global_step20" / "layer_00-model_states.pt").unlink()


def _folder_of_30_moved_away(exp: Experiment, store: Path) -> None:
    scratch = Path(exp.paths.checkpoints)
    (scratch / "global_step30").rename(scratch / "moved-30")


@pytest.mark.parametrize("meanwhile, deleted, left", [
    (_rollback_to_20, ["global_step10"], [20, 30, 40]),  # 20 is where the run resumes now, 30 after it
    (_link_into_10, ["global_step20", "global_step30"], [10, 40]),  # 10 is no plain folder of files any more
    (_file_gone_from_20s_copy, ["global_step10", "global_step30"], [20, 40]),  # 20's copy is no copy any more
    (_folder_of_30_moved_away, ["global_step10", "global_step20"], [40]),  # 30 is no folder to delete: refused
], ids=["the resume point moved back", "a link put into a checkpoint", "a file gone from a copy",
        "a checkpoint moved away"])
def test_what_changed_since_retentions_decision_is_not_deleted(trainings: Path, tmp_path: Path, monkeypatch,
                                                               meanwhile, deleted: list[str], left: list[int]) -> None:
    """Retention decides to delete 10, 20 and 30 (whole verified copies, keep_last 1, latest 40); `meanwhile`
    happens right after the decision: the checks right before each deletion keep what is no longer safe to go."""
    exp = _experiment(trainings, tmp_path / "run", keep_optimizer_every=10)
    for step in (10, 20, 30, 40):
        _save(exp, step)
    store = backup.run_backup(backup.settings(exp)).store
    assert backup_store.entries(store) == ["global_step10", "global_step20", "global_step30", "global_step40"]
    exp = _with(exp, keep_last=1)
    real = retention.apply

    def after_the_decision(checkpoints, decision, still_verified):
        assert decision.delete == [10, 20, 30]
        meanwhile(exp, store)
        return real(checkpoints, decision, still_verified)

    monkeypatch.setattr(backup.retention, "apply", after_the_decision)
    report = backup.run_backup(backup.settings(exp))
    assert report.deleted == deleted and _steps(exp) == left
    assert list(report.left_on_scratch) == (["global_step30"] if meanwhile is _folder_of_30_moved_away else [])


# --- evaluation results after retention -------------------------------------------------------------------------------

def _result(exp: Experiment, step: int) -> results.Result:
    data = {"bsops": {"format": results.FORMAT, "step": step, "run_id": layout.run_id(Path(exp.paths.checkpoints))},
            "results": {"smoke": {"acc,none": 0.5}}}
    path = results.result_path(exp, f"global_step{step}")
    results.write(path, data)
    return results.from_dict(data, step, path)


def test_results_of_checkpoints_retention_deleted_count_through_their_copies(trainings: Path, tmp_path: Path) -> None:
    exp = _experiment(trainings, tmp_path / "run", keep_optimizer_every=10, keep_last=1)
    for step in (10, 20, 30):
        _save(exp, step)
    assert backup.run_backup(backup.settings(exp)).deleted == ["global_step10", "global_step20"]
    assert _steps(exp) == [30]
    found = [_result(exp, step) for step in (10, 15, 20, 30)]
    assert evaluated.saved_steps(exp) == {10, 20, 30}
    kept, problems = evaluated.counted(found, exp)
    assert [r.step for r in kept] == [10, 20, 30]
    assert [p.file for p in problems] == [str(results.result_path(exp, "global_step15"))]
    # Without the store, only what is on scratch counts: the copies are what keep 10 and 20 counted.
    kept, problems = evaluated.counted(found, _with(exp, dest=None))
    assert [r.step for r in kept] == [30] and len(problems) == 3


def test_an_unreadable_store_or_run_id_counts_what_is_on_scratch(trainings: Path, tmp_path: Path) -> None:
    exp = _experiment(trainings, tmp_path / "run", keep_optimizer_every=10, keep_last=1)
    for step in (10, 20):
        _save(exp, step)
    backup.run_backup(backup.settings(exp))
    result = _result(exp, 20)
    (Path(exp.paths.checkpoints) / layout.RUN_ID).write_text("not a run id\n")
    assert evaluated.saved_steps(exp) == {20}
    assert evaluated.counted([], exp) == ([], [])
    kept, problems = evaluated.counted([result], exp)
    assert [r.step for r in kept] == [20] and problems == []


# --- the store's own files, read as untrusted input ----------------------------------------------------------------------

def _manifest(store: Path) -> Path:
    return backup_store.manifest_path(store, "global_step10")


def _edit(field: str, value):
    def change(store: Path) -> None:
        data = json.loads(_manifest(store).read_text())
        data[field] = value
        _manifest(store).write_text(json.dumps(data))
    return change


def _dangling(store: Path) -> None:
    _manifest(store).unlink()
    _manifest(store).symlink_to(store / "nowhere")


@pytest.mark.parametrize("damage, problems", [
    (_edit("tag", "step10"), 1),
    (_edit("tar", "yes"), 1),
    (_edit("tar", True), 1),  # a tar without its size
    (_dangling, 1),  # a link (to nothing) is never read through
], ids=["tag not a tag", "tar not a boolean", "tar without tar_size", "a dangling link"])
def test_a_store_manifest_that_is_not_this_backups_is_no_copy(trainings: Path, tmp_path: Path, damage,
                                                              problems: int) -> None:
    exp = _experiment(trainings, tmp_path / "run")
    _save(exp, 10)
    store = backup.run_backup(backup.settings(exp)).store
    damage(store)
    assert backup_store.read_manifest(store, "global_step10") is None and not backup_store.is_backed_up(store, "global_step10")
    found = backup_store.manifests(store)
    assert found.records == [] and [p.file for p in found.problems] == [str(_manifest(store))] * problems
    assert len(backup_store.store_problems(store)) == problems


def test_a_journal_with_a_bad_line_before_its_last_is_a_store_problem(trainings: Path, tmp_path: Path) -> None:
    exp = _experiment(trainings, tmp_path / "run")
    _save(exp, 10)
    staging = _staged(exp, 10)
    store = staging.parent.parent
    good = {"path": "layer_00-model_states.pt", "size": 3, "sha256": "0" * 64}
    (staging / backup_store.JOURNAL).write_text("not json\n" + json.dumps(good) + "\n")
    (staging.parent / "global_step10.7").write_text("a file among the staged folders")
    found = backup_store.store_problems(store)
    assert [(p.file, p.line) for p in found] == [(str(staging / backup_store.JOURNAL), 1)]
    shutil.rmtree(staging.parent)
    (store / backup_store.PARTIAL).symlink_to(tmp_path)  # a link is never followed
    assert backup_store.store_problems(store) == []


def test_what_a_backup_refuses_before_it_starts(trainings: Path, tmp_path: Path) -> None:
    exp = _with(_experiment(trainings, tmp_path / "run"), dest=None)
    with pytest.raises(backup_store.BackupError, match=exp.name):
        backup.destination(backup.settings(exp))
    assert backup.destination(backup.settings(_with(exp, dest=str(tmp_path / "to")))) == tmp_path / "to"
    for name in ("", ".", "..", "a/b", "a\0b"):
        with pytest.raises(backup_store.BackupError):
            backup_store.run_store(tmp_path, name, "0" * 32)


def test_a_link_in_a_checkpoint_or_as_one_is_never_fingerprinted(trainings: Path, tmp_path: Path) -> None:
    exp = _experiment(trainings, tmp_path / "run")
    folder = _save(exp, 10)
    (folder / "sub").mkdir()
    (folder / "sub" / "link").symlink_to(folder / layout.META)
    with pytest.raises(backup_store.BackupError, match="sub/link"):
        backup.fingerprint(Checkpoint("global_step10", 10, folder))
    link = folder.parent / "global_step20"
    link.symlink_to(folder)
    with pytest.raises(backup_store.BackupError, match="global_step20"):
        backup.fingerprint(Checkpoint("global_step20", 20, link))


# --- retention's own refusals -------------------------------------------------------------------------------------------

def test_protect_resumable_passes_over_weights_only_and_uncommitted_checkpoints(tmp_path: Path) -> None:
    from bigscience_ops.checkpoints import manifest

    def checkpoint(step: int, optimizer: bool | None) -> Checkpoint:
        folder = tmp_path / f"global_step{step}"
        folder.mkdir()
        (folder / "layer_00-model_states.pt").write_bytes(b"w" * step)
        if optimizer is not None:
            commit_checkpoint(folder, optimizer=optimizer)
        return Checkpoint(folder.name, step, folder)

    found = [checkpoint(0, False), checkpoint(10, None), checkpoint(20, False)]
    # No checkpoint holds its optimizer state: nothing to protect (a warm start's weights, a save cut short).
    assert retention.protect_resumable(found, lambda c: False, lambda c, m: None) == {}
    found += [checkpoint(30, True), checkpoint(40, True)]
    why = {40: "layer_00-model_states.pt: missing"}
    protected = retention.protect_resumable(found, lambda c: False, lambda c, m: why.get(c.step))
    assert sorted(protected) == [30, 40] and why[40] in protected[40]
    assert protected[30] == retention.UNCOPIED_RESUMABLE and manifest.read(found[-1].path).optimizer


def test_apply_refuses_links_files_and_a_folder_gone_before_its_deletion(tmp_path: Path) -> None:
    real = tmp_path / "global_step10"
    real.mkdir()
    (real / "layer_00-model_states.pt").write_bytes(b"w")
    link = tmp_path / "global_step20"
    link.symlink_to(real)
    plain = tmp_path / "global_step30"
    plain.write_text("a file")
    gone = tmp_path / "global_step40"
    gone.mkdir()
    found = [Checkpoint(p.name, layout.step_of(p.name), p) for p in (real, link, plain, gone)]

    def verified(ckpt: Checkpoint) -> bool:
        if ckpt.step == 40:
            gone.rename(tmp_path / "rolled-back-40")  # moved away between its last check and its deletion
        return True

    done = retention.apply(found, retention.Decision({}, [10, 20, 30, 40]), verified)
    assert done.deleted == ["global_step10"]
    assert sorted(done.refused) == ["global_step20", "global_step30", "global_step40"]
    assert link.is_symlink() and plain.is_file() and not real.exists() and (tmp_path / "rolled-back-40").is_dir()
    universal = tmp_path / "global_step50_universal"
    universal.symlink_to(tmp_path)
    fifty = tmp_path / "global_step50"
    fifty.mkdir()
    done = retention.apply([Checkpoint(fifty.name, 50, fifty)], retention.Decision({}, [50]), lambda c: True)
    assert done.deleted == ["global_step50"] and list(done.refused) == ["global_step50_universal"]
    assert universal.is_symlink()
