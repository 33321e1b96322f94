"""The trainer and a node schedule: it saves and exits at a phase boundary, refuses a task of the wrong size,
and resumes at the new size even though the new DP could not split the (past) rampup batch sizes."""

from __future__ import annotations

import pytest

from bigscience_ops.schema import NodePhase
from bigscience_ops import plan
from bigscience_ops.schedule.run import run_schedule
from tests.fixtures_trainer import launch, run_ok, scalars, small_experiment, write_run

pytestmark = pytest.mark.slow


def checkpoint_steps(out):
    """The steps of the global_stepN checkpoints (not the universal copies converted beside them)."""
    return sorted(int(p.name.removeprefix("global_step")) for p in (out / "checkpoints").glob("global_step*")
                  if p.name.removeprefix("global_step").isdigit())


def test_phase_boundary_exit_wrong_size_refused_and_resume_at_the_new_size(tmp_path):
    # PP=2 on 1 "node" of 2 processes (DP 1), then 2 nodes (DP 2) once the rampup 4, 6, 8 is over:
    # DP 2 cannot split the rampup's 6, so the old check refused this layout whatever the position.
    exp = small_experiment(tmp_path, train=dict(samples=120), checkpoint=dict(save_interval=100),
                           logging=dict(log_interval=1, eval_interval=100, eval_iters=0))
    boundary = run_schedule(exp).batch.rampup_steps + 2
    exp = small_experiment(tmp_path, train=dict(samples=120), checkpoint=dict(save_interval=100),
                           logging=dict(log_interval=1, eval_interval=100, eval_iters=0),
                           parallel=dict(zero_stage=1),  # DP 1 -> 2 goes through DeepSpeed's universal checkpoint
                           slurm=dict(gpus_per_node=2, nodes=1,
                                      node_schedule=[NodePhase(1), NodePhase(2, from_iteration=boundary)]))
    first, second = run_schedule(exp).phases()
    assert second.first_step == boundary + 1
    assert not plan.make_plan(exp).errors
    write_run(exp, tmp_path)

    one = run_ok(tmp_path, 2)
    assert "node schedule: phase 1 (2 nodes" in one.stdout
    assert checkpoint_steps(tmp_path) == [boundary]  # saved exactly at the boundary, nothing more trained

    again = launch(tmp_path, 2)  # the same size again: refused before any engine is built
    assert again.returncode != 0
    assert "slurm.node_schedule" in again.stderr and "4 processes" in again.stderr

    resumed = run_ok(tmp_path, 4)
    assert f"resumed from {tmp_path / 'checkpoints' / f'global_step{boundary}'}" in resumed.stdout
    total = run_schedule(exp).train_iters
    assert checkpoint_steps(tmp_path)[-1] == total
    losses = scalars(tmp_path / "tensorboard", "lm loss")
    assert sorted(losses) == list(range(1, total + 1))
    assert losses[total] < losses[1]
