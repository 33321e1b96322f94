"""The checkpoint folder's rules that mutation testing found untested (scripts/mutation.py): each test here fails on a
mutant of checkpoints/ (layout, manifest, resume, set_aside, audit) or of the trainer's resume that every other test
let through. Real folders and files; the trainer's resume runs in a one-process gloo group."""

from __future__ import annotations

import io
import json
import os
import random
import time
from pathlib import Path

import pytest
import torch

from bigscience_ops.checkpoints import audit, layout, manifest, resume, set_aside
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.trainer import checkpointing
from bigscience_ops.untrusted import MAX_STEP
from tests.fixtures_runs import commit_checkpoint
from tests.fixtures_smtp import free_port


def _save(checkpoints: Path, step: int, *, commit: bool = True, latest: bool = True) -> Path:
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "layer_01-model_states.pt").write_bytes(os.urandom(100 + step))
    (folder / "mp_rank_00_model_states.pt").write_bytes(os.urandom(50))
    meta = {"iteration": step, "model": {"hidden_size": 64, "num_layers": 2},
            "parallel": {"tensor": 1, "pipeline": 1, "data": 1}, layout.COMMIT_KEY: manifest.MANIFEST}
    (folder / layout.META).write_text(json.dumps(meta))
    if commit:
        commit_checkpoint(folder)
    if latest:
        layout.write_latest(checkpoints, folder.name)
    return folder


# --------------------------------------------------------------------------- set-aside records

def test_folders_set_aside_in_the_same_second_each_get_their_own_place_and_record(tmp_path: Path) -> None:
    for step in (10, 20):
        _save(tmp_path, step, latest=False)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "global_step10").mkdir()
    when = 1_790_000_000.0
    first = set_aside.set_aside(tmp_path, tmp_path / "global_step10", "why  one\nline", now=when)
    _save(tmp_path, 10, latest=False)
    second = set_aside.set_aside(tmp_path, tmp_path / "global_step10", "the second é", now=when)
    third = set_aside.set_aside(tmp_path, tmp_path / "global_step20", "third", now=when)
    places = [Path(r.folder) for r in (first, second, third)]
    assert len({p.parent for p in places[:2]}) == 2 and places[0].parent == places[2].parent
    assert places[1].parent.name == places[0].parent.name + ".2"
    assert all(p.is_dir() and p.parent.parent == tmp_path for p in places)
    assert places[0].parent.name == "set-aside-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    read = set_aside.read_checked(tmp_path)
    assert read.problems == [] and [(r.time, r.tag, r.folder, r.reason) for r in read.records] == [
        (when, "global_step10", str(places[0]), "why one line"), (when, "global_step10", str(places[1]), "the second é"),
        (when, "global_step20", str(places[2]), "third")]
    assert (tmp_path / set_aside.RECORD).read_bytes().isascii()
    before = time.time()
    now = set_aside.set_aside(tmp_path, _save(tmp_path, 30, latest=False), "now")
    assert before <= now.time <= time.time()


# --------------------------------------------------------------------------- bsops verify --json

def test_the_audit_as_data_carries_every_field_of_every_finding_and_record(tmp_path: Path) -> None:
    _save(tmp_path, 10)
    _save(tmp_path, 20, commit=False, latest=False)
    moved = set_aside.set_aside(tmp_path, _save(tmp_path, 30, latest=False), "a reason", now=1_790_000_000.0)
    with open(tmp_path / set_aside.RECORD, "a") as record:
        record.write("not json\n")
    found = audit.audit(tmp_path)
    data = audit.as_data(found)
    assert json.loads(json.dumps(data)) == data
    assert data["checkpoints"] == str(tmp_path) and data["ok"] is True and len(data["problems"]) == 1
    assert str(tmp_path / set_aside.RECORD) in data["problems"][0]
    size = sum(r.size for r in manifest.read(tmp_path / "global_step10").files.values())
    assert data["findings"] == [
        {"tag": "global_step10", "step": 10, "state": audit.VERIFIED, "detail": found.findings[0].detail,
         "bytes_read": size},
        {"tag": "global_step20", "step": 20, "state": audit.UNCOMMITTED, "detail": resume.UNFINISHED, "bytes_read": 0}]
    assert data["set_aside"] == [{"time": moved.time, "tag": "global_step30", "folder": moved.folder,
                                  "reason": "a reason"}]
    only = audit.audit(tmp_path, step=20, hashes=False)
    assert [f.tag for f in only.findings] == ["global_step20"]
    assert audit.audit(tmp_path, hashes=False).findings[0].bytes_read == 0
    legacy = tmp_path / "global_step40"
    legacy.mkdir()
    torch.save({"module": None}, legacy / "mp_rank_00_model_states.pt")
    (legacy / layout.META).write_text(json.dumps({"iteration": 40}))
    [finding] = audit.audit(tmp_path, step=40).findings
    assert finding.state == audit.BEFORE_MANIFESTS and not (legacy / manifest.MANIFEST).exists()
    [finding] = audit.audit(tmp_path, step=40, adopt=True).findings
    assert finding.state == audit.ADOPTED and manifest.read(legacy).adopted


# --------------------------------------------------------------------------- layout: the records it writes

def test_the_folders_records_are_written_whole_and_read_back(tmp_path: Path) -> None:
    layout.write_meta(tmp_path / "new" / "global_step5", {"iteration": 5, "name": "é"})
    ckpt = layout.Checkpoint("global_step5", 5, tmp_path / "new" / "global_step5")
    assert ckpt.meta() == {"iteration": 5, "name": "é"}
    with pytest.raises(ValueError):
        layout.write_latest(tmp_path, "step5")
    layout.write_latest(tmp_path, "global_step5")
    assert (tmp_path / layout.LATEST).read_bytes() == b"global_step5" and layout.latest_step(tmp_path) == 5
    assert layout.latest_step(tmp_path / "new") is None
    layout.write_meta(tmp_path / "new" / "global_step5", {"iteration": 6})  # written again, whole
    assert ckpt.meta() == {"iteration": 6}
    with pytest.raises(ValueError, match="not-hex"):
        layout.write_run_id(tmp_path, "not-hex")
    layout.write_run_id(tmp_path / "a" / "b", "0" * 32)
    assert layout.run_id(tmp_path / "a" / "b") == "0" * 32
    first = layout.ensure_run_id(tmp_path / "run")
    assert len(first) == 32 and layout.run_id(tmp_path / "run") == first == layout.ensure_run_id(tmp_path / "run")
    assert (tmp_path / "run" / layout.RUN_ID).read_text() == first + "\n"
    second = layout.new_run_id(tmp_path / "run")
    assert second != first and layout.run_id(tmp_path / "run") == second


def test_links_and_incomplete_folders_are_named_and_file_kinds_are_told_apart(tmp_path: Path) -> None:
    _save(tmp_path, 10)
    _save(tmp_path, 20, commit=False)
    (tmp_path / "global_step30").symlink_to(tmp_path / "global_step10")
    [problem] = layout.linked_checkpoints(tmp_path)
    assert (problem.file, problem.line) == (str(tmp_path / "global_step30"), 0) and problem.what
    assert [c.tag for c in layout.incomplete_checkpoints(tmp_path)] == ["global_step20"]
    assert [c.tag for c in layout.saved_checkpoints(tmp_path)] == ["global_step10"]
    assert layout.is_optimizer_file("sub/zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert not layout.is_optimizer_file("mp_rank_00_model_states.pt")
    assert layout.is_model_states_file("sub/mp_rank_01_model_states.pt")
    assert not layout.is_model_states_file("layer_01-model_states.pt")
    ckpt = layout.Checkpoint("global_step10", 10, tmp_path / "global_step10")
    (ckpt.path / "sub").mkdir()
    (ckpt.path / "sub" / "x.pt").write_bytes(b"x")
    assert ckpt.files() == sorted([layout.META, "layer_01-model_states.pt", manifest.MANIFEST,
                                   "mp_rank_00_model_states.pt", "sub/x.pt"])
    os.mkfifo(ckpt.path / "sub" / "fifo")
    with pytest.raises(CheckpointError, match="fifo"):
        ckpt.files()


def test_a_hashing_writer_records_what_went_through_it(tmp_path: Path) -> None:
    path = tmp_path / "file.pt"
    with open(path, "wb") as handle:
        writer = manifest.HashingWriter(handle)
        assert writer.writable()
        buffered = io.BufferedWriter(writer)
        torch.save({"w": torch.arange(20000.0)}, buffered)  # many writes through the 8 KiB buffer
        buffered.flush()
    assert writer.record() == manifest.hash_file(path) and writer.record().size == path.stat().st_size > 80000


# --------------------------------------------------------------------------- the trainer's resume

def test_a_checkpoint_of_another_model_or_layout_is_refused_naming_each_field(tmp_path: Path) -> None:
    _save(tmp_path, 10)
    found = checkpointing.find_resume(tmp_path)
    assert found.tag == "global_step10" and found.path == tmp_path / "global_step10"
    assert found.meta["iteration"] == 10 and found.manifest == manifest.read(found.path)
    shape = {"hidden_size": 64, "num_layers": 2, "hidden_dropout": 0.5, "attention_dropout": 0.5}
    checkpointing.check_compatible(found, shape, 1, 1)
    with pytest.raises(CheckpointError) as caught:
        checkpointing.check_compatible(found, {**shape, "num_layers": 3}, 2, 1)
    assert "num_layers" in str(caught.value) and "parallel.tensor" in str(caught.value)
    assert "parallel.pipeline" not in str(caught.value) and "dropout" not in str(caught.value)
    with pytest.raises(CheckpointError, match="parallel.pipeline"):
        checkpointing.check_compatible(found, shape, 1, 4)
    with pytest.raises(CheckpointError) as caught:
        checkpointing.check_compatible(found, {**shape, "num_layers": 17}, 3, 1)
    layers, tensor = (str(caught.value).split(field)[1].split(";")[0] for field in ("num_layers", "parallel.tensor"))
    assert "2" in layers and "17" in layers and "1" in tensor and "3" in tensor
    bare = checkpointing.Resume(found.tag, found.path, {"iteration": 10}, found.manifest)  # bsops.json of no model
    with pytest.raises(CheckpointError) as caught:
        checkpointing.check_compatible(bare, {"hidden_size": 64}, 1, 1)
    assert "hidden_size" in str(caught.value) and "parallel.tensor" in str(caught.value)


def test_find_resume_refuses_checkpoints_without_latest_and_a_latest_without_manifest(tmp_path: Path) -> None:
    assert checkpointing.find_resume(tmp_path / "none") is None and checkpointing.find_resume(tmp_path) is None
    for step in (10, 20, 30, 40):
        _save(tmp_path, step, latest=False)
    with pytest.raises(CheckpointError) as caught:
        checkpointing.find_resume(tmp_path)
    assert all(f"global_step{s}" in str(caught.value) for s in (20, 30, 40)) and "global_step10" not in str(
        caught.value)
    _save(tmp_path, 50, commit=False)
    with pytest.raises(CheckpointError, match="global_step50"):
        checkpointing.find_resume(tmp_path)


def test_the_rng_state_goes_back_to_where_it_was_saved(tmp_path: Path) -> None:
    assert checkpointing.rng_file(tmp_path, 3) == tmp_path / "rng_state_003.pt"
    assert checkpointing.load_rng(tmp_path, 0) is False
    file = checkpointing.save_rng(tmp_path / "global_step1", 0)
    assert file == tmp_path / "global_step1" / "rng_state_000.pt"
    import numpy as np

    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    checkpointing.save_rng(tmp_path / "global_step1", 0)
    random.random(), np.random.rand(), torch.rand(3)
    assert checkpointing.load_rng(tmp_path / "global_step1", 0) is True
    assert (random.random(), np.random.rand(), torch.rand(1).item()) != expected  # restored to after `expected`
    checkpointing.load_rng(tmp_path / "global_step1", 0)
    again = (random.random(), np.random.rand(), torch.rand(1).item())
    checkpointing.load_rng(tmp_path / "global_step1", 0)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == again
    assert checkpointing.load_rng(tmp_path / "global_step1", 1) is False
    assert checkpointing.save_rng(tmp_path / "a" / "b", 2) == tmp_path / "a" / "b" / "rng_state_002.pt"


def test_a_resume_with_nothing_committed_sets_latest_aside_and_starts_over(tmp_path: Path, single_rank_group) -> None:
    _save(tmp_path, 10, commit=False)
    said: list[str] = []
    checkpointing.resolve_resume(tmp_path, said.append)
    assert not (tmp_path / layout.LATEST).exists() and layout.list_checkpoints(tmp_path) == []
    records = set_aside.read_checked(tmp_path).records
    assert [r.tag for r in records] == ["global_step10", layout.LATEST]
    assert Path(records[1].folder).read_text() == "global_step10" and len(said) == 2
    assert all(r.folder in line for r, line in zip(records, said))
    checkpointing.resolve_resume(tmp_path / "missing", said.append)
    assert len(said) == 2


def test_a_resume_names_every_mismatch_and_repairs_a_latest_that_names_nothing(tmp_path: Path,
                                                                               single_rank_group) -> None:
    _save(tmp_path, 10)
    bad = _save(tmp_path, 20)
    for name in ("layer_01-model_states.pt", "mp_rank_00_model_states.pt"):
        os.truncate(bad / name, 3)
    said: list[str] = []
    checkpointing.resolve_resume(tmp_path, said.append)
    [record] = set_aside.read_checked(tmp_path).records
    assert record.tag == "global_step20" and "layer_01-model_states.pt" in record.reason and "1 more" in record.reason
    assert layout.latest_tag(tmp_path) == "global_step10" and "global_step10" in said[-1]
    layout.write_latest(tmp_path, "global_step99")
    said.clear()
    checkpointing.resolve_resume(tmp_path, said.append)
    assert layout.latest_tag(tmp_path) == "global_step10" and len(said) == 2 and "global_step99" in said[0]


# --------------------------------------------------------------------------- resume's decisions

def test_the_files_are_shared_over_the_ranks_by_size_largest_first() -> None:
    sizes = {"f": 100, "e": 90, "d": 50, "c": 40, "b": 10, "a": 10}
    found = manifest.Manifest("global_step1", 1, "", "t", {}, True,
                              {rel: manifest.FileRecord(size, rel * 32) for rel, size in sizes.items()}, 0.0)
    assert resume.shares(found, 1) == [["f", "e", "d", "c", "a", "b"]]
    assert resume.shares(found, 2) == [["f", "c", "a"], ["e", "d", "b"]]
    assert resume.shares(found, 3) == [["f"], ["e", "a"], ["d", "c", "b"]]
    assert resume.shares(found, 8)[6:] == [[], []]


def test_a_survey_orders_the_candidates_and_names_what_latest_cannot_say(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        _save(tmp_path, step, latest=False)
    (tmp_path / "global_step20" / manifest.MANIFEST).write_text("{")
    (tmp_path / "global_step40").symlink_to(tmp_path / "global_step10")
    (tmp_path / "global_step50").write_text("a file")
    layout.write_latest(tmp_path, "global_step10")
    found = resume.survey(tmp_path)
    assert [(c.tag, c.state) for c in found.candidates] == [
        ("global_step10", resume.COMMITTED), ("global_step30", resume.COMMITTED),
        ("global_step20", resume.UNREADABLE)]
    assert found.candidates[2].why and found.latest == "global_step10" and found.latest_problem == ""
    assert found.links == ("global_step40",)
    (tmp_path / layout.LATEST).write_text("garbage")
    broken = resume.survey(tmp_path)
    assert broken.latest is None and "garbage" in broken.latest_problem
    outcome = resume.decide(broken, lambda cand: None)
    assert outcome.chosen.tag == "global_step30" and len(outcome.notes) == 2
    assert "global_step30" in outcome.notes[0] and "global_step40" in outcome.notes[1]
    nothing = resume.decide(resume.Survey((), None), lambda cand: None)
    assert nothing.chosen is None and nothing.notes == [] and nothing.set_aside == []


def test_a_resume_sets_aside_a_file_put_into_a_checkpoint_and_says_nothing_more_of_one_problem(
        tmp_path: Path, single_rank_group) -> None:
    _save(tmp_path, 10)
    _save(tmp_path, 20)
    (tmp_path / "global_step20" / "extra.pt").write_bytes(b"x")
    checkpointing.resolve_resume(tmp_path, lambda line: None)
    [record] = set_aside.read_checked(tmp_path).records
    assert record.tag == "global_step20" and record.reason.startswith("extra.pt") and "more" not in record.reason
    assert layout.latest_tag(tmp_path) == "global_step10"


def test_a_latest_naming_nothing_in_an_empty_folder_is_set_aside(tmp_path: Path, single_rank_group) -> None:
    layout.write_latest(tmp_path, "global_step30")
    said: list[str] = []
    checkpointing.resolve_resume(tmp_path, said.append)
    assert not (tmp_path / layout.LATEST).exists()
    [record] = set_aside.read_checked(tmp_path).records
    assert record.tag == layout.LATEST and Path(record.folder).read_text() == "global_step30"


def test_a_checkpoint_saved_before_manifests_is_adopted_and_said(tmp_path: Path, single_rank_group) -> None:
    folder = tmp_path / "global_step10"
    folder.mkdir()
    torch.save({"module": None, "iteration": 10}, folder / "mp_rank_00_model_states.pt")
    (folder / layout.META).write_text(json.dumps({"iteration": 10, "parallel": {"tensor": 1, "pipeline": 1}}))
    layout.write_latest(tmp_path, "global_step10")
    said: list[str] = []
    checkpointing.resolve_resume(tmp_path, said.append)
    adopted = manifest.read(folder)
    assert adopted.adopted and adopted.iteration == 10 and sorted(adopted.files) == [
        layout.META, "mp_rank_00_model_states.pt"]
    assert len(said) == 1 and "global_step10" in said[0]


def test_after_a_damaged_latest_the_older_saves_that_never_committed_are_set_aside_too(tmp_path: Path) -> None:
    _save(tmp_path, 10, commit=False, latest=False)
    _save(tmp_path, 20, latest=False)
    _save(tmp_path, 30)
    found = resume.survey(tmp_path)
    outcome = resume.decide(found, lambda cand: "damaged" if cand.tag == "global_step30" else None)
    assert outcome.chosen.tag == "global_step20"
    assert [(c.tag, why) for c, why in outcome.set_aside] == [("global_step30", "damaged"),
                                                             ("global_step10", resume.UNFINISHED)]
    (tmp_path / layout.LATEST).write_text("garbage")
    only_unfinished = resume.decide(resume.survey(tmp_path), lambda cand: "damaged")
    assert only_unfinished.refused and only_unfinished.chosen is None
    refusal = resume.refusal(only_unfinished, tmp_path)
    assert all(c.tag in refusal for c, _ in only_unfinished.refused) and str(tmp_path) in refusal
    for step in (20, 30):
        (tmp_path / f"global_step{step}" / manifest.MANIFEST).unlink()
    fresh = resume.decide(resume.survey(tmp_path), lambda cand: None)
    assert fresh.chosen is None and not fresh.refused and len(fresh.notes) == 1 and "garbage" in fresh.notes[0]


def test_a_relaunch_of_a_warm_start_with_another_model_names_the_saved_value(tmp_path: Path) -> None:
    folder = _save(tmp_path, 0)
    meta = {"iteration": 0, "weights_only": True, "model": {"num_layers": 17, "hidden_size": 64},
            "parallel": {"tensor": 1, "pipeline": 1, "data": 1}}
    (folder / layout.META).write_text(json.dumps(meta))
    commit_checkpoint(folder)
    why = resume.relaunch_refusal(tmp_path, {"num_layers": 23, "hidden_size": 64}, 1, 2, 1, 0, 50304)
    assert "num_layers" in why and "17" in why and "23" in why and "hidden_size" not in why
    assert resume.relaunch_refusal(tmp_path, {"num_layers": 17, "hidden_size": 64}, 1, 2, 4, 1, 50304) is None
    assert "parallel.tensor" in resume.relaunch_refusal(tmp_path, {"num_layers": 17, "hidden_size": 64}, 2, 1, 1, 0,
                                                        50304)


def _two_ranks(tmp_path: Path, checkpoints: Path) -> list[dict]:
    """resolve_resume on two trainer ranks (forked processes in a gloo group): what each said or raised."""
    import signal
    import time as clock

    import torch.distributed as dist

    tmp_path.mkdir(parents=True, exist_ok=True)
    address = f"tcp://127.0.0.1:{free_port()}"
    pids = []
    for rank in (0, 1):
        pid = os.fork()
        if pid == 0:  # a rank: report, then leave without running the parent's cleanup
            code = 1
            try:
                dist.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
                said: list[str] = []
                try:
                    checkpointing.resolve_resume(checkpoints, said.append)
                    out = {"said": said}
                except CheckpointError as exc:
                    out = {"error": str(exc)}
                dist.destroy_process_group()
                (tmp_path / f"rank{rank}.json").write_text(json.dumps(out))
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    deadline = clock.monotonic() + 60  # a hang detector: the two ranks take well under a second
    while pids and clock.monotonic() < deadline:
        pids = [pid for pid in pids if os.waitpid(pid, os.WNOHANG) == (0, 0)]
        clock.sleep(0.02)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert not pids, "a rank did not finish"
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_two_ranks_adopt_once_and_agree_on_a_damaged_file_only_one_of_them_reads(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    folder = checkpoints / "global_step10"
    folder.mkdir(parents=True)
    torch.save({"module": None, "iteration": 10}, folder / "mp_rank_00_model_states.pt")
    (folder / layout.META).write_text(json.dumps({"iteration": 10, "parallel": {"tensor": 1, "pipeline": 1}}))
    layout.write_latest(checkpoints, "global_step10")
    first, second = _two_ranks(tmp_path / "adopt", checkpoints)
    assert manifest.read(folder).adopted and len(first["said"]) == 1 and second == {"said": []}
    # global_step20: each rank reads its share; the file flipped in the second rank's share is found by it alone
    bad = _save(checkpoints, 20)
    found = manifest.read(bad)
    mine, theirs = (sorted(rel for rel in share if rel.endswith(".pt")) for share in resume.shares(found, 2))
    assert theirs and not mine
    theirs = theirs[0]
    data = bytearray((bad / theirs).read_bytes())
    data[0] ^= 1
    (bad / theirs).write_bytes(bytes(data))
    first, second = _two_ranks(tmp_path / "verify", checkpoints)
    [record] = set_aside.read_checked(checkpoints).records
    assert record.tag == "global_step20" and record.reason.startswith(theirs)
    assert layout.latest_tag(checkpoints) == "global_step10" and second == {"said": []} and len(first["said"]) == 2


def test_the_step_a_resume_takes_is_latest_when_complete_else_the_newest_complete(tmp_path: Path) -> None:
    assert layout.resume_step(tmp_path) is None
    for step in (10, 20, 30):
        _save(tmp_path, step, latest=False)
    _save(tmp_path, 40, commit=False, latest=False)
    assert layout.resume_step(tmp_path) == 30  # no latest: the newest complete
    layout.write_latest(tmp_path, "global_step20")  # after a rollback: latest names an older complete one
    assert layout.resume_step(tmp_path) == 20
    layout.write_latest(tmp_path, "global_step40")  # a save that did not finish
    assert layout.resume_step(tmp_path) == 30
    layout.write_latest(tmp_path, "global_step90")  # names nothing
    assert layout.resume_step(tmp_path) == 30


def test_a_latest_that_cannot_be_followed_names_the_last_five_checkpoints_there(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40, 50, 60):
        _save(tmp_path, step, latest=False)
    for latest in ("garbage", "global_step99"):
        (tmp_path / layout.LATEST).write_text(latest)
        with pytest.raises(CheckpointError) as caught:
            layout.latest_checkpoint(tmp_path)
        held = str(caught.value)
        assert str(tmp_path / layout.LATEST) in held and latest in held
        assert all(f"global_step{s}" in held for s in (20, 30, 40, 50, 60)) and "global_step10" not in held
    (tmp_path / layout.LATEST).unlink()
    (tmp_path / layout.LATEST).symlink_to(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="link"):
        layout.latest_tag(tmp_path)
    (tmp_path / layout.LATEST).unlink()
    (tmp_path / layout.LATEST).write_bytes(b"\xff\xfe")
    with pytest.raises(CheckpointError, match="UTF-8"):
        layout.latest_tag(tmp_path)


def test_an_adopted_manifest_records_the_run_as_its_bsops_json_and_folder_say(tmp_path: Path) -> None:
    layout.write_run_id(tmp_path, "ab" * 16)
    folder = tmp_path / "global_step10"
    folder.mkdir()
    torch.save({"module": None}, folder / "mp_rank_00_model_states.pt")
    meta = {"iteration": 10, "weights_only": True, "parallel": {"tensor": 2, "pipeline": 3, "data": 4},
            "experiment": {"name": "tr8", "parallel": {"zero_stage": 1}, "train": {"precision": "bf16"}}}
    (folder / layout.META).write_text(json.dumps(meta))
    ckpt = layout.Checkpoint(folder.name, 10, folder)
    assert resume.adopt(tmp_path, ckpt) is None
    found = manifest.read(folder)
    assert (found.iteration, found.run_id, found.experiment, found.optimizer, found.adopted) == (
        10, "ab" * 16, "tr8", False, True)
    assert found.layout == {"tensor": 2, "pipeline": 3, "data": 4, "zero_stage": 1, "precision": "bf16"}
    (folder / manifest.MANIFEST).unlink()
    (tmp_path / layout.RUN_ID).unlink()
    (folder / layout.META).write_text(json.dumps({"iteration": 10}))
    assert resume.adopt(tmp_path, ckpt) is None
    found = manifest.read(folder)
    assert (found.run_id, found.experiment, found.optimizer) == ("", "", True)
    assert found.layout == {"tensor": 1, "pipeline": 1, "data": 1, "zero_stage": 0, "precision": ""}
    (folder / manifest.MANIFEST).unlink()
    made = manifest.adopt(folder, iteration=10, run_id="", experiment="", layout=found.layout, optimizer=True,
                          now=1234.5)
    assert made.committed_at == 1234.5 == manifest.read(folder).committed_at


# --------------------------------------------------------------------------- manifest: what a manifest may hold

def _raw(folder: Path, **changes) -> dict:
    """A manifest of `folder` (one file, "a.pt", 3 bytes) as JSON data, with `changes` (None: the field left out)."""
    raw = {"format": manifest.FORMAT, "hash": manifest.HASH, "tag": folder.name, "iteration": 1, "run_id": "",
           "experiment": "", "layout": {"tensor": 1, "pipeline": 1, "data": 1, "zero_stage": 0}, "optimizer": True,
           "adopted": False, "committed_at": 0, "files": {"a.pt": {"size": 3, "xxh3": "0123456789abcdef" * 2}}}
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not None}


def _reads(folder: Path, raw) -> bool:
    """Whether `raw`, written as the folder's manifest, is read (True) or refused (False)."""
    folder.mkdir(exist_ok=True)
    (folder / manifest.MANIFEST).write_text(json.dumps(raw))
    try:
        found = manifest.read(folder)
    except manifest.ManifestError:
        return False
    assert isinstance(found, manifest.Manifest)
    return True


def test_a_manifest_is_read_only_when_every_field_is_within_its_bounds(tmp_path: Path) -> None:
    folder = tmp_path / "global_step1"
    top = {"tensor": 1 << 20, "pipeline": 1 << 20, "data": 1 << 20, "zero_stage": 1 << 20}
    read = [_reads(folder, _raw(folder, **change)) for change in (
        {}, {"iteration": 0}, {"iteration": MAX_STEP}, {"run_id": "r" * 64}, {"experiment": "e" * 256},
        {"committed_at": 1.5}, {"optimizer": False, "adopted": True}, {"layout": {**top, "precision": "bf16"}},
        {"layout": {"tensor": 0, "pipeline": 0, "data": 0, "zero_stage": 0}},
        {"files": {"a/b.pt": {"size": 1 << 62, "xxh3": "f" * 32}, "c": {"size": 0, "xxh3": "0" * 32}}})]
    assert read == [True] * 10
    refused = [(name, value) for name, value in [
        ("format", 2), ("format", None), ("hash", "sha256"), ("hash", None), ("iteration", -1),
        ("iteration", MAX_STEP + 1), ("iteration", None), ("iteration", 1.0), ("run_id", "r" * 65), ("run_id", None),
        ("experiment", "e" * 257), ("experiment", None), ("committed_at", -1), ("committed_at", None),
        ("optimizer", 1), ("optimizer", None), ("adopted", 0), ("adopted", None), ("layout", None), ("layout", [1]),
        ("files", None), ("files", {}), ("files", [["a.pt", {"size": 3, "xxh3": "0" * 32}]]),
        *(("layout", {**top, key: (1 << 20) + 1}) for key in top), *(("layout", {**top, key: -1}) for key in top),
        *(("layout", {k: v for k, v in top.items() if k != key}) for key in top),
    ] if _reads(folder, _raw(folder, **{name: value}))]
    assert refused == []
    raw = _raw(folder)
    del raw["run_id"]
    assert not _reads(folder, raw)
    assert not _reads(folder, [raw]) and not _reads(folder, "text")
    long_tag = tmp_path / ("global_step" + "1" * 54)  # 65 characters: a tag takes at most 64
    assert _reads(tmp_path / ("global_step" + "1" * 53), _raw(tmp_path / ("global_step" + "1" * 53)))
    assert not _reads(long_tag, _raw(long_tag))
    assert not _reads(folder, _raw(folder, tag="global_step2"))  # another folder's manifest
    (folder / manifest.MANIFEST).write_text(json.dumps(_raw(folder, hash="sha256", format=7)))
    with pytest.raises(manifest.ManifestError) as refused:  # the format and hash it holds: what a person acts on
        manifest.read(folder)
    assert "sha256" in str(refused.value) and "7" in str(refused.value)
    (folder / manifest.MANIFEST).write_text(json.dumps(_raw(folder, files={"/etc/x.pt": {"size": 1, "xxh3": "0" * 32}})))
    with pytest.raises(manifest.ManifestError, match="/etc/x.pt"):  # the file it lists outside the folder
        manifest.read(folder)
    found = manifest.read(tmp_path / ("global_step" + "1" * 53))
    assert (found.tag, found.iteration, found.run_id, found.experiment, found.optimizer, found.adopted,
            found.committed_at) == ("global_step" + "1" * 53, 1, "", "", True, False, 0)
    assert found.layout == {"tensor": 1, "pipeline": 1, "data": 1, "zero_stage": 0}
    assert found.files == {"a.pt": manifest.FileRecord(3, "0123456789abcdef" * 2)} and found.size == 3


@pytest.mark.parametrize("rel, entry", [
    ("", None), ("/abs.pt", None), ("a/../b.pt", None), ("..", None), ("a\\b.pt", None), ("a\tb.pt", None),
    ("a\x7fb.pt", None), (manifest.MANIFEST, None),
    ("a.pt", {"size": 3}), ("a.pt", {"xxh3": "0" * 32}), ("a.pt", {"size": 3, "xxh3": "0" * 32, "more": 1}),
    ("a.pt", [3, "0" * 32]), ("a.pt", {"size": -1, "xxh3": "0" * 32}), ("a.pt", {"size": (1 << 62) + 1, "xxh3": "0" * 32}),
    ("a.pt", {"size": True, "xxh3": "0" * 32}), ("a.pt", {"size": "3", "xxh3": "0" * 32}),
    ("a.pt", {"size": 3, "xxh3": "0" * 31}), ("a.pt", {"size": 3, "xxh3": "0" * 33}),
    ("a.pt", {"size": 3, "xxh3": "A" * 32}), ("a.pt", {"size": 3, "xxh3": "g" * 32}),
    ("a.pt", {"size": 3, "xxh3": 0}),
])
def test_a_manifest_listing_a_file_outside_the_folder_or_an_entry_of_another_shape_is_refused(
        tmp_path: Path, rel, entry) -> None:
    folder = tmp_path / "global_step1"
    files = {rel: entry if entry is not None else {"size": 3, "xxh3": "0" * 32}, "ok.pt": {"size": 1, "xxh3": "1" * 32}}
    assert not _reads(folder, _raw(folder, files=files))
    assert _reads(folder, _raw(folder, files={"ok.pt": {"size": 1, "xxh3": "1" * 32}, "a..b/.x": {"size": 0,
                                                                                             "xxh3": "2" * 32}}))


def test_a_manifest_that_is_not_json_or_nests_without_end_is_refused_and_none_is_none(tmp_path: Path) -> None:
    folder = tmp_path / "global_step1"
    folder.mkdir()
    assert manifest.read(folder) is None
    for data in (b"\xff\xfe{}", b"[" * 100_000, b"{", b""):
        (folder / manifest.MANIFEST).write_bytes(data)
        with pytest.raises(manifest.ManifestError):
            manifest.read(folder)
    (folder / manifest.MANIFEST).unlink()
    (folder / manifest.MANIFEST).symlink_to(tmp_path / "nowhere")
    with pytest.raises(manifest.ManifestError):
        manifest.read(folder)
    (folder / manifest.MANIFEST).unlink()
    os.mkfifo(folder / manifest.MANIFEST)
    with pytest.raises(manifest.ManifestError):
        manifest.read(folder)


def test_a_committed_manifest_reads_back_as_written_its_files_in_order(tmp_path: Path) -> None:
    folder = tmp_path / "global_step7"
    folder.mkdir()
    files = {"z.pt": manifest.FileRecord(5, "a" * 32), "b/a.pt": manifest.FileRecord(0, "b" * 32)}
    made = manifest.Manifest("global_step7", 7, "ab" * 16, "tr8", {"tensor": 2, "pipeline": 1, "data": 4,
                             "zero_stage": 1, "precision": "bf16"}, False, files, 12.25, adopted=True)
    manifest.commit(folder, made)
    assert manifest.read(folder) == made and made.size == 5
    text = (folder / manifest.MANIFEST).read_text()
    assert text.endswith("}\n") and list(json.loads(text)["files"]) == ["b/a.pt", "z.pt"]
    assert json.loads(text)["format"] == manifest.FORMAT and json.loads(text)["hash"] == manifest.HASH
    assert manifest.files_on_disk(folder) == []  # the manifest is no file of the checkpoint


# --------------------------------------------------------------------------- manifest: hashing and verify

def test_a_file_is_hashed_as_it_is_window_by_window_and_never_through_a_link(tmp_path: Path) -> None:
    import xxhash

    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert manifest.hash_file(empty) == manifest.FileRecord(0, xxhash.xxh3_128(b"").hexdigest())
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    assert manifest.hash_file(small) == manifest.record_file(small) == manifest.FileRecord(
        3, xxhash.xxh3_128(b"abc").hexdigest())
    big = tmp_path / "big"  # a window and two bytes more
    with open(big, "wb") as handle:
        handle.truncate(manifest.WINDOW + 2)
        handle.seek(manifest.WINDOW)
        handle.write(b"x")
    data = bytearray(manifest.WINDOW + 2)
    data[manifest.WINDOW] = ord("x")
    assert manifest.hash_file(big) == manifest.FileRecord(len(data), xxhash.xxh3_128(bytes(data)).hexdigest())
    (tmp_path / "link").symlink_to(small)
    for read in (manifest.hash_file, manifest.record_file):
        with pytest.raises(OSError):
            read(tmp_path / "link")


def test_a_hashing_writer_hashes_only_what_its_file_took(tmp_path: Path) -> None:
    import xxhash

    class Short:
        """A file that takes at most 2 bytes a write, as a raw file may."""

        def __init__(self) -> None:
            self.data = b""

        def write(self, data) -> int:
            self.data += bytes(data[:2])
            return min(2, len(data))

    handle = Short()
    writer = manifest.HashingWriter(handle)
    assert writer.write(b"abcde") == 2 and writer.write(b"fgh") == 2
    assert writer.record() == manifest.FileRecord(4, xxhash.xxh3_128(b"abfg").hexdigest()) and handle.data == b"abfg"


def _folder_of(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, manifest.Manifest]:
    folder = tmp_path / "global_step1"
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    made = commit_checkpoint(folder)
    return folder, made


def test_verify_names_each_file_not_as_saved_and_counts_the_bytes_it_read(tmp_path: Path) -> None:
    folder, made = _folder_of(tmp_path, {"a.pt": b"aaaa", "b.pt": b"bbbbbb", "c/d.pt": b"dd", "e.pt": b"ee",
                                         "f.pt": b"ff", "g.pt": b"gg"})
    checked = manifest.verify(folder, made)
    assert checked.ok and checked.mismatches == [] and checked.bytes_read == 18
    assert manifest.verify(folder, made, hashes=False).bytes_read == 0
    (folder / "a.pt").write_bytes(b"aaab")  # same size, other content
    (folder / "b.pt").write_bytes(b"b")  # other size
    (folder / "c" / "d.pt").unlink()
    (folder / "e.pt").unlink()
    (folder / "e.pt").mkdir()
    (folder / "f.pt").unlink()
    (folder / "f.pt").symlink_to(folder / "g.pt")
    (folder / "x.pt").write_bytes(b"x")  # put there after the save
    (folder / "y.pt").symlink_to(folder / "g.pt")
    checked = manifest.verify(folder, made)
    assert not checked.ok
    assert [(m.path, m.what) for m in checked.mismatches if m.what == "missing"] == [("c/d.pt", "missing")]
    assert [m.path for m in checked.mismatches] == ["x.pt", "y.pt", "a.pt", "b.pt", "c/d.pt", "e.pt", "f.pt"]
    assert all(str(m) == f"{m.path}: {m.what}" and isinstance(m.what, str) and m.what for m in checked.mismatches)
    assert checked.bytes_read == 4 + 2  # a.pt and g.pt hashed: the others failed before their content
    sizes = manifest.verify(folder, made, hashes=False)
    assert [m.path for m in sizes.mismatches] == ["x.pt", "y.pt", "b.pt", "c/d.pt", "e.pt", "f.pt"]
    assert [m.path for m in manifest.verify(folder, made, only=["a.pt", "g.pt"]).mismatches] == ["a.pt"]
    assert [m.path for m in manifest.verify(folder, made, only=["g.pt"], extras=True).mismatches] == ["x.pt", "y.pt"]
    assert [m.path for m in manifest.verify(folder, made, extras=False).mismatches] == [
        "a.pt", "b.pt", "c/d.pt", "e.pt", "f.pt"]
    assert manifest.verify(folder, made, only=[]).ok


def test_the_files_on_disk_are_the_plain_files_below_but_the_manifest_and_its_temporaries(tmp_path: Path) -> None:
    folder = tmp_path / "global_step1"
    (folder / "sub" / "deeper").mkdir(parents=True)
    for rel in ("b.pt", "a.pt", "sub/deeper/c.pt", "sub/manifest.json.old", ".manifest.json", "manifest.jsonx"):
        (folder / rel).write_bytes(b"x")
    for rel in (manifest.MANIFEST, f".{manifest.MANIFEST}.123.tmp", f"sub/.{manifest.MANIFEST}.9.tmp"):
        (folder / rel).write_bytes(b"{}")
    (folder / "link.pt").symlink_to(folder / "a.pt")
    assert manifest.files_on_disk(folder) == [".manifest.json", "a.pt", "b.pt", "manifest.jsonx",
                                              "sub/deeper/c.pt", "sub/manifest.json.old"]


# --------------------------------------------------------------------------- manifest: adopting an old save

def test_adopting_checks_every_torch_file_and_writes_nothing_when_one_is_damaged(tmp_path: Path) -> None:
    folder = tmp_path / "global_step3"
    folder.mkdir()
    torch.save({"w": torch.arange(10.0)}, folder / "a.pt")
    (folder / "notes.txt").write_bytes(b"not a zip, not a torch file")
    (folder / "sub").mkdir()
    torch.save({"w": torch.arange(5.0)}, folder / "sub" / "b.pt")
    assert manifest.zip_problem(folder / "a.pt") is None and manifest.zip_problem(folder / "notes.txt")
    data = (folder / "sub" / "b.pt").read_bytes()
    (folder / "sub" / "b.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(manifest.ManifestError, match="b.pt"):
        manifest.adopt(folder, iteration=3, run_id="", experiment="x", layout={}, optimizer=True, now=1.0)
    assert not (folder / manifest.MANIFEST).exists()
    (folder / "sub" / "b.pt").write_bytes(data)
    before = time.time()
    shape = {"tensor": 1, "pipeline": 2, "data": 3, "zero_stage": 1, "precision": "bf16"}
    made = manifest.adopt(folder, iteration=3, run_id="r", experiment="x", layout=shape, optimizer=False)
    assert before <= made.committed_at <= time.time()
    assert manifest.read(folder) == made and made.adopted and (made.tag, made.iteration, made.run_id) == (
        "global_step3", 3, "r")
    assert (made.experiment, made.layout, made.optimizer) == ("x", shape, False)
    assert sorted(made.files) == ["a.pt", "notes.txt", "sub/b.pt"]
    assert made.files["sub/b.pt"] == manifest.hash_file(folder / "sub" / "b.pt")
    assert manifest.zip_problem(tmp_path / "missing.pt") and manifest.zip_problem(folder)


# --------------------------------------------------------------------------- set_aside: the record's bounds

def test_a_set_aside_record_keeps_a_reason_of_at_most_its_limit_and_reads_each_field_within_bounds(
        tmp_path: Path) -> None:
    folder = _save(tmp_path, 10, latest=False)
    (tmp_path / "set-aside-x").mkdir()
    moved = set_aside.set_aside(tmp_path, folder, "w" * 1500, now=1_790_000_000.0)
    assert moved.reason == "w" * set_aside.REASON_LIMIT and not folder.exists() and Path(moved.folder).is_dir()
    [record] = set_aside.read_checked(tmp_path).records
    assert record == moved
    good = {"time": 1.0, "tag": "t" * 64, "folder": "f" * 4096, "reason": "r" * 1000}
    lines = [good, {**good, "tag": "t" * 65}, {**good, "folder": "f" * 4097}, {**good, "reason": "r" * 1001},
             {**good, "time": -1}, {**good, "tag": 5}, {**good, "folder": None}, {**good, "reason": ["r"]}]
    (tmp_path / set_aside.RECORD).write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = set_aside.read_checked(tmp_path)
    assert found.records == [set_aside.SetAside(**good)]
    assert [p.line for p in found.problems] == [2, 3, 4, 5, 6, 7, 8]


def test_a_link_where_a_folder_would_be_set_aside_is_stepped_over(tmp_path: Path) -> None:
    when = 1_790_000_000.0
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    (tmp_path / f"set-aside-{stamp}").mkdir()
    (tmp_path / f"set-aside-{stamp}" / "global_step10").symlink_to(tmp_path / "nowhere")
    moved = set_aside.set_aside(tmp_path, _save(tmp_path, 10, latest=False), "why", now=when)
    assert Path(moved.folder) == tmp_path / f"set-aside-{stamp}.2" / "global_step10"
    assert (tmp_path / f"set-aside-{stamp}" / "global_step10").is_symlink()


# --------------------------------------------------------------------------- audit: each state and its facts

def test_the_audit_tells_each_state_with_its_detail_and_the_bytes_it_read(tmp_path: Path) -> None:
    legacy = tmp_path / "global_step5"
    legacy.mkdir()
    torch.save({"module": None}, legacy / "mp_rank_00_model_states.pt")
    (legacy / layout.META).write_text(json.dumps({"iteration": 5}))
    good = _save(tmp_path, 10, latest=False)
    bad = _save(tmp_path, 20, latest=False)
    (bad / "layer_01-model_states.pt").write_bytes(b"")
    (bad / "mp_rank_00_model_states.pt").unlink()
    flipped = _save(tmp_path, 30, latest=False)
    data = bytearray((flipped / "mp_rank_00_model_states.pt").read_bytes())
    data[0] ^= 1
    (flipped / "mp_rank_00_model_states.pt").write_bytes(bytes(data))
    refused = tmp_path / "global_step40"
    refused.mkdir()
    (refused / manifest.MANIFEST).write_text("{")
    _save(tmp_path, 50, commit=False, latest=False)
    told: list[audit.Finding] = []
    found = audit.audit(tmp_path, progress=told.append)
    assert told == found.findings and [(f.tag, f.state) for f in found.findings] == [
        ("global_step5", audit.BEFORE_MANIFESTS), ("global_step10", audit.VERIFIED), ("global_step20", audit.DAMAGED),
        ("global_step30", audit.DAMAGED), ("global_step40", audit.REFUSED), ("global_step50", audit.UNCOMMITTED)]
    by_tag = {f.tag: f for f in found.findings}
    assert not (legacy / manifest.MANIFEST).exists() and by_tag["global_step5"].detail
    assert by_tag["global_step5"].bytes_read == 0 and by_tag["global_step5"].step == 5
    assert by_tag["global_step10"].bytes_read == manifest.read(good).size
    assert "3 files" in by_tag["global_step10"].detail
    assert by_tag["global_step20"].detail.startswith("layer_01-model_states.pt: ")
    assert "(and 1 more)" in by_tag["global_step20"].detail  # the torch files failed before their content was read
    assert by_tag["global_step20"].bytes_read == (bad / layout.META).stat().st_size
    assert by_tag["global_step30"].detail.startswith("mp_rank_00_model_states.pt: ")
    assert "more" not in by_tag["global_step30"].detail
    assert by_tag["global_step30"].bytes_read == manifest.read(flipped).size
    assert str(refused / manifest.MANIFEST) in by_tag["global_step40"].detail
    assert by_tag["global_step50"].detail == resume.UNFINISHED and not found.ok
    sizes = audit.audit(tmp_path, hashes=False, step=30)
    assert [(f.state, f.bytes_read) for f in sizes.findings] == [(audit.VERIFIED, 0)] and sizes.ok
    data = (legacy / "mp_rank_00_model_states.pt").read_bytes()
    (legacy / "mp_rank_00_model_states.pt").write_bytes(data[: len(data) // 2])
    [damaged] = audit.audit(tmp_path, step=5, adopt=True).findings
    assert damaged.state == audit.DAMAGED and "mp_rank_00_model_states.pt" in damaged.detail
    assert damaged.bytes_read == 0 and not (legacy / manifest.MANIFEST).exists()
    (legacy / "mp_rank_00_model_states.pt").write_bytes(data)
    [adopted] = audit.audit(tmp_path, step=5, adopt=True).findings
    assert adopted.state == audit.ADOPTED and adopted.detail and adopted.bytes_read == manifest.read(legacy).size > 0
    assert audit.audit(tmp_path, step=10).ok and audit.audit(tmp_path, step=50).ok
    assert not audit.audit(tmp_path, step=40).ok and audit.audit(tmp_path, step=99).findings == []
    assert audit.audit(tmp_path / "missing").findings == []


def test_the_audit_names_each_set_aside_line_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / set_aside.RECORD).write_text('{"time": 1}\nnot json\n')
    found = audit.audit(tmp_path)
    assert len(found.problems) == 2 and all(p.startswith(str(tmp_path / set_aside.RECORD)) for p in found.problems)
    assert found.ok and found.findings == [] and found.set_aside == []


# --------------------------------------------------------------------------- layout: tags, listing, completeness

def test_a_tag_is_global_step_and_ascii_digits_and_the_listing_is_by_step(tmp_path: Path) -> None:
    assert [layout.step_of(t) for t in ("global_step0", "global_step10", "global_step" + "9" * 18)] == [
        0, 10, int("9" * 18)]
    assert [layout.step_of(t) for t in ("global_step", "global_step1a", "xglobal_step1", "global_step" + "9" * 19,
                                        "global_step1_universal", "global_step-1")] == [None] * 6
    assert layout.list_checkpoints(tmp_path / "missing") == []
    (tmp_path / "afile").write_text("x")
    assert layout.list_checkpoints(tmp_path / "afile") == []
    for step in (9, 100, 10):
        (tmp_path / f"global_step{step}").mkdir()
    (tmp_path / "global_step11").write_text("a file")
    (tmp_path / "global_step12_universal").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "global_step13").symlink_to(tmp_path / "global_step9")
    (tmp_path / "global_step14").symlink_to(tmp_path / "afile")
    listed = layout.list_checkpoints(tmp_path)
    assert [(c.tag, c.step, c.path) for c in listed] == [
        (f"global_step{s}", s, tmp_path / f"global_step{s}") for s in (9, 10, 13, 100)]
    assert [c.is_link for c in listed] == [False, False, True, False]
    assert [c.refusal() is None for c in listed] == [True, True, False, True]
    assert layout.Checkpoint("global_step11", 11, tmp_path / "global_step11").refusal()
    assert layout.Checkpoint("global_step15", 15, tmp_path / "global_step15").refusal()
    assert [p.file for p in layout.linked_checkpoints(tmp_path)] == [str(tmp_path / "global_step13")]


def test_a_checkpoint_is_complete_when_its_manifest_reads_and_its_files_are_there_at_their_sizes(
        tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        _save(tmp_path, step, latest=False)
    os.truncate(tmp_path / "global_step20" / "layer_01-model_states.pt", 1)
    (tmp_path / "global_step30" / manifest.MANIFEST).write_text("{")
    data = bytearray((tmp_path / "global_step40" / "layer_01-model_states.pt").read_bytes())
    data[0] ^= 1  # content: a listing does not read it
    (tmp_path / "global_step40" / "layer_01-model_states.pt").write_bytes(bytes(data))
    _save(tmp_path, 50, commit=False, latest=False)
    (tmp_path / "global_step60").symlink_to(tmp_path / "global_step10")
    assert [c.tag for c in layout.complete_checkpoints(tmp_path)] == ["global_step10", "global_step40"]
    assert [c.tag for c in layout.saved_checkpoints(tmp_path)] == ["global_step10", "global_step40"]
    assert [c.tag for c in layout.incomplete_checkpoints(tmp_path)] == [
        "global_step20", "global_step30", "global_step50"]
    ckpt = layout.Checkpoint("global_step10", 10, tmp_path / "global_step10")
    assert ckpt.committed() == manifest.read(ckpt.path) and ckpt.manifest() == manifest.read(ckpt.path)
    link = layout.Checkpoint("global_step60", 60, tmp_path / "global_step60")
    assert link.committed() is None and not link.saved_before_manifests()
    with pytest.raises(CheckpointError):
        link.manifest()
    with pytest.raises(CheckpointError):
        link.meta()


def test_a_save_before_manifests_is_a_bsops_json_without_the_commit_key_and_no_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "global_step10"
    folder.mkdir()
    ckpt = layout.Checkpoint("global_step10", 10, folder)
    assert not ckpt.saved_before_manifests()  # no bsops.json
    (folder / layout.META).write_text(json.dumps({"iteration": 10}))
    assert ckpt.saved_before_manifests() and ckpt.manifest() is None and ckpt.committed() is None
    (folder / layout.META).write_text(json.dumps({"iteration": 10, layout.COMMIT_KEY: manifest.MANIFEST}))
    assert not ckpt.saved_before_manifests()
    (folder / layout.META).write_text("[]")
    assert not ckpt.saved_before_manifests()
    (folder / layout.META).write_text(json.dumps({"iteration": 10}))
    (folder / manifest.MANIFEST).write_text("{")
    assert not ckpt.saved_before_manifests()
    (tmp_path / "global_step20").symlink_to(folder)
    assert not layout.Checkpoint("global_step20", 20, tmp_path / "global_step20").saved_before_manifests()


def test_a_bsops_json_is_read_only_as_a_json_object_of_a_plain_file(tmp_path: Path) -> None:
    folder = tmp_path / "global_step1"
    folder.mkdir()
    ckpt = layout.Checkpoint("global_step1", 1, folder)
    for data in (None, b"\xff", b"[" * 100_000, b"[1]", b"x" * (layout.META_LIMIT + 1)):
        if data is not None:
            (folder / layout.META).write_bytes(data)
        with pytest.raises(CheckpointError):
            ckpt.meta()
    (folder / layout.META).write_bytes(json.dumps({"a": 1}).encode() + b" " * (layout.META_LIMIT - 8))
    assert ckpt.meta() == {"a": 1}
    (tmp_path / "global_step2").write_text("{}")
    with pytest.raises(CheckpointError):
        layout.Checkpoint("global_step2", 2, tmp_path / "global_step2").meta()


# --------------------------------------------------------------------------- resume: the walk over the candidates

def _cand(tmp_path: Path, step: int, state: str, why: str = "") -> resume.Candidate:
    ckpt = layout.Checkpoint(f"global_step{step}", step, tmp_path / f"global_step{step}")
    return resume.Candidate(ckpt, state, None, why)


def test_the_walk_takes_the_first_that_passes_and_sets_aside_what_failed_and_the_saves_never_committed(
        tmp_path: Path) -> None:
    c30, c40, c20, c15, c10 = (_cand(tmp_path, 30, resume.COMMITTED), _cand(tmp_path, 40, resume.UNCOMMITTED, "u40"),
                               _cand(tmp_path, 20, resume.LEGACY), _cand(tmp_path, 15, resume.UNCOMMITTED, "u15"),
                               _cand(tmp_path, 10, resume.UNREADABLE, "r10"))
    asked: list[str] = []

    def check(cand: resume.Candidate) -> str | None:
        asked.append(cand.tag)
        return "bad" if cand.tag == "global_step30" else None

    out = resume.decide(resume.Survey((c30, c40, c20, c15, c10), "global_step30"), check)
    assert asked == ["global_step30", "global_step20"] and out.chosen is c20 and out.refused == []
    assert out.set_aside == [(c30, "bad"), (c40, "u40"), (c15, "u15")] and out.notes == []
    out = resume.decide(resume.Survey((c10, c40, c30), "global_step9", "latest names nothing", ("global_step50",)),
                        lambda cand: "bad")
    assert out.chosen is None and out.refused == [(c10, "r10"), (c40, "u40"), (c30, "bad")] and out.set_aside == []
    assert out.notes == []  # refused: nothing is said, nothing moves
    out = resume.decide(resume.Survey((c40, c15), None), lambda cand: None)
    assert out.chosen is None and out.refused == [] and out.set_aside == [(c40, "u40"), (c15, "u15")]
    assert len(out.notes) == 1 and "`latest`" in out.notes[0]
    out = resume.decide(resume.Survey((c30,), None, "", ("global_step50", "global_step60")), lambda cand: None)
    assert out.chosen is c30 and out.set_aside == [] and len(out.notes) == 3
    assert "global_step30" in out.notes[0] and "global_step50" in out.notes[1] and "global_step60" in out.notes[2]
    out = resume.decide(resume.Survey((c30,), "global_step30", "", ("global_step50",)), lambda cand: None)
    assert len(out.notes) == 1 and "global_step50" in out.notes[0]
    assert resume.decide(resume.Survey((), None, "", ()), lambda cand: None).notes == []
    out = resume.decide(resume.Survey((c10,), None, "unreadable latest"), lambda cand: None)
    assert out.refused == [(c10, "r10")] and out.set_aside == [] and out.notes == []  # a manifest that cannot be read
    out = resume.decide(resume.Survey((c40,), "global_step40", "unreadable latest"), lambda cand: None)
    assert out.set_aside == [(c40, "u40")] and out.chosen is None and len(out.notes) == 1
    assert out.notes[0].startswith("unreadable latest: ")


def test_a_save_before_manifests_is_tried_only_at_or_before_latest(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        folder = tmp_path / f"global_step{step}"
        folder.mkdir()
        (folder / layout.META).write_text(json.dumps({"iteration": step}))
    layout.write_latest(tmp_path, "global_step20")
    found = resume.survey(tmp_path)
    assert [(c.tag, c.state) for c in found.candidates] == [
        ("global_step20", resume.LEGACY), ("global_step30", resume.UNCOMMITTED), ("global_step10", resume.LEGACY)]
    assert found.candidates[1].why == resume.UNFINISHED and found.candidates[0].why == ""
    assert found.latest == "global_step20" and found.latest_problem == "" and found.links == ()
    (tmp_path / layout.LATEST).unlink()
    assert [c.state for c in resume.survey(tmp_path).candidates] == [resume.LEGACY] * 3
    layout.write_latest(tmp_path, "global_step99")
    missing = resume.survey(tmp_path)
    assert missing.latest == "global_step99" and "global_step99" in missing.latest_problem
    assert [c.tag for c in missing.candidates] == ["global_step30", "global_step20", "global_step10"]
    assert [c.state for c in missing.candidates] == [resume.LEGACY] * 3
    assert resume.survey(tmp_path / "missing") == resume.Survey((), None, "", ())


# --------------------------------------------------------------------------- the trainer's resume: what rank 0 does

def test_a_resume_from_the_checkpoint_latest_names_moves_nothing_and_says_nothing(tmp_path: Path,
                                                                                 single_rank_group) -> None:
    _save(tmp_path, 10, latest=False)
    _save(tmp_path, 20)
    before = (tmp_path / layout.LATEST).stat().st_ino
    said: list[str] = []
    checkpointing.resolve_resume(tmp_path, said.append)
    assert said == [] and (tmp_path / layout.LATEST).stat().st_ino == before
    assert set_aside.read_checked(tmp_path).records == [] and layout.latest_tag(tmp_path) == "global_step20"
    (tmp_path / layout.LATEST).unlink()  # no latest: the newest verified is named
    checkpointing.resolve_resume(tmp_path, said.append)
    assert layout.latest_tag(tmp_path) == "global_step20" and len(said) == 2 and "global_step20" in said[1]
    checkpointing.resolve_resume(tmp_path / "missing", said.append)
    empty = tmp_path / "empty"
    empty.mkdir()
    checkpointing.resolve_resume(empty, said.append)
    assert len(said) == 2 and list(empty.iterdir()) == []


def test_a_latest_that_is_a_dangling_link_with_nothing_committed_is_set_aside(tmp_path: Path,
                                                                              single_rank_group) -> None:
    (tmp_path / layout.LATEST).symlink_to(tmp_path / "nowhere")
    said: list[str] = []
    checkpointing.resolve_resume(tmp_path, said.append)
    assert not (tmp_path / layout.LATEST).is_symlink()
    [record] = set_aside.read_checked(tmp_path).records
    assert record.tag == layout.LATEST and Path(record.folder).is_symlink() and len(said) == 2


def test_a_resume_names_the_first_of_the_sorted_mismatches_and_how_many_more(tmp_path: Path,
                                                                           single_rank_group) -> None:
    _save(tmp_path, 10, latest=False)
    bad = _save(tmp_path, 20)
    for name in ("zz.pt", "aa.pt", "mm.pt"):
        (bad / name).write_bytes(b"x")
    checkpointing.resolve_resume(tmp_path, lambda line: None)
    [record] = set_aside.read_checked(tmp_path).records
    assert record.reason.startswith("aa.pt: ") and "(and 2 more)" in record.reason


def test_a_checkpoint_reached_through_a_link_of_its_own_name_is_refused_not_read(tmp_path: Path) -> None:
    _save(tmp_path, 10, latest=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "global_step10").symlink_to(tmp_path / "global_step10")
    link = layout.Checkpoint("global_step10", 10, tmp_path / "other" / "global_step10")
    with pytest.raises(CheckpointError):
        link.manifest()
    assert link.committed() is None and layout.complete_checkpoints(tmp_path / "other") == []


def test_a_verified_checkpoint_says_how_many_files_and_megabytes_it_holds(tmp_path: Path) -> None:
    folder = tmp_path / "global_step10"
    folder.mkdir()
    with open(folder / "big.pt", "wb") as handle:
        handle.truncate(1_150_001)
    commit_checkpoint(folder)
    [finding] = audit.audit(tmp_path, hashes=False).findings
    assert finding.state == audit.VERIFIED and finding.detail.startswith("1 files, 1.2 MB: ")


@pytest.mark.parametrize("name, value", [("tag", 5), ("iteration", -1), ("run_id", 5), ("experiment", None),
                                         ("committed_at", "now")])
def test_a_refused_manifest_names_the_field_that_is_wrong(tmp_path: Path, name: str, value) -> None:
    folder = tmp_path / "global_step1"
    folder.mkdir()
    (folder / manifest.MANIFEST).write_text(json.dumps({**_raw(folder), name: value}))
    with pytest.raises(manifest.ManifestError, match=f"field {name}: "):
        manifest.read(folder)


def test_the_tensor_parallel_dropout_generator_goes_back_to_where_it_was_saved(tmp_path: Path) -> None:
    from bigscience_ops.trainer import tensor_parallel

    tracker = tensor_parallel._rng_tracker()
    before = tracker.get_states()
    try:
        tracker.reset()
        checkpointing.save_rng(tmp_path, 0)  # no TP generator seeded: none restored
        assert checkpointing.load_rng(tmp_path, 0) and tracker.get_states() == {}
        tracker.add(tensor_parallel.RNG_TRACKER_NAME, 1234)
        checkpointing.save_rng(tmp_path, 0)
        with tracker.fork(tensor_parallel.RNG_TRACKER_NAME):
            expected = torch.rand(3)
        assert checkpointing.load_rng(tmp_path, 0)
        with tracker.fork(tensor_parallel.RNG_TRACKER_NAME):
            assert torch.equal(torch.rand(3), expected)
    finally:
        tracker.reset()
        tracker.set_states(before)
