"""A node schedule on the real cluster: tiny starts on 1 node, then trains on 2 once its rampup is over.

The first array (1 node) trains to the phase boundary, saves and exits; its `task end` hook cancels the
array's pending task and submits the rest of the array at 2 nodes, chained afterany; that array resumes
at DP 2 (through the universal checkpoint) and finishes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bigscience_ops.run import ledger
from bigscience_ops.launch import cluster as submit
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.plan import make_plan
from bigscience_ops.schedule.run import run_schedule
from tests.fixtures_experiments import SHRUNK_MODEL, tiny_yaml
from tests.fixtures_slurm import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_tiny_moves_from_one_node_to_two_at_its_phase_boundary(tmp_path: Path, trainings: Path, slurm_cluster) -> None:
    (trainings / "tinyph.yaml").write_text(tiny_yaml(
        tmp_path / "run",
        # A rampup 8, 16 keeps every step boundary a multiple of MBS x DP = 4 x 2 (see the plan's warning).
        "train: {samples: 480}\nparallel: {zero_stage: 1}\nbatch: {rampup: {start: 8, increment: 8, samples: 160}}\n"
        "checkpoint: {exit_interval: null, save_interval: 1000}\nlogging: {eval_interval: 1000}\n",
        SHRUNK_MODEL,  # tiny's model shrunk to seconds: the phases, not the model, are under test
        f"slurm: {{job_name: {slurm_cluster.prefix}-phases, partition: {slurm_cluster.partition}, gpus_per_node: 2, "
        "array: 3, node_schedule: [{nodes: 1}, {nodes: 2, from_samples: 320}]}\n"))
    exp = load_experiment("tinyph", trainings)
    assert not make_plan(exp).problems
    first, second = run_schedule(exp).phases()
    total = run_schedule(exp).train_iters
    boundary = second.first_step - 1
    assert 0 < boundary < total

    launch = submit.plan_launch(exp)
    assert launch.experiment.slurm.nodes == 1 and "--nodes=1" in launch.rendered.files[launch.rendered.script]
    job_id = submit.submit(launch).job_id
    slurm_cluster.submitted.append(job_id)

    records = Path(exp.paths.output) / ledger.LEDGER_NAME

    def resized() -> str | None:
        return ledger.resized(ledger.read(records), job_id) if records.exists() else None

    next_job = wait_until("the first array to hand the run on", resized, timeout=600, interval=0.5)
    slurm_cluster.submitted.append(next_job)
    wait_until("both arrays to finish", lambda: not slurm_cluster.jobs(job_id) and not slurm_cluster.jobs(next_job),
               timeout=600, interval=0.5)

    assert ledger.latest_iteration(Path(exp.paths.checkpoints)) == total
    attempts = ledger.attempts(ledger.read(records))
    # One task of the first array (its pending tasks cancelled), then the second array's; its tasks after
    # the one that finished find the training done.
    spans = [(a.start_iteration, a.end_iteration, a.exit_code) for a in attempts]
    assert spans[:2] == [(0, boundary, 0), (boundary, total, 0)]
    assert spans[2:] == [(total, total, 0)] * (len(spans) - 2)
    assert [a.job_id for a in attempts][:2] == [f"{job_id}_1", f"{next_job}_1"]
    assert all(a.job_id.startswith(f"{next_job}_") for a in attempts[1:])
    assert "," not in attempts[0].nodes and "[" not in attempts[0].nodes  # one node
    assert re.fullmatch(r"\w+\[\d+-\d+\]|\w+,\w+", attempts[1].nodes), attempts[1].nodes  # two
    runs = sorted(Path(exp.paths.output, "launches").glob("*/sbatch.json"))
    answers = [json.loads(p.read_text()) for p in runs]
    assert [a["job_id"] for a in answers] == [job_id, next_job]
    assert answers[1]["after"] == [job_id]
    script = Path(answers[1]["argv"][-1]).read_text()
    assert "#SBATCH --array=1-2%1" in script and "#SBATCH --nodes=2" in script  # the rest of the 3-task array
    second_exp = json.loads((runs[1].parent / "experiment.json").read_text())
    assert second_exp["slurm"]["nodes"] == 2
    log = (Path(exp.paths.logs) / "main_log.txt").read_text()
    assert f"training finished at iteration {total}" in log
