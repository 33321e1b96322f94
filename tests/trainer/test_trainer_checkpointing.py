"""trainer/checkpointing.py, the save: when the trainer saves (the run schedule's save steps, with SaveSchedule's
ranges and interval) and the save itself: each rank's RNG state and rank 0's bsops.json written into
`global_stepN/` before DeepSpeed's engine saves, then the manifest (every file, its size and hash), then
`latest`; a step never saved twice, a resumed step not saved again.
Fast: the engine is a stand-in that records its calls and writes a file as DeepSpeed's would, the folder a real
one, and a one-process gloo group (the `single_rank_group` fixture) answers the ranks and barriers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from bigscience_ops.checkpoints import layout, manifest, set_aside
from bigscience_ops.schedule.batch_lr import SaveSchedule
from bigscience_ops.trainer import checkpointing as ckpt
from bigscience_ops.trainer.metrics import Metrics

SEED_003 = SaveSchedule(((100, 10), (1000, 18)), 1500)
META = {"model": {"hidden_size": 64, "num_layers": 2}, "parallel": {"tensor": 1, "pipeline": 1}}
"""What the trainer's meta() gives for rank 0's bsops.json (a part of it)."""


class RecordingEngine:
    """Stands for DeepSpeed's engine behind DeepSpeedState.save: records each call, what the tag's folder held then
    and whether `latest` named it already, and writes this rank's model-states file as DeepSpeed would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict, list[str]]] = []
        self.latest_during: list[str | None] = []
        self.after_each: list[object] = []  # what the debug kill in a save (BSOPS_KILL_IN_SAVE) handed it

    def save(self, folder: Path, tag: str, client_state: dict, after_each=None) -> dict[Path, manifest.FileRecord]:
        held = sorted(p.name for p in (Path(folder) / tag).iterdir())
        self.calls.append((str(folder), tag, client_state, held))
        self.latest_during.append(layout.latest_tag(folder))
        self.after_each.append(after_each)
        written = Path(folder) / tag / f"mp_rank_{dist.get_rank():02d}_model_states.pt"
        torch.save({"iteration": client_state["iteration"]}, written)
        return {written: manifest.record_file(written)}

    @property
    def tags(self) -> list[str]:
        return [tag for _, tag, _, _ in self.calls]


class RecordingBoard:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, int, float]] = []

    def scalar(self, tag: str, value: float | None, iteration: int, consumed_samples: int | None = None) -> None:
        self.scalars.append((tag, iteration, value))


class Saving:
    """A Checkpointer over tmp_path/checkpoints with the stand-in engine, and what it was asked for."""

    def __init__(self, folder: Path, saves: SaveSchedule, fault=lambda iteration: None) -> None:
        self.engine, self.board, self.lines, self.metas = RecordingEngine(), RecordingBoard(), [], 0
        metrics = Metrics(self.board, self.lines.append, train_iters=100, log_interval=1, flops_per_token=1.0,
                          peak_tflops=None, world_size=1, curriculum=False)
        about = {"run_id": "", "experiment": "tiny", "optimizer": True,
                 "layout": {"tensor": 1, "pipeline": 1, "data": 1, "zero_stage": 0, "precision": "fp32"}}
        self.checkpointer = ckpt.Checkpointer(folder, saves, self.engine, self.meta, lambda: about, metrics, fault)

    def meta(self) -> dict:
        self.metas += 1
        return dict(META)


@pytest.fixture
def saving(tmp_path: Path, single_rank_group: None):
    return lambda saves, **kw: Saving(tmp_path / "checkpoints", saves, **kw)


def test_seed_003_interpretability_schedule_in_one_run():
    saves = SEED_003.steps(5500)
    assert saves == [s for s in range(1, 5501) if SEED_003.due(s)]  # by ranges == step by step
    assert saves[:10] == list(range(10, 101, 10))
    assert saves[10:12] == [118, 136] and 1000 in saves and 982 in saves
    assert [s for s in saves if s > 1000] == [2500, 4000, 5500]
    assert len([s for s in saves if 100 < s <= 1000]) == 50


def test_plain_save_interval_is_megatrons_modulo():
    assert SaveSchedule((), 10).steps(25) == [10, 20, 25]
    assert SaveSchedule((), None).steps(20) == [20]
    assert [s for s in range(1, 26) if SaveSchedule((), 10).due(s)] == [10, 20]


def test_the_trainer_saves_at_the_schedules_steps_only(saving, tmp_path: Path) -> None:
    saves = SaveSchedule(((4, 2),), 3)  # every 2 steps up to 4, then every 3 counted from 4
    run = saving(saves)
    for iteration in range(1, 14):
        run.checkpointer.step_done(iteration)
    assert run.engine.tags == ["global_step2", "global_step4", "global_step7", "global_step10", "global_step13"]
    assert run.engine.tags == [f"global_step{s}" for s in saves.steps(13)]  # what the plan lists
    assert [c.step for c in layout.list_checkpoints(tmp_path / "checkpoints")] == [2, 4, 7, 10, 13]


def test_a_save_writes_the_rng_state_and_meta_before_the_engine_saves(saving, tmp_path: Path) -> None:
    run = saving(SaveSchedule((), 10))
    run.checkpointer.save(7)
    folder = tmp_path / "checkpoints"
    assert run.engine.calls == [(str(folder), "global_step7", {"iteration": 7}, [layout.META, "rng_state_000.pt"])]
    assert json.loads((folder / "global_step7" / layout.META).read_text()) == {**META, "commit": "manifest.json"}
    assert run.checkpointer.last_saved == 7 and run.metas == 1
    [(tag, iteration, elapsed)] = run.board.scalars
    assert (tag, iteration) == ("save-checkpoint-time", 7) and elapsed >= 0
    assert len(run.lines) == 1


def test_a_save_commits_a_manifest_of_every_file_and_then_moves_latest(saving, tmp_path: Path) -> None:
    run = saving(SaveSchedule((), 10))
    run.checkpointer.save(10)
    run.checkpointer.save(20)
    folder = tmp_path / "checkpoints"
    assert run.engine.latest_during == [None, "global_step10"]  # `latest` moves only after the save committed
    assert layout.latest_tag(folder) == "global_step20"
    found = manifest.read(folder / "global_step20")
    assert found is not None and found.iteration == 20 and found.optimizer and found.layout["precision"] == "fp32"
    assert sorted(found.files) == [layout.META, "mp_rank_00_model_states.pt", "rng_state_000.pt"]
    assert sorted(found.files) == manifest.files_on_disk(folder / "global_step20")
    for rel, rec in found.files.items():
        assert rec == manifest.hash_file(folder / "global_step20" / rel)
    assert [c.step for c in layout.complete_checkpoints(folder)] == [10, 20]


def test_the_manifest_holds_what_each_rank_hashed_as_it_wrote_and_rank_0_vouches_for_the_rest(
        saving, tmp_path: Path) -> None:
    """A rank's record is of the bytes as it wrote them: a file changed on disk before the commit keeps its rank's
    record (so the next resume finds it damaged); a file no rank reported (DeepSpeed writes helpers beside the
    states) is hashed by rank 0 and listed too."""
    run = saving(SaveSchedule((), 10))
    plain = run.engine.save

    def changed_after_writing(folder: Path, tag: str, client_state: dict, after_each=None):
        written = plain(folder, tag, client_state, after_each)
        [file] = written
        file.write_bytes(file.read_bytes() + b"changed")
        (Path(folder) / tag / "zero_to_fp32.py").write_text("# a helper no rank reports\n")
        return written

    run.engine.save = changed_after_writing
    run.checkpointer.save(10)
    path = tmp_path / "checkpoints" / "global_step10"
    found = manifest.read(path)
    assert found.files["zero_to_fp32.py"] == manifest.hash_file(path / "zero_to_fp32.py")
    assert [m.path for m in manifest.verify(path, found).mismatches] == ["mp_rank_00_model_states.pt"]


def test_a_file_a_rank_recorded_that_is_gone_or_outside_the_folder_refuses_the_commit(saving, tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    run = saving(SaveSchedule((), 10))
    run.checkpointer.save(10)
    plain = run.engine.save
    stray = tmp_path / "elsewhere.pt"

    def lost(folder: Path, tag: str, client_state: dict, after_each=None):
        written = plain(folder, tag, client_state, after_each)
        for file in written:
            file.unlink()  # recorded, then gone before the commit
        return written

    def outside(folder: Path, tag: str, client_state: dict, after_each=None):
        stray.write_bytes(b"states")
        return {**plain(folder, tag, client_state, after_each), stray: manifest.record_file(stray)}

    for step, save, named in ((20, lost, "mp_rank_00_model_states.pt"), (30, outside, "elsewhere.pt")):
        run.engine.save = save
        with pytest.raises(layout.CheckpointError, match=named):
            run.checkpointer.save(step)
        assert manifest.read(folder / f"global_step{step}") is None
    assert layout.latest_tag(folder) == "global_step10"


def test_the_debug_kill_in_a_save_reaches_the_engine_at_its_step_only(saving) -> None:
    def kill(path: Path) -> None: ...

    run = saving(SaveSchedule((), 10), fault=lambda iteration: kill if iteration == 20 else None)
    run.checkpointer.save(10)
    run.checkpointer.save(20)
    assert run.engine.after_each == [None, kill]


def test_a_save_is_reported_with_its_folder_and_time(saving, tmp_path: Path) -> None:
    run = saving(SaveSchedule((), 10))
    run.checkpointer.save(10)
    [(step, elapsed)] = [(step, value) for tag, step, value in run.board.scalars if tag == "save-checkpoint-time"]
    assert step == 10 and 0 <= elapsed < 60
    assert any(str(tmp_path / "checkpoints") in line and "iteration" in line for line in run.lines)


def test_a_save_of_a_step_an_earlier_attempt_left_sets_that_folder_aside(saving, tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    (folder / "global_step10").mkdir(parents=True)
    (folder / "global_step10" / "layer_00-model_states.pt").write_bytes(b"cut short")
    run = saving(SaveSchedule((), 10))
    run.checkpointer.save(10)
    [aside] = set_aside.read_checked(folder).records
    assert aside.tag == "global_step10" and (Path(aside.folder) / "layer_00-model_states.pt").read_bytes() == b"cut short"
    assert "layer_00-model_states.pt" not in manifest.read(folder / "global_step10").files


def test_a_full_disk_during_a_save_is_one_error_and_no_commit(saving, tmp_path: Path) -> None:
    run = saving(SaveSchedule((), 10))
    run.checkpointer.save(10)

    def full(folder: Path, tag: str, client_state: dict, after_each=None) -> dict[Path, manifest.FileRecord]:
        raise OSError(28, "No space left on device", str(Path(folder) / tag / "mp_rank_00_model_states.pt"))

    run.engine.save = full
    with pytest.raises(layout.CheckpointError, match="No space left on device") as caught:
        run.checkpointer.save(20)
    assert "global_step10" in str(caught.value)  # what the next launch resumes from
    assert layout.latest_tag(tmp_path / "checkpoints") == "global_step10"
    assert manifest.read(tmp_path / "checkpoints" / "global_step20") is None
    assert [c.step for c in layout.complete_checkpoints(tmp_path / "checkpoints")] == [10]


def test_the_saved_rng_state_gives_back_the_same_draws(saving, tmp_path: Path) -> None:
    run = saving(SaveSchedule((), 10))
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    run.checkpointer.save(3)
    drawn = (torch.rand(4), random.random(), np.random.rand(2))
    assert ckpt.load_rng(tmp_path / "checkpoints" / "global_step3", 0)
    again = (torch.rand(4), random.random(), np.random.rand(2))
    assert torch.equal(drawn[0], again[0]) and drawn[1] == again[1] and np.array_equal(drawn[2], again[2])


def test_a_stop_right_after_a_scheduled_save_writes_nothing_twice(saving) -> None:
    run = saving(SaveSchedule((), 4))
    run.checkpointer.step_done(4)
    run.checkpointer.save(4)  # the exit interval, a signal or the end at the same step
    assert run.engine.tags == ["global_step4"] and run.metas == 1
    run.checkpointer.step_done(5)
    run.checkpointer.save(5)
    assert run.engine.tags == ["global_step4", "global_step5"]


def test_the_step_a_task_resumed_from_is_not_saved_again(saving, tmp_path: Path) -> None:
    run = saving(SaveSchedule((), 10))
    run.checkpointer.resumed_at(10)
    run.checkpointer.step_done(10)
    run.checkpointer.save(10)  # a task stopped (kill switch, signal) before its first step
    assert run.engine.calls == [] and run.metas == 0
    assert not (tmp_path / "checkpoints" / "global_step10").exists()
    for iteration in range(11, 21):
        run.checkpointer.step_done(iteration)
    assert run.engine.tags == ["global_step20"]


def test_without_a_save_interval_only_a_stop_saves(saving) -> None:
    run = saving(SaveSchedule((), None))
    for iteration in range(1, 51):
        run.checkpointer.step_done(iteration)
    assert run.engine.calls == []
    run.checkpointer.save(50)
    assert run.engine.tags == ["global_step50"]


def test_another_rank_writes_its_rng_state_and_no_meta(saving, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    run = saving(SaveSchedule((), 10))
    run.checkpointer.save(10)
    assert [held for _, _, _, held in run.engine.calls] == [["rng_state_001.pt"]]
    assert run.metas == 0 and not (tmp_path / "checkpoints" / "global_step10" / layout.META).exists()
    assert manifest.read(tmp_path / "checkpoints" / "global_step10") is None  # rank 0 commits, after every rank


def test_a_resume_never_goes_through_a_linked_checkpoint(tmp_path: Path) -> None:
    """The trainer refuses a `global_stepN` that is a link, as rollback, backup and info do."""
    from bigscience_ops.checkpoints.layout import CheckpointError
    from bigscience_ops.trainer.checkpointing import find_resume

    elsewhere = tmp_path / "elsewhere" / "global_step5"
    elsewhere.mkdir(parents=True)
    (elsewhere / "bsops.json").write_text('{"iteration": 5}')
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "global_step5").symlink_to(elsewhere)
    (checkpoints / "latest").write_text("global_step5")
    with pytest.raises(CheckpointError, match="global_step5"):
        find_resume(checkpoints)
