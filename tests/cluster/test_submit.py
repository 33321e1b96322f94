"""`bsops launch` on the real cluster: refuse an overlap, chain on the whole array, keep a run record."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from bigscience_ops.run import ledger
from bigscience_ops.launch import cluster as submit
from bigscience_ops.config.loading import load_experiment
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_slurm import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def experiment(tmp_path: Path, trainings: Path, slurm_cluster):
    name = f"{slurm_cluster.prefix}-a-job-name-longer-than-forty-characters-for-squeue"
    (trainings / "exp.yaml").write_text(
        tiny_yaml(tmp_path / "run", f"slurm: {{job_name: {name}, partition: {slurm_cluster.partition}}}\n"))
    return load_experiment("exp", trainings)


def test_launch_refuses_overlap_and_chains_on_the_whole_array(experiment, slurm_cluster, tmp_path: Path) -> None:
    old = slurm_cluster.script(tmp_path, "old.sh", "sleep 1")
    old_id = slurm_cluster.submit(old, name=experiment.slurm.job_name, array_tasks=3, hold=True)

    with pytest.raises(submit.LaunchError) as err:
        submit.plan_launch(experiment)
    assert old_id in str(err.value) and "--after-current" in str(err.value)

    plan = submit.plan_launch(experiment, after_current=True)
    assert plan.after == [old_id]
    assert plan.queue_note == f"queue checked: 1 job(s) named {experiment.slurm.job_name!r} already queued"
    assert f"--dependency=afterany:{old_id}" in plan.argv
    assert not plan.run_dir.exists(), "planning writes nothing"
    new_id = submit.submit(plan).job_id
    slurm_cluster.submitted.append(new_id)

    record = json.loads((plan.run_dir / "sbatch.json").read_text())
    assert record["job_id"] == new_id and record["argv"] == plan.argv
    assert sorted(p.name for p in plan.run_dir.iterdir()) == ["ds_config.json", "exp.slurm", "experiment.json", "sbatch.json"]
    assert ledger.read(Path(experiment.paths.output) / ledger.LEDGER_NAME)[-1].event == "launch"

    jobs = wait_until("the new array waiting on its dependency",
                      lambda: [j for j in slurm_cluster.jobs(new_id) if j.reason == "Dependency"])
    assert all(j.state == "PENDING" for j in jobs)
    # The dependency names the whole old array, never one of its tasks.
    assert jobs[0].dependency.startswith(f"afterany:{old_id}_*"), jobs[0].dependency
    assert jobs[0].array_task == "1-2%1"


def squeue_without_a_configuration(folder: Path) -> Path:
    """`folder/squeue`: the real squeue, run where Slurm's default configuration folder (/etc/slurm) is an empty
    tmpfs (a mount namespace of its own, private to that one command), so that with SLURM_CONF unset it finds no
    cluster, as on a machine where Slurm is installed but not configured, whatever this machine's /etc/slurm
    holds; returns `folder` for PATH."""
    real = shutil.which("squeue")
    assert real, "squeue is not installed: scripts/test.sh installs slurm-client (as the slurm_cluster fixture does)"
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "squeue"
    wrapper.write_text("#!/bin/sh\nexec unshare --mount --map-root-user sh -c "
                       f"'mount -t tmpfs none /etc/slurm 2>/dev/null; exec \"$0\" \"$@\"' {shlex.quote(real)} \"$@\"\n")
    wrapper.chmod(0o755)
    return folder


def test_a_dry_run_without_slurm_renders_and_says_why_the_queue_was_not_checked(tmp_path: Path, trainings: Path,
                                                                                 monkeypatch) -> None:
    """Run on every machine, whether its Slurm has a configuration in /etc/slurm or not."""
    (trainings / "alone.yaml").write_text(tiny_yaml(tmp_path / "run"))
    exp = load_experiment("alone", trainings)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("PATH", f"{squeue_without_a_configuration(tmp_path / 'bin')}:{os.environ['PATH']}")
    with pytest.raises(Exception) as err:  # a real launch needs the queue
        submit.plan_launch(exp)
    assert str(err.value).startswith("Slurm is not configured on this machine (SLURM_CONF is unset)")
    plan = submit.plan_launch(exp, dry_run=True)
    [note] = [line for line in plan.describe() if line.startswith("queue")]
    assert note == ("queue not checked: Slurm is not configured on this machine (SLURM_CONF is unset): no cluster "
                    "configuration found; set SLURM_CONF to your cluster's slurm.conf, or run on a login node; "
                    "a real launch needs the queue")
    assert "Could not establish a configuration source" in plan.queue.error.detail()  # what --verbose adds
    assert "--format" not in note and plan.argv[0] == "sbatch" and not plan.run_dir.exists()
