"""The plan under curriculum learning: tokens trained, per node phase, and token-based LR lengths.

Seed 001 (tr8-104B's curriculum run) sets total_curriculum_step to about half the steps and gives
the LR warmup and decay in tokens, which the trainer counts at each step's curriculum length; the
plan must count them the same way rather than as samples x seq_length.
"""

from __future__ import annotations

import dataclasses

import pytest

from bigscience_ops.config import load_experiment

from bigscience_ops.schema import CurriculumConfig, NodePhase
from bigscience_ops.plan import make_plan
from bigscience_ops.run_schedule import run_schedule
from bigscience_ops.planview import plan_text
from bigscience_ops.schedules import BatchSchedule, Curriculum


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
