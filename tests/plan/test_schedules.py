"""bigscience_ops.schedule.batch_lr' curriculum: the ramp counted stretch by stretch (one per length) equals
counting step by step, and the work grows with the number of lengths, never with the steps."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.schedule.batch_lr import BatchSchedule, Curriculum


def step_by_step(curriculum: Curriculum, last_step: int) -> list[tuple[int, int, int]]:
    out: list[list[int]] = []
    for step in range(1, last_step + 1):
        seqlen = curriculum.seqlen_at(step)
        if out and out[-1][0] == seqlen:
            out[-1][2] = step
        else:
            out.append([seqlen, step, step])
    return [tuple(s) for s in out]


def random_curricula(seed: int, count: int) -> list[Curriculum]:
    """Both regimes: fewer lengths than steps (searched) and about one length per step (computed)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        step = rng.choice([1, 2, 8, 16, 64])
        low = step * rng.randint(1, 20)
        out.append(Curriculum(low, low + step * rng.randint(0, 400), step, rng.randint(1, 1500)))
    return out


@pytest.mark.parametrize("seed", range(2))
def test_stretches_equal_the_lengths_step_by_step(seed: int) -> None:
    for c in random_curricula(seed, 250):
        for last in {1, c.total_steps // 3 + 1, c.total_steps, c.total_steps + 37}:
            assert c.stretches(last) == step_by_step(c, last), (c, last)


@pytest.mark.parametrize("batch", [BatchSchedule(32), BatchSchedule(48, 8, 8, 700)], ids=["fixed", "rampup"])
def test_tokens_through_each_step_and_steps_to_reach_equal_counting_step_by_step(batch: BatchSchedule) -> None:
    for c in random_curricula(7, 60):
        steps = c.total_steps + 50
        counter, expected, total = c.token_counter(batch), [], 0
        for step in range(1, steps + 1):
            total += (batch.consumed_after(step) - batch.consumed_after(step - 1)) * c.seqlen_at(step)
            expected.append(total)
        assert [counter.through(s) for s in range(steps + 1)] == [0, *expected], c
        assert sum(p[3] for p in c.phases(batch, steps)) == expected[-1]
        for tokens in {1, expected[0], expected[0] + 1, expected[len(expected) // 2] - 1, expected[-1],
                       expected[-1] + 1}:
            step = counter.steps_to_reach(tokens)
            reached = expected[step - 1] if step <= steps else counter.through(step)
            assert reached >= tokens and (step == 1 or counter.through(step - 1) < tokens), (c, tokens)


def test_the_work_follows_the_lengths_not_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """tr8-104B's 249 lengths over the longest curriculum accepted: a few evaluations per length."""
    calls = []
    original = Curriculum.seqlen_at
    monkeypatch.setattr(Curriculum, "seqlen_at", lambda self, step: calls.append(step) or original(self, step))
    counter = Curriculum(64, 2048, 8, 2**18 - 1).token_counter(BatchSchedule(2048, 16, 16, 6_000_000))
    assert len(counter._stretches) == 249 and len(calls) < 5 * 249
    assert counter.through(2**18) == sum(
        (counter.batch.consumed_after(last) - counter.batch.consumed_after(first - 1)) * seqlen
        for seqlen, first, last in counter.curriculum.stretches(2**18))


def test_plan_answers_for_the_most_lengths_over_the_longest_curriculum(trainings: Path) -> None:
    """2**18 lengths over 2**18 - 1 steps (each step its own length), the costliest curriculum the schema
    accepts: bsops plan answers (1e18 steps once spun for minutes; the bound now refuses it)."""
    (trainings / "long.yaml").write_text(
        "base: tiny\nmodel: {seq_length: 2097152}\n"
        "curriculum: {total_curriculum_step: 262143, min_difficulty: 8, difficulty_step: 8}\n")
    started = time.process_time()
    result = CliRunner().invoke(main, ["plan", "long", "--trainings-dir", str(trainings)])
    assert "curriculum (fixed_linear): steps 1-262,143 train samples cut to 8 growing to 2097152" in result.output, \
        result.output[-2000:]
    assert time.process_time() - started < 10
