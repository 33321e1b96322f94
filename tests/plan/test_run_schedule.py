"""The RunSchedule is computed once and read by the plan, the launch and the trainer: no second route."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bigscience_ops.config.loading import load_experiment
from bigscience_ops.plan import make_plan
from bigscience_ops.launch.launch_plan import build_launch_plan
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schedule.batch_lr import SaveSchedule
from tests.fixtures_runs import commit_checkpoint


def test_the_plan_and_the_trainer_take_their_numbers_from_one_object(tmp_path) -> None:
    """Altering the schedule object alters both the plan and the trainer: neither re-derives it from the config."""
    from bigscience_ops.trainer.train import Trainer

    exp = load_experiment("tiny")
    run = run_schedule(exp)
    altered = dataclasses.replace(run, train_iters=run.train_iters + 7, train_samples=run.train_samples + 7,
                                  warmup_samples=run.warmup_samples + 3, saves=SaveSchedule((), 3))
    plan = make_plan(exp, altered)
    trainer = Trainer(exp, {}, schedule=altered)
    assert trainer.run_schedule is altered
    assert plan.train_iters == trainer.train_iters == run.train_iters + 7
    assert plan.train_samples == run.train_samples + 7
    assert plan.warmup_samples == altered.warmup_samples and plan.warmup_steps == altered.warmup_steps
    assert plan.storage.saves == len(SaveSchedule((), 3).steps(plan.train_iters))
    assert trainer.lr is altered.lr and trainer.schedule is altered.batch
    # Without an object handed over, both compute it with the same function from the experiment.
    assert make_plan(exp).train_iters == Trainer(exp, {}).train_iters == run.train_iters


@pytest.mark.parametrize("name", ["tiny", "tr1-13B", "tr8-104B", "tr1-13B-short"])
def test_the_plan_shows_the_schedule_the_run_runs(name: str) -> None:
    exp = load_experiment(name)
    run = run_schedule(exp)
    plan = make_plan(exp, run)
    assert (plan.train_iters, plan.train_samples) == (run.train_iters, run.batch.consumed_after(run.train_iters))
    assert plan.rampup_steps == run.batch.rampup_steps and plan.increments == run.batch.increments()
    assert [ph.phase for ph in plan.phases] == list(run.node_phases)
    assert plan.storage.schedule_saves == len(run.saves.steps(run.train_iters))
    assert plan.decay_steps == run.batch.steps_to_consume(run.decay_samples)


def test_a_launch_plans_the_experiment_at_its_phase(tmp_path) -> None:
    """build_launch_plan: the phase of the latest checkpoint, the experiment at its node count, the plan of that."""
    exp = load_experiment("tr1-13B")  # 16 -> 64 -> 128 nodes
    exp = dataclasses.replace(exp, paths=dataclasses.replace(exp.paths, checkpoints=str(tmp_path)))
    first = build_launch_plan(exp)
    assert first.iteration == 0 and first.phase.nodes == 16 and first.experiment.slurm.nodes == 16
    second = first.schedule.node_phases[1]
    saved = tmp_path / f"global_step{second.first_step - 1}"  # saved at the boundary
    saved.mkdir()
    (saved / "bsops.json").write_text(json.dumps({"iteration": second.first_step - 1}))
    commit_checkpoint(saved)
    (tmp_path / "latest").write_text(saved.name)
    resumed = build_launch_plan(exp, schedule=first.schedule)
    assert resumed.schedule is first.schedule and resumed.iteration == second.first_step - 1
    assert resumed.phase == second and resumed.experiment.slurm.nodes == second.nodes == 64
    assert resumed.plan.world_size == 64 * exp.slurm.gpus_per_node
    assert resumed.plan.train_iters == first.plan.train_iters == first.schedule.train_iters


def test_a_launch_is_refused_while_the_runs_kill_switch_exists(tmp_path) -> None:
    from bigscience_ops.launch.launch_plan import KillSwitchOn

    exp = load_experiment("tr1-13B")
    switch = tmp_path / "kill switch"
    exp = dataclasses.replace(exp, paths=dataclasses.replace(exp.paths, checkpoints=str(tmp_path)),
                              checkpoint=dataclasses.replace(exp.checkpoint, kill_switch_path=str(switch)))
    assert build_launch_plan(exp).iteration == 0
    switch.touch()
    with pytest.raises(KillSwitchOn, match=f"the kill switch {switch} exists: .* Remove it \\(rm '{switch}'\\)"):
        build_launch_plan(exp)
