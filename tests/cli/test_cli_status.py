"""`bsops status EXP` on the real cluster: settings from the experiment, email once, recovery, the cron job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_slurm import wait_until
from tests.fixtures_smtp import alerts_yaml
from tests.fixtures_runs import commit_checkpoint

pytestmark = pytest.mark.slurm


@pytest.fixture
def watched(tmp_path: Path, trainings: Path, slurm_cluster, plain_server) -> Path:
    """`trainings` with a tiny experiment whose alerts go to the test SMTP server."""
    _, port = plain_server
    (trainings / "watched.yaml").write_text(
        tiny_yaml(tmp_path / "run", f"slurm: {{job_name: {slurm_cluster.prefix}-watched}}\n", alerts_yaml(port, 60)))
    return trainings


def status(folder: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["status", "watched", "--trainings-dir", str(folder)])
    return result.exit_code, result.output


def test_status_of_an_experiment_alerts_once_then_recovers(watched: Path, slurm_cluster, plain_server,
                                                           tmp_path: Path) -> None:
    from bigscience_ops.run import ledger

    inbox, _ = plain_server
    exp = load_experiment("watched", watched)
    ledger.mark_launch(Path(exp.paths.output), "4242")  # launched and gone (a run never launched is no alert)
    code, out = status(watched)
    assert code == 1 and f"***ALERT: {exp.slurm.job_name} is not RUNNING or SCHEDULED: it stopped at iteration 0" in out
    assert len(inbox.messages) == 1 and "watched" in inbox.messages[0].get_content()
    assert status(watched)[0] == 1 and len(inbox.messages) == 1  # within the cooldown

    job = slurm_cluster.script(tmp_path, "job.sh", "sleep 60")
    job_id = slurm_cluster.submit(job, name=exp.slurm.job_name)
    ledger.mark_launch(Path(exp.paths.output), job_id)  # launched again: the run's own job, not a look-alike
    try:
        wait_until("the job running", lambda: [j for j in slurm_cluster.jobs(job_id) if j.state == "RUNNING"])
        code, out = status(watched)
    finally:
        slurm_cluster.cancel_all()
    assert code == 0 and "is running for" in out and job_id in out
    assert len(inbox.messages) == 2 and "recover" in inbox.messages[1]["Subject"].lower()
    log = Path(exp.paths.logs) / "watchdog.log"
    assert log.read_text().count("***ALERT") == 2 and "is running for" in log.read_text()
    assert not (Path(exp.paths.logs) / "main_log.txt").exists()


def test_cron_status_job_runs_the_watchdog(watched: Path, tmp_path: Path, plain_server,
                                          slurm_cluster) -> None:
    from bigscience_ops.ops.cron import runner as cron

    inbox, _ = plain_server
    cron_dir = tmp_path / "cron"
    cron_dir.mkdir()
    (cron_dir / "cron.yaml").write_text(f"name_prefix: {slurm_cluster.prefix}-wcron\n")
    # The hourly chain was installed once and is gone: the watchdog watches the watchers too.
    cron.write_runner(cron.render_runner(cron_dir, "hourly", cron.load_settings(cron_dir)))
    result = CliRunner().invoke(main, ["cron", "add", "watched", "--cron-dir", str(cron_dir),
                                       "--trainings-dir", str(watched)])
    assert result.exit_code == 0, result.output
    script = cron_dir / "cron.hourly" / "watched-slurm-status.slurm"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr  # an alert is the watchdog working, not the job failing
    assert "***ALERT" in run.stdout and len(inbox.messages) == 1
    assert f"{slurm_cluster.prefix}-wcron-hourly is not queued" in run.stdout
    assert f"{slurm_cluster.prefix}-wcron-daily" not in run.stdout  # never installed: not this watchdog's business


@pytest.mark.parametrize("torn", ["task-ledger.jsonl", "checkpoints/latest", "rollbacks.jsonl"])
def test_a_torn_run_file_is_emailed_with_the_stopped_run_on_the_real_cluster(watched: Path, plain_server,
                                                                             torn: str) -> None:
    """A node died mid-write: the status watchdog still runs (it exited 2 before it, telling nobody), emails that
    the run stopped at 80 and names the torn file and line."""
    import json

    from bigscience_ops.run import ledger

    inbox, _ = plain_server
    exp = load_experiment("watched", watched)
    out, checkpoints = Path(exp.paths.output), Path(exp.paths.checkpoints)
    ledger.mark_launch(out, "4242")
    for step in (40, 80):
        (checkpoints / f"global_step{step}").mkdir(parents=True)
        (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(checkpoints / f"global_step{step}")
    (checkpoints / "latest").write_text("global_step80")
    with open(out / torn, "ab") as handle:
        handle.write({"task-ledger.jsonl": b'{"event": "begin", "job_id": "4242_3", "no',
                      "checkpoints/latest": b"", "rollbacks.jsonl": b'{"time": 1795000000, "from_s'}[torn])
    if torn == "checkpoints/latest":
        (out / torn).write_bytes(b"global_st")
    code, output = status(watched)
    assert code == 1 and "error:" not in output and "Traceback" not in output, output
    assert f"{exp.slurm.job_name} is not RUNNING or SCHEDULED: it stopped at iteration 80 of" in output
    [mail] = inbox.messages
    body = mail.get_content()
    assert "stopped at iteration 80 of" in body and str(out / torn) in body
    assert str(out / torn) in (Path(exp.paths.logs) / "watchdog.log").read_text()
