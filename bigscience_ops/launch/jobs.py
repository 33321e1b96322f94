"""Every job bsops starts goes out one way: described once, written, then started by an Executor (Slurm or local).

- `Executor`: where a job runs. `write(job)` writes what the job needs and returns its script; `start(job, script,
  started)` submits or runs it. The only per-backend parts are the submission (sbatch, or bash in a process group
  of its own) and the handle it returns (as submitit's executors differ only in their submission text and command).
  The training's LaunchPlan has two (launch/cluster.py, launch/local.py); every other job is a `ScriptJob`, carried
  out with `SlurmScripts` or `LocalScripts` by `run_job`.
- `submit`: the one call of sbatch in bsops (tests/launch/test_launch_jobs.py checks it); every executor submits through it.
- `Job`: what every executor's `start` returns (submitit's Job): its id, its state (queued, running, gone),
  cancel, wait, and the path of its log. `SlurmJob` is a job in the queue, found by name (and, once sbatch
  answered, by id); the launch check, the eval scheduler, the cron runner and the watchdog ask it, and none of them
  reads squeue's records by name on its own. `processes.LocalJob` is a job run here in a process group, and
  launch/local.py's `LocalRun` a training's array run here, task after task (gone once `start` returns).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from bigscience_ops import slurm
from bigscience_ops.launch import processes
from bigscience_ops.untrusted import write_atomically

QUEUED, RUNNING, GONE = "queued", "running", "gone"
"""A job's state as its handle tells it: waiting in the queue, running (any task of it), or no longer queued."""

@runtime_checkable
class Job(Protocol):
    """A job bsops started, wherever it runs: what `bsops launch`, the eval scheduler and the cron runner ask of it."""

    @property
    def job_id(self) -> str | None:
        """Slurm's job id (an array's), the local process group's, or a local run's array id; None before sbatch
        answered."""

    @property
    def log(self) -> Path | None:
        """Where its output goes (a training's: the run's main log); None when it is not known here."""

    def state(self) -> str:
        """QUEUED, RUNNING or GONE."""

    def cancel(self) -> object:
        """End it (queued or running); a job already gone is left as it is."""

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until it is GONE; its exit code where this machine knows it (a local job), else None. Raises
        TimeoutError after `timeout` seconds."""


Spec = TypeVar("Spec", contravariant=True)
Result = TypeVar("Result", bound=Job, covariant=True)
"""What an executor's start returns: a Job, whatever the executor."""
Started = Callable[[str, str], None]
"""What an executor calls once its job has started: (job kind, job id)."""


class Executor(Protocol[Spec, Result]):
    """Where a job runs: Slurm or this machine. The same files are written in the same order either way."""

    def write(self, job: Spec) -> Path:
        """Write what the job needs (its record, its script); returns the script."""

    def start(self, job: Spec, script: Path, started: Started) -> Result:
        """Submit or run the written job; call `started(kind, job_id)` once it has started."""


def _nothing(kind: str, job_id: str) -> None:
    return None


# ----------------------------------------------------------------------------- the handle of a queued job

Query = Callable[..., Sequence[slurm.Job]]
"""slurm.query_jobs or a stand-in with its keywords (users, name, timeout)."""


@dataclass(frozen=True)
class SlurmJob:
    """A job of the queue by its name, of these users (empty: anyone's), and by its id once sbatch answered.

    Found by name, so a job whose submission was never recorded still counts; with `job_id`, only that job (the
    whole array: any task of it)."""

    name: str
    users: tuple[str, ...] = ()
    job_id: str | None = None
    log: Path | None = None
    """The job's output as submitted (a training's main log), when the submitter knows it."""

    def ask(self, query: Query | None = None, timeout: float | None = None) -> Sequence[slurm.Job]:
        """One squeue call for this name and these users (timeout: slurm's default): every record answered
        (slurm.Jobs keeps what did not parse). Raises slurm.SlurmError when the queue cannot be asked: the state is
        then unknown, never gone."""
        query = query or slurm.query_jobs  # looked up now: a test's stand-in for the whole module counts
        return query(users=list(self.users), name=self.name, **({} if timeout is None else {"timeout": timeout}))

    def named(self, jobs: Sequence[slurm.Job]) -> list[slurm.Job]:
        """This job's records among `jobs` (any names, as squeue answered), whatever their state (the watchdog tells
        a job that will never start, or one completing, from one that runs)."""
        return [j for j in jobs if j.name == self.name
                and (self.job_id is None or self.job_id in (j.job_id, j.array_job_id))]

    def records(self, jobs: Sequence[slurm.Job]) -> list[slurm.Job]:
        """This job's records among `jobs` that hold a place in the queue (slurm.QUEUED_STATES)."""
        return [j for j in self.named(jobs) if j.state in slurm.QUEUED_STATES]

    def state(self, jobs: Sequence[slurm.Job] | None = None) -> str:
        """RUNNING when a task of it runs, QUEUED when it waits, GONE when none is queued (asks squeue unless given
        its answer)."""
        found = self.records(self.ask() if jobs is None else jobs)
        if any(j.state == "RUNNING" for j in found):
            return RUNNING
        return QUEUED if found else GONE

    def cancel(self, *, pending_only: bool = False, timeout: float = slurm.DEFAULT_TIMEOUT_S) -> list[str]:
        """scancel this job (the whole array of its id; without an id, every queued job of its name and users), only
        once the queue says it is a job of this name: an id from the environment never cancels another's job.
        pending_only: only its tasks that wait, never a running one (the rest of an array). Returns the records'
        ids cancelled."""
        arrays = [self.job_id] if self.job_id else sorted({j.array_job_id for j in self.records(self.ask())},
                                                     key=lambda i: (len(i), i))
        users = list(self.users)
        cancel = slurm.cancel_pending if pending_only else slurm.cancel_array
        return [i for array in arrays for i in cancel(array, self.name, users, timeout=timeout)]

    def wait(self, timeout: float | None = None, poll_s: float = 10.0) -> None:
        """Ask the queue every `poll_s` seconds until no task of the job is queued (Slurm keeps no exit code bsops
        reads: None). Raises TimeoutError after `timeout` seconds, slurm.SlurmError when the queue cannot be asked."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.state() != GONE:
            if deadline is not None and time.monotonic() + poll_s > deadline:
                raise TimeoutError(f"job {self.job_id or self.name} still queued or running after {timeout} s")
            time.sleep(poll_s)
        return None


def submit(script: Path, options: slurm.SbatchOptions = slurm.SbatchOptions(), *, name: str = "",
           users: Sequence[str] = (), env: Mapping[str, str] | None = None, log: Path | None = None) -> SlurmJob:
    """sbatch `script` with `options`; the handle of the new job. The one place in bsops that submits to Slurm.

    Raises slurm.SlurmError (sbatch's argv, exit code and stderr) when sbatch refuses or does not answer."""
    argv = slurm.sbatch_argv(Path(script), options)
    job_id = slurm.submit(argv, env=env)
    return SlurmJob(name or slurm.script_job_name(Path(script)), tuple(users), job_id, log)


# ----------------------------------------------------------------------------- jobs other than the training

@dataclass(frozen=True)
class ScriptJob:
    """One job described once: its Slurm name, its script (and the text to write there; None: written already),
    the files written before it (path, text), the folders it needs made (Slurm does not make its --output's), and
    how sbatch takes it."""

    name: str
    script: Path
    text: str | None = None
    files: tuple[tuple[Path, str], ...] = ()
    folders: tuple[Path, ...] = ()
    options: slurm.SbatchOptions = field(default_factory=slurm.SbatchOptions)
    kind: str = "job"
    """What it is, for `started` (eval, hourly, runner)."""


def write_files(job: ScriptJob) -> Path:
    """The folders, the files and then the script, each file replaced whole (a reader never sees half of one)."""
    for folder in job.folders:
        Path(folder).mkdir(parents=True, exist_ok=True)
    for path, text in job.files:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(Path(path), text.encode("utf-8"))
    if job.text is not None:
        job.script.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(job.script, job.text.encode("utf-8"), mode=0o755)
    return job.script


@dataclass(frozen=True)
class SlurmScripts:
    """The Slurm executor of a ScriptJob: write its files, then sbatch its script (`submit`)."""

    users: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None

    def write(self, job: ScriptJob) -> Path:
        return write_files(job)

    def start(self, job: ScriptJob, script: Path, started: Started = _nothing) -> SlurmJob:
        handle = submit(script, job.options, name=job.name, users=self.users, env=self.env)
        started(job.kind, handle.job_id or "")
        return handle


@dataclass(frozen=True)
class LocalScripts:
    """The local executor of a ScriptJob: write its files, then run `bash SCRIPT` here in a process group of its own,
    its output into `output` (default: the script's path with .out); the handle's `stop` ends all of it."""

    output: Path | None = None
    env: Mapping[str, str] | None = None

    def write(self, job: ScriptJob) -> Path:
        return write_files(job)

    def start(self, job: ScriptJob, script: Path, started: Started = _nothing) -> processes.LocalJob:
        output = self.output or script.with_suffix(".out")
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "ab") as sink:
            proc = processes.start(["bash", str(script)], env=self.env or os.environ, cwd=script.parent,
                                   stdout=sink, stderr=sink)
        handle = processes.LocalJob(proc, job.name, output)
        started(job.kind, handle.job_id)
        return handle


def run_job(job: Spec, executor: Executor[Spec, Result], started: Started = _nothing) -> Result:
    """Write the job, then start it: the same order for every executor."""
    return executor.start(job, executor.write(job), started)
