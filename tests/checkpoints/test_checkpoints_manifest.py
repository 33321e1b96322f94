"""checkpoints/manifest.py, resume.py and audit.py on real folders: the manifest that commits a save, what a resume
takes and sets aside, and `bsops verify`. Fast: hand-made checkpoints (tests/fixtures_runs.commit_checkpoint) and a
one-process gloo group for the resume's collectives; the real runs are in tests/faults/test_faults_checkpoints.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from bigscience_ops.checkpoints import audit, layout, manifest, resume, set_aside
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.run import lock as run_lock
from bigscience_ops.trainer import checkpointing
from tests.fixtures_runs import commit_checkpoint


def _save(checkpoints: Path, step: int, *, commit: bool = True, latest: bool = True, before_manifests: bool = False
          ) -> Path:
    """A checkpoint folder as the trainer writes it: torch files (zip archives), bsops.json, the manifest."""
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    torch.save({"weight": torch.arange(step + 300.0)}, folder / "layer_01-model_states.pt")
    torch.save({"module": None, "iteration": step}, folder / "mp_rank_00_model_states.pt")
    meta = {"iteration": step, "parallel": {"tensor": 1, "pipeline": 1, "data": 1},
            "experiment": {"name": "tiny", "parallel": {"zero_stage": 0}, "train": {"precision": "fp32"}}}
    if not before_manifests:
        meta[layout.COMMIT_KEY] = manifest.MANIFEST
    (folder / layout.META).write_text(json.dumps(meta))
    if commit:
        commit_checkpoint(folder)
    if latest:
        (checkpoints / layout.LATEST).write_text(folder.name)
    return folder


def _flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 1
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- the manifest

def test_a_manifest_lists_every_file_and_reads_back_as_written(tmp_path: Path) -> None:
    folder = _save(tmp_path, 10)
    found = manifest.read(folder)
    assert sorted(found.files) == manifest.files_on_disk(folder) == [layout.META, "layer_01-model_states.pt",
                                                                       "mp_rank_00_model_states.pt"]
    assert found.files["layer_01-model_states.pt"] == manifest.hash_file(folder / "layer_01-model_states.pt")
    assert found.size == sum((folder / rel).stat().st_size for rel in found.files)
    assert manifest.verify(folder, found).ok and manifest.verify(folder, found).bytes_read == found.size


@pytest.mark.parametrize("damage, what", [
    (lambda f: os.truncate(f / "layer_01-model_states.pt", 10), "is 10 bytes, its manifest says"),
    (lambda f: _flip(f / "layer_01-model_states.pt"), "content differs from its manifest"),
    (lambda f: (f / "layer_01-model_states.pt").unlink(), "missing"),
    (lambda f: (f / "extra.pt").write_bytes(b"x"), "is not in its manifest"),
    (lambda f: ((f / "layer_01-model_states.pt").unlink(), (f / "layer_01-model_states.pt").symlink_to("/etc/passwd")),
     "not a plain file"),
])
def test_verify_names_the_file_that_is_not_as_saved(tmp_path: Path, damage, what: str) -> None:
    folder = _save(tmp_path, 10)
    damage(folder)
    [bad] = manifest.verify(folder, manifest.read(folder)).mismatches
    assert what in str(bad)


def test_sizes_alone_miss_a_flipped_byte_hashes_do_not(tmp_path: Path) -> None:
    folder = _save(tmp_path, 10)
    _flip(folder / "layer_01-model_states.pt")
    assert manifest.verify(folder, manifest.read(folder), hashes=False).ok
    assert layout.complete_checkpoints(tmp_path)[0].tag == "global_step10"  # listing stats, a resume reads
    assert not manifest.verify(folder, manifest.read(folder)).ok


@pytest.mark.parametrize("content, why", [
    (b"{", "not a JSON manifest"),
    (b"[]", "a JSON list"),
    (b'{"format": 2, "hash": "xxh3_128"}', "format '2'"),
    (None, "names 'global_step99'"),
    ("../../etc/passwd", "not a relative path"),
    ("size", "size: expected a byte count"),
])
def test_a_manifest_that_is_not_the_trainers_is_refused_naming_the_file(tmp_path: Path, content, why) -> None:
    folder = _save(tmp_path, 10)
    data = json.loads((folder / manifest.MANIFEST).read_text())
    if content is None:
        data["tag"] = "global_step99"
    elif content == "size":
        data["files"][layout.META]["size"] = -1
    elif isinstance(content, str):
        data["files"][content] = data["files"].pop(layout.META)
    (folder / manifest.MANIFEST).write_bytes(json.dumps(data).encode() if not isinstance(content, bytes) else content)
    with pytest.raises(manifest.ManifestError, match=why) as refused:
        manifest.read(folder)
    assert str(folder / manifest.MANIFEST) in str(refused.value)
    assert [c.tag for c in layout.complete_checkpoints(tmp_path)] == []


def test_a_manifest_that_is_a_link_is_never_read(tmp_path: Path) -> None:
    folder = _save(tmp_path, 10)
    (tmp_path / "elsewhere.json").write_bytes((folder / manifest.MANIFEST).read_bytes())
    (folder / manifest.MANIFEST).unlink()
    (folder / manifest.MANIFEST).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(manifest.ManifestError, match="never read through a link"):
        manifest.read(folder)


def test_zip_checks_catch_truncation_and_a_flipped_byte_without_unpickling(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"w": torch.arange(50_000.0)}, path)
    assert manifest.zip_problem(path) is None
    _flip(path, at=path.stat().st_size // 2)
    assert "fails its CRC-32" in manifest.zip_problem(path)
    os.truncate(path, 3000)
    assert "not a whole zip archive" in manifest.zip_problem(path)


# --------------------------------------------------------------------------- what a resume takes

def _decide(checkpoints: Path) -> resume.Outcome:
    def check(cand: resume.Candidate) -> str | None:
        if cand.state == resume.LEGACY:
            return resume.adopt(checkpoints, cand.ckpt)
        bad = manifest.verify(cand.ckpt.path, cand.manifest).mismatches
        return str(bad[0]) if bad else None
    return resume.decide(resume.survey(checkpoints), check)


def test_latest_is_taken_when_it_verifies_and_a_save_cut_short_after_it_is_set_aside(tmp_path: Path) -> None:
    for step in (10, 20):
        _save(tmp_path, step)
    _save(tmp_path, 30, commit=False, latest=False)
    out = _decide(tmp_path)
    assert out.chosen.tag == "global_step20" and [(c.tag, why) for c, why in out.set_aside] == [
        ("global_step30", resume.UNFINISHED)] and out.refused == [] and out.notes == []


def test_a_damaged_latest_falls_back_to_the_newest_verified(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        _save(tmp_path, step)
    _flip(tmp_path / "global_step30" / "layer_01-model_states.pt")
    os.truncate(tmp_path / "global_step20" / "mp_rank_00_model_states.pt", 5)
    out = _decide(tmp_path)
    assert out.chosen.tag == "global_step10"
    assert [c.tag for c, _ in out.set_aside] == ["global_step30", "global_step20"]


@pytest.mark.parametrize("latest", [None, b"junk\n", b"global_step3", b"global_step99", b"global_step\xff"])
def test_latest_missing_garbage_before_or_past_resolves_to_the_newest_verified(tmp_path: Path, latest) -> None:
    for step in (10, 20):
        _save(tmp_path, step)
    (tmp_path / layout.LATEST).unlink()
    if latest is not None:
        (tmp_path / layout.LATEST).write_bytes(latest)
    out = _decide(tmp_path)
    assert out.chosen.tag == "global_step20" and out.set_aside == []
    [note] = out.notes
    assert "resuming from global_step20, the newest verified checkpoint" in note


def test_nothing_committed_ever_starts_from_scratch_with_the_cut_short_save_set_aside(tmp_path: Path) -> None:
    _save(tmp_path, 10, commit=False)  # the first save of a run, cut short: `latest` was never written by bsops
    out = _decide(tmp_path)
    assert out.chosen is None and out.refused == [] and [c.tag for c, _ in out.set_aside] == ["global_step10"]


def test_a_run_whose_every_committed_checkpoint_is_damaged_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    for step in (10, 20):
        _save(tmp_path, step)
        _flip(tmp_path / f"global_step{step}" / "layer_01-model_states.pt")
    out = _decide(tmp_path)
    assert out.chosen is None and out.set_aside == [] and [c.tag for c, _ in out.refused] == ["global_step20",
                                                                                              "global_step10"]
    assert "Nothing was moved" in resume.refusal(out, tmp_path)


def test_checkpoints_saved_before_manifests_are_adopted_when_their_zip_archives_check_out(tmp_path: Path) -> None:
    for step in (10, 20):
        _save(tmp_path, step, commit=False, before_manifests=True)
    _save(tmp_path, 30, commit=False, latest=False, before_manifests=True)  # after latest: DeepSpeed was saving it
    os.truncate(tmp_path / "global_step20" / "layer_01-model_states.pt", 700)
    out = _decide(tmp_path)
    assert out.chosen.tag == "global_step10" and out.chosen.state == resume.LEGACY
    assert [(c.tag, "not a whole zip archive" in why) for c, why in out.set_aside] == [("global_step20", True),
                                                                                       ("global_step30", False)]
    adopted = manifest.read(tmp_path / "global_step10")
    assert adopted.adopted and adopted.iteration == 10 and manifest.verify(tmp_path / "global_step10", adopted).ok


def test_shares_split_the_bytes_about_evenly_and_cover_every_file_once(tmp_path: Path) -> None:
    folder = _save(tmp_path, 10)
    for i in range(7):
        (folder / f"layer_{i + 2:02d}-model_states.pt").write_bytes(os.urandom(1000 * (i + 1)))
    found = commit_checkpoint(folder)
    split = resume.shares(found, 3)
    assert sorted(rel for part in split for rel in part) == sorted(found.files)
    loads = [sum(found.files[rel].size for rel in part) for part in split]
    assert max(loads) - min(loads) <= max(f.size for f in found.files.values())


def test_the_trainers_resume_moves_what_it_sets_aside_and_points_latest(tmp_path: Path, single_rank_group) -> None:
    for step in (10, 20):
        _save(tmp_path, step)
    _save(tmp_path, 30, commit=False, latest=False)
    os.truncate(tmp_path / "global_step20" / "layer_01-model_states.pt", 9)
    before = {p.name for p in (tmp_path / "global_step20").iterdir()}
    said: list[str] = []
    checkpointing.resolve_resume(tmp_path, said.append)
    assert layout.latest_tag(tmp_path) == "global_step10"
    assert [c.tag for c in layout.list_checkpoints(tmp_path)] == ["global_step10"]
    records = set_aside.read_checked(tmp_path).records
    assert [r.tag for r in records] == ["global_step20", "global_step30"]
    assert {p.name for p in Path(records[0].folder).iterdir()} == before  # moved whole
    assert len([line for line in said if "set aside" in line]) == 2 and "latest now names global_step10" in said[-1]
    assert checkpointing.find_resume(tmp_path).tag == "global_step10"


def test_the_trainers_resume_refuses_on_every_rank_when_nothing_verifies(tmp_path: Path, single_rank_group) -> None:
    _save(tmp_path, 10)
    _flip(tmp_path / "global_step10" / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointError, match="no checkpoint of .* can be resumed from"):
        checkpointing.resolve_resume(tmp_path, lambda line: None)
    assert (tmp_path / "global_step10").is_dir() and not (tmp_path / set_aside.RECORD).exists()


# --------------------------------------------------------------------------- bsops verify

def test_bsops_verify_reports_each_checkpoint_and_exits_1_on_a_damaged_one(trainings: Path, tmp_path: Path) -> None:
    args = ["verify", "tiny", "--trainings-dir", str(trainings)]
    runner = CliRunner()
    exp_checkpoints = Path(load_experiment("tiny", trainings).paths.checkpoints)
    for step in (10, 20):
        _save(exp_checkpoints, step)
    _save(exp_checkpoints, 30, commit=False, latest=False)
    good = runner.invoke(main, [*args, "--json"])
    assert good.exit_code == 0, good.output
    data = json.loads(good.stdout)
    assert [(f["tag"], f["state"]) for f in data["findings"]] == [
        ("global_step10", audit.VERIFIED), ("global_step20", audit.VERIFIED), ("global_step30", audit.UNCOMMITTED)]
    _flip(exp_checkpoints / "global_step20" / "layer_01-model_states.pt")
    quick = runner.invoke(main, [*args, "--sizes-only"])
    assert quick.exit_code == 0 and "global_step20: verified" in quick.output  # sizes cannot see a flipped byte
    bad = runner.invoke(main, args)
    assert bad.exit_code == 1 and "global_step20: damaged: layer_01-model_states.pt: content differs" in bad.output
    assert "Traceback" not in bad.output


def test_bsops_verify_adopt_writes_manifests_and_is_refused_while_the_run_trains(trainings: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_lock, "_WAIT_S", 0.2)  # the holder below never lets go: the refusal need not wait long
    checkpoints = Path(load_experiment("tiny", trainings).paths.checkpoints)
    for step in (10, 20):
        _save(checkpoints, step, commit=False, before_manifests=True)
    runner = CliRunner()
    args = ["verify", "tiny", "--trainings-dir", str(trainings)]
    listed = runner.invoke(main, args)
    assert listed.exit_code == 1 and listed.output.count(audit.BEFORE_MANIFESTS) == 2
    assert layout.complete_checkpoints(checkpoints) == []
    with run_lock.hold(Path(load_experiment("tiny", trainings).paths.output), "a training task"):
        held = runner.invoke(main, [*args, "--adopt"])
    assert held.exit_code == 2 and "in use by a training task" in held.output
    assert not (checkpoints / "global_step10" / manifest.MANIFEST).exists()
    adopted = runner.invoke(main, [*args, "--adopt"])
    assert adopted.exit_code == 0 and adopted.output.count(f": {audit.ADOPTED}:") == 2, adopted.output
    assert [c.step for c in layout.complete_checkpoints(checkpoints)] == [10, 20]


# --------------------------------------------------------------------------- a relaunch that cannot resume

def _as_trained(trainings: Path, step: int = 10) -> Path:
    """tiny's checkpoints folder with a committed checkpoint whose bsops.json records tiny's own model and layout."""
    import dataclasses

    from bigscience_ops.config.loading import to_dict
    from bigscience_ops.sizing import GPTShape

    exp = load_experiment("tiny", trainings)
    checkpoints = Path(exp.paths.checkpoints)
    folder = _save(checkpoints, step)
    p = exp.parallel
    meta = {"iteration": step, "model": dataclasses.asdict(GPTShape.from_experiment(exp)),
            "parallel": {"tensor": p.tensor, "pipeline": p.pipeline, "data": 1}, "experiment": to_dict(exp),
            layout.COMMIT_KEY: manifest.MANIFEST}
    (folder / layout.META).write_text(json.dumps(meta))
    commit_checkpoint(folder)
    return checkpoints


@pytest.mark.parametrize("overrides, named", [
    (["model.hidden_size=512", "model.num_attention_heads=8"], "model.hidden_size: checkpoint"),
    (["model.num_layers=3"], "model.num_layers: checkpoint 4, config 3"),
    (["model.vocab_size=8000"], "model.vocab_size: checkpoint"),
])
def test_a_relaunch_whose_model_cannot_load_the_checkpoints_is_refused_before_anything_starts(
        trainings: Path, tmp_path: Path, overrides: list[str], named: str) -> None:
    checkpoints = _as_trained(trainings)
    args = ["render", "tiny", *overrides, "--trainings-dir", str(trainings)]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "cannot be resumed by this launch" in refused.output and named in refused.output, refused.output
    assert not Path("rendered").exists() and [c.step for c in layout.complete_checkpoints(checkpoints)] == [10]
    same = CliRunner().invoke(main, ["render", "tiny", "--trainings-dir", str(trainings)])
    assert same.exit_code == 0, same.output  # the model it was written with: fine
