"""`bsops plan` reproduces the training notes' numbers and checks every rule before launching."""

from __future__ import annotations

import dataclasses
import pytest

from bigscience_ops.config import load_experiment
from bigscience_ops.plan import (
    count_parameters, estimate_days, make_plan, padded_vocab_size, valid_node_counts,
)
from bigscience_ops.schedules import BatchSchedule, LRSchedule


@pytest.fixture(scope="module")
def tr1():
    return load_experiment("tr1-13B")


def with_slurm(exp, **changes):
    return dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, **changes))


def test_model_sizes_match_the_seeds(tr1) -> None:
    assert round(count_parameters(tr1.model).seed_formula / 1e9) == 13
    tr8 = load_experiment("tr8-104B")
    assert round(count_parameters(tr8.model).seed_formula / 1e9) == 104
    assert round(make_plan(tr8).params.total / 1e9) == 104


def test_tr8_copied_ffn_would_be_58B_and_is_warned() -> None:
    tr8 = load_experiment("tr8-104B")
    copied = dataclasses.replace(tr8.model, ffn_hidden_size=20480)
    assert 56e9 < count_parameters(copied).total < 58e9  # the chronicles' "58B", not 104B
    plan = make_plan(dataclasses.replace(tr8, model=copied))
    [warning] = [p for p in plan.warnings if p.field == "model.ffn_hidden_size"]
    assert "tr8" in warning.message and warning.value == 20480
    assert not plan.errors


def test_megatron_7_5B_rank_count_and_vocab_padding() -> None:
    exp = load_experiment("megatron-7.5B")
    assert padded_vocab_size(50257, 128, 8) == 51200
    params = count_parameters(exp.model, tensor_parallel=8, pipeline_parallel=1)
    assert params.padded_vocab == 51200
    assert params.per_stage == (941594624,)  # "rank (4, 0): 941594624"
    plan = make_plan(exp)
    assert plan.train_iters == 508626  # "iteration 1/  508626"
    assert plan.dataset_sizes == (146484375, 5863680, 11520)  # "datasets target sizes"


def test_pipeline_stages_sum_to_total_plus_the_tied_copy(tr1) -> None:
    params = count_parameters(tr1.model, tensor_parallel=1, pipeline_parallel=4)
    word = params.padded_vocab * tr1.model.hidden_size
    assert sum(params.per_stage) == params.total + word


def test_training_memory_seed_and_exact(tr1) -> None:
    plan = make_plan(tr1)
    assert plan.memory.training_seed_rounded == 234 * 10**9  # 18 x 13
    assert plan.memory.training_total == 18 * plan.params.total
    tr8 = make_plan(load_experiment("tr8-104B"))
    assert tr8.memory.training_seed_rounded == 1872 * 10**9  # 18 x 104
    # The tr1-13B notes' checkpoints without optimizer states are "26GB": 2 bytes per parameter.
    assert round(plan.memory.checkpoint_without_optimizer / 1e9) == 26


def test_days_estimate_seed_003() -> None:
    assert f"{estimate_days(300e9, 13e9, 256, 45):.2f}" == "31.35"


def test_tr1_rampup_increments_exact_and_seed_rounded(tr1) -> None:
    plan = make_plan(tr1)
    table = plan.increments
    assert len(table) == 63
    assert all(round(inc.nominal_samples) == 79365 for inc in table)
    assert [inc.naive_steps for inc in table[:4]] == [4960, 2480, 1653, 1240]  # the seed's figures
    assert [inc.steps for inc in table[:4]] == [4961, 2480, 1654, 1240]  # what Megatron runs
    assert [inc.global_batch_size for inc in table[:4]] == [16, 32, 48, 64]
    assert table[-1].global_batch_size == 1008
    assert sum(inc.steps for inc in table) == plan.rampup_steps


def test_tr1_iterations_and_consumed_samples(tr1) -> None:
    plan = make_plan(tr1)
    assert plan.train_iters == 311541  # "iteration 168000/ 311541"
    schedule = BatchSchedule(1024, 16, 16, 5_000_000)
    assert schedule.consumed_after(168000) == 153013584  # "consumed samples: 153013584"


def test_warmup_shown_in_samples_and_steps_with_the_seed_mistake(tr1) -> None:
    plan = make_plan(tr1)
    assert plan.warmup_samples == 216_320
    assert plan.warmup_steps == 8641  # not the 2000 steps the tr1-13B notes meant
    assert plan.decay_samples == 126_953_125  # 260B tokens / 2048
    assert any("216_320" in n and "8641" in n for n in plan.notes)
    schedule = BatchSchedule(1024, 16, 16, 5_000_000)
    assert schedule.consumed_after(2000) == 32000  # 2000 steps at GBS 16


def test_warmup_in_iters_converts_through_the_rampup() -> None:
    exp = load_experiment("tiny")
    lr = dataclasses.replace(exp.lr_schedule, warmup_samples=None, warmup_iters=50)
    plan = make_plan(dataclasses.replace(exp, lr_schedule=lr))
    r = exp.batch.rampup
    schedule = BatchSchedule(exp.batch.global_batch_size, r.start, r.increment, r.samples)
    assert schedule.consumed_after(50) < 50 * exp.batch.global_batch_size  # the rampup is in those steps
    assert plan.warmup_samples == schedule.consumed_after(50)
    assert plan.warmup_steps == 50


def test_megatron_batch_schedule_matches_a_plain_loop() -> None:
    """Megatron's update_train_iters and RampupBatchsizeNumMicroBatches, written out plainly."""
    start, inc, ramp, gbs, total = 16, 16, 5_000_000, 1024, 300_000_000
    per = ramp / ((gbs - start) // inc)

    def current(consumed: int) -> int:
        return gbs if consumed > ramp else start + int(consumed / per) * inc

    iters = consumed = 0
    while consumed <= ramp:
        consumed += current(consumed)
        iters += 1
    iters += (total - consumed) // gbs
    schedule = BatchSchedule(gbs, start, inc, ramp)
    assert schedule.train_iters(total) == iters
    for step in (1, 4961, 4962, 23456, 23457, 100000):
        assert schedule.batch_size_of_step(step) == current(schedule.consumed_after(step - 1))
        assert schedule.steps_to_consume(schedule.consumed_after(step)) == step


def test_lr_schedule_is_megatron_annealing() -> None:
    lr = LRSchedule(max_lr=6e-5, min_lr=6e-6, warmup_samples=183105, decay_samples=126953125)
    assert f"{lr.lr_at(50):.3E}" == "1.638E-08"  # the Megatron-on-Slurm recipe: iteration 25, 50 samples
    assert lr.lr_at(183105) == pytest.approx(6e-5)
    assert lr.lr_at(126953125) == pytest.approx(6e-6)
    assert lr.lr_at(10**9) == 6e-6
    mid = (183105 + 126953125) / 2
    assert lr.lr_at(mid) == pytest.approx((6e-5 + 6e-6) / 2)


def test_valid_node_counts_during_and_after_rampup(tr1) -> None:
    plan = make_plan(tr1)
    # The tr1-13B notes: during the rampup DP can be at most 16, so at most 32 nodes.
    assert plan.nodes_during_rampup == [2, 4, 8, 16, 32]
    # After it: up to 8192 GPUs, powers of two only (96 nodes does not work).
    assert max(plan.nodes_after_rampup) * 4 == 8192
    assert 64 in plan.nodes_after_rampup and 128 in plan.nodes_after_rampup
    assert 96 not in plan.nodes_after_rampup


def test_gbs_not_divisible_during_rampup_is_an_error(tr1) -> None:
    plan = make_plan(with_slurm(tr1, nodes=64))  # DP 32 cannot split GBS 16
    [error] = plan.errors
    assert error.field == "batch.rampup" and error.value == 16
    assert make_plan(with_slurm(tr1, nodes=32)).errors == []


def test_gbs_not_divisible_after_rampup_is_an_error() -> None:
    exp = load_experiment("megatron-7.5B")
    plan = make_plan(with_slurm(exp, nodes=5))  # DP 5 does not divide 288
    assert [e.field for e in plan.errors] == ["batch.global_batch_size"]


def test_world_not_a_multiple_of_model_parallel_is_an_error(tr1) -> None:
    plan = make_plan(with_slurm(tr1, nodes=3))  # 12 GPUs, TP x PP = 8
    assert [e.field for e in plan.errors] == ["slurm.nodes"]


def test_train_samples_shorter_than_rampup_is_an_error(tr1) -> None:
    exp = dataclasses.replace(tr1, train=dataclasses.replace(tr1.train, samples=4_000_000))
    assert "train.samples" in [e.field for e in make_plan(exp).errors]


def test_explicit_exit_duration_beyond_time_limit_is_an_error(tr1) -> None:
    ck = dataclasses.replace(tr1.checkpoint, exit_duration_in_mins=1200)
    assert "checkpoint.exit_duration_in_mins" in [e.field for e in make_plan(dataclasses.replace(tr1, checkpoint=ck)).errors]


def test_bundled_experiments_plan_without_errors() -> None:
    for name in ("tr1-13B", "tr1-13B-short", "tr8-104B", "megatron-7.5B", "gpt-760M", "tiny"):
        assert make_plan(load_experiment(name)).errors == [], name


def test_valid_node_counts_respect_gpus_per_node(tr1) -> None:
    assert valid_node_counts(tr1, [1024]) == [2 ** k for k in range(1, 12)]
