"""The hourly eval job on the real cluster: while a training saves, `bsops cron add --jobs eval`'s script, run again and
again, evaluates every saved checkpoint exactly once, after its save is complete, one eval job at a time; then
`bsops chronicle` shows the table.

The eval jobs run the real ranks (ops/evaluate/worker.py under srun + torchrun, PP=2 over the cluster's two nodes)
and the real driver, on bits per byte of the bundled held-out text (lm-eval's tasks cost each job its import: they
are the worker's and the driver's own tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops import slurm
from bigscience_ops.launch import cluster as submit
from bigscience_ops.checkpoints import layout
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.evaluate import results, next_eval
from tests.fixtures_experiments import SHRUNK_MODEL, tiny_yaml
from tests.fixtures_slurm import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SMALL = ("batch: {global_batch_size: 8, micro_batch_size: 2, rampup: {start: 4, increment: 2, samples: 40}}\n"
         "train: {samples: 200}\nlr_schedule: {warmup_samples: 40}\n"
         "checkpoint: {save_interval: 15, exit_interval: null}\nlogging: {log_interval: 5, eval_interval: 100}\n")
EVAL = ("eval: {tasks: [], sources: {epistles: corpus/eval/kjv_epistles.jsonl}, docs_per_source: 3, every_saves: 1, "
        "time: '00:10:00'}\n")


def test_every_saved_checkpoint_is_evaluated_once_one_job_at_a_time(tmp_path: Path, trainings: Path, slurm_cluster,
                                                                    monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # bsops and torchrun in jobs
    (trainings / "evcl.yaml").write_text(tiny_yaml(
        tmp_path / "run", SMALL, SHRUNK_MODEL, EVAL,
        f"slurm: {{job_name: {slurm_cluster.prefix}-evcl, partition: {slurm_cluster.partition}, array: 1}}\n"))
    exp = load_experiment("evcl", trainings)
    cron_dir = tmp_path / "cron"
    added = CliRunner().invoke(main, ["cron", "add", "evcl", "--jobs", "eval", "--cron-dir", str(cron_dir),
                                      "--trainings-dir", str(trainings)])
    assert added.exit_code == 0, added.output
    hourly = cron_dir / "cron.hourly" / "evcl-eval-next.slurm"

    training = submit.submit(submit.plan_launch(exp)).job_id
    slurm_cluster.submitted.append(training)
    name, ledger, most = next_eval.job_name(exp), Path(exp.paths.output) / "eval" / next_eval.LEDGER_NAME, [0]

    def hourly_pass() -> bool:
        """One run of the hourly job (as the cron runner starts it, without Slurm); True once all is evaluated."""
        proc = subprocess.run(["bash", str(hourly)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        ids = [r.job_id for r in next_eval.read_ledger(ledger).records if r.event == "submitted"]
        slurm_cluster.submitted.extend(i for i in ids if i not in slurm_cluster.submitted)  # cancelled at the end
        evaluating = [j for j in slurm.query_jobs(timeout=30) if j.name == name]
        most[0] = max(most[0], len(evaluating))
        saved = layout.complete_checkpoints(Path(exp.paths.checkpoints))
        done = {r.step for r in next_eval.read_ledger(ledger).records if r.event == "done"}  # a pass records it
        return (not slurm_cluster.jobs(training) and not evaluating and bool(saved)
                and all(next_eval.has_result(Path(exp.paths.output), c.tag) and c.step in done for c in saved))

    wait_until("every saved checkpoint to be evaluated", hourly_pass, timeout=900, interval=3)

    saved = layout.complete_checkpoints(Path(exp.paths.checkpoints))
    assert [c.step for c in saved] == [15, 28]  # a save every 15 steps and the final one
    records = next_eval.read_ledger(ledger)
    assert records.problems == []
    submitted = [r for r in records.records if r.event == "submitted"]
    assert sorted(r.step for r in submitted) == [15, 28]  # each exactly once
    assert sorted((r.step, r.event) for r in records.records if r.event != "submitted") == [(15, "done"), (28, "done")]
    assert most[0] == 1  # never two at once
    for record in submitted:  # submitted only once the save was complete (its bsops.json written before)
        assert (Path(exp.paths.checkpoints) / record.tag / layout.META).stat().st_mtime <= record.time
        assert "exit code 0" in Path(record.log).read_text()
    found, problems = results.read_all(Path(exp.paths.output))
    assert problems == [] and [r.step for r in found] == [15, 28]
    bpb = [r.metrics["epistles/bits_per_byte"] for r in found]
    assert all(0 < value < 20 for value in bpb)
    assert json.loads(results.result_path(exp, "global_step28").read_text())["bsops"]["layout"] == {
        "tensor": 1, "pipeline": 2}

    chronicle = CliRunner().invoke(main, ["chronicle", "evcl", "--trainings-dir", str(trainings)])
    assert chronicle.exit_code == 0, chronicle.output
    [row] = [line for line in chronicle.stdout.split("\n") if line.startswith("| epistles/bits")]
    assert [cell.strip() for cell in row.strip("|").split("|")][1:] == [results.shown(v) for v in bpb]
