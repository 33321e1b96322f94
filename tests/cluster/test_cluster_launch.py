"""`bsops launch tiny` on the real cluster: a two-node job, an array of two tasks, the second resuming."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import ledger
from bigscience_ops.launch import cluster as submit
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.schedule.run import run_schedule
from tests.fixtures_experiments import SHRUNK_MODEL, tiny_yaml
from tests.fixtures_slurm import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_tiny_array_trains_on_two_nodes_and_resumes(tmp_path: Path, trainings: Path, slurm_cluster) -> None:
    # A shorter tiny: the first task stops at step 30 (exit_interval), the second resumes and finishes.
    # Its schedule (both tasks in its rampup), scripts, data and PP=2 over two nodes are tiny's; the model is
    # shrunk to seconds.
    (trainings / "tinycl.yaml").write_text(tiny_yaml(
        tmp_path / "run", "train: {samples: 600}\ncheckpoint: {exit_interval: 30, save_interval: 15}\n", SHRUNK_MODEL,
        f"slurm: {{job_name: {slurm_cluster.prefix}-tiny, partition: {slurm_cluster.partition}}}\n"))
    exp = load_experiment("tinycl", trainings)
    total = run_schedule(exp).train_iters
    assert 30 < total <= 60

    job_id = submit.submit(submit.plan_launch(exp)).job_id
    slurm_cluster.submitted.append(job_id)
    wait_until("both array tasks to finish", lambda: not slurm_cluster.jobs(job_id), timeout=600, interval=0.5)

    checkpoints = Path(exp.paths.checkpoints)
    assert ledger.latest_iteration(checkpoints) == total
    attempts = ledger.attempts(ledger.read(Path(exp.paths.output) / ledger.LEDGER_NAME))
    assert [(a.start_iteration, a.end_iteration, a.exit_code) for a in attempts] == [(0, 30, 0), (30, total, 0)]
    assert [a.job_id for a in attempts] == [f"{job_id}_1", f"{job_id}_2"]
    assert all(re.fullmatch(r"\w+\[1-2\]|\w+,\w+", a.nodes) for a in attempts), [a.nodes for a in attempts]
    log = (Path(exp.paths.logs) / "main_log.txt").read_text()
    assert re.search(rf"iteration\s+30/\s+{total} \|", log)
    assert "resumed from" in log and f"training finished at iteration {total}" in log
    outputs = sorted(p.name for p in Path(exp.paths.logs).glob("*.out"))
    assert outputs == [f"{exp.slurm.job_name}-{job_id}_1.out", f"{exp.slurm.job_name}-{job_id}_2.out"]
    # The launch is in the user's runs index with its Slurm job id: `bsops runs` lists it, finished, and `bsops info`
    # names it by its folder (its record is launches/<time>/experiment.json).
    listed = CliRunner().invoke(main, ["runs", "--json"])
    [row] = json.loads(listed.stdout)["runs"]
    assert (row["folder"], row["state"], row["job"], row["job_id"]) == (exp.paths.output, "finished", "slurm", job_id)
    shown = CliRunner().invoke(main, ["info", exp.paths.output])
    assert shown.exit_code == 0 and f"run folder: {exp.paths.output} (named on the command line" in shown.output
