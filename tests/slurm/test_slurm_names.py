"""slurm/names.py: the hourly jobs' reserved name form, which no experiment's training job can take.

Experiment `x`'s backup job used to be `x-backup`, the training job of an experiment named `x-backup`:
`status x-backup` then reported a stopped run as running, and `cron run` skipped x's backup every hour.
Now the hourly jobs are `bsops.<job name>.<kind>`, and experiment names and slurm.job_name refuse that form."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigscience_ops import slurm
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import ConfigError
from bigscience_ops.config.files import NAME, check_name
from bigscience_ops.ops import hourly_registry
from bigscience_ops.ops.cron import runner as cron
from bigscience_ops.schema import SLURM_JOB_NAME


def test_hourly_job_names_have_the_reserved_form() -> None:
    assert slurm.hourly_job_name("x", "backup") == "bsops.x.backup"
    assert slurm.hourly_job_name("tr8-104B", "slurm-status") == "bsops.tr8-104B.slurm-status"
    assert slurm.is_hourly_job_name("bsops.a.b.hub-sync") and not slurm.is_hourly_job_name("x-backup")
    assert not slurm.is_hourly_job_name("bsops..backup") and not slurm.is_hourly_job_name("bsops.x.Backup")
    for kind, name in (("back.up", "x"), ("", "x"), ("backup", ""), ("backup", "bsops.x")):
        with pytest.raises(ValueError):
            slurm.hourly_job_name(name, kind)


@pytest.mark.parametrize("name", ["x", "x-backup", "x-hub-sync", "x-slurm-status", "bsops", "bsops-x", "x.backup",
                                  "BSOPS.x", "a" * 100])
def test_no_experiment_job_name_is_an_hourly_job_name(name: str) -> None:
    """Every name an experiment or slurm.job_name may take differs from every hourly job's name."""
    assert NAME.fullmatch(name) and SLURM_JOB_NAME.problem(name) is None
    check_name(name, "test")
    hourly = {slurm.hourly_job_name(training, job.suffix) for training in (name, "x")
              for job in hourly_registry.JOBS.values()}
    assert name not in hourly and not slurm.is_hourly_job_name(name)


@pytest.mark.parametrize("name", ["bsops.x", "bsops.x.backup", "bsops.tr8.slurm-status", "bsops-cron-hourly",
                                  "bsops-cron-daily"])
def test_the_reserved_form_is_refused_as_experiment_and_job_name(name: str, trainings: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_name(name, "NAME")
    assert info.value.field == "name" and info.value.value == name and "bsops" in info.value.allowed
    assert "bsops" in SLURM_JOB_NAME.problem(name)
    (trainings / "lookalike.yaml").write_text(f"base: tiny\nslurm: {{job_name: {name}}}\n")
    with pytest.raises(ConfigError) as info:
        load_experiment("lookalike", trainings)
    assert info.value.field == "slurm.job_name" and info.value.value == name
    (trainings / f"{name}.yaml").write_text("base: tiny\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(name, trainings)
    assert info.value.field == "name"


def test_rendered_hourly_jobs_carry_the_reserved_names(trainings: Path, tmp_path: Path) -> None:
    (trainings / "held.jsonl").write_text('{"text": "x"}\n')
    (trainings / "x.yaml").write_text("base: tiny\nbackup: {dest: /tmp/store}\n"
                                      "hub: {logs_repo: bs/x-logs}\neval: {sources: {held: held.jsonl}}\n")
    (trainings / "named.yaml").write_text("base: tiny\nslurm: {job_name: tr-named}\n")
    x, named = load_experiment("x", trainings), load_experiment("named", trainings)
    settings = cron.CronSettings()
    scripts = {kind: hourly_registry.render(kind, tmp_path, x, trainings, settings) for kind in hourly_registry.JOBS}
    assert {kind: slurm.script_job_name(_written(s)) for kind, s in scripts.items()} == {
        "status": "bsops.x.slurm-status", "hub-sync": "bsops.x.hub-sync", "backup": "bsops.x.backup",
        "eval": "bsops.x.eval-next"}
    assert sorted(s.path.name for s in scripts.values()) == ["x-backup.slurm", "x-eval-next.slurm", "x-hub-sync.slurm",
                                                              "x-slurm-status.slurm"]  # file names as before
    status = _written(hourly_registry.render("status", tmp_path, named, trainings, settings))
    assert slurm.script_job_name(status) == "bsops.tr-named.slurm-status"
    assert [(i.experiment, i.kind) for i in hourly_registry.installed(tmp_path)] == [
        ("named", "status"), ("x", "backup"), ("x", "eval"), ("x", "hub-sync"), ("x", "status")]


def _written(script: cron.RunnerScript) -> Path:
    return cron.write_runner(script)
