"""Re-evaluating a step replaces its TensorBoard points (driver.write_scalars): one event file per evaluated
checkpoint, the earlier evaluations' files of that step removed, other steps' and the training's left alone."""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path

import pytest

from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.evaluate import driver
from tests.evaluate.test_ops_evaluate_results import eval_result


def _points(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> every (step, value) point over every event file of the folder (none deduplicated)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(str(folder / "events.out.tfevents.*"))):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def test_re_evaluating_a_step_leaves_one_point_per_metric(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    board = tmp_path / "tb"
    exp = load_experiment("tiny")
    exp = dataclasses.replace(exp, paths=dataclasses.replace(exp.paths, tensorboard=str(board)),
                              logging=dataclasses.replace(exp.logging, tensorboard=True))
    training = SummaryWriter(log_dir=str(board))  # the trainer's own file stays
    training.add_scalar("lm loss", 5.0, 10)
    training.close()
    for value in (0.25, 0.5, 0.75):  # step 100 evaluated three times, the last value is what stays
        result = eval_result(100, {"lambada/acc": value})
        written, replaced = driver.write_scalars(exp, result)
        assert written == len(driver.results.metrics(result))
    assert replaced == 1  # the second evaluation's file, once the third's was written
    driver.write_scalars(exp, eval_result(200, {"lambada/acc": 0.1}))
    points = _points(board)
    assert sorted(points["eval/lambada/acc"]) == [(100, 0.75), (200, pytest.approx(0.1))]
    assert sorted(points["eval/lambada/acc vs tokens"]) == [(100 * 8 * 64, 0.75), (200 * 8 * 64, pytest.approx(0.1))]
    assert points["lm loss"] == [(10, 5.0)]
    assert len(driver.earlier_event_files(board, "global_step100")) == 1


def test_a_limited_result_has_tags_of_its_own_and_never_replaces_the_full_points(tmp_path: Path) -> None:
    board = tmp_path / "tb"
    exp = load_experiment("tiny")
    exp = dataclasses.replace(exp, paths=dataclasses.replace(exp.paths, tensorboard=str(board)),
                              logging=dataclasses.replace(exp.logging, tensorboard=True))
    driver.write_scalars(exp, eval_result(100, {"lambada/acc": 0.5}))
    for value in (0.9, 0.8):  # eval.limit 5, twice: its own file replaced, the full one left
        limited = eval_result(100, {"lambada/acc": value})
        limited["bsops"]["limit"] = 5
        driver.write_scalars(exp, limited)
    points = _points(board)
    assert points["eval/lambada/acc"] == [(100, 0.5)]
    assert points["eval-limited/lambada/acc"] == [(100, pytest.approx(0.8))]
    assert len(driver.earlier_event_files(board, "global_step100", driver.LIMITED_PREFIX)) == 1
