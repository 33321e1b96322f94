"""Cron emulation: runner scripts, scrontab entries, and self-respawning chains on the real cluster."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops import slurm
from bigscience_ops.ops.cron import runner as cron
from bigscience_ops.cli import main
from tests.fixtures_slurm import recorded_terminator, wait_until
from tests.fixtures_smtp import alerts_yaml


def test_next_boundary_is_on_the_hour() -> None:
    now = dt.datetime(2026, 11, 22, 3, 41, 7, tzinfo=dt.timezone.utc)
    assert cron.next_boundary(now, 3600) == dt.datetime(2026, 11, 22, 4, 0, 0, tzinfo=dt.timezone.utc)
    assert cron.next_boundary(now, 86400) == dt.datetime(2026, 11, 23, 0, 0, 0, tzinfo=dt.timezone.utc)
    on = dt.datetime(2026, 11, 22, 4, 0, 0, tzinfo=dt.timezone.utc)
    assert cron.next_boundary(on, 3600) == dt.datetime(2026, 11, 22, 5, 0, 0, tzinfo=dt.timezone.utc)


def test_job_names_come_from_the_script(tmp_path: Path) -> None:
    (tmp_path / "cron.hourly").mkdir()
    (tmp_path / "cron.hourly" / "a.slurm").write_text("#!/bin/bash\n#SBATCH --job-name='a long name'\necho\n")
    (tmp_path / "cron.hourly" / "b.slurm").write_text("#!/bin/bash\necho\n#SBATCH --job-name=ignored\n")
    (tmp_path / "cron.hourly" / "notes.txt").write_text("not a job")
    (tmp_path / "cron.hourly" / "c.slurm").write_text("#!/bin/bash\n#SBATCH --job-name='it\\'s' # note\necho\n")
    scripts = cron.folder_scripts(tmp_path, "hourly")
    assert [(s.name, slurm.script_job_name(s)) for s in scripts] == [
        ("a.slurm", "a long name"), ("b.slurm", "b"), ("c.slurm", "it's")]
    assert cron.folder_scripts(tmp_path, "daily") == []
    (tmp_path / "cron.hourly" / "d.slurm").write_text("#!/bin/bash\n#SBATCH --job-name='unclosed\necho\n")
    with pytest.raises(ValueError, match="unmatched"):
        slurm.script_job_name(tmp_path / "cron.hourly" / "d.slurm")


def test_runner_and_status_job_scripts_are_valid_bash(tmp_path: Path) -> None:
    settings = cron.CronSettings(partition="cpu_p,prepost", env_setup=["source /opt/env.sh"])
    runner = cron.write_runner(cron.render_runner(tmp_path, "hourly", settings, period_seconds=5))
    text = runner.read_text()
    assert "#SBATCH --job-name=bsops-cron-hourly\n" in text and "#SBATCH --partition=cpu_p,prepost\n" in text
    assert "--period-seconds 5" in text and "source /opt/env.sh\n" in text
    assert subprocess.run(["bash", "-n", str(runner)], timeout=30).returncode == 0
    result = CliRunner().invoke(main, ["cron", "add", "tr1-13B", "--cron-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    status_job = tmp_path / "cron.hourly" / "tr1-13B-slurm-status.slurm"
    assert "#SBATCH --job-name=bsops.tr1-13B.slurm-status\n" in status_job.read_text()
    assert "bsops status tr1-13B --trainings-dir" in status_job.read_text()
    assert subprocess.run(["bash", "-n", str(status_job)], timeout=30).returncode == 0


def test_cron_jobs_run_where_their_experiment_resolved_its_outputs(trainings: Path, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """Each job starts in the folder its experiment's relative outputs resolved against at `cron add` (the
    current folder for a bundled experiment, the project folder for the user's), whatever folder Slurm
    starts it in: a stand-in `bsops` on PATH records where the job ran it."""
    here = tmp_path / "added from"  # a space: the folder is quoted
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.delenv("BSOPS_TRAININGS", raising=False)
    monkeypatch.delenv("BSOPS_DATA_DIR", raising=False)
    stand_in = tmp_path / "bin" / "bsops"
    stand_in.parent.mkdir()
    stand_in.write_text('#!/bin/bash\npwd -P >> "$RAN_IN"\n')
    stand_in.chmod(0o755)
    env = dict(os.environ, PATH=f"{stand_in.parent}:{os.environ['PATH']}", RAN_IN=str(tmp_path / "ran-in"))
    for case, options, folder in (("bundled", [], here), ("project", ["--trainings-dir", str(trainings)], tmp_path)):
        cron_dir = tmp_path / f"cron-{case}"
        result = CliRunner().invoke(main, ["cron", "add", "tiny", "--cron-dir", str(cron_dir), *options])
        assert result.exit_code == 0, result.output
        (tmp_path / "ran-in").unlink(missing_ok=True)
        scripts = sorted((cron_dir / "cron.hourly").glob("*.slurm"))  # tiny has no hub repos or backup.dest
        assert [s.name for s in scripts] == ["tiny-slurm-status.slurm"]
        for script in scripts:
            ran = subprocess.run(["bash", str(script)], cwd="/", env=env, capture_output=True, text=True, timeout=30)
            assert ran.returncode == 0, ran.stderr
        assert (tmp_path / "ran-in").read_text().splitlines() == [str(folder.resolve())], case

def test_cron_settings_reject_unknown_keys(tmp_path: Path) -> None:
    (tmp_path / "cron.yaml").write_text("partiton: cpu\n")
    with pytest.raises(Exception) as err:
        cron.load_settings(tmp_path)
    assert "partition" in str(err.value)


@pytest.fixture
def cron_dir(tmp_path: Path, slurm_cluster, monkeypatch) -> Path:
    """A cron folder whose runners carry this session's prefix, with bsops on the jobs' PATH."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    directory = tmp_path / "cron"
    (directory / "cron.hourly").mkdir(parents=True)
    (directory / "cron.yaml").write_text(f"name_prefix: {slurm_cluster.prefix}-cron\ntime: '2'\n")
    yield directory
    for period in cron.PERIODS:
        name = cron.runner_name(period, f"{slurm_cluster.prefix}-cron")
        subprocess.run(["scancel", f"--name={name}"], timeout=30, check=False)


def _runner_jobs(prefix: str) -> list[slurm.Job]:
    return [j for j in slurm.query_jobs() if j.name.startswith(f"{prefix}-cron-")]


@pytest.mark.slurm
def test_install_twice_leaves_one_chain(cron_dir: Path, slurm_cluster) -> None:
    first = cron.install(cron_dir, period_seconds=3600)
    assert all("submitted" in line for line in first)
    second = cron.install(cron_dir, period_seconds=3600)
    assert all("already queued" in line for line in second)
    # Done when the first runners have ended and only their re-armed successors wait for the hour.
    jobs = wait_until("both chains re-armed for the next hour, the first runners gone",
                      lambda: (found := _runner_jobs(slurm_cluster.prefix)) and len(found) == 2
                      and all(j.reason == "BeginTime" for j in found) and found, timeout=60)
    assert sorted(j.name for j in jobs) == sorted(cron.runner_name(p, f"{slurm_cluster.prefix}-cron") for p in cron.PERIODS)
    assert all(j.reason == "BeginTime" and j.start_time.minute == 0 and j.start_time.second == 0 for j in jobs)
    states = cron.chains(cron_dir)
    assert all(len(s.jobs) == 1 for s in states) and "next run" in states[0].describe()


@pytest.mark.slurm
def test_install_dry_run_reads_the_queue_and_submits_and_writes_nothing(cron_dir: Path, slurm_cluster) -> None:
    before = sorted(str(p.relative_to(cron_dir)) for p in cron_dir.rglob("*"))
    lines = cron.install(cron_dir, period_seconds=3600, dry_run=True)
    assert len(lines) == len(cron.PERIODS) and all("would write" in line and "submit it" in line for line in lines)
    assert _runner_jobs(slurm_cluster.prefix) == []
    assert sorted(str(p.relative_to(cron_dir)) for p in cron_dir.rglob("*")) == before


@pytest.mark.slow
@pytest.mark.slurm
def test_runner_respawns_and_submits_its_folder(cron_dir: Path, slurm_cluster, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    job_name = f"{slurm_cluster.prefix}-hourly-job"
    (cron_dir / "cron.hourly" / "touch.slurm").write_text(
        f"#!/bin/bash\n#SBATCH --job-name={job_name}\n#SBATCH --time=1\n#SBATCH --output=/dev/null\n"
        f"touch {marks}/$SLURM_JOB_ID\n")
    # A job whose previous instance is still queued is skipped: this one is held the whole test.
    held = f"{slurm_cluster.prefix}-held"
    (cron_dir / "cron.hourly" / "held.slurm").write_text(f"#!/bin/bash\n#SBATCH --job-name={held}\necho\n")
    slurm_cluster.submit(cron_dir / "cron.hourly" / "held.slurm", name=held, hold=True)
    cron.install(cron_dir, period_seconds=4, periods=("hourly",))
    log = cron_dir / "logs" / "cron.hourly.log"
    wait_until("three runner passes", lambda: log.exists() and log.read_text().count("re-armed") >= 3, timeout=90)
    wait_until("the folder job ran twice", lambda: len(list(marks.iterdir())) >= 2, timeout=60)
    text = log.read_text()
    assert text.count(f"skipped held.slurm ({held}): previous instance") >= 3
    assert "touch.slurm" in text
    # Every pass re-armed on a 4-second boundary.
    stamps = [line.rsplit(" for ", 1)[1] for line in text.splitlines() if "re-armed" in line]
    assert all(int(s[-2:]) % 4 == 0 for s in stamps), stamps
    # Exactly one runner is waiting: the chain never forks.
    waiting = [j for j in _runner_jobs(slurm_cluster.prefix) if j.state == "PENDING"]
    assert len(waiting) <= 1


@pytest.mark.slurm
def test_a_pass_whose_next_runner_already_started_keeps_that_runners_successor(cron_dir: Path, slurm_cluster,
                                                                             tmp_path: Path) -> None:
    """A pass can outlast the start of the runner it re-armed (a late start, a short period): that runner re-arms
    in turn, and its successor is then the one runner waiting, not an extra chain to cancel."""
    settings = cron.load_settings(cron_dir)
    name = cron.runner_name("hourly", settings.name_prefix)
    runner = cron.write_runner(cron.render_runner(cron_dir, "hourly", settings))
    started = slurm_cluster.submit(slurm_cluster.script(tmp_path, "next.sh", "sleep 60"), name=name)
    wait_until("the re-armed runner running", lambda: [j for j in slurm_cluster.jobs(started) if j.state == "RUNNING"])
    alone = cron.run_pass(cron_dir, "hourly", runner, rearmed_job=started, rearmed_for="now")  # not re-armed yet
    successor = slurm_cluster.submit_held(name)
    report = cron.run_pass(cron_dir, "hourly", runner, rearmed_job=started, rearmed_for="now")
    assert not alone.failed and not report.failed and "cancelled" not in "\n".join(alone.lines + report.lines)
    assert [j.state for j in slurm.query_jobs(timeout=30) if j.job_id == successor] == ["PENDING"]


@pytest.mark.slurm
def test_a_failed_submission_is_logged_as_alert(cron_dir: Path, slurm_cluster) -> None:
    (cron_dir / "cron.hourly" / "bad.slurm").write_text("#!/bin/bash\n#SBATCH --partition=no-such-partition\necho\n")
    report = cron.run_pass(cron_dir, "hourly", runner=None)
    assert [Path(s).name for s, _ in report.failed] == ["bad.slurm"]
    assert "***ALERT: cron.hourly: submitting" in (cron_dir / "logs" / "cron.hourly.log").read_text()




# squeue that also prints the recorded jobs of another user whose names hold a real newline, U+2028, a forged
# record...: squeue's own records, ended with this query's terminator (from its SQUEUE_FORMAT), as a real squeue
# would print them.
HOSTILE_SQUEUE = """#!/bin/bash
{real} "$@" || exit
exec sed "s/{terminator}/${{SQUEUE_FORMAT##*$'\\x1f'}}/g" {recorded}
"""


@pytest.mark.slurm
def test_one_bad_script_and_a_hostile_queue_entry_never_stop_a_pass(cron_dir: Path, slurm_cluster, plain_server,
                                                                     tmp_path: Path, monkeypatch) -> None:
    """A script sbatch would refuse (an unclosed quote) is logged, emailed and skipped; the job beside it
    is submitted; queue entries with hostile names are counted in the log, not fatal."""
    inbox, port = plain_server
    with open(cron_dir / "cron.yaml", "a") as handle:
        handle.write(alerts_yaml(port))
    (tmp_path / "recorded").write_bytes((Path(__file__).parents[1] / "assets" / "slurm" / "squeue-hostile-names.txt")
                                        .read_bytes())
    (tmp_path / "squeue").write_text(HOSTILE_SQUEUE.format(real=shutil.which("squeue"), recorded=tmp_path / "recorded",
                                                           terminator=recorded_terminator()))
    (tmp_path / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (cron_dir / "cron.hourly" / "a-broken.slurm").write_text("#!/bin/bash\n#SBATCH --job-name='unclosed\necho\n")
    watchdog = f"{slurm_cluster.prefix}-watchdog"
    (cron_dir / "cron.hourly" / "b-watchdog.slurm").write_text(
        f"#!/bin/bash\n#SBATCH --job-name={watchdog}\n#SBATCH --time=1\n#SBATCH --output=/dev/null\n#SBATCH --hold\necho\n")
    report = cron.run_pass(cron_dir, "hourly", runner=None)
    slurm_cluster.submitted += [job_id for _, job_id in report.submitted]
    assert [name for name, _ in report.submitted] == [watchdog]
    assert [what for what, _ in report.failed] == [f"reading {cron_dir / 'cron.hourly' / 'a-broken.slurm'}"]
    log = cron.log_path(cron_dir, "hourly").read_text()
    assert "unmatched" in log and "10 squeue entries did not parse and were skipped" in log
    [mail] = inbox.messages
    assert "a-broken.slurm" in mail.get_content()


# squeue that fails on its first call, as a controller under load answers, then is the real one.
FLAKY_SQUEUE = """#!/bin/bash
if mkdir "$(dirname "$0")/failed-once" 2>/dev/null; then
    echo "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation" >&2
    exit 1
fi
exec {real} "$@"
"""


@pytest.mark.slow
@pytest.mark.slurm
def test_a_failing_squeue_is_emailed_and_the_chain_survives(cron_dir: Path, slurm_cluster, plain_server,
                                                           tmp_path: Path) -> None:
    inbox, port = plain_server
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "squeue").write_text(FLAKY_SQUEUE.format(real=shutil.which("squeue")))
    (shims / "squeue").chmod(0o755)
    with open(cron_dir / "cron.yaml", "a") as handle:
        handle.write(f"env_setup: ['export PATH={shims}:$PATH']\n"
                     + alerts_yaml(port))
    marks = tmp_path / "marks"
    marks.mkdir()
    (cron_dir / "cron.hourly" / "touch.slurm").write_text(
        f"#!/bin/bash\n#SBATCH --job-name={slurm_cluster.prefix}-touch\n#SBATCH --time=1\n#SBATCH --output=/dev/null\n"
        f"touch {marks}/$SLURM_JOB_ID\n")
    cron.install(cron_dir, period_seconds=4, periods=("hourly",))
    log = cron.log_path(cron_dir, "hourly")
    wait_until("three runner passes", lambda: log.exists() and log.read_text().count("pass done") >= 3, timeout=120)
    text = log.read_text()
    # The first pass could not ask Slurm: it said so and emailed, and the chain went on.
    assert text.count("***ALERT: cron.hourly: squeue failed") == 1, text
    assert text.count("re-armed") >= 3
    [mail] = inbox.messages
    assert "squeue" in mail["Subject"] and "Socket timed out" in mail.get_content()
    wait_until("the folder job ran in a later pass", lambda: list(marks.iterdir()), timeout=60)
    states = {s.name: s for s in cron.chains(cron_dir)}
    assert states[cron.runner_name("hourly", f"{slurm_cluster.prefix}-cron")].jobs


def test_cron_status_alerts_on_a_chain_that_missed_its_period(tmp_path: Path) -> None:
    from bigscience_ops.slurm import Job

    (tmp_path / "cron.yaml").write_text("name_prefix: c\n")
    settings = cron.load_settings(tmp_path)
    cron.write_runner(cron.render_runner(tmp_path, "hourly", settings, period_seconds=60))
    cron.write_runner(cron.render_runner(tmp_path, "daily", settings))
    now = dt.datetime(2026, 11, 22, 12, 0, 0).astimezone()
    due = now - dt.timedelta(minutes=3)
    late = Job(job_id="12", array_job_id="12", array_task=None, name="c-hourly", user="u", state="PENDING",
               reason="Priority", partition="p", num_nodes=1, nodes="", elapsed_s=0, time_limit_min=20,
               start_time=due.replace(tzinfo=None), submit_time=None, dependency=None)
    on_time = dataclasses.replace(late, job_id="13", array_job_id="13", name="c-daily",
                                  start_time=(now + dt.timedelta(hours=5)).replace(tzinfo=None))
    states = {s.name: s for s in cron.chains(tmp_path, jobs=[late, on_time], now=now)}
    assert [p for p in states["c-hourly"].problems if "missed its period" in p]
    assert states["c-daily"].problems == ()
    # The last pass logged long ago is a missed period too, and a missing chain is named.
    log = cron.log_path(tmp_path, "daily")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[2026-11-19 00:00:00] pass done\n")
    old = (now - dt.timedelta(days=3)).timestamp()
    os.utime(log, (old, old))
    states = {s.name: s for s in cron.chains(tmp_path, jobs=[on_time], now=now)}
    assert len(states["c-daily"].problems) == 1 and "last pass" in states["c-daily"].problems[0]
    assert len(states["c-hourly"].problems) == 1 and "not queued" in states["c-hourly"].problems[0]


@pytest.mark.parametrize(("jobs", "field"), [("backup", "backup.dest"), ("status,hub-sync", "hub.logs_repo")])
def test_cron_add_refuses_a_job_whose_settings_are_missing(tmp_path: Path, jobs: str, field: str) -> None:
    """tr1-13B-short has neither backup.dest nor a hub repo: its hourly backup or sync could only fail."""
    cron_dir = tmp_path / "cron"
    result = CliRunner().invoke(main, ["cron", "add", "tr1-13B-short", "--jobs", jobs, "--cron-dir", str(cron_dir)])
    assert result.exit_code == 2 and result.output.startswith("error: ") and len(result.output.splitlines()) == 1
    assert f"{field}: got None" in result.output and "Traceback" not in result.output
    assert not (cron_dir / "cron.hourly").exists() or not list((cron_dir / "cron.hourly").iterdir())


def test_cron_add_by_default_writes_the_jobs_the_experiment_has_settings_for(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["cron", "add", "tr1-13B-short", "--cron-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "not adding the backup job: backup.dest is not set" in result.output
    assert [p.name for p in (tmp_path / "cron.hourly").iterdir()] == ["tr1-13B-short-slurm-status.slurm"]


def test_the_chain_check_gets_the_status_runs_timeout(tmp_path: Path, monkeypatch) -> None:
    """A hung controller: the chains' squeue is given up after the status run's --timeout, not its own default."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\nexec sleep 120\n")  # stands in for a controller that never answers
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cron_dir = tmp_path / "cron"
    (cron_dir / "runners").mkdir(parents=True)
    with pytest.raises(slurm.SlurmError, match="within 1 s"):
        cron.chains(cron_dir, timeout=1)


def test_the_default_cron_folder_is_the_users(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert cron.default_cron_dir({"HOME": home}) == tmp_path / "home" / ".local" / "share" / "bsops" / "cron"
    assert cron.default_cron_dir({"HOME": home, "XDG_DATA_HOME": str(tmp_path / "xdg")}) == tmp_path / "xdg" / "bsops" / "cron"
    assert cron.default_cron_dir({"HOME": home, "XDG_DATA_HOME": "/x", "BSOPS_CRON_DIR": str(tmp_path / "c")}) == \
        tmp_path / "c"


def test_cron_add_list_remove_in_the_default_folder(trainings: Path, tmp_path: Path, monkeypatch) -> None:
    """Without --cron-dir the jobs go into the user's folder (named on stderr), never bsops' package; the job
    scripts and the runner name that folder, so they keep it whatever $BSOPS_CRON_DIR says later."""
    from bigscience_ops import resources

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("XDG_DATA_HOME", "BSOPS_CRON_DIR"):
        monkeypatch.delenv(name, raising=False)
    default = tmp_path / "home" / ".local" / "share" / "bsops" / "cron"
    (trainings / "full.yaml").write_text(f"base: tiny\nbackup: {{dest: {tmp_path / 'store'}}}\n")
    added = CliRunner().invoke(main, ["cron", "add", "full", "--trainings-dir", str(trainings)])
    assert added.exit_code == 0, added.output
    assert added.stderr.startswith(f"cron folder: {default} (the default")
    assert "not adding the hub-sync job: hub.logs_repo is not set" in added.stdout
    assert "no runner chain in" in added.stdout and "bsops cron install" in added.stdout
    assert CliRunner().invoke(main, ["cron", "add", "tiny"]).exit_code == 0
    assert sorted(p.name for p in (default / "cron.hourly").iterdir()) == [
        "full-backup.slurm", "full-slurm-status.slurm", "tiny-slurm-status.slurm"]
    assert not list(resources.bundled("templates").parent.rglob("*.slurm"))  # nothing into bsops' bundled folders
    assert f"--cron-dir {default}" in (default / "cron.hourly" / "full-slurm-status.slurm").read_text()
    runner = cron.render_runner(default, "hourly", cron.CronSettings())
    assert f"--cron-dir {default}" in runner.text and runner.path == default / "runners" / "bsops-cron-hourly.slurm"
    (default / "cron.hourly" / "mine.slurm").write_text("#!/bin/bash\n#SBATCH --job-name=mine\necho mine\n")

    listed = CliRunner().invoke(main, ["cron", "list"])
    assert listed.exit_code == 0 and [line.split() for line in listed.stdout.splitlines()] == [
        ["full", "backup", "hourly", str(default / "cron.hourly" / "full-backup.slurm")],
        ["full", "status", "hourly", str(default / "cron.hourly" / "full-slurm-status.slurm")],
        ["-", "other", "hourly", str(default / "cron.hourly" / "mine.slurm")],
        ["tiny", "status", "hourly", str(default / "cron.hourly" / "tiny-slurm-status.slurm")]]
    removed = CliRunner().invoke(main, ["cron", "remove", "full", "--jobs", "backup"])
    assert removed.exit_code == 0 and removed.stdout == f"removed {default / 'cron.hourly' / 'full-backup.slurm'}\n"
    assert CliRunner().invoke(main, ["cron", "remove", "full"]).exit_code == 0
    again = CliRunner().invoke(main, ["cron", "remove", "full"])
    assert again.exit_code == 1 and "no status/hub-sync/backup/eval job of full" in again.stdout
    assert CliRunner().invoke(main, ["cron", "remove", "mine"]).exit_code == 1  # not one cron add wrote: kept
    assert sorted(p.name for p in (default / "cron.hourly").iterdir()) == ["mine.slurm", "tiny-slurm-status.slurm"]
