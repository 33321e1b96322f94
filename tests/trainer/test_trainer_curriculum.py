"""Curriculum learning by sequence length, token-based LR decay and skipped iteration ranges.

The schedule is checked against DeepSpeed's own CurriculumScheduler and seed 001's settings; the
trainer runs (torchrun, gloo, CPU, PP=2) check the lengths the model was fed, the tokens counted,
the LR driven by those tokens, and that skipped iterations consume data without an update.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schema import CurriculumConfig, SaveRange
from bigscience_ops.errors import ConfigError
from bigscience_ops.schedule.batch_lr import BatchSchedule, Curriculum, LRSchedule, in_skip_range, parse_skip_ranges
from bigscience_ops.trainer.data import truncate
from tests.fixtures_trainer import concurrently, run_ok, scalars, small_experiment, write_run


def test_fixed_linear_equals_deepspeeds_scheduler():
    from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler

    for lo, hi, step, total in [(64, 2048, 8, 36_000), (8, 32, 8, 12), (16, 1024, 16, 999)]:
        ds = CurriculumScheduler({"curriculum_type": "seqlen", "min_difficulty": lo, "max_difficulty": hi,
                                  "schedule_type": "fixed_linear",
                                  "schedule_config": {"total_curriculum_step": total, "difficulty_step": step}})
        ours = Curriculum(lo, hi, step, total)
        probe = sorted({1, 2, 3, total // 2, total - 1, total, total + 1, 3 * total} | set(range(1, 2000, 7)))
        for s in probe:  # DeepSpeed's update_difficulty is stateful and monotone: ask in order
            assert ours.seqlen_at(s) == ds.update_difficulty(s), (lo, hi, step, total, s)


def test_seed_001_settings():
    """tr8-104B: seq 2048, GBS 2048, 300B tokens: 71525 steps, total_curriculum_step ~ 36_000."""
    c = Curriculum(64, 2048, 8, 36_000)
    assert c.seqlen_at(1) == 64 and c.seqlen_at(36_000) == 2048 and c.seqlen_at(71_525) == 2048
    assert all(c.seqlen_at(s) % 8 == 0 for s in range(1, 36_001, 97))
    assert c.seqlen_at(18_000) == 64 + (2048 - 64) // 2 // 8 * 8
    phases = c.phases(BatchSchedule(2048), 71_525)
    assert phases[0][:2] == (64, 1) and phases[-1][0] == 2048 and phases[-1][2] == 71_525
    total = sum(p[3] for p in phases)
    assert total == sum(2048 * c.seqlen_at(s) for s in range(1, 71_526))
    assert 0.74 < total / (71_525 * 2048 * 2048) < 0.76  # the first half trains on about half the tokens


def test_skip_ranges_parse_merge_and_refuse():
    assert parse_skip_ranges(["100-120", "5", "118-130", "131-131"]) == [(5, 5), (100, 131)]
    assert in_skip_range(100, [(100, 131)]) and not in_skip_range(99, [(100, 131)])
    for bad in ["120-100", "0-3", "a-b", "1-2-3"]:
        with pytest.raises(ValueError, match=bad):
            parse_skip_ranges([bad])


def test_config_refusals(tmp_path):
    from bigscience_ops.config.loading import from_dict, to_dict

    data = to_dict(small_experiment(tmp_path))
    with pytest.raises(ConfigError, match="train.skip_iterations"):
        from_dict({**data, "train": {**data["train"], "skip_iterations": ["9-3"]}})
    for curriculum, field in [({"min_difficulty": 12, "difficulty_step": 8, "total_curriculum_step": 5},
                               "curriculum.min_difficulty"),
                              ({"min_difficulty": 64, "total_curriculum_step": 5}, "curriculum.min_difficulty"),
                              ({"min_difficulty": 8, "total_curriculum_step": 0}, "curriculum.total_curriculum_step")]:
        with pytest.raises(ConfigError, match=field):
            from_dict({**data, "curriculum": curriculum})
    ok = from_dict({**data, "curriculum": {"min_difficulty": 8, "total_curriculum_step": 5}})
    assert ok.curriculum == CurriculumConfig(min_difficulty=8, difficulty_step=8, total_curriculum_step=5)


def test_truncate_cuts_tokens_labels_and_mask():
    tokens = torch.arange(2 * 32).view(2, 32)
    batch = (tokens, (tokens + 1, torch.ones(2, 32)))
    t, (labels, mask) = truncate(batch, 8)
    assert t.shape == labels.shape == mask.shape == (2, 8)
    assert torch.equal(labels, tokens[:, :8] + 1)
    assert truncate(batch, 32)[0] is tokens and truncate(batch, None)[0] is tokens


def test_token_decay_follows_tokens_not_samples():
    lr = LRSchedule(1.0, 0.1, warmup_samples=10, decay_samples=100, style="linear", decay_tokens=1000)
    assert lr.lr_at(5, 40) == 0.5  # warmup still in samples
    assert lr.lr_at(50, 100, warmup_end_tokens=100) == 1.0  # the decay starts where the warmup ended
    assert math.isclose(lr.lr_at(50, 550, warmup_end_tokens=100), 0.55)  # half the token span
    assert lr.lr_at(50, 1001, warmup_end_tokens=100) == 0.1
    by_tokens = LRSchedule(1.0, 0.1, 0, 100, "linear", warmup_tokens=200, decay_tokens=1200)
    assert by_tokens.lr_at(99, 100) == 0.5 and math.isclose(by_tokens.lr_at(0, 700), 0.55)


CURRICULUM = CurriculumConfig(min_difficulty=8, difficulty_step=8, total_curriculum_step=12)


def _curriculum_experiment(out):
    exp = small_experiment(out, lr_schedule=dict(decay_tokens=6400), checkpoint=dict(save_interval=50))
    return dataclasses.replace(exp, curriculum=CURRICULUM)


def _skip_experiment(out):
    return small_experiment(out, train=dict(skip_iterations=["5-8", "14-14"]),
                            checkpoint=dict(save_schedule=[SaveRange(until=8, interval=4)], save_interval=50))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """name -> (experiment, run folder, launch) of the curriculum run and the skip-iterations run, side by side."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("curriculum", "skip")}

    def train(name: str, make_exp):
        exp = make_exp(folders[name])
        write_run(exp, folders[name])
        return exp, folders[name], run_ok(folders[name], 2)

    return concurrently({"curriculum": lambda: train("curriculum", _curriculum_experiment),
                         "skip": lambda: train("skip", _skip_experiment)})


@pytest.fixture(scope="module")
def curriculum_run(runs):
    return runs["curriculum"]


@pytest.mark.slow
def test_curriculum_lengths_seen_and_tokens_counted(curriculum_run):
    exp, out, proc = curriculum_run
    steps = range(1, run_schedule(exp).train_iters + 1)
    schedule = run_schedule(exp).batch
    expected = Curriculum(8, 32, 8, 12)
    seen = scalars(out / "tensorboard", "curriculum seqlen")
    assert [seen[s] for s in steps] == [expected.seqlen_at(s) for s in steps]
    assert {8, 16, 24, 32} <= set(seen.values())
    tokens = scalars(out / "tensorboard", "consumed tokens")
    running = 0
    for s in steps:
        running += schedule.batch_size_of_step(s) * expected.seqlen_at(s)
        assert tokens[s] == running, s
    assert running < schedule.consumed_after(len(steps)) * 32
    meta = json.loads((out / "checkpoints" / f"global_step{len(steps)}" / "bsops.json").read_text())
    assert meta["consumed_tokens"] == running and meta["state"]["consumed_train_tokens"] == running
    assert f"consumed tokens: {running:12d}" in proc.stdout
    valid = scalars(out / "tensorboard", "lm loss validation")  # full-length validation between steps
    assert sorted(valid) == [10, 20, 28] and valid[28] < valid[10]


@pytest.mark.slow
def test_lr_decays_by_tokens_trained_on(curriculum_run):
    exp, out, _ = curriculum_run
    run = run_schedule(exp)
    schedule, lr = run.batch, dataclasses.replace(run.lr, decay_tokens=6400)
    seen = scalars(out / "tensorboard", "curriculum seqlen")
    logged = scalars(out / "tensorboard", "learning-rate")
    samples = tokens = 0
    warm_end = None
    for s in sorted(logged):
        gbs = schedule.batch_size_of_step(s)
        samples, tokens = samples + gbs, tokens + gbs * int(seen[s])
        if warm_end is None and samples >= lr.warmup_samples:
            warm_end = tokens
        assert math.isclose(logged[s], lr.lr_at(samples, tokens, warm_end or 0), rel_tol=1e-6), s
    last = max(logged)  # 6400 tokens = 200 samples at full length: in samples the decay would end with the run
    in_samples = dataclasses.replace(run.lr, warmup_tokens=None, decay_tokens=None)
    by_samples = in_samples.lr_at(schedule.consumed_after(last))
    assert by_samples < 1.05 * exp.optimizer.min_lr
    assert logged[last] > 1.5 * by_samples  # the curriculum's short samples slow the decay


@pytest.fixture(scope="module")
def skip_run(runs):
    return runs["skip"]


def _layers(folder):
    return {p.name: torch.load(p, weights_only=True) for p in sorted(folder.glob("layer_*-model_states.pt"))}


@pytest.mark.slow
def test_skipped_iterations_consume_data_without_update(skip_run):
    exp, out, proc = skip_run
    schedule = run_schedule(exp).batch
    ck = out / "checkpoints"
    before, after = _layers(ck / "global_step4"), _layers(ck / "global_step8")
    assert before and before.keys() == after.keys()
    for name in before:
        for key in before[name]:
            assert torch.equal(before[name][key], after[name][key]), (name, key)
    metas = {s: json.loads((ck / f"global_step{s}" / "bsops.json").read_text()) for s in (4, 8)}
    assert metas[4]["consumed_train_samples"] == schedule.consumed_after(4)
    assert metas[8]["consumed_train_samples"] == schedule.consumed_after(8)  # the skipped steps' data is consumed
    assert metas[8]["state"]["lr_scheduler_samples"] == metas[4]["state"]["lr_scheduler_samples"]
    losses = scalars(out / "tensorboard", "lm loss")
    iters = run_schedule(exp).train_iters
    assert sorted(losses) == [s for s in range(1, iters + 1) if s not in (5, 6, 7, 8, 14)]
    final = json.loads((ck / f"global_step{iters}" / "bsops.json").read_text())
    assert final["consumed_train_samples"] == schedule.consumed_after(iters)
    assert losses[iters] < losses[1] - 0.5
