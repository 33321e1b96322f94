"""The hostile table: squeue output, job names and log tails that a cluster, another user or a crashed node can
produce, each expecting a clear refusal or a correct result: no traceback, no hang, no silent wrong answer.

Slurm is faked only at the subprocess edge: a stand-in `squeue` (and `sbatch` where `cron run` submits) prints
constructed output ended with the terminator of the query that runs it, as the real client would; the parsers,
the watchdog and `cron run` run unchanged. Logs are real files (sparse where they stand for hundreds of MB of
NUL bytes, which read as such). Every case runs under a hang guard (SIGALRM)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops import slurm
from bigscience_ops.run import ledger
from bigscience_ops.run import log as runlog
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import ConfigError
from bigscience_ops.config.files import check_name
from bigscience_ops.run.iterations import parse_iteration_line
from bigscience_ops.ops import hourly_registry
from bigscience_ops.ops.cron import runner as cron
from bigscience_ops.ops import health
from bigscience_ops.ops.watch import status
from bigscience_ops.views import samples
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_status import ITERATION
from tests.hang import ends_within

D = slurm.SQUEUE_DELIMITER
T = b"@T@"  # stands for the query's terminator in a stand-in's output
NOW = datetime(2026, 11, 22, 3, 42, 0)
STARTED = "2026-11-22T01:00:00"
HANG_GUARD_S = 60


class Hung(Exception):
    pass


@pytest.fixture(autouse=True)
def hang_guard():
    """A case that blocks (a FIFO opened, a quadratic read) fails here instead of hanging the run."""
    def hung(*_):
        raise Hung(f"no answer within {HANG_GUARD_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_GUARD_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def record(job_id: str, name: str | bytes, *, state: str = "RUNNING", user: str = "u", **changed: str) -> bytes:
    """One squeue record as the real client prints it for slurm.squeue_format (name last, then the terminator)."""
    array = job_id.split("_")[0]
    values = {"job_id": job_id, "array_job_id": array, "array_task": job_id.split("_")[1] if "_" in job_id else "N/A",
              "own_id": array, "user": user, "state": state, "reason": "None" if state == "RUNNING" else "Priority",
              "partition": "p", "num_nodes": "1", "nodes": "n1" if state == "RUNNING" else "", "elapsed": "2:42:00",
              "time_limit": "20:00:00", "start_time": STARTED, "submit_time": STARTED, "dependency": "(null)",
              **changed}
    fields = [values[key].encode() for key, _ in slurm.SQUEUE_FIELDS[:-1]]
    return D.encode().join([*fields, name if isinstance(name, bytes) else name.encode(), T]) + b"\n"


class Cluster:
    """Stand-in Slurm clients at the subprocess edge, on PATH for this test."""

    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv("SLURM_CONF", raising=False)
        self.submitted = folder / "submitted"
        self.answer(b"")
        self._client("sbatch", f'echo "$@" >> {self.submitted}\necho 4242\n')

    def answer(self, output: bytes, *, code: int = 0, stderr: str = "") -> None:
        """squeue prints `output` (T replaced by its query's terminator), `stderr`, and exits `code`."""
        (self.folder / "squeue.out").write_bytes(output)
        (self.folder / "squeue.err").write_text(stderr)
        self._client("squeue", "export LC_ALL=C\nt=${SQUEUE_FORMAT##*$'\\x1f'}\n"
                               f'sed "s/@T@/$t/g" {self.folder / "squeue.out"}\ncat {self.folder / "squeue.err"} >&2\n'
                               f"exit {code}\n")

    def sbatch_calls(self) -> list[str]:
        return self.submitted.read_text().splitlines() if self.submitted.exists() else []

    def _client(self, name: str, body: str) -> None:
        path = self.folder / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    return Cluster(tmp_path / "bin", monkeypatch)


def _refused_as_unknown(cluster: Cluster, output: bytes) -> None:
    """squeue exits 0 with `output`: the queue is unknown (SlurmOutputError), and the watchdog says so (exit 2)."""
    cluster.answer(output)
    with pytest.raises(slurm.SlurmOutputError) as info:
        slurm.query_jobs(timeout=10)
    assert "cannot query Slurm" in str(info.value)
    report = status.check("tr1-13B", now=NOW, timeout=10)
    assert report.exit_code == status.EXIT_ERROR and [a.condition for a in report.alerts] == ["slurm-error"]


# --- squeue output -------------------------------------------------------------------------------------------

def squeue_garbage(cluster: Cluster, **_) -> None:
    _refused_as_unknown(cluster, b"this site's squeue wrapper says hello\n")


def squeue_header_only(cluster: Cluster, **_) -> None:
    _refused_as_unknown(cluster, b"JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)\n")


def squeue_truncated_record(cluster: Cluster, **_) -> None:
    _refused_as_unknown(cluster, record("5_1", "other") + record("6_1", "tr1-13B")[:50])


def squeue_too_few_fields(cluster: Cluster, **_) -> None:
    fields = record("5_1", "tr1-13B").split(D.encode())
    _refused_as_unknown(cluster, D.encode().join(fields[:5] + fields[6:]))


def squeue_a_field_too_many(cluster: Cluster, **_) -> None:
    fields = record("5_1", "tr1-13B").split(D.encode())
    _refused_as_unknown(cluster, D.encode().join([fields[0], b"extra", *fields[1:]]))


def squeue_missing_terminator(cluster: Cluster, **_) -> None:
    _refused_as_unknown(cluster, record("5_1", "tr1-13B").replace(D.encode() + T, b""))


def squeue_another_querys_terminator(cluster: Cluster, **_) -> None:
    _refused_as_unknown(cluster, record("5_1", "tr1-13B").replace(T, b"f" * 32))


def squeue_good_records_then_garbage(cluster: Cluster, **_) -> None:
    _refused_as_unknown(cluster, record("5_1", "tr1-13B") + b"Segmentation fault (core dumped)\n")


def squeue_binary_in_a_slurm_field(cluster: Cluster, **_) -> None:
    _refused_as_unknown(cluster, record("5_1", "tr1-13B", state="RUN\xffNING"))


def squeue_empty_is_an_empty_queue(cluster: Cluster, **_) -> None:
    cluster.answer(b"")
    assert slurm.query_jobs(timeout=10) == []
    report = status.check("tr1-13B", now=NOW, timeout=10)
    assert [a.condition for a in report.alerts] == ["not-scheduled"] and report.exit_code == status.EXIT_ALERT


def squeue_error_on_stderr_with_exit_0(cluster: Cluster, **_) -> None:
    cluster.answer(b"", stderr="squeue: error: Invalid user: nosuch\n")
    with pytest.raises(slurm.SlurmCommandError, match="Invalid user"):
        slurm.query_jobs(timeout=10)


def squeue_exits_1(cluster: Cluster, **_) -> None:
    cluster.answer(b"", code=1, stderr="squeue: error: Unable to contact slurm controller (connect failure)\n")
    report = status.check("tr1-13B", now=NOW, timeout=10)
    assert report.exit_code == status.EXIT_ERROR and "cannot reach the Slurm controller" in report.lines[0]


def squeue_name_not_utf8(cluster: Cluster, **_) -> None:
    cluster.answer(record("5_1", b"bad\xff\xfename") + record("6_1", "tr1-13B"))
    jobs = slurm.query_jobs(timeout=10)
    assert [j.name for j in jobs] == ["tr1-13B"] and len(jobs.unparsed) == 1
    report = status.check("tr1-13B", now=NOW, timeout=10)
    assert report.exit_code == status.EXIT_HEALTHY and "1 squeue entry did not parse" in report.lines[-1]


def squeue_nul_in_a_name(cluster: Cluster, **_) -> None:
    cluster.answer(record("5_1", b"tr1-13B\x00") + record("6_1", "other"))
    jobs = slurm.query_jobs(timeout=10)
    assert [j.name for j in jobs] == ["other"] and len(jobs.unparsed) == 1
    assert status.check("tr1-13B", now=NOW, timeout=10).alerts[0].condition == "not-scheduled"


def squeue_forged_record_in_a_name(cluster: Cluster, **_) -> None:
    forged = record("999_1", "tr1-13B", user="victim").replace(T, b"f" * 32)
    cluster.answer(record("5_1", b"x\n" + forged, user="mallory", state="PENDING"))
    report = status.check("tr1-13B", now=NOW, timeout=10)
    assert [a.condition for a in report.alerts] == ["not-scheduled"]  # the forged RUNNING record is not believed
    assert not [line for line in report.lines if "is running" in line]


def squeue_invalid_durations(cluster: Cluster, **_) -> None:
    cluster.answer(record("5_1", "tr1-13B", elapsed="INVALID", time_limit="INVALID"))
    [job] = slurm.query_jobs(timeout=10)
    assert (job.elapsed_s, job.time_limit_min) == (0, None)
    assert status.check("tr1-13B", now=NOW, timeout=10).exit_code == status.EXIT_HEALTHY


def squeue_ten_thousand_records(cluster: Cluster, **_) -> None:
    cluster.answer(b"".join(record(f"{i}_1", f"job-{i}", user=f"u{i % 7}") for i in range(10_000))
                   + record("20000_1", "tr1-13B"))
    report = ends_within(lambda: status.check("tr1-13B", now=NOW, timeout=30),
                         "10,001 records read back and forth (a quadratic reading would take minutes)")
    assert report.exit_code == status.EXIT_HEALTHY


def squeue_megabyte_name_compared_whole(cluster: Cluster, **_) -> None:
    long = "tr1-13B" + "x" * (1 << 20)
    cluster.answer(record("5_1", long))
    assert status.check("tr1-13B", now=NOW, timeout=10).alerts[0].condition == "not-scheduled"
    assert status.check(long, now=NOW, timeout=10).exit_code == status.EXIT_HEALTHY


def cron_run_with_unparseable_squeue(cluster: Cluster, tmp_path: Path, **_) -> None:
    """cron run is told 'cannot query Slurm', submits nothing blind, and never says to re-install a chain."""
    folder = tmp_path / "cron"
    (folder / "cron.hourly").mkdir(parents=True)
    (folder / "cron.hourly" / "job.slurm").write_text("#!/bin/bash\n#SBATCH --job-name=bsops.x.backup\necho\n")
    cluster.answer(b"garbage from a wrapper\n")
    report = cron.run_pass(folder, "hourly", runner=None, now=datetime.now().astimezone())
    assert [what for what, _ in report.failed] == ["squeue"] and "cannot query Slurm" in report.failed[0][1]
    assert report.submitted == [] and cluster.sbatch_calls() == []
    assert "install" not in "\n".join(report.lines)
    with pytest.raises(slurm.SlurmOutputError):
        cron.chains(folder)


# --- job names -----------------------------------------------------------------------------------------------

def reserved_experiment_name(**_) -> None:
    with pytest.raises(ConfigError) as info:
        check_name("bsops.x", "NAME")
    assert info.value.value == "bsops.x" and "bsops." in info.value.allowed


def reserved_slurm_job_name(trainings: Path, **_) -> None:
    (trainings / "sneaky.yaml").write_text("base: tiny\nslurm: {job_name: bsops.x.backup}\n")
    with pytest.raises(ConfigError) as info:
        load_experiment("sneaky", trainings)
    assert info.value.field == "slurm.job_name" and info.value.value == "bsops.x.backup"


def new_with_a_300_character_name(trainings: Path, **_) -> None:
    before = sorted(trainings.iterdir())
    result = CliRunner().invoke(main, ["new", "a" * 300, "--base", "tiny", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)  # a usage error, not an OSError
    assert "Traceback" not in result.output and "300 characters" in result.output
    assert sorted(trainings.iterdir()) == before


def new_with_the_reserved_form(trainings: Path, **_) -> None:
    result = CliRunner().invoke(main, ["new", "bsops.x", "--base", "tiny", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and "bsops." in result.output and not (trainings / "bsops.x.yaml").exists()


def look_alike_running_job(cluster: Cluster, trainings: Path, tmp_path: Path, **_) -> None:
    """A RUNNING job of the run's name whose array the run never submitted is another run's, not this run running."""
    exp = _experiment(trainings, tmp_path, "watched")
    ledger.mark_launch(Path(exp.paths.output), "5000")
    cluster.answer(record("6000_1", "watched", user="someone-else"))
    report = status.check("watched", now=NOW, timeout=10, run=_run(exp))
    assert [a.condition for a in report.alerts] == ["not-scheduled"]
    assert "a job of another run with this name" in report.lines[0]
    cluster.answer(record("6000_1", "watched", user="someone-else") + record("5000_2", "watched"))
    assert status.check("watched", now=NOW, timeout=10, run=_run(exp)).exit_code == status.EXIT_HEALTHY


def hourly_job_is_not_a_training(cluster: Cluster, trainings: Path, tmp_path: Path, **_) -> None:
    """Experiment x's backup job running is not experiment x-backup running: x-backup's stop is an alert."""
    x = _experiment(trainings, tmp_path, "x", "backup: {dest: /tmp/store}\n")
    exp = _experiment(trainings, tmp_path, "x-backup")
    ledger.mark_launch(Path(exp.paths.output), "5000")
    cluster.answer(record("7000", hourly_registry.job_name_of("backup", x)))
    report = status.check(exp.slurm.job_name, now=NOW, timeout=10, run=_run(exp))
    assert [a.condition for a in report.alerts] == ["not-scheduled"]


def cron_run_submits_x_backup_beside_experiment_x_backup(cluster: Cluster, trainings: Path, tmp_path: Path,
                                                          **_) -> None:
    """The training job of an experiment named x-backup never makes `cron run` skip x's backup as still running."""
    x = _experiment(trainings, tmp_path, "x", "backup: {dest: /tmp/store}\n")
    folder = tmp_path / "cron"
    cron.write_runner(hourly_registry.render("backup", folder, x, trainings, cron.CronSettings()))
    cluster.answer(record("5000_1", "x-backup", user=os.environ.get("USER", "u")))
    report = cron.run_pass(folder, "hourly", runner=None, now=datetime.now().astimezone())
    assert report.skipped == [] and [name for name, _ in report.submitted] == ["bsops.x.backup"]
    assert len(cluster.sbatch_calls()) == 1
    cluster.answer(record("4242", "bsops.x.backup"))  # its own previous instance still runs: that one is skipped
    again = cron.run_pass(folder, "hourly", runner=None, now=datetime.now().astimezone())
    assert [name for name, _ in again.skipped] == ["bsops.x.backup"] and again.submitted == []


def unicode_look_alike_name(cluster: Cluster, **_) -> None:
    cluster.answer(record("5_1", "tr1\u201013B") + record("6_1", "tr1-13B\u200b"))  # hyphen U+2010, zero-width space
    assert status.check("tr1-13B", now=NOW, timeout=10).alerts[0].condition == "not-scheduled"


def name_with_a_trailing_space(cluster: Cluster, **_) -> None:
    cluster.answer(record("5_1", "tr1-13B "))
    assert [j.name for j in slurm.query_jobs(timeout=10)] == ["tr1-13B "]
    assert status.check("tr1-13B", now=NOW, timeout=10).alerts[0].condition == "not-scheduled"


def name_cut_at_a_column_width_is_no_match(cluster: Cluster, **_) -> None:
    long = "tr1-13B-round3-a-job-name-longer-than-forty-characters"
    cluster.answer(record("5_1", long[:40]))  # what a fixed-width squeue would show
    assert status.check(long, now=NOW, timeout=10).alerts[0].condition == "not-scheduled"


# --- log tails -----------------------------------------------------------------------------------------------

def log_with_a_line_of_70_mb(tmp_path: Path, **_) -> None:
    log = tmp_path / "main_log.txt"
    with open(log, "wb") as f:
        f.write((ITERATION + "\n").encode())
        for _ in range(70):
            f.write(b"x" * (1 << 20))
    lines, offset = runlog.tail(log, 20)  # how long these take against a normal log: benchmarks/log_tail.py
    assert len(lines) == 1 and lines[0].startswith("[bsops: only the last") and offset < log.stat().st_size
    progress = status.read_progress(log)
    assert progress.last_iteration is None and progress.searched == status.PROGRESS_BYTES


def log_ending_in_256_mb_of_nuls(tmp_path: Path, trainings: Path, **_) -> None:
    exp = _experiment(trainings, tmp_path, "nuls")
    log = Path(exp.paths.logs) / "main_log.txt"
    log.parent.mkdir(parents=True)
    with open(log, "wb") as f:
        f.write((ITERATION + "\n").encode())
        f.truncate(256 << 20)
    # How long `logs` and `info` take on it, against a normal log: benchmarks/log_tail.py (nuls).
    result = CliRunner().invoke(main, ["logs", "nuls", "--trainings-dir", str(trainings), "-n", "5"])
    assert result.exit_code == 0 and "NUL bytes" in result.stdout
    info = CliRunner().invoke(main, ["info", "nuls", "--trainings-dir", str(trainings)])
    assert info.exit_code == 0 and "Traceback" not in info.output


def log_of_binary_garbage(tmp_path: Path, **_) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes(os.urandom(1 << 20) + b"\n" + (ITERATION + "\n").encode())
    lines, _ = runlog.tail(log, 50)
    assert lines[-1] == ITERATION and all(len(line.encode()) <= 4 * runlog.LINE_BYTES for line in lines)
    assert health.entries(lines)[-1].stats.iteration == 168000
    assert status.read_progress(log).last_iteration == ITERATION.strip()


def log_is_a_fifo(tmp_path: Path, trainings: Path, **_) -> None:
    exp = _experiment(trainings, tmp_path, "fifo")
    log = Path(exp.paths.logs) / "main_log.txt"
    log.parent.mkdir(parents=True)
    os.mkfifo(log)
    with pytest.raises(runlog.LogError, match="FIFO"):
        runlog.find_log(exp)
    result = CliRunner().invoke(main, ["logs", "fifo", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and "FIFO" in result.output
    assert "not a log file" in status.read_progress(log).problem
    with pytest.raises(samples.SamplesError, match="FIFO"):
        samples._read_log(exp, None)


def log_is_a_folder(tmp_path: Path, trainings: Path, **_) -> None:
    exp = _experiment(trainings, tmp_path, "folder")
    (Path(exp.paths.logs) / "main_log.txt").mkdir(parents=True)
    with pytest.raises(runlog.LogError, match="folder"):
        runlog.find_log(exp)


def log_links_to_a_device(tmp_path: Path, **_) -> None:
    (tmp_path / "main_log.txt").symlink_to("/dev/zero")
    with pytest.raises(runlog.LogError, match="is a link"):
        runlog.tail(tmp_path / "main_log.txt", 5)
    assert "is a link" in status.read_progress(tmp_path / "main_log.txt").problem


def log_links_to_a_secret(tmp_path: Path, trainings: Path, **_) -> None:
    """A logs repo clone whose main_log.txt links to a key: `bsops logs --from-clone` refuses it by name."""
    exp = _experiment(trainings, tmp_path, "linked")
    (tmp_path / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "main_log.txt").symlink_to(tmp_path / "id_rsa")
    with pytest.raises(runlog.LogError, match="is a link"):
        runlog.find_log(exp, clone)
    result = CliRunner().invoke(main, ["logs", "linked", "--trainings-dir", str(trainings), "--from-clone", str(clone)])
    assert result.exit_code == 2 and "PRIVATE KEY" not in result.output and "is a link" in result.output


def log_link_dangles(tmp_path: Path, trainings: Path, **_) -> None:
    exp = _experiment(trainings, tmp_path, "dangling")
    Path(exp.paths.logs).mkdir(parents=True)
    (Path(exp.paths.logs) / "main_log.txt").symlink_to(tmp_path / "nowhere")
    with pytest.raises(runlog.LogError, match="is a link"):
        runlog.find_log(exp)
    assert "is a link" in status.read_progress(Path(exp.paths.logs) / "main_log.txt").problem


def iteration_number_of_5000_digits(**_) -> None:
    assert parse_iteration_line(" iteration " + "9" * 5000 + "/ 10 | lm loss: 2.0 |") is None
    assert parse_iteration_line(" iteration 1/ 10 | lm loss: 2.0 |" + "x" * 20_000) is None


def stamp_that_is_no_date(tmp_path: Path, **_) -> None:
    log = tmp_path / "main_log.txt"
    log.write_text(ITERATION + "\n[2026-02-30 25:61:61] watchdog line\n")
    assert status.read_progress(log).last_iteration == ITERATION.strip()


def samples_start_line_with_micro_batch_size_0(**_) -> None:
    line = ("> training tiny: 1000 parameters, TP=1 PP=2 DP=2, micro batch size 0, on data.blend, 28 iterations, "
            "starting at 0")
    layouts, skipped = samples.read_layouts([line])
    assert layouts == [] and len(skipped) == 1 and "micro batch size 0" in skipped[0]


def crlf_and_carriage_returns(tmp_path: Path, **_) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes((ITERATION + "\r\n").encode() + b"progress 10%\rprogress 100%\r\n")
    assert runlog.tail(log, 2)[0] == [ITERATION, "progress 10%\rprogress 100%"]


def watchdog_log_is_a_fifo(tmp_path: Path, **_) -> None:
    os.mkfifo(tmp_path / "watchdog.log")
    with pytest.raises(runlog.LogError):
        status.append_to_log(status.watchdog_log(tmp_path / "main_log.txt"), ["a line"])


def cron_folder_holds_a_fifo_script(cluster: Cluster, tmp_path: Path, **_) -> None:
    folder = tmp_path / "cron"
    (folder / "cron.hourly").mkdir(parents=True)
    os.mkfifo(folder / "cron.hourly" / "a-fifo.slurm")
    (folder / "cron.hourly" / "b-job.slurm").write_text("#!/bin/bash\n#SBATCH --job-name=bsops.x.backup\necho\n")
    report = cron.run_pass(folder, "hourly", runner=None, now=datetime.now().astimezone())
    assert [Path(what.split(" ", 1)[1]).name for what, _ in report.failed] == ["a-fifo.slurm"]
    assert [name for name, _ in report.submitted] == ["bsops.x.backup"]
    assert [i.kind for i in hourly_registry.installed(folder)] == [None, None]  # read by name and head, never blocked


def cron_log_and_runner_are_fifos(cluster: Cluster, tmp_path: Path, **_) -> None:
    """A FIFO in place of the cron log or of a runner script never blocks `cron run` or `cron status`."""
    folder = tmp_path / "cron"
    (folder / "cron.hourly").mkdir(parents=True)
    (folder / "logs").mkdir()
    (folder / "runners").mkdir()
    os.mkfifo(cron.log_path(folder, "hourly"))
    os.mkfifo(folder / "runners" / f"{cron.runner_name('hourly')}.slurm")
    assert cron.runner_period(folder, "hourly", "bsops-cron") == cron.PERIODS["hourly"]
    with pytest.raises(runlog.LogError, match="FIFO"):
        cron.run_pass(folder, "hourly", runner=None, now=datetime.now().astimezone())
    states = cron.chains(folder)
    assert [s.installed for s in states] == [True, False] and "not queued" in states[0].problems[0]


# --- helpers and the table -------------------------------------------------------------------------------------

def _experiment(trainings: Path, tmp_path: Path, name: str, *sections: str):
    (trainings / f"{name}.yaml").write_text(tiny_yaml(tmp_path / "runs" / name, *sections))
    return load_experiment(name, trainings)


def _run(exp):
    from bigscience_ops.ops.watch import lifecycle

    return lifecycle.run_state(exp, timeout=10)


CASES: list[Callable[..., None]] = [
    squeue_garbage, squeue_header_only, squeue_truncated_record, squeue_too_few_fields, squeue_a_field_too_many,
    squeue_missing_terminator, squeue_another_querys_terminator, squeue_good_records_then_garbage,
    squeue_binary_in_a_slurm_field, squeue_empty_is_an_empty_queue, squeue_error_on_stderr_with_exit_0,
    squeue_exits_1, squeue_name_not_utf8, squeue_nul_in_a_name, squeue_forged_record_in_a_name,
    squeue_invalid_durations, squeue_ten_thousand_records, squeue_megabyte_name_compared_whole,
    cron_run_with_unparseable_squeue,
    reserved_experiment_name, reserved_slurm_job_name, new_with_a_300_character_name, new_with_the_reserved_form,
    look_alike_running_job, hourly_job_is_not_a_training, cron_run_submits_x_backup_beside_experiment_x_backup,
    unicode_look_alike_name, name_with_a_trailing_space, name_cut_at_a_column_width_is_no_match,
    log_with_a_line_of_70_mb, log_ending_in_256_mb_of_nuls, log_of_binary_garbage, log_is_a_fifo, log_is_a_folder,
    log_links_to_a_device, log_links_to_a_secret, log_link_dangles, iteration_number_of_5000_digits,
    stamp_that_is_no_date, samples_start_line_with_micro_batch_size_0, crlf_and_carriage_returns,
    watchdog_log_is_a_fifo, cron_folder_holds_a_fifo_script, cron_log_and_runner_are_fifos,
]


@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
def test_hostile_input(case: Callable[..., None], cluster: Cluster, trainings: Path, tmp_path: Path) -> None:
    case(cluster=cluster, trainings=trainings, tmp_path=tmp_path)


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 30 and len({case.__name__ for case in CASES}) == len(CASES)
