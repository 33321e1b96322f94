"""Where a run stands, read from its run folder: finished, or how its last array task ended.

The watchdog asks this when no job of the training is queued: a training that reached its final
iteration is done (healthy, announced once), one never launched (no task ledger, and no checkpoint or
only a warm start's global_step0) is not launched yet, one whose kill switch file exists was stopped on
purpose (an info line, no alert), and any other is an alert that says how its last task ended:
Slurm's accounting (sacct) where the cluster keeps it, else the task ledger and the end of Slurm's
output file for that task (slurmstepd writes "CANCELLED ... DUE TO TIME LIMIT").

The run's files are untrusted input: a torn ledger line, a `latest` cut short or a link, a bad line of
rollbacks.jsonl, a manifest or journal of the backup store that is not one: each is a `Problem` in
`RunState.problems` (the watchdog alerts about each file), and the rest is still read. With `latest`
unreadable, the run stands at its newest finished save (a folder with bsops.json). The checkpoints the trainer set
aside (set-aside.jsonl) are read the same way, each one an alert of its own (told once).

A run launched on this machine (`bsops launch --local`: `launched_here`) is `local`: the watchdog asks its
processes, not the Slurm queue, and its made-up task ids are never asked of sacct.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.checkpoints import layout, set_aside
from bigscience_ops.checkpoints.set_aside import SetAside
from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import Problem, open_plain
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schema import Experiment

# slurmstepd's line in the job's output file when Slurm ends a job.
STEPD_END = re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT (\S+)( DUE TO [A-Z ]+?)? \*\*\*")


@dataclass(frozen=True)
class RunState:
    iteration: int
    """The latest checkpoint's iteration."""
    train_iters: int
    last_task: ledger.Attempt | None
    experiment: Experiment | None = field(default=None, compare=False, repr=False)
    timeout: float = field(default=30.0, compare=False, repr=False)
    launched: bool = True
    """Whether the task ledger records anything: a launch, a task, a resize."""
    warm_start: bool = False
    """Whether the latest checkpoint is a warm start's weights-only global_step0 (checkpoints/warm_start.py)."""
    kill_switch: str | None = None
    """checkpoint.kill_switch_path when that file exists: the run was stopped on purpose (docs/OPERATOR.md, "Everyday use")."""
    problems: tuple[Problem, ...] = field(default=(), compare=False)
    """What of the run's files could not be read (file, line, what): each file is an alert of the watchdog's."""
    set_aside: tuple[SetAside, ...] = field(default=(), compare=False)
    """The checkpoints the trainer set aside (incomplete or corrupt when resumed from), oldest first: each is an
    alert of the watchdog's, told once."""
    local: bool = False
    """Launched on this machine (`bsops launch --local`: its newest record is the run folder's own experiment.json,
    where a Slurm launch writes launches/<time>/): watched through its processes, never the Slurm queue."""

    @property
    def finished(self) -> bool:
        return self.iteration >= self.train_iters

    @cached_property
    def ended(self) -> str | None:
        """How the last task ended, in words (`exit code 1`, `TIMEOUT`, `CANCELLED DUE TO TIME LIMIT at ...`).

        Asked only when the watchdog finds nothing of the run queued: sacct is not queried while the job runs.
        """
        if self.last_task is None or self.experiment is None:
            return None
        accounted = None if self.local else _sacct_state(self.last_task.job_id, self.timeout)  # a local id is made up
        return accounted or _ledger_and_output_state(self.experiment, self.last_task)


def run_state(exp: Experiment, timeout: float = 30.0) -> RunState:
    """Where `exp`'s run stands, from its folder; never raises for what the run's files hold (see the module)."""
    output, checkpoints = Path(exp.paths.output), Path(exp.paths.checkpoints)
    problems: list[Problem] = []
    iteration, latest = _iteration(checkpoints, problems)
    read = ledger.read_checked(output / ledger.LEDGER_NAME)
    problems += read.problems
    problems += rollbacks.read_checked(output).problems
    problems += _store_problems(exp)
    aside = set_aside.read_checked(checkpoints)
    problems += aside.problems
    history = ledger.attempts(read.records)
    # A ledger with lines, even none of them readable, is a launched run: never "not launched yet" (no alert).
    launched = bool(read.records) or bool(read.problems)
    return RunState(iteration, run_schedule(exp).train_iters, history[-1] if history else None, exp, timeout,
                    launched=launched, warm_start=iteration == 0 and _warm_start(latest),
                    kill_switch=exp.checkpoint.kill_switch_path if ledger.kill_switch_on(exp) else None,
                    problems=tuple(problems), set_aside=tuple(aside.records), local=launched_here(output))


def launched_here(output: Path) -> bool:
    """Whether the run in `output` was last launched on this machine: its newest record is the folder's own
    experiment.json (`bsops launch --local`), not a launches/<time>/ record of a Slurm launch."""
    from bigscience_ops.run.opening import newest_record

    record = newest_record(Path(output))
    return record is not None and record.parent == Path(output)


def _iteration(checkpoints: Path, problems: list[Problem]) -> tuple[int, layout.Checkpoint | None]:
    """The latest checkpoint's iteration (0 before the first save) and the checkpoint; when `latest` cannot be read,
    names no plain checkpoint folder or names one that is not complete (no committed manifest, a file not as saved),
    a problem and the newest complete checkpoint instead: where the next task resumes (the trainer rewrites `latest`
    to name it)."""
    try:
        latest = layout.latest_checkpoint(checkpoints)
        if latest is not None and latest.committed() is None and not latest.saved_before_manifests():
            raise layout.CheckpointError(f"names {latest.tag}, which is not a complete checkpoint (no committed "
                                         "manifest, or a file not as saved)")
    except (BsopsError, OSError) as exc:
        try:
            saved = layout.saved_checkpoints(checkpoints)
        except OSError:  # the folder cannot be listed: the problem says so
            saved = []
        try:  # a tag that reads but names no plain folder: the run stands there when nothing else was saved
            named = layout.latest_step(checkpoints) or 0
        except (BsopsError, OSError):
            named = 0
        fallback = (f"; the newest finished save, {saved[-1].tag}, is taken as where the run stands" if saved
                    else "; no finished save found")
        problems.append(Problem(str(checkpoints / layout.LATEST), 0, f"{_without_file(exc, checkpoints)}{fallback}"))
        return (saved[-1].step if saved else named), None
    return (0 if latest is None else latest.step), latest


def _without_file(exc: Exception, checkpoints: Path) -> str:
    """The error's words without its leading `<file>: `, which the problem names already."""
    text = " ".join(str(exc).split())
    prefix = f"{checkpoints / layout.LATEST}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def _store_problems(exp: Experiment) -> list[Problem]:
    """The backup store's manifests and journals of this run that cannot be read (none without backup.dest)."""
    if not exp.backup.dest:
        return []
    from bigscience_ops.ops.keep import store as backup_store  # the watchdog reads the store only where there is one

    try:
        run_id = layout.run_id(Path(exp.paths.checkpoints))
        if run_id is None:
            return []
        return backup_store.store_problems(backup_store.run_store(Path(exp.backup.dest), exp.name, run_id))
    except (BsopsError, OSError) as exc:
        return [Problem(str(exp.backup.dest), 0, f"the backup store cannot be read: {' '.join(str(exc).split())}")]


def _warm_start(latest: layout.Checkpoint | None) -> bool:
    """Whether `latest` names a step-0 checkpoint whose bsops.json says it holds weights only."""
    if latest is None or latest.step != 0:
        return False
    try:
        meta = latest.meta()
    except BsopsError:
        return False
    return meta.get("weights_only") is True


def _sacct_state(job_id: str, timeout: float) -> str | None:
    """`sacct` State and ExitCode of the task; None where the cluster keeps no accounting."""
    if job_id.startswith("local-"):
        return None
    try:
        record = slurm.job_accounting(job_id, timeout=timeout)
    except slurm.SlurmError:
        return None
    return None if record is None else f"{record.state} (exit code {record.exit_code}, from sacct)"


def _ledger_and_output_state(exp: Experiment, last: ledger.Attempt) -> str:
    where = ""
    out = Path(exp.paths.logs) / f"{exp.slurm.job_name}-{last.job_id}.out"
    try:
        match = None
        handle = open_plain(out) if "/" not in last.job_id else None  # a plain file of the logs folder only
        with handle or contextlib.nullcontext():
            if handle is not None:
                handle.seek(max(0, os.fstat(handle.fileno()).st_size - 65536))
                for line in handle.read(65536).decode(errors="replace").split("\n"):
                    match = STEPD_END.search(line) or match
        if match:
            where = f"; Slurm: CANCELLED{match.group(2) or ''} at {match.group(1)} ({out})"
    except (OSError, BsopsError):
        pass
    if last.exit_code is None:
        return f"task {last.job_id} was killed before it recorded its end{where}"
    return f"task {last.job_id} ended with exit code {last.exit_code}{where}"
