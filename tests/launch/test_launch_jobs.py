"""One way out for every job (launch/jobs.py): the one sbatch call, the SlurmJob handle on the real test cluster, the
local executor's handle and the one process-tree stop (launch/processes.py)."""

from __future__ import annotations

import ast
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bigscience_ops import slurm
from bigscience_ops.launch import jobs, processes
from tests.fixtures_slurm import wait_until

REPO = Path(__file__).resolve().parents[2]


def _slurm_submit_calls() -> dict[str, list[int]]:
    """Module -> lines of every call of slurm's submit in the package (`slurm.submit(...)`, `commands.submit(...)`,
    or a bare `submit(...)` imported from bigscience_ops.slurm), and of any argv literal starting with "sbatch"
    handed to slurm.run."""
    found: dict[str, list[int]] = {}
    for path in sorted((REPO / "bigscience_ops").rglob("*.py")):
        if path.parts[-2] == "slurm" and path.parent.parent.name == "bigscience_ops":
            continue  # the slurm package defines it (argv.py builds the argv, commands.py runs it)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        from_slurm = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                      and (node.module or "").startswith("bigscience_ops.slurm") for alias in node.names
                      if alias.name == "submit"}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            submits = ((isinstance(f, ast.Attribute) and f.attr == "submit" and isinstance(f.value, ast.Name)
                        and f.value.id in ("slurm", "commands"))
                       or (isinstance(f, ast.Name) and f.id in from_slurm))
            runs_sbatch = (isinstance(f, ast.Attribute) and f.attr in ("run", "run_unchecked") and node.args
                           and isinstance(node.args[0], ast.List) and node.args[0].elts
                           and isinstance(node.args[0].elts[0], ast.Constant) and node.args[0].elts[0].value == "sbatch")
            if submits or runs_sbatch:
                found.setdefault(str(path.relative_to(REPO)), []).append(node.lineno)
    return found


def test_sbatch_is_called_from_one_module() -> None:
    """The training, the eval job, the cron runners and the hourly jobs all go out through launch/jobs.py."""
    calls = _slurm_submit_calls()
    assert list(calls) == ["bigscience_ops/launch/jobs.py"], calls
    assert len(calls["bigscience_ops/launch/jobs.py"]) == 1, calls


def test_the_checker_finds_a_second_caller(tmp_path: Path, monkeypatch) -> None:
    """The check above can fail: a module that calls slurm.submit itself is found."""
    fake = tmp_path / "bigscience_ops" / "ops"
    fake.mkdir(parents=True)
    (fake / "sneaky.py").write_text("from bigscience_ops import slurm\n\ndef go(a):\n    return slurm.submit(a)\n")
    (fake / "other.py").write_text("from bigscience_ops.slurm import submit as s\n\ns(['sbatch', 'x'])\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert _slurm_submit_calls() == {"bigscience_ops/ops/other.py": [3], "bigscience_ops/ops/sneaky.py": [4]}


def test_every_executor_returns_one_kind_of_job(tmp_path: Path) -> None:
    """Five executors start jobs (Slurm and local, for scripts, the training and the evaluation's ranks): each
    start returns a Job (id, log, state, cancel, wait), so no caller branches on what ran it."""
    from bigscience_ops.launch.local import LocalRun

    returned = {}
    for path in sorted((REPO / "bigscience_ops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "start" and item.args.args[:1] \
                            and item.args.args[0].arg == "self" and node.name not in ("Executor", "RunExecutor"):
                        returned[node.name] = ast.unparse(item.returns).rsplit(".", 1)[-1]
    assert len(returned) == 5 and set(returned.values()) == {"SlurmJob", "LocalJob", "LocalRun"}, returned
    proc = processes.start(["true"], stdout=None, stderr=None)
    local = processes.LocalJob(proc, "probe", tmp_path / "probe.out")
    assert local.wait(timeout=30) == 0 and local.state() == jobs.GONE
    made = [jobs.SlurmJob("probe", (), "7", tmp_path / "log"), local,
            LocalRun(SimpleNamespace(paths=SimpleNamespace(output=str(tmp_path), logs=str(tmp_path / "logs"))),
                     tmp_path / "job.sh", [], False, "5")]  # type: ignore[arg-type]
    for job in made:
        assert isinstance(job, jobs.Job), job
    assert (made[0].job_id, made[0].log, made[1].job_id, made[1].log, made[2].job_id, made[2].log.parent) == \
        ("7", tmp_path / "log", str(proc.pid), tmp_path / "probe.out", "5", tmp_path / "logs")
    assert made[2].state() == jobs.GONE and made[2].wait() == 0 and made[2].cancel() is None
    assert not isinstance(object(), jobs.Job)


def test_a_slurm_handle_waits_until_its_job_has_left_the_queue(monkeypatch) -> None:
    def job(state: str) -> slurm.Job:
        return slurm.Job("11_1", "11", None, "train", "u", state, "None", "p", 1, "", 0, None, None, None, None)

    answers = iter([[job("RUNNING")], [job("PENDING")], []])
    asked, slept = [], []

    class Clock:  # the handle's time: a sleep moves it on
        now = 100.0

        @classmethod
        def monotonic(cls) -> float:
            return cls.now

        @classmethod
        def sleep(cls, seconds: float) -> None:
            slept.append(seconds)
            cls.now += seconds

    monkeypatch.setattr(slurm, "query_jobs", lambda **kw: asked.append(kw) or next(answers))
    monkeypatch.setattr(jobs, "time", Clock)
    assert jobs.SlurmJob("train", (), "11").wait(timeout=None, poll_s=3) is None
    assert len(asked) == 3 and slept == [3, 3] and asked[0] == {"users": [], "name": "train"}
    answers = iter([[job("RUNNING")]] * 5)
    with pytest.raises(TimeoutError, match="job 11 still queued or running after 7 s"):
        jobs.SlurmJob("train", (), "11").wait(timeout=7, poll_s=3)
    assert slept[2:] == [3, 3]  # asked at 0, 3 and 6 s; a fourth ask would come after the 7 s


def test_the_handle_reads_a_queue_answer() -> None:
    def job(job_id: str, name: str, state: str) -> slurm.Job:
        return slurm.Job(job_id, job_id.split("_")[0], None, name, "u", state, "None", "p", 1, "", 0, None, None,
                         None, None)

    queue = [job("7_1", "t", "RUNNING"), job("7_[2-3%1]", "t", "PENDING"), job("8", "t", "COMPLETED"),
             job("9", "other", "RUNNING")]
    assert jobs.SlurmJob("t").state(queue) == jobs.RUNNING
    assert [j.job_id for j in jobs.SlurmJob("t").records(queue)] == ["7_1", "7_[2-3%1]"]
    assert jobs.SlurmJob("t", job_id="8").state(queue) == jobs.GONE  # completed: no longer queued
    assert [j.job_id for j in jobs.SlurmJob("t").named(queue)] == ["7_1", "7_[2-3%1]", "8"]  # what the watchdog reads
    assert jobs.SlurmJob("t", job_id="7").state(queue[1:]) == jobs.QUEUED
    asked = []
    assert jobs.SlurmJob("t", ("me",)).ask(lambda **kw: asked.append(kw) or []) == []
    assert asked == [{"users": ["me"], "name": "t"}]


@pytest.mark.slurm
def test_a_script_job_goes_out_and_its_handle_follows_it(slurm_cluster, tmp_path: Path) -> None:
    name = f"{slurm_cluster.prefix}-handle"
    out = tmp_path / "logs"
    text = f"#!/bin/bash\n#SBATCH --job-name={name}\n#SBATCH --time=2\n#SBATCH --output={out}/%j.out\nsleep 30\n"
    job = jobs.ScriptJob(name, tmp_path / "job.slurm", text, ((tmp_path / "record.json", "{}\n"),), (out,),
                         slurm.SbatchOptions(array_tasks=2))  # one task at a time: the second waits
    seen = []
    handle = jobs.run_job(job, jobs.SlurmScripts(), lambda kind, job_id: seen.append((kind, job_id)))
    slurm_cluster.submitted.append(handle.job_id)
    assert (tmp_path / "record.json").read_text() == "{}\n" and out.is_dir() and os.access(job.script, os.X_OK)
    assert handle.name == name and seen == [("job", handle.job_id)]
    wait_until("the job running", lambda: handle.state() == jobs.RUNNING, timeout=30)
    assert jobs.SlurmJob(name).state() == jobs.RUNNING  # found by name alone, as the schedulers ask
    assert handle.cancel(pending_only=True) == [f"{handle.job_id}_2"]  # the rest of the array, not the running task
    wait_until("the second task gone", lambda: [j.job_id for j in handle.records(handle.ask())] == [f"{handle.job_id}_1"],
               timeout=30)
    assert handle.state() == jobs.RUNNING
    assert jobs.SlurmJob("another-name", job_id=handle.job_id).cancel() == []  # an id alone never cancels a job
    assert handle.cancel() == [f"{handle.job_id}_1"]
    wait_until("the job gone", lambda: handle.state() == jobs.GONE, timeout=30)


def test_the_local_executor_runs_the_same_job_and_stops_all_of_it(tmp_path: Path) -> None:
    """A job whose child runs in a session of its own and ignores SIGTERM: stop_tree ends both."""
    pidfile = tmp_path / "child.pid"
    text = (f"#!/bin/bash\nsetsid bash -c 'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done' &\n"
            "wait\n")
    handle = jobs.run_job(jobs.ScriptJob("local", tmp_path / "job.slurm", text), jobs.LocalScripts())
    child = int(wait_until("the child's pid", lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=10))
    assert handle.state() == processes.RUNNING and processes.alive(child)
    assert child in processes.descendants(handle.proc.pid)
    started = time.monotonic()
    handle.stop(grace_s=1)
    # A hang detector, not a speed test: the stop takes its 1 s of grace; one that waited for the child to end of
    # itself would wait for ever (it ignores SIGTERM), or return with it alive (checked below).
    assert time.monotonic() - started < 60
    assert handle.state() == processes.GONE and not processes.alive(child)


def test_stop_tree_of_an_ended_job_returns_at_once(tmp_path: Path) -> None:
    proc = processes.start(["true"])
    proc.wait()
    started = time.monotonic()
    processes.stop_tree(proc, grace_s=3600)
    # A hang detector, not a speed test: it returns at once; one that waited out the grace would take an hour.
    assert time.monotonic() - started < 60


def test_raising_on_restores_the_handler() -> None:
    before = signal.getsignal(signal.SIGUSR2)

    class Told(Exception):
        def __init__(self, sig: signal.Signals) -> None:
            super().__init__(sig.name)

    with pytest.raises(Told, match="SIGUSR2"), processes.raising_on([signal.SIGUSR2], Told):
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(1)
    assert signal.getsignal(signal.SIGUSR2) == before
