"""The watchdog reads the run folder: a finished training is healthy and announced once, one that
ended early is an alert saying how, and stalls are measured from the trainer's own last write."""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bigscience_ops.run import ledger
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.watch import lifecycle, status, watchdog
from bigscience_ops.schedule.run import run_schedule
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_smtp import plain_outbox
from tests.fixtures_status import ITERATION, seed_job
from tests.fixtures_runs import commit_checkpoint

NOW = datetime(2026, 11, 22, 12, 0, 0)
# What slurmstepd writes into the job's output file when the time limit ends it (Slurm 22.05).
STEPD_TIMEOUT = "slurmstepd: error: *** JOB 4242 ON hostn1 CANCELLED AT 2026-11-22T11:20:00 DUE TO TIME LIMIT ***\n"


@pytest.fixture
def exp(trainings: Path, tmp_path: Path):
    (trainings / "life.yaml").write_text(tiny_yaml(tmp_path / "run"))
    return load_experiment("life", trainings)


def task(exp, job: str, start: int, end: int | None, code: int | None) -> None:
    env = {"SLURM_ARRAY_JOB_ID": job.split("_")[0], "SLURM_ARRAY_TASK_ID": job.split("_")[1],
           "SLURM_JOB_NODELIST": "hostn[1-2]"}
    checkpoints = Path(exp.paths.checkpoints)
    save(checkpoints, start)
    ledger.begin(Path(exp.paths.output), checkpoints, 0, env)
    if end is not None:
        save(checkpoints, end)
        ledger.end(Path(exp.paths.output), checkpoints, code, env)


def save(checkpoints: Path, step: int) -> None:
    """A finished save of `step` (its folder with bsops.json) and `latest` naming it, as the trainer leaves them."""
    (checkpoints / f"global_step{step}").mkdir(parents=True, exist_ok=True)
    (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
    commit_checkpoint(checkpoints / f"global_step{step}")
    (checkpoints / "latest").write_text(f"global_step{step}")


def test_a_finished_training_is_healthy_and_announced_once(exp, plain_server, tmp_path: Path) -> None:
    inbox, port = plain_server
    total = run_schedule(exp).train_iters
    task(exp, "100_1", 0, 120, 0)
    task(exp, "100_2", 120, total, 0)
    run = lifecycle.run_state(exp)
    assert run.finished and run.iteration == total
    log = Path(exp.paths.logs) / "main_log.txt"
    for _ in range(2):
        settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=log, outbox=plain_outbox(port))
        result = watchdog.watch(settings, query=lambda **_: [], run=run, now=NOW)
        assert result.exit_code == status.EXIT_HEALTHY and result.report.finished_at == total
        assert f"training finished at iteration {total}" in result.lines[0]
    [mail] = inbox.messages
    assert mail["Subject"].startswith("[FINISHED]") and str(total) in mail["Subject"]


def test_a_training_that_stopped_early_says_how(exp) -> None:
    task(exp, "100_1", 0, 120, 0)
    task(exp, "100_2", 120, 120, 1)
    stopped = status.evaluate(exp.slurm.job_name, [], now=NOW, run=lifecycle.run_state(exp))
    [alert] = stopped.alerts
    assert alert.condition == "not-scheduled" and stopped.exit_code == status.EXIT_ALERT
    assert f"iteration 120 of {run_schedule(exp).train_iters}" in alert.message and "exit code 1" in alert.message

    task(exp, "100_3", 120, None, None)  # killed: no end record; Slurm's output file says why
    logs = Path(exp.paths.logs)
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{exp.slurm.job_name}-100_3.out").write_text("START TIME ...\n" + STEPD_TIMEOUT)
    [alert] = status.evaluate(exp.slurm.job_name, [], now=NOW, run=lifecycle.run_state(exp)).alerts
    assert "DUE TO TIME LIMIT" in alert.message and "100_3" in alert.message


def test_a_run_stopped_by_its_kill_switch_is_an_info_line_until_the_switch_is_removed(exp) -> None:
    task(exp, "100_1", 0, 120, 0)
    switch = Path(exp.checkpoint.kill_switch_path)
    switch.write_text("")
    report = status.evaluate(exp.slurm.job_name, [], now=NOW, run=lifecycle.run_state(exp))
    assert report.alerts == () and report.exit_code == status.EXIT_HEALTHY
    [line] = report.lines
    assert line.endswith(f"{exp.slurm.job_name} was stopped on purpose at iteration 120 of "
                         f"{run_schedule(exp).train_iters}: its kill switch {switch} exists (remove it, then "
                         f"`bsops launch life` to go on)")
    switch.unlink()  # removed and not relaunched: gone
    [alert] = status.evaluate(exp.slurm.job_name, [], now=NOW, run=lifecycle.run_state(exp)).alerts
    assert alert.condition == "not-scheduled"


@pytest.mark.parametrize("warm", [True, False])
def test_a_run_not_launched_yet_is_an_info_line_not_an_alert(exp, warm: bool) -> None:
    checkpoints = Path(exp.paths.checkpoints)
    if warm:  # what `bsops warm-start` leaves: a weights-only global_step0 and `latest` naming it
        (checkpoints / "global_step0").mkdir(parents=True)
        (checkpoints / "global_step0" / "bsops.json").write_text('{"iteration": 0, "weights_only": true}')
        commit_checkpoint(checkpoints / "global_step0")
        (checkpoints / "latest").write_text("global_step0")
    run = lifecycle.run_state(exp)
    assert (run.launched, run.warm_start, run.iteration) == (False, warm, 0)
    report = status.evaluate(exp.slurm.job_name, [], now=NOW, run=run)
    assert report.alerts == () and report.exit_code == status.EXIT_HEALTHY
    [line] = report.lines
    start = "from its warm start (global_step0)" if warm else "from scratch"
    assert line.endswith(f"{exp.slurm.job_name} has not been launched yet: it starts {start} with `bsops launch`")

    ledger.mark_launch(Path(exp.paths.output), "4242")  # launched, and nothing of it queued: gone
    [alert] = status.evaluate(exp.slurm.job_name, [], now=NOW, run=lifecycle.run_state(exp)).alerts
    assert alert.condition == "not-scheduled" and "no array task has run yet" in alert.message
    assert alert.headline == "launch it again (bsops launch life): stopped at iteration 0, nothing queued"


def test_a_hang_is_measured_from_the_last_iteration_line(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "main_log.txt"
    log.parent.mkdir()
    log.write_text(ITERATION + "\n")
    written = NOW - timedelta(minutes=50)
    os.utime(log, (written.timestamp(), written.timestamp()))
    running = seed_job(start_time=NOW - timedelta(hours=10), elapsed_s=36000)

    def watch(now: datetime) -> watchdog.WatchResult:
        settings = watchdog.WatchSettings("tr1-13B-round3", log_path=log, stall_minutes=60)
        return watchdog.watch(settings, query=lambda **_: [running], now=now)

    assert watch(NOW).exit_code == status.EXIT_HEALTHY
    assert log.read_text() == ITERATION + "\n" and log.stat().st_mtime == written.timestamp()
    # Eleven minutes later the line is 61 minutes old: reported now, not a watchdog period later.
    late = watch(NOW + timedelta(minutes=11))
    assert [a.condition for a in late.report.alerts] == ["stalled"]
    assert "for 1:01:00" in late.report.alerts[0].message
    assert (tmp_path / "logs" / "watchdog.log").read_text().count("is running for") == 2


# `sacct --noheader --parsable2 --format=JobID,State,ExitCode --jobs=100_3` for an array task the
# time limit ended, in the layout sacct(1) documents for --parsable2 ('|' between fields, none at
# the end; the task, then its steps). The test cluster keeps no accounting (no slurmdbd), so a
# stand-in at the subprocess edge answers with it.
SACCT_TIMEOUT = "100_3|TIMEOUT|0:0\n100_3.batch|CANCELLED|0:15\n100_3.extern|COMPLETED|0:0\n100_3.0|CANCELLED|0:15\n"


def test_where_slurm_keeps_accounting_the_end_comes_from_sacct(exp, tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sacct-argv"
    (bin_dir / "sacct").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                                   f"case \"$*\" in *--jobs=100_3*) printf '{SACCT_TIMEOUT}';; esac\n")
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    task(exp, "100_1", 0, 120, 0)
    task(exp, "100_3", 120, None, None)  # no end record, and no output file: only sacct knows
    run = lifecycle.run_state(exp)
    # While a task of the run is queued or running, nothing asks sacct.
    running = seed_job(start_time=NOW - timedelta(hours=1), elapsed_s=3600)
    running = dataclasses.replace(running, name=exp.slurm.job_name)
    assert status.evaluate(exp.slurm.job_name, [running], now=NOW, run=run).alerts == ()
    assert not calls.exists()
    assert run.ended == "TIMEOUT (exit code 0:0, from sacct)"
    [alert] = status.evaluate(exp.slurm.job_name, [], now=NOW, run=run).alerts
    assert "TIMEOUT (exit code 0:0, from sacct)" in alert.message
    assert calls.read_text().split() == ["--noheader", "--parsable2", "--format=JobID,State,ExitCode",
                                         "--jobs=100_3"]


# --- a run launched here: its processes, never the queue --------------------------------------------------------

HOLD = ("import sys, time; from bigscience_ops.run import lock as run_lock\n"
        "with run_lock.hold(sys.argv[1], 'bsops launch --local'):\n"
        "    print('held', flush=True); time.sleep(60)\n")


def _no_queue(**_: object) -> list:
    raise AssertionError("a run launched here is never looked for in the Slurm queue")


def test_a_local_run_is_watched_through_its_processes_not_the_queue(exp, plain_server) -> None:
    """Launched with `bsops launch --local` (its record in the run folder itself): running while a process holds the
    run (named), an alert once nothing does before the end (never "cannot query Slurm", never "killed" while its
    task trains), finished and healthy at the end."""
    import subprocess
    import sys

    from bigscience_ops.config.loading import to_dict

    inbox, port = plain_server
    out = Path(exp.paths.output)
    out.mkdir(parents=True)
    (out / "experiment.json").write_text(json.dumps(to_dict(exp)))  # what a local launch records
    task(exp, "500_1", 0, 120, 0)
    task(exp, "500_2", 120, None, None)  # training now: no end record yet
    settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=Path(exp.paths.logs) / "main_log.txt",
                                      outbox=plain_outbox(port))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        run = lifecycle.run_state(exp)
        assert run.local and run.ended is not None
        running = watchdog.watch(settings, run=run, now=NOW, query=_no_queue)
        assert running.exit_code == status.EXIT_HEALTHY and running.report.alerts == (), running.lines
        assert f"bsops launch --local (pid {holder.pid} on " in running.lines[0] and "task 500_2" in running.lines[0]
        assert f"processes {holder.pid} python" in running.lines[0] and "killed" not in running.lines[0]
    finally:
        holder.kill()
        holder.wait()
    stopped = watchdog.watch(settings, run=lifecycle.run_state(exp), now=NOW, query=_no_queue)
    [alert] = stopped.report.alerts
    assert alert.condition == "local-stopped" and stopped.exit_code == status.EXIT_ALERT
    assert alert.headline == ("launch it again (bsops launch life --local): stopped at iteration 120, nothing running "
                              "here")
    assert "task 500_2 was killed before it recorded its end" in alert.message  # as it was: nothing holds the run
    assert watchdog.watch(settings, run=lifecycle.run_state(exp), now=NOW, query=_no_queue).exit_code == 1
    save(Path(exp.paths.checkpoints), run_schedule(exp).train_iters)
    done = watchdog.watch(settings, run=lifecycle.run_state(exp), now=NOW, query=_no_queue)
    assert done.exit_code == status.EXIT_HEALTHY and done.report.finished_at == run_schedule(exp).train_iters
    assert [m["Subject"].split()[0] for m in inbox.messages] == ["[ALERT]", "[RECOVERED]", "[FINISHED]"], \
        [m["Subject"] for m in inbox.messages]


def test_a_slurm_launch_after_a_local_one_is_watched_in_the_queue_again(exp) -> None:
    from bigscience_ops.config.loading import to_dict

    out = Path(exp.paths.output)
    out.mkdir(parents=True)
    (out / "experiment.json").write_text(json.dumps(to_dict(exp)))
    assert lifecycle.run_state(exp).local
    record = out / "launches" / "20261122-120000" / "experiment.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps(to_dict(exp)))
    os.utime(out / "experiment.json", (NOW.timestamp() - 60, NOW.timestamp() - 60))
    assert not lifecycle.run_state(exp).local
