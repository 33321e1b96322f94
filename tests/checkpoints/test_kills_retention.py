"""Retention rules that mutation testing found untested (scripts/mutation.py): each test here fails on a mutant of
checkpoints/retention.py that every other test let through. The decision is pure; the deletions run on real
folders."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bigscience_ops.checkpoints import layout, retention
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.keep import backup
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import commit_checkpoint

ALL = {10, 20, 30, 40, 50}


def test_keep_last_counts_only_the_checkpoints_up_to_the_one_the_run_resumes_from() -> None:
    # After a rollback to 30, 40 and 50 are kept as "after latest"; the newest two up to 30 are 20 and 30.
    decision = retention.decide(ALL, 30, ALL, keep_last=2, keep_every=None)
    assert decision.delete == [10] and set(decision.keep) == {20, 30, 40, 50}
    # Counting the checkpoints past 30 would have kept 40 and 50 as "the newest" and deleted 20.
    assert retention.decide(ALL, 30, ALL, keep_last=3, keep_every=None).delete == []


def test_the_step_resumed_from_is_kept_and_only_later_steps_count_as_after_it() -> None:
    decision = retention.decide(ALL, 50, ALL, keep_last=1, keep_every=None)
    assert decision.delete == [10, 20, 30, 40] and list(decision.keep) == [50]
    # every kept step has its reason, a non-empty text the report prints
    for args in [(ALL, 30, ALL, 1, None), (ALL, None, ALL, 1, None), (ALL, 50, {10}, 1, 20), (ALL, 50, ALL, None, None)]:
        decision = retention.decide(*args)
        assert decision.keep and all(isinstance(why, str) and why for why in decision.keep.values())
        assert set(decision.keep) | set(decision.delete) == ALL and not set(decision.keep) & set(decision.delete)


def test_keep_every_keeps_its_multiples_and_unverified_steps_stay() -> None:
    decision = retention.decide(ALL, 50, ALL - {30}, keep_last=1, keep_every=20)
    assert decision.delete == [10] and set(decision.keep) == {20, 30, 40, 50}
    assert retention.decide(ALL, None, ALL, keep_last=1, keep_every=None).delete == []
    assert retention.decide(ALL, 50, ALL, keep_last=None, keep_every=None).delete == []


def _save(checkpoints: Path, step: int) -> None:
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "layer_00-model_states.pt").write_bytes(os.urandom(1000))
    (folder / layout.META).write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)


def test_a_backup_after_a_rollback_keeps_keep_last_checkpoints_up_to_latest(trainings: Path, tmp_path: Path) -> None:
    """The documented policy end to end: latest names 30 after a rollback; 40 and 50 are after it (a rollback set
    them aside or a save is in progress), keep_last=2 keeps 20 and 30, and only 10 goes."""
    policy = {"dest": str(tmp_path / "store"), "keep_last": 2, "keep_optimizer_every": 10}
    (trainings / "rolled.yaml").write_text(tiny_yaml(tmp_path / "rolled", f"backup: {json.dumps(policy)}\n"))
    exp = load_experiment("rolled", trainings)
    scratch = Path(exp.paths.checkpoints)
    layout.new_run_id(scratch)
    for step in sorted(ALL):
        _save(scratch, step)
    (scratch / layout.LATEST).write_text("global_step30")
    report = backup.run_backup(backup.settings(exp))
    assert report.failed == {} and report.deleted == ["global_step10"]
    assert sorted(p.name for p in scratch.glob("global_step*")) == [f"global_step{s}" for s in (20, 30, 40, 50)]


def test_apply_deletes_only_what_was_decided_and_still_verified_and_refuses_links(tmp_path: Path) -> None:
    scratch = tmp_path / "checkpoints"
    for step in sorted(ALL):
        _save(scratch, step)
    (scratch / "global_step20_universal").mkdir()
    (scratch / "global_step30_universal").symlink_to(tmp_path)
    checkpoints = layout.complete_checkpoints(scratch)
    decision = retention.Decision({50: "latest"}, [10, 20, 30, 40])
    applied = retention.apply(checkpoints, decision, lambda c: c.step != 40)
    assert applied.deleted == ["global_step10", "global_step20", "global_step20_universal", "global_step30"]
    assert list(applied.refused) == ["global_step30_universal"] and str(tmp_path) in applied.refused[
        "global_step30_universal"]
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("global")) == [
        "global_step30_universal", "global_step40", "global_step50"]
    assert tmp_path.is_dir()


def test_apply_goes_on_past_kept_unverified_and_refused_checkpoints(tmp_path: Path) -> None:
    """Every decided deletion is tried: a kept checkpoint, one whose copy no longer verifies, or a link before it
    never stops the ones after it."""
    scratch = tmp_path / "checkpoints"
    for step in sorted(ALL):
        _save(scratch, step)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    linked = layout.Checkpoint("global_step25", 25, scratch / "global_step25")
    linked.path.symlink_to(outside)
    file = layout.Checkpoint("global_step35", 35, scratch / "global_step35")
    file.path.write_text("not a folder")
    checkpoints = sorted([*layout.complete_checkpoints(scratch), linked, file], key=lambda c: c.step)
    decision = retention.Decision({10: "one of the newest", 50: "latest"}, [20, 25, 30, 35, 40])
    applied = retention.apply(checkpoints, decision, lambda c: c.step != 30)
    assert applied.deleted == ["global_step20", "global_step40"]
    assert sorted(applied.refused) == ["global_step25", "global_step35"]
    assert str(linked.path) in applied.refused["global_step25"] and str(file.path) in applied.refused["global_step35"]
    assert outside.is_dir() and linked.path.is_symlink() and file.path.is_file()
    assert sorted(p.name for p in scratch.glob("global_step*")) == [
        "global_step10", "global_step25", "global_step30", "global_step35", "global_step50"]


def test_a_checkpoint_that_cannot_be_deleted_is_refused_and_keeps_its_universal_copy(tmp_path: Path) -> None:
    scratch = tmp_path / "checkpoints"
    for step in (10, 20):
        _save(scratch, step)
    (scratch / "global_step10_universal").mkdir()

    def gone_meanwhile(ckpt: layout.Checkpoint) -> bool:  # verified, then removed by someone else before the delete
        os.rename(ckpt.path, tmp_path / "moved-away")
        return True

    applied = retention.apply(layout.complete_checkpoints(scratch), retention.Decision({20: "latest"}, [10]),
                              gone_meanwhile)
    assert applied.deleted == [] and list(applied.refused) == ["global_step10"]
    assert str(scratch / "global_step10") in applied.refused["global_step10"]
    assert (scratch / "global_step10_universal").is_dir()


def _ckpt(scratch: Path, step: int, *, optimizer: bool = True) -> layout.Checkpoint:
    folder = scratch / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(os.urandom(500))
    commit_checkpoint(folder, optimizer=optimizer)
    return layout.Checkpoint(folder.name, step, folder)


def test_the_newest_resumable_checkpoint_is_protected_past_weights_only_ones(tmp_path: Path) -> None:
    scratch = tmp_path / "checkpoints"
    complete = [_ckpt(scratch, 10), _ckpt(scratch, 20), _ckpt(scratch, 30, optimizer=False)]
    never_copied, matches = (lambda c: False), (lambda c, found: None)
    assert retention.protect_resumable(complete, never_copied, matches) == {20: retention.UNCOPIED_RESUMABLE}
    # a whole copy of 20 in the store: nothing needs protecting
    assert retention.protect_resumable(complete, lambda c: c.step == 20, matches) == {}
    # 20 no longer matches its manifest: kept for inspection, and 10 is the newest resumable one
    protected = retention.protect_resumable(complete, never_copied, lambda c, found: "x" if c.step == 20 else None)
    assert list(protected) == [20, 10] and protected[10] == retention.UNCOPIED_RESUMABLE
    assert "x" in protected[20]
    assert retention.protect_resumable([complete[2]], never_copied, matches) == {}


def test_a_step_kept_as_a_multiple_of_keep_every_has_its_reason() -> None:
    decision = retention.decide(ALL, 50, ALL, keep_last=1, keep_every=20)
    assert decision.delete == [10, 30] and set(decision.keep) == {20, 40, 50}
    assert all(isinstance(decision.keep[step], str) and "20" in decision.keep[step] for step in (20, 40))
