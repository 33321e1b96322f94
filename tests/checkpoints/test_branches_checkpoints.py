"""Checkpoint readers' branches no other test runs (issue 51), on real folders: layout.py's refusals of links,
FIFOs and garbage; manifests of the wrong shape; the resume's survey, decision and adoption over such folders; the
relaunch check of a warm start; set-aside folders of one second; the audit of one step; the trainer's find_resume
and layout check. Each asserts what is returned or raised and what is left on disk."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import audit, layout, manifest, resume, set_aside
from bigscience_ops.checkpoints.layout import Checkpoint, CheckpointError
from bigscience_ops.trainer import checkpointing
from tests.fixtures_runs import commit_checkpoint


def _folder(checkpoints: Path, step: int, *, commit: bool = True, meta: dict | None = None) -> Path:
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "layer_00-model_states.pt").write_bytes(os.urandom(64))
    (folder / layout.META).write_text(json.dumps({"iteration": step} if meta is None else meta))
    if commit:
        commit_checkpoint(folder)
    return folder


def _ckpt(folder: Path) -> Checkpoint:
    return Checkpoint(folder.name, layout.step_of(folder.name), folder)


# --- layout.py ---------------------------------------------------------------------------------------------------------

def test_a_latest_naming_a_file_is_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "global_step5").write_text("a file")
    layout.write_latest(tmp_path, "global_step5")
    with pytest.raises(CheckpointError, match="global_step5"):
        layout.latest_checkpoint(tmp_path)
    assert _ckpt(tmp_path / "global_step5").refusal() is not None and layout.resume_step(tmp_path) is None
    with pytest.raises(ValueError):
        layout.write_latest(tmp_path, "step5")
    assert (tmp_path / layout.LATEST).read_text() == "global_step5"


@pytest.mark.parametrize("what", ["link", "FIFO"])
def test_a_checkpoint_holding_a_link_or_fifo_lists_no_files(tmp_path: Path, what: str) -> None:
    folder = _folder(tmp_path, 10)
    odd = folder / "odd"
    odd.symlink_to(folder / layout.META) if what == "link" else os.mkfifo(odd)
    with pytest.raises(CheckpointError, match="odd"):
        _ckpt(folder).files()
    # A link is a mismatch (it could lead a copy or a deletion outside); a FIFO is no file DeepSpeed would load.
    assert (_ckpt(folder).committed() is None) == (what == "link")


@pytest.mark.parametrize("meta", ["link", "FIFO", b"{cut", b"[1, 2]"])
def test_a_bsops_json_that_is_no_json_object_is_refused(tmp_path: Path, meta) -> None:
    folder = _folder(tmp_path, 10, commit=False)
    file = folder / layout.META
    file.unlink()
    if meta == "link":
        file.symlink_to(tmp_path)
    elif meta == "FIFO":
        os.mkfifo(file)
    else:
        file.write_bytes(meta)
    with pytest.raises(CheckpointError, match=str(file)):
        _ckpt(folder).meta()
    assert not _ckpt(folder).saved_before_manifests()
    link = tmp_path / "global_step20"
    link.symlink_to(folder)
    with pytest.raises(CheckpointError, match="global_step20"):
        _ckpt(link).meta()


def test_a_run_id_or_latest_that_is_a_dangling_link_or_not_text_is_refused(tmp_path: Path) -> None:
    (tmp_path / layout.LATEST).symlink_to(tmp_path / "nowhere")
    (tmp_path / layout.RUN_ID).symlink_to(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match=layout.LATEST):
        layout.latest_tag(tmp_path)
    with pytest.raises(CheckpointError, match=layout.RUN_ID):
        layout.run_id(tmp_path)
    (tmp_path / layout.RUN_ID).unlink()
    (tmp_path / layout.RUN_ID).write_bytes(b"\xff\xfe" * 16)
    with pytest.raises(CheckpointError, match=layout.RUN_ID):
        layout.run_id(tmp_path)
    with pytest.raises(ValueError):
        layout.write_run_id(tmp_path, "not-hex")
    assert (tmp_path / layout.RUN_ID).read_bytes() == b"\xff\xfe" * 16


# --- manifest.py --------------------------------------------------------------------------------------------------------

def _field(name: str, value):
    def change(raw: dict) -> dict:
        return {**raw, name: value}
    return change


def _file_entry(entry):
    def change(raw: dict) -> dict:
        return {**raw, "files": {"layer_00-model_states.pt": entry}}
    return change


@pytest.mark.parametrize("change", [
    _field("iteration", -1),
    _field("optimizer", "yes"),
    _field("layout", {"tensor": "one"}),
    _field("files", {}),
    _file_entry({"size": 64}),
    _file_entry({"size": 64, "xxh3": "z" * 32}),
    _file_entry({"size": -1, "xxh3": "0" * 32}),
], ids=["iteration below 0", "optimizer not a boolean", "layout not counts", "no files", "a file without its hash",
        "a hash not hex", "a size below 0"])
def test_a_manifest_of_the_wrong_shape_is_refused_and_its_checkpoint_incomplete(tmp_path: Path, change) -> None:
    folder = _folder(tmp_path, 10)
    file = folder / manifest.MANIFEST
    file.write_text(json.dumps(change(json.loads(file.read_text()))))
    with pytest.raises(manifest.ManifestError, match=str(file)):
        manifest.read(folder)
    assert layout.complete_checkpoints(tmp_path) == []
    [cand] = resume.survey(tmp_path).candidates
    assert cand.state == resume.UNREADABLE and str(file) in cand.why
    found = audit.audit(tmp_path)
    assert [f.state for f in found.findings] == [audit.REFUSED] and not found.ok


def test_a_manifest_that_is_a_dangling_link_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 10, commit=False)
    (folder / manifest.MANIFEST).symlink_to(tmp_path / "nowhere")
    with pytest.raises(manifest.ManifestError, match=manifest.MANIFEST):
        manifest.read(folder)


def test_a_hashing_writer_under_a_buffer_records_what_reached_the_file(tmp_path: Path) -> None:
    path = tmp_path / "written.pt"
    data = os.urandom(300_000)
    with open(path, "wb") as handle:
        raw = manifest.HashingWriter(handle)
        with io.BufferedWriter(raw, buffer_size=4096) as buffered:
            assert raw.writable()
            buffered.write(data)
        record = raw.record()
    assert record == manifest.hash_file(path) and record.size == len(data)


# --- resume.py and the trainer's resume ---------------------------------------------------------------------------------

def test_a_checkpoint_link_is_never_resumed_and_the_newest_committed_is(tmp_path: Path) -> None:
    _folder(tmp_path, 10)
    folder = _folder(tmp_path, 20)
    (tmp_path / "global_step30").symlink_to(folder)
    found = resume.survey(tmp_path)
    assert found.links == ("global_step30",) and found.latest is None
    outcome = resume.decide(found, lambda cand: None)
    assert outcome.chosen.tag == "global_step20" and outcome.set_aside == []
    assert len(outcome.notes) == 2 and "global_step30" in outcome.notes[1]


def test_adopting_a_save_whose_record_lacks_its_iteration_says_why(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 10, commit=False, meta={"parallel": {"tensor": 1}})
    why = resume.adopt(tmp_path, _ckpt(folder))
    assert why is not None and str(folder / layout.META) in why
    assert not (folder / manifest.MANIFEST).exists()


def test_the_relaunch_check_of_a_warm_start_and_an_unreadable_record(tmp_path: Path) -> None:
    shape = {"num_layers": 2, "hidden_size": 64}
    folder = _folder(tmp_path, 0, meta={"iteration": 0, "weights_only": True, "model": dict(shape),
                                        "parallel": {"tensor": 1, "pipeline": 1}})
    layout.write_latest(tmp_path, folder.name)
    assert resume.relaunch_refusal(tmp_path, shape, 1, 2, 4, 1, 256) is None  # any PP and DP from weights
    refusal = resume.relaunch_refusal(tmp_path, {**shape, "hidden_size": 128}, 2, 1, 1, 0, 256)
    assert "model.hidden_size" in refusal and "parallel.tensor" in refusal and str(folder) in refusal
    (folder / layout.META).write_text("{cut")
    commit_checkpoint(folder)
    assert str(folder / layout.META) in resume.relaunch_refusal(tmp_path, shape, 1, 1, 1, 0, 256)
    assert resume.relaunch_refusal(tmp_path / "empty", shape, 1, 1, 1, 0, 256) is None


def test_two_folders_of_one_tag_set_aside_in_one_second_go_apart(tmp_path: Path) -> None:
    first = set_aside.set_aside(tmp_path, _folder(tmp_path, 10, commit=False), "cut short", now=1_800_000_000)
    second = set_aside.set_aside(tmp_path, _folder(tmp_path, 10, commit=False), "cut short again",
                                 now=1_800_000_000)
    third = set_aside.set_aside(tmp_path, _folder(tmp_path, 10, commit=False), "and again", now=1_800_000_000)
    assert Path(second.folder).parent.name == Path(first.folder).parent.name + ".2"
    assert Path(third.folder).parent.name == Path(first.folder).parent.name + ".3"
    assert all(Path(r.folder).is_dir() for r in (first, second, third))
    assert [r.reason for r in set_aside.read_checked(tmp_path).records] == ["cut short", "cut short again",
                                                                             "and again"]


def test_an_audit_of_one_step_checks_that_step_only(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        _folder(tmp_path, step)
    (tmp_path / "global_step10" / "layer_00-model_states.pt").write_bytes(b"short")
    found = audit.audit(tmp_path, step=20)
    assert [(f.tag, f.state) for f in found.findings] == [("global_step20", audit.VERIFIED)] and found.ok


def test_find_resume_refuses_what_resolve_resume_would_never_leave(tmp_path: Path) -> None:
    assert checkpointing.find_resume(tmp_path / "none") is None and checkpointing.find_resume(tmp_path) is None
    _folder(tmp_path, 10, commit=False)
    with pytest.raises(CheckpointError, match="global_step10"):
        checkpointing.find_resume(tmp_path)  # checkpoints, but no latest: never a silent fresh start
    layout.write_latest(tmp_path, "global_step10")
    with pytest.raises(CheckpointError, match=manifest.MANIFEST):
        checkpointing.find_resume(tmp_path)  # latest names a save that did not finish
    commit_checkpoint(tmp_path / "global_step10")
    found = checkpointing.find_resume(tmp_path)
    assert (found.tag, found.meta, found.manifest.iteration) == ("global_step10", {"iteration": 10}, 10)


def test_a_checkpoint_of_another_shape_or_layout_is_refused_naming_each_field(tmp_path: Path) -> None:
    meta = {"iteration": 10, "model": {"hidden_size": 64, "num_layers": 2, "hidden_dropout": 0.1},
            "parallel": {"tensor": 1, "pipeline": 2}}
    _folder(tmp_path, 10, meta=meta)
    layout.write_latest(tmp_path, "global_step10")
    found = checkpointing.find_resume(tmp_path)
    same = {"hidden_size": 64, "num_layers": 2, "hidden_dropout": 0.0}  # dropout may change on resume
    assert checkpointing.check_compatible(found, same, 1, 2) is None
    with pytest.raises(CheckpointError) as refused:
        checkpointing.check_compatible(found, {**same, "hidden_size": 128}, 2, 2)
    assert "model.hidden_size" in str(refused.value) and "parallel.tensor" in str(refused.value)
    assert "parallel.pipeline" not in str(refused.value)


def test_nothing_ever_committed_sets_latest_aside_and_starts_over(tmp_path: Path) -> None:
    _folder(tmp_path, 10, commit=False, meta={"iteration": 10, layout.COMMIT_KEY: manifest.MANIFEST})
    layout.write_latest(tmp_path, "global_step10")
    found = resume.survey(tmp_path)
    outcome = resume.decide(found, lambda cand: pytest.fail("an uncommitted save is never checked"))
    said: list[str] = []
    checkpointing._act(tmp_path, found, outcome, said.append)
    assert outcome.chosen is None and not outcome.refused
    assert not (tmp_path / layout.LATEST).exists() and layout.list_checkpoints(tmp_path) == []
    records = set_aside.read_checked(tmp_path).records
    assert sorted(Path(r.folder).name for r in records) == ["global_step10", layout.LATEST] and len(said) == 2

