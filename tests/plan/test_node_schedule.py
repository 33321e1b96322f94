"""Node schedules: the plan checks and times each phase; launch and the task hooks pick the phase's size."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from bigscience_ops.schedule import nodes as node_schedule

from bigscience_ops import plan, sizing
from bigscience_ops.config.loading import Overrides, apply_overrides
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.schema import NodePhase
from bigscience_ops.errors import ConfigError
from tests.fixtures_trainer import REPO


def write(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.yaml").write_text(text)


@pytest.fixture()
def trainings(tmp_path: Path) -> Path:
    folder = tmp_path / "trainings"
    folder.mkdir()
    write(folder, "tr1-13B", (REPO / "trainings" / "tr1-13B.yaml").read_text())
    return folder


def scheduled(exp, *entries: dict):
    return dataclasses.replace(exp, slurm=dataclasses.replace(
        exp.slurm, node_schedule=[NodePhase(**e) for e in entries], nodes=entries[0]["nodes"]))


def test_the_notes_inputs_give_their_31_35_days(trainings):
    """13B, 300B tokens, 64 nodes x 4 GPUs, 45 TFLOPs: the tr1-13B notes' 31.35 days, as one phase or a schedule."""
    write(trainings, "notes", "base: tr1-13B\ntrain: {samples: 146_484_375}\nslurm: {nodes: 64}\n")
    single = plan.make_plan(load_experiment("notes", trainings))
    assert single.tokens == pytest.approx(300e9, rel=1e-5)  # less the partial last batch
    assert f"{single.days_seed_rounded:.2f}" == "31.35"
    write(trainings, "notes2", "base: tr1-13B\ntrain: {samples: 146_484_375}\nslurm: {node_schedule: [{nodes: 64}]}\n")
    one_phase = plan.make_plan(load_experiment("notes2", trainings))
    assert [ph.phase.nodes for ph in one_phase.phases] == [64]
    assert f"{one_phase.days_seed_rounded:.2f}" == "31.35"


def test_tr1_13B_schedule_16_64_128_with_the_last_three_weeks_on_128():
    exp = load_experiment("tr1-13B", REPO / "trainings")
    p = plan.make_plan(exp)
    assert not p.errors, p.errors
    assert [ph.phase.nodes for ph in p.phases] == [16, 64, 128]
    ramp, middle, last = p.phases
    assert ramp.last_step == p.rampup_steps  # 16 nodes exactly while the batch size ramps up
    assert ramp.batch_sizes[0] == 16 and middle.batch_sizes == last.batch_sizes == (1024,)
    assert last.days == pytest.approx(21, abs=0.1)
    assert last.last_step == p.train_iters and middle.first_step == ramp.last_step + 1
    assert sum(ph.samples for ph in p.phases) == p.train_samples
    assert sum(ph.tokens for ph in p.phases) == p.tokens
    assert p.days == pytest.approx(sum(ph.days for ph in p.phases))
    # Each phase's days: its tokens at 45 TFLOPs on its GPUs.
    assert ramp.days == pytest.approx(sizing.estimate_days(ramp.tokens, p.params.total, 64, 45))
    # The YAML's comment states the plan's total.
    comment = re.search(r"= (\d+\.\d+) days", (REPO / "trainings" / "tr1-13B.yaml").read_text())
    assert comment and comment.group(1) == f"{p.days:.2f}"


def test_a_phase_whose_dp_cannot_split_its_batch_sizes_is_an_error():
    exp = load_experiment("tr1-13B", REPO / "trainings")
    early = scheduled(exp, {"nodes": 16}, {"nodes": 64, "from_samples": 1_000_000})
    p = plan.make_plan(early)
    [error] = p.errors
    assert error.field == "slurm.node_schedule[1].nodes" and error.value == 64
    # The same node count once the rampup is over is fine.
    assert not plan.make_plan(scheduled(exp, {"nodes": 16}, {"nodes": 64, "from_samples": 5_000_000})).errors


def test_from_iteration_and_from_samples_meet_at_the_same_step_boundary():
    exp = load_experiment("tr1-13B", REPO / "trainings")
    schedule = run_schedule(exp).batch
    by_samples = node_schedule.node_phases(scheduled(exp, {"nodes": 16}, {"nodes": 32, "from_samples": 100_000}).slurm, schedule)
    step = by_samples[1].first_step
    assert schedule.consumed_after(step - 2) < 100_000 <= schedule.consumed_after(step - 1)
    by_iter = node_schedule.node_phases(scheduled(exp, {"nodes": 16}, {"nodes": 32, "from_iteration": step - 1}).slurm,
                                 schedule)
    assert by_iter[1].start_samples == by_samples[1].start_samples == schedule.consumed_after(step - 1)
    assert node_schedule.phase_at(by_iter, by_iter[1].start_samples - 1).nodes == 16
    assert node_schedule.phase_at(by_iter, by_iter[1].start_samples).nodes == 32


def test_phases_out_of_order_are_an_error():
    exp = load_experiment("tr1-13B", REPO / "trainings")
    bad = scheduled(exp, {"nodes": 16}, {"nodes": 64, "from_samples": 9_000_000}, {"nodes": 128, "from_iteration": 100})
    assert [e.field for e in plan.make_plan(bad).errors] == ["slurm.node_schedule"]


@pytest.mark.parametrize("text, field", [
    ("slurm: {nodes: 4, node_schedule: [{nodes: 4}]}", "slurm.node_schedule"),
    ("slurm: {node_schedule: [{nodes: 4, from_samples: 10}]}", "slurm.node_schedule[0]"),
    ("slurm: {node_schedule: [{nodes: 4}, {nodes: 8}]}", "slurm.node_schedule[1]"),
    ("slurm: {node_schedule: [{nodes: 4}, {nodes: 8, from_samples: 10, from_iteration: 3}]}", "slurm.node_schedule[1]"),
    ("slurm: {node_schedule: [{nodes: 4}, {nodes: 4, from_samples: 10}]}", "slurm.node_schedule[1].nodes"),
    ("slurm: {node_schedule: [{nodes: 4}, {nodes: 0, from_samples: 10}]}", "slurm.node_schedule[1].nodes"),
])
def test_bad_schedules_name_the_field(trainings, text, field):
    write(trainings, "bad", f"base: tr1-13B\n{text}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("bad", trainings)
    assert err.value.field == field


def test_a_file_sets_the_node_plan_as_a_whole(trainings):
    """A child's slurm.nodes replaces an inherited node_schedule, and a child's schedule an inherited slurm.nodes."""
    write(trainings, "fixed", "base: tr1-13B\nslurm: {nodes: 8}\n")
    fixed = load_experiment("fixed", trainings)
    assert fixed.slurm.node_schedule == [] and fixed.slurm.nodes == 8
    write(trainings, "again", "base: fixed\nslurm: {node_schedule: [{nodes: 2}, {nodes: 4, from_iteration: 10}]}\n")
    again = load_experiment("again", trainings)
    assert again.slurm.nodes == 2 and "slurm.nodes" in again.derived
    assert [p.nodes for p in run_schedule(again).phases()] == [2, 4]


def test_launch_size_follows_the_latest_checkpoint():
    exp = load_experiment("tr1-13B", REPO / "trainings")
    p = plan.make_plan(exp)
    first, middle, last = p.phases
    assert run_schedule(exp).phase_of_iteration(0).nodes == 16
    assert run_schedule(exp).phase_of_iteration(first.last_step - 1).nodes == 16
    assert run_schedule(exp).phase_of_iteration(first.last_step).nodes == 64
    assert run_schedule(exp).phase_of_iteration(last.first_step - 1).nodes == 128
    launched = apply_overrides(exp, Overrides(nodes=run_schedule(exp).phase_of_iteration(last.first_step).nodes))
    assert launched.slurm.nodes == 128 and launched.slurm.node_schedule == exp.slurm.node_schedule
    assert plan.make_plan(launched).dp == 64 and not plan.make_plan(launched).errors


def test_the_launched_node_count_must_be_a_phase_of_the_schedule():
    exp = load_experiment("tr1-13B", REPO / "trainings")
    stray = dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, nodes=32))
    assert [(e.field, e.value) for e in plan.make_plan(stray).errors] == [("slurm.nodes", 32)]


def test_boundaries_between_micro_steps_are_fine():
    """tr1-13B's post-rampup boundaries fall between micro-steps of the new MBS x DP; the trainer's feed
    resumes there as Megatron's sampler does (test_trainer_units), so the plan has nothing to say."""
    p = plan.make_plan(load_experiment("tr1-13B", REPO / "trainings"))
    assert all(ph.phase.start_samples % int(ph.dp) for ph in p.phases[1:])
    assert not [w for w in p.warnings if w.field.startswith("slurm.node_schedule")]
