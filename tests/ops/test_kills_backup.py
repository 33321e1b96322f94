"""Backup checks that mutation testing found untested (scripts/mutation.py): each test here fails on a mutant of
ops/keep/backup.py that every other test let through. Real folders and tar files; no training."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import layout
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.keep import backup
from bigscience_ops.ops.keep import store as backup_store
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import commit_checkpoint


def _save(checkpoints: Path, step: int, *, latest: bool = True) -> Path:
    """A complete checkpoint as the trainer leaves it: two layer files, bsops.json, a committed manifest."""
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "layer_00-model_states.pt").write_bytes(os.urandom(3000))
    (folder / "layer_01-model_states.pt").write_bytes(os.urandom(2000))
    (folder / layout.META).write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)
    if latest:
        (checkpoints / layout.LATEST).write_text(f"global_step{step}")
    return folder


@pytest.fixture
def tarred(trainings: Path, tmp_path: Path):
    """A run with global_step10 backed up whole as a tar: (experiment, the run's store, the tar's members)."""
    policy = {"dest": str(tmp_path / "store"), "tar": True, "keep_optimizer_every": 10}
    (trainings / "tarred.yaml").write_text(tiny_yaml(tmp_path / "tarred", f"backup: {json.dumps(policy)}\n"))
    exp = load_experiment("tarred", trainings)
    layout.new_run_id(Path(exp.paths.checkpoints))
    _save(Path(exp.paths.checkpoints), 10)
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10"] and report.failed == {}
    with tarfile.open(report.store / "global_step10.tar") as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive if m.isfile()}
    assert backup_store.verify(report.store, "global_step10") == []
    return exp, report.store, members


def _retar(path: Path, members: dict[str, bytes]) -> None:
    """`path` written again as a tar of exactly `members` (name -> bytes)."""
    with tarfile.open(path, "w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("change", ["same size, other bytes", "one byte longer", "one byte shorter"])
def test_a_tar_whose_member_differs_from_the_manifest_fails_verification(tarred, change: str) -> None:
    _, store, members = tarred
    name = "layer_00-model_states.pt"
    data = members[name]
    members[name] = {"same size, other bytes": bytes([data[0] ^ 0xFF]) + data[1:], "one byte longer": data + b"\0",
                     "one byte shorter": data[:-1]}[change]
    _retar(store / "global_step10.tar", members)
    bad = backup_store.verify(store, "global_step10")
    assert len(bad) == 1 and name in bad[0]


def test_a_tar_member_the_manifest_does_not_list_or_a_listed_one_missing_fails_verification(tarred) -> None:
    _, store, members = tarred
    _retar(store / "global_step10.tar", {**members, "extra.pt": b"x" * 10})
    bad = backup_store.verify(store, "global_step10")
    assert len(bad) == 1 and "extra.pt" in bad[0]
    missing = "layer_01-model_states.pt"
    _retar(store / "global_step10.tar", {n: d for n, d in members.items() if n != missing})
    bad = backup_store.verify(store, "global_step10")
    assert len(bad) == 1 and missing in bad[0]


def test_a_tar_that_is_not_a_tar_fails_verification_and_a_damaged_tar_never_lets_retention_delete(tarred) -> None:
    exp, store, _ = tarred
    scratch = Path(exp.paths.checkpoints)
    original = (store / "global_step10.tar").read_bytes()
    (store / "global_step10.tar").write_bytes(b"not a tar at all" * 100)
    assert len(backup_store.verify(store, "global_step10")) == 1
    # Two newer checkpoints: with a verified copy global_step10 would go (keep_last=1). Its tar, of the size the
    # store's manifest records (what the cheap check reads), has one byte of a member flipped in place: bit rot.
    (store / "global_step10.tar").write_bytes(original)
    _flip_a_byte_of(store / "global_step10.tar", "layer_00-model_states.pt")
    for step in (20, 30):
        _save(scratch, step)
    keep_one = dataclasses.replace(exp, backup=dataclasses.replace(exp.backup, keep_last=1))
    report = backup.run_backup(backup.settings(keep_one))
    assert backup_store.is_backed_up(store, "global_step10") and len(backup_store.verify(store, "global_step10")) == 1
    assert report.backed_up == ["global_step20", "global_step30"] and report.deleted == ["global_step20"]
    assert (scratch / "global_step10").is_dir()


def _flip_a_byte_of(path: Path, member: str) -> None:
    with tarfile.open(path) as archive:
        offset = archive.getmember(member).offset_data
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def _engine_state(checkpoints: Path, step: int, weight: float) -> Path:
    """A checkpoint whose DeepSpeed engine state holds the optimizer (ZeRO-0), saved by torch as the trainer does,
    beside a ZeRO optimizer partition: what a weights-only copy rewrites and leaves out."""
    import torch

    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    state = {"module": {"w": torch.full((4, 4), weight)}, "optimizer": {"exp_avg": torch.ones(4, 4)}, "iteration": step}
    torch.save(state, folder / "mp_rank_00_model_states.pt")
    torch.save({"partition": torch.zeros(8)}, folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (folder / layout.META).write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)
    (checkpoints / layout.LATEST).write_text(folder.name)
    return folder


@pytest.fixture
def weights_only(trainings: Path, tmp_path: Path):
    """(experiment, checkpoints folder) of a run whose backups are weights-only (no step keeps its optimizer)."""
    policy = {"dest": str(tmp_path / "store"), "keep_optimizer_every": 1000}
    (trainings / "light.yaml").write_text(tiny_yaml(tmp_path / "light", f"backup: {json.dumps(policy)}\n"))
    exp = load_experiment("light", trainings)
    layout.new_run_id(Path(exp.paths.checkpoints))
    return exp, Path(exp.paths.checkpoints)


def test_a_weights_only_copy_holds_the_weights_without_the_optimizer_and_verifies(weights_only) -> None:
    import torch

    exp, scratch = weights_only
    _engine_state(scratch, 10, 0.5)
    progress = Counted()
    report = backup.run_backup(backup.settings(exp), progress=progress)
    assert report.backed_up == ["global_step10"] and report.failed == {}
    store = report.store
    found = backup_store.read_manifest(store, "global_step10")
    assert found["kind"] == "weights-only" and found["rewritten"] == ["mp_rank_00_model_states.pt"]
    assert found["left_out"] == ["manifest.json", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    copy = torch.load(store / "global_step10" / "mp_rank_00_model_states.pt", weights_only=True)
    assert copy["optimizer"] is None and copy["iteration"] == 10 and torch.equal(copy["module"]["w"],
                                                                                  torch.full((4, 4), 0.5))
    assert sorted(p.name for p in (store / "global_step10").iterdir()) == ["bsops.json", "mp_rank_00_model_states.pt"]
    assert not list(store.rglob("*.tmp")) and backup_store.verify(store, "global_step10") == []
    # every byte read from scratch was counted once: the rewritten file's size and bsops.json's
    assert progress.read == sum((scratch / "global_step10" / f).stat().st_size
                                for f in ("mp_rank_00_model_states.pt", layout.META))


class Counted(backup.BackupProgress):
    def __init__(self) -> None:
        self.read = 0

    def advance(self, nbytes: int) -> None:
        self.read += nbytes


def test_a_model_states_file_changed_after_its_save_is_never_rewritten_into_the_store(weights_only) -> None:
    import torch

    exp, scratch = weights_only
    folder = _engine_state(scratch, 10, 0.5)
    states = folder / "mp_rank_00_model_states.pt"
    size = states.stat().st_size
    torch.save({"module": {"w": torch.full((4, 4), 0.25)}, "optimizer": {"exp_avg": torch.ones(4, 4)},
                "iteration": 10}, states)  # other weights, the same layout: the same size, another content
    assert states.stat().st_size == size
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == [] and list(report.failed) == ["global_step10"]
    assert str(states) in report.failed["global_step10"]
    assert backup_store.entries(report.store) == [] and not (report.store / "global_step10").exists()


@pytest.fixture
def stored(trainings: Path, tmp_path: Path):
    """(the run's store, its entry global_step10's manifest as written) after a folder backup of one checkpoint."""
    policy = {"dest": str(tmp_path / "store")}
    (trainings / "kept.yaml").write_text(tiny_yaml(tmp_path / "kept", f"backup: {json.dumps(policy)}\n"))
    exp = load_experiment("kept", trainings)
    layout.new_run_id(Path(exp.paths.checkpoints))
    _save(Path(exp.paths.checkpoints), 10)
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10"]
    return report.store, json.loads(backup_store.manifest_path(report.store, "global_step10").read_text())


MANIFEST_CHANGES = {  # a change to a manifest the backup wrote -> a value its problem must name (None: still fine)
    "a list": (lambda m: [m], "list"),
    "tag not a tag": (lambda m: {**m, "tag": "step10"}, "step10"),
    "tag not text": (lambda m: {**m, "tag": 10}, "10"),
    "step below 0": (lambda m: {**m, "step": -1}, "-1"),
    "step past the largest": (lambda m: {**m, "step": 10**18}, str(10**18)),
    "step 0 (a warm start's global_step0)": (lambda m: {**m, "step": 0}, True),
    "an empty file, its mtime 0": (lambda m: {**m, "files": {"a": {"size": 0, "sha256": "0" * 64}},
                                              "source_files": {"a": [0, 0]}}, True),
    "a file past 2**63 bytes": (lambda m: {**m, "files": {"a": {"size": 2**63 + 1, "sha256": "0" * 64}}}, None),
    "a file of 2**63 bytes, past the largest step": (lambda m: {**m, "files": {"a": {"size": 2**63, "sha256": "0" * 64}}},
                                                     True),
    "a tar of 2**63 bytes": (lambda m: {**m, "tar": True, "tar_size": 2**63}, True),
    "an empty tar": (lambda m: {**m, "tar": True, "tar_size": 0}, True),
    "a source file past 2**63 bytes": (lambda m: {**m, "source_files": {"a": [2**63 + 1, 0]}}, None),
    "a tar past 2**63 bytes": (lambda m: {**m, "tar": True, "tar_size": 2**63 + 1}, None),
    "verified before 1970": (lambda m: {**m, "verified_at": "1960-01-01T00:00:00+00:00"}, "1960"),
    "kind unknown": (lambda m: {**m, "kind": "partial"}, "partial"),
    "verified_at no date": (lambda m: {**m, "verified_at": "yesterday"}, "yesterday"),
    "verified_at missing": (lambda m: {k: v for k, v in m.items() if k != "verified_at"}, "None"),
    "a sha256 too short": (lambda m: {**m, "files": {"a": {"size": 1, "sha256": "ab"}}}, None),
    "source_files not pairs": (lambda m: {**m, "source_files": {"a": [1]}}, None),
    "tar not a boolean": (lambda m: {**m, "tar": "yes"}, None),
    "a tar without its size": (lambda m: {**m, "tar": True}, None),
}


@pytest.mark.parametrize("change", list(MANIFEST_CHANGES))
def test_a_store_manifest_with_a_bad_field_is_a_problem_naming_the_file_and_the_value(stored, change: str) -> None:
    store, written = stored
    edit, named = MANIFEST_CHANGES[change]
    path = backup_store.manifest_path(store, "global_step10")
    path.write_text(json.dumps(edit(written)))
    found, problem = backup_store.manifest_checked(store, "global_step10")
    if named is True:
        assert problem is None and found == edit(written)
        return
    assert found is None and (problem.file, problem.line) == (str(path), 0) and problem.what
    if named is not None:
        assert named in problem.what
    checked = backup_store.manifests(store)
    assert checked.records == [] and [p.file for p in checked.problems] == [str(path)]
    [line] = backup_store.verify(store, "global_step10")
    assert str(path) in line


def test_a_store_manifest_that_is_no_json_or_a_link_is_a_problem_and_a_good_one_a_record(stored) -> None:
    store, written = stored
    path = backup_store.manifest_path(store, "global_step10")
    checked = backup_store.manifests(store)
    assert checked.problems == [] and checked.records == [("global_step10", written)]
    path.write_bytes(b"{not json")
    _, problem = backup_store.manifest_checked(store, "global_step10")
    assert (problem.file, problem.line) == (str(path), 0) and "not json" in problem.held and problem.what
    path.unlink()
    path.symlink_to(store / "elsewhere.json")
    found, problem = backup_store.manifest_checked(store, "global_step10")
    assert found is None and problem.file == str(path) and problem.line == 0 and problem.what
    [line] = backup_store.verify(store, "global_step10")
    assert str(path) in line


def test_the_store_problems_are_its_bad_manifests_and_interrupted_journals_bad_lines(stored, tmp_path: Path) -> None:
    store, _ = stored
    assert backup_store.store_problems(store) == []
    good = json.dumps({"path": "a.pt", "size": 1, "sha256": "0" * 64})
    for name, lines in {"global_step20": f"garbage\n{good}\n", "global_step30": f"{good}\n{good}\n",
                        "global_step40": f'{good}\n{{"path": "b'}.items():
        (store / backup_store.PARTIAL / name).mkdir(parents=True)
        (store / backup_store.PARTIAL / name / backup_store.JOURNAL).write_text(lines)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / backup_store.JOURNAL).write_text("garbage\n" + good + "\n")
    (store / backup_store.PARTIAL / "global_step50").symlink_to(elsewhere)
    problems = backup_store.store_problems(store)
    assert [(p.file, p.line) for p in problems] == [(str(store / backup_store.PARTIAL / "global_step20" / backup_store.JOURNAL), 1)]
    backup_store.manifest_path(store, "global_step10").write_text("[]")
    assert len(backup_store.store_problems(store)) == 2


def test_a_tar_with_a_folder_member_and_a_member_past_one_read_chunk_verifies_by_its_files(tarred) -> None:
    _, store, members = tarred
    big = os.urandom(backup_store.CHUNK + 1000)
    path = store / "global_step10.tar"
    with tarfile.open(path, "w") as archive:
        folder = tarfile.TarInfo("a-folder")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
        for name, data in {**members, "big.pt": big}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    found = json.loads(backup_store.manifest_path(store, "global_step10").read_text())
    import hashlib

    listed = {**found["files"], "big.pt": {"size": len(big), "sha256": hashlib.sha256(big).hexdigest()}}
    backup_store.manifest_path(store, "global_step10").write_text(json.dumps({**found, "files": listed,
                                                                        "tar_size": path.stat().st_size}))
    assert backup_store.verify(store, "global_step10") == []
    listed["big.pt"]["size"] -= 1
    backup_store.manifest_path(store, "global_step10").write_text(json.dumps({**found, "files": listed,
                                                                        "tar_size": path.stat().st_size}))
    [line] = backup_store.verify(store, "global_step10")
    assert str(path) in line and "big.pt" in line


def test_a_tar_copy_is_backed_up_only_while_its_tar_is_there_with_the_size_its_manifest_records(tarred) -> None:
    _, store, _ = tarred
    path = store / "global_step10.tar"
    assert backup_store.is_backed_up(store, "global_step10")
    data = path.read_bytes()
    path.write_bytes(data + b"\0")
    assert not backup_store.is_backed_up(store, "global_step10")
    path.unlink()
    assert not backup_store.is_backed_up(store, "global_step10")
    path.mkdir()
    assert not backup_store.is_backed_up(store, "global_step10")


def test_a_store_without_interrupted_copies_or_whose_partial_folder_is_a_link_has_no_journal_problems(
        stored, tmp_path: Path) -> None:
    store, _ = stored
    shutil.rmtree(store / backup_store.PARTIAL, ignore_errors=True)
    assert backup_store.store_problems(store) == []
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "global_step20").mkdir(parents=True)
    (elsewhere / "global_step20" / backup_store.JOURNAL).write_text("garbage\n{}\n")
    (store / backup_store.PARTIAL).symlink_to(elsewhere)
    assert backup_store.store_problems(store) == []


def test_a_folder_copy_with_a_file_past_one_read_chunk_verifies_by_its_whole_size(stored) -> None:
    import hashlib

    store, written = stored
    big = os.urandom(backup_store.CHUNK + 1000)
    (store / "global_step10" / "big.pt").write_bytes(big)
    listed = {**written["files"], "big.pt": {"size": len(big), "sha256": hashlib.sha256(big).hexdigest()}}
    backup_store.manifest_path(store, "global_step10").write_text(json.dumps({**written, "files": listed}))
    assert backup_store.is_backed_up(store, "global_step10") and backup_store.verify(store, "global_step10") == []
    assert backup_store.hash_file(store / "global_step10" / "big.pt") == (len(big), hashlib.sha256(big).hexdigest())


def test_a_weights_only_plan_leaves_out_bf16_optimizer_partitions_that_sort_before_the_weights(tmp_path: Path) -> None:
    """bf16_zero_pp_rank_*_optim_states.pt sorts before every layer file: each file is judged on its own."""
    folder = tmp_path / "checkpoints" / "global_step10"
    folder.mkdir(parents=True)
    files = {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 700, "layer_00-model_states.pt": 300,
             "mp_rank_00_model_states.pt": 200, layout.META: 50}
    for name, size in files.items():
        (folder / name).write_bytes(os.urandom(size))
    commit_checkpoint(folder)
    ckpt = layout.Checkpoint("global_step10", 10, folder)
    plan = backup.plan_checkpoint(ckpt, whole=False)
    assert plan.files == [layout.META, "layer_00-model_states.pt", "mp_rank_00_model_states.pt"]
    assert plan.left_out == ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "manifest.json"]
    assert plan.rewritten == ["mp_rank_00_model_states.pt"] and plan.size == 550
    assert plan.source == backup.fingerprint(ckpt) and not plan.whole
    whole = backup.plan_checkpoint(ckpt, whole=True)
    assert whole.files == sorted([*files, "manifest.json"]) and whole.left_out == whole.rewritten == []
    # the plan is of the files as the caller fingerprinted them: what it copies is checked against that
    source = {**plan.source, "layer_00-model_states.pt": [1, plan.source["layer_00-model_states.pt"][1]]}
    given = backup.plan_checkpoint(ckpt, False, source)
    assert given.source == source and given.size == 251


def test_a_model_states_file_holding_no_dict_is_copied_as_it_is(weights_only) -> None:
    import torch

    exp, scratch = weights_only
    folder = _engine_state(scratch, 10, 0.5)
    torch.save([torch.ones(2), 3], folder / "mp_rank_00_model_states.pt")
    commit_checkpoint(folder)
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10"] and report.failed == {}
    copy = torch.load(report.store / "global_step10" / "mp_rank_00_model_states.pt", weights_only=True)
    assert len(copy) == 2 and torch.equal(copy[0], torch.ones(2)) and copy[1] == 3


def test_a_model_states_file_the_restricted_loader_refuses_is_reported_with_the_loaders_error(weights_only) -> None:
    import torch

    exp, scratch = weights_only
    folder = _engine_state(scratch, 10, 0.5)
    states = folder / "mp_rank_00_model_states.pt"
    states.write_bytes(b"not a pickle at all")
    commit_checkpoint(folder)
    with pytest.raises(Exception) as refused:
        torch.load(states, map_location="cpu", weights_only=True)
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == [] and list(report.failed) == ["global_step10"]
    why = report.failed["global_step10"]
    assert str(states) in why and refused.type.__name__ in why and " ".join(str(refused.value).split())[:40] in why
    assert backup_store.entries(report.store) == [] and not (report.store / backup_store.PARTIAL / "global_step10").exists()


def _journal(staging: Path, *lines: str) -> Path:
    staging.mkdir(parents=True, exist_ok=True)
    (staging / backup_store.JOURNAL).write_text("".join(line + "\n" for line in lines))
    return staging / backup_store.JOURNAL


def _entry(path: str, size: int = 1) -> str:
    return json.dumps({"path": path, "size": size, "sha256": "0" * 64})


def test_an_interrupted_copys_journal_vouches_for_every_file_up_to_its_first_line_that_is_no_journal_line(
        tmp_path: Path) -> None:
    staging = tmp_path / ".partial" / "global_step20"
    _journal(staging, _entry("a.pt"), _entry("sub/b.pt", 7))
    done = {"a.pt": {"size": 1, "sha256": "0" * 64}, "sub/b.pt": {"size": 7, "sha256": "0" * 64}}
    assert backup_store.journal_checked(staging) == (done, []) and backup_store.journal_vouched(staging) == done
    for bad in ['{"path": "c.pt"}', json.dumps({"size": 1, "sha256": "0" * 64}), '["a.pt"]',
                json.dumps({"path": "c.pt", "size": 1, "sha256": "xyz"})]:
        for lines in [(_entry("a.pt"), bad, _entry("sub/b.pt", 7)), (_entry("a.pt"), bad)]:
            path = _journal(staging, *lines)
            vouched, problems = backup_store.journal_checked(staging)
            assert vouched == {"a.pt": done["a.pt"]}, (bad, lines)
            assert [(p.file, p.line) for p in problems] == [(str(path), 2)] and problems[0].what, (bad, lines)
    # a last line cut short by the kill is no problem: that file is copied again
    (staging / backup_store.JOURNAL).write_text(_entry("a.pt") + "\n" + _entry("sub/b.pt")[:20])
    assert backup_store.journal_checked(staging) == ({"a.pt": done["a.pt"]}, [])


def test_a_store_is_made_in_a_new_folder_with_missing_parents_or_in_an_empty_one(tmp_path: Path) -> None:
    for dest in (tmp_path / "a" / "b" / "store", tmp_path / "empty"):
        if dest.name == "empty":
            dest.mkdir()
        assert backup_store.open_store(dest) == dest
        assert backup_store.open_store(dest) == dest
        # the marker says what the folder is and the store's format version
        assert json.loads((dest / backup_store.STORE_MARKER).read_text()) == {"bsops": "backup store", "version": 2}
    assert backup_store.open_store(tmp_path / "not yet", create=False) == tmp_path / "not yet"
    assert not (tmp_path / "not yet").exists()


class Interrupted(backup.BackupProgress):
    """Told of the work; after `calls` reads it raises KeyboardInterrupt, as a Ctrl-C in the middle of a copy."""

    def __init__(self, calls: int = 10**9) -> None:
        self.calls, self.read, self.begun, self.ended = calls, 0, [], []

    def begin(self, plan: backup.Planned) -> None:
        self.begun.append(plan.ckpt.tag)

    def advance(self, nbytes: int) -> None:
        self.calls -= 1
        if self.calls < 0:
            raise KeyboardInterrupt
        self.read += nbytes

    def end(self, plan: backup.Planned, resumed: bool) -> None:
        self.ended.append((plan.ckpt.tag, resumed))


@pytest.fixture
def nested(trainings: Path, tmp_path: Path):
    """(experiment, global_step10's folder) of a run whose checkpoint also holds a file two folders down."""
    (trainings / "nested.yaml").write_text(tiny_yaml(tmp_path / "nested",
                                                     f"backup: {json.dumps({'dest': str(tmp_path / 'store')})}\n"))
    exp = load_experiment("nested", trainings)
    layout.new_run_id(Path(exp.paths.checkpoints))
    folder = _save(Path(exp.paths.checkpoints), 10)
    (folder / "sub" / "deep").mkdir(parents=True)
    (folder / "sub" / "deep" / "x.pt").write_bytes(os.urandom(100))
    commit_checkpoint(folder)
    return exp, folder


def test_a_copy_interrupted_half_way_is_finished_in_its_own_entry_by_the_next_run(nested) -> None:
    exp, folder = nested
    with pytest.raises(KeyboardInterrupt):
        backup.run_backup(backup.settings(exp), progress=Interrupted(calls=1))
    staging = backup_store.run_store(Path(exp.backup.dest), exp.name, layout.run_id(folder.parent)) / \
        backup_store.PARTIAL / "global_step10"
    meta = (folder / layout.META).read_bytes()
    assert backup_store.journal_checked(staging) == (
        {layout.META: {"size": len(meta), "sha256": hashlib.sha256(meta).hexdigest()}}, [])
    (staging / f".{layout.META}.tmp").write_bytes(b"half a file a kill left")
    progress = Interrupted()
    report = backup.run_backup(backup.settings(exp), progress=progress)
    assert report.resumed == report.backed_up == ["global_step10"] and report.failed == {}
    assert backup_store.entries(report.store) == ["global_step10"] and backup_store.verify(report.store,
                                                                                         "global_step10") == []
    copied = sorted(p.relative_to(report.store / "global_step10").as_posix()
                    for p in (report.store / "global_step10").rglob("*") if p.is_file())
    assert copied == [layout.META, "layer_00-model_states.pt", "layer_01-model_states.pt", "sub/deep/x.pt"]
    assert progress.begun == ["global_step10"] and progress.ended == [("global_step10", True)]
    assert progress.read == sum((folder / rel).stat().st_size for rel in copied)
    assert list((report.store / backup_store.PARTIAL).iterdir()) == []
    found = backup_store.read_manifest(report.store, "global_step10")
    assert (found["entry"], found["source"]) == ("global_step10", str(folder))


def test_a_checkpoint_file_past_one_read_chunk_is_copied_whole(nested) -> None:
    exp, folder = nested
    big = os.urandom(backup_store.CHUNK + 1000)
    (folder / "big.pt").write_bytes(big)
    commit_checkpoint(folder)
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10"] and report.failed == {}
    assert (report.store / "global_step10" / "big.pt").read_bytes() == big


def test_a_copy_moved_into_place_without_its_manifest_and_nothing_staged_is_finished_as_resumed(nested) -> None:
    exp, _ = nested
    report = backup.run_backup(backup.settings(exp))
    backup_store.manifest_path(report.store, "global_step10").unlink()
    again = backup.run_backup(backup.settings(exp))
    assert again.resumed == again.backed_up == ["global_step10"]
    assert backup_store.entries(again.store) == ["global_step10"] and backup_store.verify(again.store,
                                                                                        "global_step10") == []


def test_an_interrupted_copy_is_found_past_a_staged_folder_whose_record_cannot_be_read(nested) -> None:
    exp, _ = nested
    with pytest.raises(KeyboardInterrupt):
        backup.run_backup(backup.settings(exp), progress=Interrupted(calls=1))
    store = backup_store.run_store(Path(exp.backup.dest), exp.name, layout.run_id(Path(exp.paths.checkpoints)))
    partial = store / backup_store.PARTIAL
    (partial / "global_step10").rename(partial / "global_step10.2")
    (partial / "global_step10").mkdir()
    (partial / "global_step10" / backup_store.SOURCE).write_bytes(b"{not json")
    report = backup.run_backup(backup.settings(exp))
    assert report.resumed == ["global_step10"] and backup_store.entries(report.store) == ["global_step10.2"]


@pytest.mark.parametrize("damaged", [1, 2, 3])
def test_a_checkpoint_damaged_after_its_save_is_refused_naming_its_first_bad_file_and_how_many_more(
        trainings: Path, tmp_path: Path, damaged: int) -> None:
    """The failure names the first file that is not as committed and counts the others: the on-call person knows
    whether one file or the whole checkpoint went bad."""
    policy = json.dumps({"dest": str(tmp_path / "store")})
    (trainings / "damaged.yaml").write_text(tiny_yaml(tmp_path / "damaged", f"backup: {policy}\n"))
    exp = load_experiment("damaged", trainings)
    layout.new_run_id(Path(exp.paths.checkpoints))
    folder = _save(Path(exp.paths.checkpoints), 10)
    names = ["layer_00-model_states.pt", "layer_01-model_states.pt", layout.META][:damaged]
    for name in names:
        with open(folder / name, "ab") as handle:
            handle.write(b"x")
    report = backup.run_backup(backup.settings(exp))
    why = report.failed["global_step10"]
    assert str(folder / sorted(names)[0]) in why
    more = [int(n) for n in re.findall(r"\(and (\d+) more\)", why)]
    assert more == ([damaged - 1] if damaged > 1 else [])
    assert report.backed_up == [] and (folder / names[0]).is_file()


@pytest.fixture
def two_saves(trainings: Path, tmp_path: Path):
    """A run with global_step10 and global_step20 (latest) and a backup store not made yet."""
    policy = json.dumps({"dest": str(tmp_path / "store")})
    (trainings / "two.yaml").write_text(tiny_yaml(tmp_path / "two", f"backup: {policy}\n"))
    exp = load_experiment("two", trainings)
    checkpoints = Path(exp.paths.checkpoints)
    _save(checkpoints, 10)
    _save(checkpoints, 20)
    return exp, checkpoints, tmp_path / "store"


def test_a_dry_run_writes_nothing_not_the_store_nor_the_run_id_and_says_where_the_copies_would_go(two_saves) -> None:
    exp, checkpoints, dest = two_saves
    report = backup.run_backup(backup.settings(exp), dry_run=True)
    assert not dest.exists() and layout.run_id(checkpoints) is None
    assert report.dest == dest and report.store == dest / "two" / "new-run"
    assert [p.ckpt.tag for p in report.planned] == ["global_step10", "global_step20"] and report.backed_up == []


def test_a_dry_run_deletes_nothing_that_retention_would(two_saves) -> None:
    exp, checkpoints, _ = two_saves
    first = backup.run_backup(backup.settings(exp))  # keep_last unset: both copied, nothing deleted
    assert first.backed_up == ["global_step10", "global_step20"] and first.deleted == []
    keep_one = dataclasses.replace(exp, backup=dataclasses.replace(exp.backup, keep_last=1))
    dry = backup.run_backup(backup.settings(keep_one), dry_run=True)
    assert dry.retention is not None and dry.retention.delete == [10]
    assert dry.deleted == [] and (checkpoints / "global_step10").is_dir()
    assert dry.already == ["global_step10", "global_step20"]
    # the store's manifest says whose copy it is
    manifest = backup_store.read_manifest(first.store, "global_step10")
    assert (manifest["run_id"], manifest["experiment"]) == (layout.run_id(checkpoints), "two")
    real = backup.run_backup(backup.settings(keep_one))
    assert real.deleted == ["global_step10"] and not (checkpoints / "global_step10").exists()


def test_a_checkpoint_holding_a_link_is_refused_naming_it_and_the_next_one_is_still_backed_up(two_saves) -> None:
    exp, checkpoints, _ = two_saves
    link = checkpoints / "global_step10" / "more"  # a folder link: the manifest lists files, fingerprint sees it
    link.symlink_to(checkpoints / "global_step20", target_is_directory=True)
    report = backup.run_backup(backup.settings(exp))
    assert str(link) in report.failed["global_step10"] and "symbolic link" in report.failed["global_step10"]
    assert report.backed_up == ["global_step20"]


def test_the_final_step_is_copied_whole_and_an_earlier_one_weights_only(trainings: Path, tmp_path: Path) -> None:
    """The final step comes from the run schedule (BackupSettings.final_step): its copy keeps the optimizer state
    with no keep_optimizer_every set. (test_ops_backup checks the same on trained checkpoints, in the slow lane.)"""
    from bigscience_ops.schedule.run import run_schedule

    (trainings / "ending.yaml").write_text(tiny_yaml(tmp_path / "ending", f"backup: {{dest: {tmp_path / 'store'}}}\n"))
    exp = load_experiment("ending", trainings)
    final = run_schedule(exp).train_iters
    assert final > 10 and exp.backup.keep_optimizer_every is None
    checkpoints = Path(exp.paths.checkpoints)
    layout.new_run_id(checkpoints)
    _save(checkpoints, 10, latest=False)
    _save(checkpoints, final)
    report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10", f"global_step{final}"]
    assert [backup_store.read_manifest(report.store, tag)["kind"] for tag in report.backed_up] == ["weights-only",
                                                                                                    "whole"]
