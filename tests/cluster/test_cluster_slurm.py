"""Against the real single-node Slurm (tests/fixtures_slurm.py starts it): arrays, chains, and what
the status watchdog reports for real running, pending, held, never-starting, missing and hung jobs."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bigscience_ops import slurm
from bigscience_ops.ops.watch import status
from tests.fixtures_slurm import SlurmCluster, wait_until

pytestmark = pytest.mark.slurm


@pytest.mark.slow
def test_array_runs_one_task_at_a_time_and_a_chain_waits_for_all_of_it(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    cluster = slurm_cluster
    name = f"{cluster.prefix}-array"
    events = tmp_path / "events.txt"
    task = cluster.script(tmp_path, "task.sh", f"""
echo "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID start $(date +%s.%N)" >> {events}
sleep 2
echo "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID end $(date +%s.%N)" >> {events}""")
    first = cluster.submit(task, name=name, array_tasks=3)
    # What `bsops launch --after-current` does: depend on the whole array, never on one task.
    second = cluster.submit(task, name=name, array_tasks=2, after_any=[first])

    def seen_running_waiting_and_chained() -> status.StatusReport | None:
        report = status.check(name, timeout=30)
        text = "\n".join(report.lines)
        ok = ("is running for" in text and "previous job array task" in text
              and f"{second}_[1-2%1]" in text and "dependency" in text)
        return report if ok else None

    report = wait_until("a running task, the rest of its array and the chained array",
                        seen_running_waiting_and_chained, timeout=30)
    assert report.exit_code == status.EXIT_HEALTHY
    wait_until("both arrays to finish", lambda: not cluster.jobs(first) and not cluster.jobs(second), timeout=90)

    spans: dict[tuple[str, str], dict[str, float]] = {}
    for line in events.read_text().splitlines():
        job, index, what, when = line.split()
        spans.setdefault((job, index), {})[what] = float(when)
    order = sorted(spans.items(), key=lambda kv: kv[1]["start"])
    assert [key for key, _ in order] == [(first, "1"), (first, "2"), (first, "3"), (second, "1"), (second, "2")]
    for (_, before), (key, after) in zip(order, order[1:]):
        assert after["start"] >= before["end"], f"{key} started before the previous task ended"


def test_status_reports_real_jobs(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    cluster = slurm_cluster
    p = cluster.prefix
    sleeper = cluster.script(tmp_path, "sleep.sh", "sleep 100")
    failing = cluster.script(tmp_path, "fail.sh", "exit 3")
    long_name = f"{p}-tr1-13B-round3-a-training-name-longer-than-forty-characters"
    assert len(long_name) > 40
    running = cluster.submit(sleeper, name=long_name)
    names = {
        "dependency": cluster.submit(sleeper, name=f"{p}-dependency", after_any=[running]),
        "begin": cluster.submit(sleeper, name=f"{p}-begin", begin="now+1hour"),
        "held": cluster.submit(sleeper, name=f"{p}-held", hold=True),
        "down": cluster.submit(sleeper, name=f"{p}-down", partition=cluster.down_partition),
    }
    failed = cluster.submit(failing, name=f"{p}-failed")
    wait_until("the failing job to end", lambda: not cluster.jobs(failed), timeout=30)
    never = cluster.submit(sleeper, name=f"{p}-never", after_ok=[failed])

    want = {running: "None", names["dependency"]: "Dependency", names["begin"]: "BeginTime",
            names["held"]: "JobHeldUser", names["down"]: "PartitionDown", never: "DependencyNeverSatisfied"}

    def reasons_reached() -> dict[str, str] | None:
        got = {j.array_job_id: j.reason for j in cluster.jobs() if j.array_job_id in want}
        return got if got == want else None

    wait_until(f"the reasons {want}", reasons_reached, timeout=30)

    report = status.check(long_name, timeout=30)
    assert report.exit_code == status.EXIT_HEALTHY, report.lines
    assert len(report.lines) == 1
    assert f"{long_name} is running for " in report.lines[0]
    assert f"({running} on '{cluster.partition}' partition (" in report.lines[0]

    report = status.check(f"{p}-dependency", timeout=30)
    assert report.exit_code == status.EXIT_HEALTHY and f"afterany:{running}" in report.lines[0]
    report = status.check(f"{p}-begin", timeout=30)
    assert report.exit_code == status.EXIT_HEALTHY, report.lines
    # An hour from submission, less the seconds since: 1:00:00 when checked in the submission's second.
    wait = re.search(r"scheduled to start in (\S+) ", report.lines[0])
    assert wait and 3600 - 120 <= slurm.parse_duration(wait.group(1)) <= 3600, report.lines[0]

    for key, reason in (("held", "JobHeldUser"), ("down", "PartitionDown"), ("never", "DependencyNeverSatisfied")):
        report = status.check(f"{p}-{key}", timeout=30)
        assert report.exit_code == status.EXIT_ALERT, report.lines
        assert [a.condition for a in report.alerts] == ["never-starts"]  # release or cancel it, not launch again
        assert reason in report.lines[0]

    missing = status.check(f"{p}-no-such-job", timeout=30)
    assert missing.exit_code == status.EXIT_ALERT
    assert missing.lines[0].endswith(f"***ALERT: {p}-no-such-job is not RUNNING or SCHEDULED! "
                                     f"Alert someone at {status.DEFAULT_CONTACT}***")
    # A prefix of the long name cut at squeue's old column width is not the job.
    assert status.check(long_name[:40], timeout=30).exit_code == status.EXIT_ALERT

    log = tmp_path / "main_log.txt"
    cli = subprocess.run([sys.executable, "-c", "from bigscience_ops.cli import main; main()", "status",
                          "--job-name", long_name, "--log", str(log), "--no-email"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode == 0, cli.stderr
    assert f"{long_name} is running for" in cli.stdout and (tmp_path / "watchdog.log").read_text() == cli.stdout
    assert not log.exists()

    shown = slurm.show_job(running, timeout=30)
    assert shown[0]["JobName"] == long_name and shown[0]["JobState"] == "RUNNING"
    slurm.cancel([running], timeout=30)
    wait_until("the dependent job to start once its dependency ended",
               lambda: any(j.state == "RUNNING" for j in cluster.jobs(names["dependency"])), timeout=30)


@pytest.mark.slow
def test_status_tells_a_hung_training_from_a_progressing_one(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    cluster = slurm_cluster
    line = "iteration {i}/ 100 | consumed samples: {i} | lm loss: 2.0 |"
    hung_log, live_log = tmp_path / "hung.txt", tmp_path / "live.txt"
    hung = cluster.script(tmp_path, "hung.sh", f'echo " {line.format(i=1)}" >> {hung_log}; sleep 100')
    live = cluster.script(tmp_path, "live.sh",
                          f'for i in $(seq 1 200); do echo " {line.format(i="$i")}" >> {live_log}; sleep 0.5; done')
    hung_id = cluster.submit(hung, name=f"{cluster.prefix}-hung")
    live_id = cluster.submit(live, name=f"{cluster.prefix}-live")

    def both_running_for(seconds: int) -> bool:
        """Both jobs running that long, and the hung one's line written that long ago (its script may start a few
        seconds after the job does on a loaded machine: the stall counts from the later of the two)."""
        jobs = cluster.jobs()
        ages = [j.elapsed_s for j in jobs if j.array_job_id in (hung_id, live_id) and j.state == "RUNNING"]
        written = hung_log.exists() and time.time() - hung_log.stat().st_mtime >= seconds
        return len(ages) == 2 and min(ages) >= seconds and written

    wait_until("both jobs running for 8 s", lambda: both_running_for(8), timeout=60)
    hung_report = status.check(f"{cluster.prefix}-hung", log_path=hung_log, stall_minutes=0.1, timeout=30)
    assert [a.condition for a in hung_report.alerts] == ["stalled"], hung_report.lines
    assert hung_report.exit_code == status.EXIT_ALERT and "iteration 1/ 100" in hung_report.alerts[0].message
    live_report = status.check(f"{cluster.prefix}-live", log_path=live_log, stall_minutes=0.1, timeout=30)
    assert live_report.exit_code == status.EXIT_HEALTHY, live_report.lines
    slurm.cancel([hung_id, live_id], timeout=30)


def test_test_only_predicts_a_start(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = slurm_cluster.script(tmp_path, "noop.sh", "true")
    argv = slurm.sbatch_argv(script, slurm.SbatchOptions(job_name=f"{slurm_cluster.prefix}-test-only", array_tasks=4,
                                                         time_limit="2", test_only=True))
    answer = slurm.parse_sbatch_test_only(slurm.run(argv, timeout=30).stderr)
    assert answer.partition == slurm_cluster.partition and answer.start_time is not None
    assert not [j for j in slurm.query_jobs(timeout=30) if j.name == f"{slurm_cluster.prefix}-test-only"]


def test_slurm_up_leaves_a_cluster_that_is_up_as_it_is(slurm_cluster: SlurmCluster) -> None:
    """A second slurm-up.sh (each session's fixture runs it) only prints the environment: the same daemons go on,
    none restarted (their pid files name the same live processes), nothing installed or configured."""
    from tests.fixtures_slurm import REPO

    run = slurm_cluster.conf.parent.parent / "run"

    def daemons() -> dict[str, int]:
        return {pid.name: int(pid.read_text()) for pid in sorted(run.glob("*.pid"))}

    before = daemons()
    assert {"munged.pid", "slurmctld.pid"} <= set(before) and any(n.startswith("slurmd-") for n in before), before
    proc = subprocess.run(["bash", str(REPO / "scripts" / "slurm-up.sh")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"export SLURM_CONF={slurm_cluster.conf}" and proc.stderr == ""
    assert daemons() == before and all(Path(f"/proc/{pid}").is_dir() for pid in before.values())


def test_a_job_name_holding_a_forged_record_never_becomes_a_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Another user's held jobs named with a newline and a whole RUNNING record of our training, in the
    plain-line format and with a guessed terminator, submitted to the real cluster: status (querying every
    user, as with slurm.group unset) does not believe them, still sees the bystander job beside them, and
    counts what it skipped."""
    cluster = slurm_cluster
    victim, bystander = f"{cluster.prefix}-victim", f"{cluster.prefix}-bystander"
    D = slurm.SQUEUE_DELIMITER
    forged = D.join(["999", "999", "N/A", "999", "victim", "RUNNING", "None", cluster.partition, "1", "vmn1",
                     "1:00:00", "20:00:00", "2026-01-01T00:00:00", "2026-01-01T00:00:00", "(null)", victim])
    hostile = [cluster.submit_held(f"x\n{forged}\n", user="nobody"),
               cluster.submit_held(f"y\n{forged}{D}{'0' * 32}\nz", user="nobody"),
               cluster.submit_held(f"{victim}\nn")]
    sleeper = cluster.script(tmp_path, "sleep.sh", "sleep 60")
    waiting = cluster.submit(sleeper, name=bystander, begin="now+1hour")
    jobs = slurm.query_jobs(timeout=30)
    assert victim not in {j.name for j in jobs} and "999" not in {j.job_id for j in jobs}
    assert [j.job_id for j in jobs if j.name == bystander] == [waiting]
    skipped = [line for line in jobs.unparsed if line.startswith(tuple(f"job {i} of " for i in hostile))]
    assert len(skipped) == 3, jobs.unparsed

    report = status.check(victim, timeout=30)
    assert [a.condition for a in report.alerts] == ["not-scheduled"], report.lines
    assert re.search(r"\d+ squeue entr(y|ies) did not parse", report.lines[-1]), report.lines
    assert status.check(bystander, timeout=30).exit_code == status.EXIT_HEALTHY
    slurm.cancel([*hostile, waiting], timeout=30)
