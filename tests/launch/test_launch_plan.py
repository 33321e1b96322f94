"""launch_plan.py, run_records.py and jobenv.py: the plan made once from the experiment, the run's records and
the command's options; the one override step; the order both executors follow; one job environment."""

from __future__ import annotations

import contextlib
import ast
import dataclasses
import json
from pathlib import Path

import pytest

from bigscience_ops.launch import launch_plan
from bigscience_ops.run import rollbacks
from bigscience_ops.run import index as runs_index
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.launch.jobenv import job_environment
from bigscience_ops.launch.launch_plan import LaunchOptions, build_launch_plan
from bigscience_ops.config.loading import Overrides, apply_overrides
from bigscience_ops.run.records import as_recorded
from bigscience_ops.run.records import EXIT_NOT_TRAINING, read_records
from tests.fixtures_experiments import tiny_yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def exp(trainings: Path, tmp_path: Path):
    (trainings / "run.yaml").write_text(tiny_yaml(tmp_path / "run"))
    return load_experiment("run", trainings)


def _rollback(output: Path, skip: str) -> None:
    rollbacks.append(output, rollbacks.Rollback(0.0, 60, 40, skip, ""))


def test_a_local_launch_elsewhere_takes_that_folders_records_not_the_configs_run_folder(exp, tmp_path: Path) -> None:
    _rollback(Path(exp.paths.output), "41-50")  # the experiment's own run folder
    elsewhere = tmp_path / "elsewhere"
    _rollback(elsewhere, "61-70")
    (elsewhere / "checkpoints").mkdir()
    (elsewhere / "checkpoints" / "latest").write_text("global_step0")
    plan = build_launch_plan(apply_overrides(exp, Overrides(out=elsewhere)),
                             LaunchOptions(job="local", master_port=12345, allow_incomplete=True))
    assert plan.experiment.train.skip_iterations == ["61-70"]
    assert plan.experiment.paths.output == str(elsewhere) and plan.record_dir == elsewhere
    assert plan.experiment.checkpoint.kill_switch_path == str(elsewhere / "kill-switch")
    assert plan.experiment.slurm.master_port == 12345
    experiment_json = json.loads(plan.rendered.files["experiment.json"])
    assert experiment_json["train"]["skip_iterations"] == ["61-70"]
    assert experiment_json["paths"]["checkpoints"] == str(elsewhere / "checkpoints")
    here = build_launch_plan(exp, LaunchOptions(job="local", allow_incomplete=True))
    assert here.experiment.train.skip_iterations == ["41-50"]


def test_loading_reads_no_run_folder_and_the_records_are_read_where_the_run_is(exp) -> None:
    output = Path(exp.paths.output)
    _rollback(output, "41-50")
    _rollback(output, "41-50")  # recorded twice (two rollbacks over the same range): applied once
    assert exp.train.skip_iterations == []
    records = read_records(exp)
    assert (records.iteration, records.kill_switch, records.skips) == (0, None, ("41-50",))
    assert as_recorded(exp).train.skip_iterations == ["41-50"]
    Path(exp.checkpoint.kill_switch_path).touch()
    assert read_records(exp).kill_switch == exp.checkpoint.kill_switch_path
    with pytest.raises(launch_plan.KillSwitchOn):
        build_launch_plan(exp, LaunchOptions(job="local", allow_incomplete=True))
    assert not (output / "tiny.slurm").exists() and not (output / "logs").exists()  # refused: nothing written


def test_apply_overrides_changes_only_what_it_is_given_and_is_idempotent(exp, tmp_path: Path) -> None:
    assert apply_overrides(exp, Overrides()) == exp
    o = Overrides(out=tmp_path / "x", skips=("5-6",), nodes=3, array=7, master_port=4000)
    assert apply_overrides(exp, Overrides(nodes_all_along=5)).slurm.node_schedule == [] and apply_overrides(
        exp, Overrides(nodes_all_along=5)).slurm.nodes == 5
    once = apply_overrides(exp, o)
    assert apply_overrides(once, o) == once
    assert (once.slurm.nodes, once.slurm.array, once.slurm.master_port) == (3, 7, 4000)
    assert once.train.skip_iterations == ["5-6"] and once.paths.logs == str(tmp_path / "x" / "logs")
    unchanged = dataclasses.replace(once, slurm=exp.slurm, train=exp.train, paths=exp.paths, checkpoint=exp.checkpoint)
    assert unchanged == exp


def test_both_executors_check_the_data_then_write_then_start(exp, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr("bigscience_ops.data.corpus.ensure_data", lambda e: calls.append("data"))

    class Recording:
        @contextlib.contextmanager
        def claim(self, plan):
            calls.append("claim")
            yield
            calls.append("release")

        def write(self, plan):
            calls.append("write")
            return plan.script

        def start(self, plan, script, started):
            calls.append("start")
            started("local", "7")
            return script

    plan = build_launch_plan(exp, LaunchOptions(job="local", allow_incomplete=True))
    assert launch_plan.execute(plan, Recording()) == plan.script
    assert calls == ["claim", "data", "write", "start", "release"]
    [line] = runs_index.read_index().records  # the launch, once its job started: the one place both executors share
    assert (line.experiment, line.folder, line.job, line.job_id) == (exp.name, exp.paths.output, "local", "7")


def test_the_job_environment_is_built_once_for_both_executors(monkeypatch) -> None:
    shell = {"PATH": "/usr/bin", "HOME": "/h", "SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "7",
             "SLURM_ARRAY_TASK_ID": "2", "BSOPS_JOB_START_EPOCH": "1", "OTHER": "x"}
    slurm_env = job_environment(shell, local=False)
    local_env = job_environment(shell, local=True, first_on_path=[Path("/run/slurm-shims")], extra={"OTHER": "y"})
    assert slurm_env["SLURM_CONF"] == "/etc/slurm.conf" and "SLURM_CONF" not in local_env
    for env in (slurm_env, local_env):
        assert not {"SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "BSOPS_JOB_START_EPOCH"} & set(env)
        assert env["HOME"] == "/h" and env["PATH"].endswith(":/usr/bin")
    assert local_env["PATH"].startswith("/run/slurm-shims:") and local_env["OTHER"] == "y"


def test_the_job_script_ends_without_training_on_the_one_exit_code(exp, monkeypatch) -> None:
    from bigscience_ops.launch import render

    script = build_launch_plan(exp, LaunchOptions(job="local", allow_incomplete=True)).rendered
    assert f"if [[ $status == {EXIT_NOT_TRAINING} ]]; then" in script.files[script.script]
    monkeypatch.setattr(render, "EXIT_NOT_TRAINING", 42)
    again = build_launch_plan(exp, LaunchOptions(job="local", allow_incomplete=True)).rendered
    assert "if [[ $status == 42 ]]; then" in again.files[again.script]


def _calls_of(name: str) -> list[str]:
    """`file:line` of every call of a function called `name` in the package (attribute or plain name)."""
    found = []
    for path in sorted((REPO / "bigscience_ops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called == name:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_the_kill_switch_is_decided_in_one_function_with_two_callers() -> None:
    """The launch, the local executor and the task hooks read it through run_records; the watchdog through its
    lifecycle; nobody else looks at the file."""
    callers = _calls_of("kill_switch_on")
    assert len(callers) <= 2, callers
    assert any(c.startswith("bigscience_ops/run/records.py") for c in callers), callers


def test_an_experiment_is_transformed_by_derivation_and_the_launch_overrides_only() -> None:
    """dataclasses.replace on a whole Experiment happens in config/derivation.py and config/loading.py (apply_overrides) only."""
    places = set()
    for path in sorted((REPO / "bigscience_ops").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replace"
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in ("exp", "experiment")):
                places.add(str(path.relative_to(REPO)))
    assert places <= {"bigscience_ops/config/derivation.py", "bigscience_ops/config/loading.py"}, places
