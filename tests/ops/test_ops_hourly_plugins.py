"""Hourly jobs as plugins (ops/hourly_job.py): each declared beside its library code and registered once; a job
declared in this test goes through the real machinery (`bsops cron add`, the runner's pass, the test cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.launch.jobs import GONE, SlurmJob
from bigscience_ops.ops import hourly_registry
from bigscience_ops.ops.cron import runner as cron
from bigscience_ops.ops.hourly_job import HourlyJob, Missing
from bigscience_ops.schema import Experiment
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_slurm import wait_until


def _described(exp: Experiment) -> Missing | None:
    return None if exp.description else ("description", "a line saying what the run is for")


PLAN_CHECK = HourlyJob(
    "plan-check", "plan-check", "plan", "00:05:00", "plan check",
    ("It prints the experiment's plan, so that the cron logs show what the run is meant to be.",),
    needs=_described, arguments=())
"""The worked example: a new hourly job is this value (in its own module) and its line in hourly_registry.PLUGINS."""


@pytest.fixture
def plan_check():
    yield hourly_registry.register(PLAN_CHECK)
    hourly_registry.unregister(PLAN_CHECK.name)


def test_the_shipped_jobs_are_declared_beside_their_code() -> None:
    from bigscience_ops.ops.evaluate import as_hourly_job as evaluate
    from bigscience_ops.ops.keep import as_hourly_jobs as keep
    from bigscience_ops.ops.watch import as_hourly_job as watch

    where = {job.name: module.__name__ for module in (watch, keep, evaluate) for job in module.JOBS}
    assert list(where) == list(hourly_registry.JOBS) == ["status", "hub-sync", "backup", "eval"]
    assert where == {"status": "bigscience_ops.ops.watch.as_hourly_job", "hub-sync": "bigscience_ops.ops.keep.as_hourly_jobs",
                     "backup": "bigscience_ops.ops.keep.as_hourly_jobs", "eval": "bigscience_ops.ops.evaluate.as_hourly_job"}
    assert [j.name for j in hourly_registry.PLUGINS] == list(hourly_registry.JOBS)


def test_register_refuses_a_taken_name_or_suffix_and_a_bad_period() -> None:
    import dataclasses

    for clash in (dataclasses.replace(PLAN_CHECK, name="backup"), dataclasses.replace(PLAN_CHECK, suffix="hub-sync"),
                  dataclasses.replace(PLAN_CHECK, period="weekly"), dataclasses.replace(PLAN_CHECK, suffix="a.b")):
        with pytest.raises(ValueError):
            hourly_registry.register(clash)
    assert list(hourly_registry.JOBS) == ["status", "hub-sync", "backup", "eval"]


def test_a_registered_job_is_what_cron_add_list_and_remove_take(plan_check, trainings: Path, tmp_path: Path) -> None:
    (trainings / "planned.yaml").write_text(tiny_yaml(tmp_path / "run", "description: the worked example\n"))
    (trainings / "bare.yaml").write_text(tiny_yaml(tmp_path / "run2", "description: ''\n"))
    cron_dir, runner = tmp_path / "cron", CliRunner()
    args = ["--cron-dir", str(cron_dir), "--trainings-dir", str(trainings)]
    listed = runner.invoke(main, ["cron", "jobs"])
    assert listed.exit_code == 0 and "plan-check" in listed.output
    added = runner.invoke(main, ["cron", "add", "planned", "--jobs", "status,plan-check", *args])
    assert added.exit_code == 0, added.output
    script = cron_dir / "cron.hourly" / "planned-plan-check.slurm"
    assert "#SBATCH --job-name=bsops.planned.plan-check\n" in script.read_text()
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    assert {(i.experiment, i.kind) for i in hourly_registry.installed(cron_dir)} == {("planned", "status"),
                                                                                 ("planned", "plan-check")}
    refused = runner.invoke(main, ["cron", "add", "bare", "--jobs", "plan-check", *args])
    assert refused.exit_code != 0 and "description" in refused.output
    default = runner.invoke(main, ["cron", "add", "bare", *args])  # left out, saying which field it needs
    assert default.exit_code == 0 and "not adding the plan-check job: description is not set" in default.output
    removed = runner.invoke(main, ["cron", "remove", "planned", "--jobs", "plan-check", "--cron-dir", str(cron_dir)])
    assert removed.exit_code == 0 and not script.exists()


@pytest.mark.slow
@pytest.mark.slurm
def test_the_worked_example_runs_through_the_runner_on_the_cluster(plan_check, slurm_cluster, trainings: Path,
                                                                   tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # bsops on the job's PATH
    exp = f"{slurm_cluster.prefix}-planned"
    (trainings / f"{exp}.yaml").write_text(tiny_yaml(tmp_path / "run", "description: the worked example\n"))
    cron_dir = tmp_path / "cron"
    cron_dir.mkdir()
    (cron_dir / "cron.yaml").write_text(f"name_prefix: {slurm_cluster.prefix}-cron\n")
    added = CliRunner().invoke(main, ["cron", "add", exp, "--jobs", "plan-check", "--cron-dir", str(cron_dir),
                                      "--trainings-dir", str(trainings)])
    assert added.exit_code == 0, added.output
    report = cron.run_pass(cron_dir, "hourly", None)  # as scrontab runs it: no chain to re-arm
    name = f"bsops.{exp}.plan-check"
    assert [n for n, _ in report.submitted] == [name] and not report.failed, report.lines
    job = SlurmJob(name, job_id=report.submitted[0][1])
    slurm_cluster.submitted.append(job.job_id)
    wait_until("the plan-check job done", lambda: job.state() == GONE, timeout=60)
    log = (cron_dir / "logs" / f"{name}-{job.job_id}.out").read_text()
    here = subprocess.run(["bsops", "plan", exp, "--trainings-dir", str(trainings)], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    parameters = [line for line in here.splitlines() if line.strip().startswith("parameters:")]
    assert parameters and parameters[0] in log.splitlines(), log
