"""`bsops plan` reproduces the training notes' numbers and checks every rule before launching."""

from __future__ import annotations

import dataclasses
import pytest

from bigscience_ops import sizing
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import ConfigError
from bigscience_ops.plan import make_plan, valid_node_counts
from bigscience_ops.planview import plan_text
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schedule.batch_lr import BatchSchedule, Curriculum, LRSchedule
from bigscience_ops.schema import CurriculumConfig, NodePhase
from bigscience_ops.sizing import count_parameters, estimate_days, padded_vocab_size


@pytest.fixture(scope="module")
def tr1():
    return load_experiment("tr1-13B")


def with_slurm(exp, **changes):
    """Slurm settings changed; a node count given replaces the experiment's node schedule (one phase)."""
    single = {"node_schedule": []} if "nodes" in changes else {}
    return dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, **single, **changes))


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
    assert round(plan.storage.weights_bytes / 1e9) == 26


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


# ----------------------------------------------------------------------------- memory per GPU



def saved_step_by_step(exp, last: int) -> list[int]:
    """The trainer's view of the save rule: SaveSchedule.due asked at every step, plus the final save."""
    saves = run_schedule(exp).saves
    steps = [s for s in range(1, last + 1) if saves.due(s)]
    return steps if steps and steps[-1] == last else steps + [last]


def with_parallel(exp, **changes):
    return dataclasses.replace(exp, parallel=dataclasses.replace(exp.parallel, **changes))


def test_layer_activations_follow_megatron_count(tr1) -> None:
    m = tr1.model
    s, h, a = m.seq_length, m.hidden_size, m.num_attention_heads
    # Korthikanti et al. 2022: sbh(34 + 5as/h) without tensor parallelism, 10 + 24/t + 5as/(ht) with it.
    assert sizing.layer_activation_bytes(m, 1, 1) == s * h * (34 + 5 * a * s / h)
    assert sizing.layer_activation_bytes(m, 2, 2) == 2 * s * h * (10 + 12 + 5 * a * s / (2 * h))
    assert sizing.checkpointed_layer_bytes(m, 1) == 2 * s * h


def test_1f1b_stage_i_holds_pp_minus_i_micro_batches(tr1) -> None:
    mem = make_plan(tr1).memory
    assert [a.in_flight for a in mem.activations] == [4, 3, 2, 1]
    assert [a.logits > 0 for a in mem.activations] == [False, False, False, True]
    # Fewer micro-batches per step than stages: never more in flight than there are.
    assert [sizing.in_flight_micro_batches(i, 4, 2) for i in range(4)] == [2, 2, 2, 1]


def test_tr1_13B_fits_a_v100_32g_only_with_activation_checkpointing(tr1) -> None:
    plan = make_plan(tr1)
    mem = plan.memory
    assert mem.gpu_limit == 32 * 2**30 and mem.gpu_limit_source == "slurm.constraint v100-32g"
    assert mem.sharded_over == 8  # ZeRO-1 over DP 8
    assert mem.largest_stage == 0 and mem.largest_total == max(mem.total_per_stage)
    assert mem.largest_total < 0.85 * mem.gpu_limit and not plan.errors
    plain = make_plan(with_parallel(tr1, activation_checkpointing=False))
    assert plain.memory.activations[0].stored == 4 * 10 * sizing.layer_activation_bytes(tr1.model, 1, 2)
    assert plain.memory.largest_total > plain.memory.gpu_limit
    [error] = [p for p in plain.errors if p.field == "slurm.constraint"]
    assert error.value == "v100-32g"


def test_near_the_limit_warns_and_above_errors(tr1) -> None:
    total = make_plan(tr1).memory.largest_total
    near = make_plan(with_slurm(tr1, gpu_memory_gb=total / 2**30 / 0.95))
    assert [p.field for p in near.warnings if p.field == "slurm.gpu_memory_gb"] == ["slurm.gpu_memory_gb"]
    assert not near.errors
    over = make_plan(with_slurm(tr1, gpu_memory_gb=total / 2**30 * 0.99))
    assert [p.field for p in over.errors] == ["slurm.gpu_memory_gb"]
    unknown = make_plan(with_slurm(tr1, constraint=None))
    assert unknown.memory.gpu_limit is None and not unknown.errors


def test_tr8_104B_stage_fits_its_32g_gpus() -> None:
    """The tr8-104B notes: 128 GPUs of 32 GB per replica for 1872 GB of model states (18 x 104B)."""
    plan = make_plan(load_experiment("tr8-104B"))
    mem = plan.memory
    assert mem.training_seed_rounded == 1872 * 10**9
    assert mem.training_total < 128 * 32 * 2**30
    assert mem.largest_total < mem.gpu_limit == 32 * 2**30


def test_bf16_optimizer_shards_over_dp_even_at_zero_0(tr1) -> None:
    bf16 = dataclasses.replace(tr1, train=dataclasses.replace(tr1.train, precision="bf16"))
    assert make_plan(with_parallel(bf16, zero_stage=0)).memory.sharded_over == 8
    assert make_plan(with_parallel(tr1, zero_stage=0)).memory.sharded_over == 1
    zero0 = make_plan(with_parallel(tr1, zero_stage=0)).memory
    # Unsharded, every GPU keeps the 12 bytes of fp32 weights and Adam moments per parameter.
    assert zero0.model_states_per_stage[1] == 18 * make_plan(tr1).params.per_stage[1]


@pytest.mark.parametrize("constraint, gb", [("v100-32g", 32), ("v100-16g", 16), ("a100", 80), ("h100&ib", 80),
                                            ("a100-40g|a100-80g", 40), ("mi250-64g", 64), ("cpu", None), (None, None)])
def test_gpu_memory_known_from_constraint(constraint, gb) -> None:
    found = sizing.gpu_memory_from_constraint(constraint)
    assert (found[1] if found else None) == gb


# ----------------------------------------------------------------------------- storage over the run

def test_tr1_13B_schedule_writes_268_checkpoints_of_183GB(tr1) -> None:
    plan = make_plan(tr1)
    st = plan.storage
    expected = saved_step_by_step(tr1, plan.train_iters)
    assert st.schedule_saves == len(expected) == 268
    # Each node phase ends with a save (the task exits, the next trains at the new size): steps 4960 and 117694.
    assert st.saves == 270 and st.exit_saves == 2
    # 14 bytes per parameter, and the tied word embedding's fp32 master and Adam moments on both end stages.
    assert round(st.checkpoint_bytes / 1e9) == 183
    # 45.65 days in tasks of 1190 minutes: 56 tasks, 2 of them end at phase boundaries, 54 at the time limit.
    assert st.time_exit_saves == 54
    assert 59e12 < st.written == (270 + 54) * st.checkpoint_bytes < 60e12
    assert st.scratch == st.written and st.backup == 0


def test_retention_and_backup_bring_it_down(tr1) -> None:
    backup = dataclasses.replace(tr1.backup, dest="/store/tr1", keep_last=3, keep_every=10_000,
                                 keep_optimizer_every=100_000)
    plan = make_plan(dataclasses.replace(tr1, backup=backup))
    st = plan.storage
    steps = sorted(set(saved_step_by_step(tr1, plan.train_iters)) | {4960, 117694})
    kept = set(steps[-3:]) | {s for s in steps if s % 10_000 == 0}
    assert st.kept_on_scratch == len(kept) and st.scratch == len(kept) * st.checkpoint_bytes
    whole = {steps[-1]} | {s for s in steps if s % 100_000 == 0}
    assert st.backed_up_whole == len(whole)
    assert st.backup == len(whole) * st.checkpoint_bytes + (270 + 54 - len(whole)) * st.weights_bytes
    assert st.scratch < st.written / 10 and st.backup < st.written / 5


def test_save_steps_match_the_trainer_for_every_experiment() -> None:
    for name in ["tiny", "tr1-13B-short", "gpt-760M", "tr8-104B"]:
        exp = load_experiment(name)
        last = make_plan(exp).train_iters
        assert run_schedule(exp).saves.steps(last) == saved_step_by_step(exp, last), name


# ----------------------------------------------------------------------------- The plan under curriculum learning: tokens trained, per node phase, and token-based LR lengths.
# Seed 001 (tr8-104B's curriculum run) sets total_curriculum_step to about half the steps and gives
# the LR warmup and decay in tokens, which the trainer counts at each step's curriculum length; the
# plan must count them the same way rather than as samples x seq_length.


def brute_force(curriculum: Curriculum, batch: BatchSchedule, steps: int) -> list[int]:
    """Tokens trained after each step 1..steps, one step at a time."""
    out, total = [], 0
    for step in range(1, steps + 1):
        total += (batch.consumed_after(step) - batch.consumed_after(step - 1)) * curriculum.seqlen_at(step)
        out.append(total)
    return out


@pytest.mark.parametrize("batch", [BatchSchedule(64), BatchSchedule(64, 8, 8, 1000)], ids=["fixed", "rampup"])
def test_tokens_through_and_steps_to_reach_equal_counting_step_by_step(batch):
    c = Curriculum(16, 256, 8, 90)
    counter = c.token_counter(batch)
    expected = brute_force(c, batch, 300)
    assert [counter.through(s) for s in range(1, 301)] == expected
    assert counter.through(0) == 0
    assert sum(p[3] for p in c.phases(batch, 300)) == expected[-1]
    for tokens in [1, expected[0], expected[0] + 1, expected[89], expected[89] + 1, expected[150] - 3, expected[-1]]:
        step = counter.steps_to_reach(tokens)
        assert expected[step - 1] >= tokens and (step == 1 or expected[step - 2] < tokens), tokens


def test_plan_counts_trained_tokens_per_phase_and_token_based_lr_through_the_curriculum():
    base = load_experiment("tr8-104B")
    lr = dataclasses.replace(base.lr_schedule, warmup_samples=None, warmup_iters=None, decay_samples=None,
                             decay_iters=None, warmup_tokens=375_000_000, decay_tokens=260_000_000_000)
    slurm = dataclasses.replace(base.slurm, node_schedule=[NodePhase(nodes=base.slurm.nodes),
                                                           NodePhase(nodes=2 * base.slurm.nodes, from_iteration=20_000)])
    full = make_plan(dataclasses.replace(base, lr_schedule=lr, slurm=slurm))
    exp = dataclasses.replace(base, lr_schedule=lr, slurm=slurm,
                              curriculum=CurriculumConfig(total_curriculum_step=36_000, min_difficulty=64))
    plan = make_plan(exp)
    seq = exp.model.seq_length
    assert full.tokens == full.full_length_tokens == plan.full_length_tokens == plan.train_samples * seq
    assert full.curriculum_steps is None and plan.curriculum_steps == 36_000
    counter = Curriculum(64, seq, 8, 36_000).token_counter(run_schedule(exp).batch)
    assert plan.tokens == counter.through(plan.train_iters) < full.tokens
    assert sum(ph.tokens for ph in plan.phases) == plan.tokens
    assert plan.phases[0].tokens == counter.through(20_000)
    assert plan.days < full.days
    assert plan.phases[1].days == pytest.approx(full.phases[1].days * plan.phases[1].tokens / full.phases[1].tokens)
    # Warmup and decay in tokens end later than tokens / seq_length samples would say: early steps are short.
    assert plan.warmup_steps == counter.steps_to_reach(375_000_000) > full.warmup_steps
    assert plan.decay_steps == counter.steps_to_reach(260_000_000_000) > full.decay_steps
    text = plan_text(plan, exp)
    assert "curriculum (fixed_linear): steps 1-36,000 train samples cut to 64 growing to 2048 tokens" in text
    assert f"{plan.tokens / plan.full_length_tokens:.1%}" in text and "curriculum" not in plan_text(full, exp)


def test_skipped_iterations_and_the_samples_they_consume_are_in_the_plan(trainings, tmp_path) -> None:
    """train.skip_iterations and a rollback's recorded skip (the launch plan adds it), in text and JSON; the
    samples counted step by step through tr1-13B's rampup. Without skips the plan has no skip line or key."""
    import json

    from bigscience_ops.run import rollbacks
    from bigscience_ops.planview import plan_data

    (trainings / "skipper.yaml").write_text(f"base: tr1-13B\npaths: {{output: {json.dumps(str(tmp_path / 'run'))}}}\n"
                                            "train: {skip_iterations: ['100-120', '30000']}\n")
    rollbacks.append(tmp_path / "run", rollbacks.Rollback(0.0, 5000, 4000, "4001-4100", ""))
    from bigscience_ops.run.records import as_recorded

    assert load_experiment("skipper", trainings).train.skip_iterations == ["100-120", "30000"]
    exp = as_recorded(load_experiment("skipper", trainings))
    assert exp.train.skip_iterations == ["100-120", "30000", "4001-4100"]
    plan = make_plan(exp)
    batch = run_schedule(exp).batch
    expected = [(a, b, sum(batch.batch_size_of_step(i) for i in range(a, b + 1))) for a, b in
                [(100, 120), (4001, 4100), (30000, 30000)]]
    assert [(s.first, s.last, s.samples) for s in plan.skips] == expected
    assert [s.tokens for s in plan.skips] == [n * exp.model.seq_length for _, _, n in expected]
    assert batch.batch_size_of_step(100) < batch.batch_size_of_step(30000)  # in the rampup: fewer samples a step
    text = plan_text(plan, exp)
    assert "skipped iterations (train.skip_iterations, a rollback's included): data consumed, no update" in text
    assert f"    100-120: 21 iterations, {expected[0][2]:,} samples" in text and "consumed without training" in text
    assert f"    in all: 122 iterations, {sum(n for _, _, n in expected):,} samples" in text
    data = json.loads(json.dumps(plan_data(plan)))
    assert [(s["first"], s["last"], s["iterations"], s["samples"]) for s in data["skips"]] == [
        (a, b, b - a + 1, n) for a, b, n in expected]
    plain = make_plan(load_experiment("tr1-13B"))
    assert plain.skips == [] and "skips" not in plan_data(plain) and "skipped iterations" not in plan_text(plain, exp)


def test_a_skip_past_the_last_iteration_is_a_warning(tr1) -> None:
    last = run_schedule(tr1).train_iters
    exp = dataclasses.replace(tr1, train=dataclasses.replace(tr1.train, skip_iterations=[f"{last - 1}-{last + 5}"]))
    plan = make_plan(exp)
    [skip] = plan.skips
    assert skip.samples == 2 * tr1.batch.global_batch_size  # only the iterations the run has
    [warning] = [p for p in plan.warnings if p.field == "train.skip_iterations"]
    assert f"past the last iteration {last}" in warning.message


# ----------------------------------------------------------------------------- time on CPU, and the budget

def test_a_cpu_run_gets_no_time_from_gpu_tflops() -> None:
    """tiny (slurm.device: cpu) took 9 minutes where 45 TFLOPs/GPU said 0.19 seconds: no estimate on CPU."""
    exp = load_experiment("tiny")
    plan = make_plan(exp)
    assert plan.days is None and [ph.days for ph in plan.phases] == [None]
    text = plan_text(plan, exp)
    assert "no time estimate on CPU (slurm.device: cpu): the TFLOPs assumption is for GPUs" in text
    assert "TFLOPs/GPU" not in text and "seconds" not in text
    gpu = dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, device="gpu"))
    assert make_plan(gpu).days == pytest.approx(estimate_days(make_plan(gpu).tokens, plan.params.total, 2, 45))


def _budget(exp, **values):
    return dataclasses.replace(exp, estimate=dataclasses.replace(exp.estimate, **values))


def test_a_plan_far_beyond_the_budget_says_so_in_one_line(tr1) -> None:
    plan = make_plan(tr1)  # 45.65 days; 59.4 TB left on scratch (324 checkpoints, no retention)
    assert plan.days == pytest.approx(45.65, abs=0.01) and round(plan.storage.scratch / 1e12, 1) == 59.4
    assert not [p for p in plan.problems if "budget" in p.field]
    # within 1.25x of the budget: no warning
    assert not [p for p in make_plan(_budget(tr1, budget_days=37, budget_storage_tb=48)).problems if "budget" in p.field]
    over = make_plan(_budget(tr1, budget_days=30, budget_storage_tb=40))
    found = {p.field: p for p in over.problems if "budget" in p.field}
    assert found["estimate.budget_days"].severity == found["estimate.budget_storage_tb"].severity == "warning"
    assert str(found["estimate.budget_days"]) == ("estimate.budget_days: 30: the plan estimates 45.7 days at 45 "
                                                  "TFLOPs/GPU, 1.5x the budget")
    assert "fill 59.4 TB, 1.5x the budget" in str(found["estimate.budget_storage_tb"])
    assert not over.errors
    lines = [line for line in plan_text(over, tr1).splitlines() if "budget" in line]
    assert len(lines) == 2 and all(line.startswith("  - warning: estimate.budget_") for line in lines)
    # retention brings the scratch down under the budget
    kept = dataclasses.replace(tr1.backup, keep_last=3)
    assert not [p for p in make_plan(dataclasses.replace(_budget(tr1, budget_storage_tb=40), backup=kept)).problems
                if "budget" in p.field]
    # tiny on CPU has no days to compare: only its storage is checked
    tiny = make_plan(_budget(load_experiment("tiny"), budget_days=1e-6, budget_storage_tb=1e-6))
    assert [p.field for p in tiny.problems if "budget" in p.field] == ["estimate.budget_storage_tb"]


@pytest.mark.parametrize("field, value", [("budget_days", 0), ("budget_days", -1), ("budget_storage_tb", 0),
                                          ("budget_storage_tb", 2e6)])
def test_budget_fields_out_of_bounds_are_refused(tmp_path, field, value) -> None:
    (tmp_path / "bad.yaml").write_text(f"base: tiny\nestimate: {{{field}: {value}}}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("bad", tmp_path)
    assert f"estimate.{field}" in str(err.value) and str(value) in str(err.value)
