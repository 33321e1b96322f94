"""Where a run stands, read from its run folder: finished, or how its last array task ended.

The watchdog asks this when no job of the training is queued: a training that reached its final
iteration is done (healthy, announced once), one never launched (no task ledger, and no checkpoint or
only a warm start's global_step0) is not launched yet, one whose kill switch file exists was stopped on
purpose (an info line, no alert), and any other is an alert that says how its last task ended:
Slurm's accounting (sacct) where the cluster keeps it, else the task ledger and the end of Slurm's
output file for that task (slurmstepd writes "CANCELLED ... DUE TO TIME LIMIT").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from bigscience_ops import ledger, slurm
from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import BsopsError
from bigscience_ops.run_schedule import run_schedule
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
    """checkpoint.kill_switch_path when that file exists: the run was stopped on purpose (README "Everyday use")."""

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
        return (_sacct_state(self.last_task.job_id, self.timeout)
                or _ledger_and_output_state(self.experiment, self.last_task))


def run_state(exp: Experiment, timeout: float = 30.0) -> RunState:
    output = Path(exp.paths.output)
    iteration = ledger.latest_iteration(Path(exp.paths.checkpoints))
    records = ledger.read(output / ledger.LEDGER_NAME)
    history = ledger.attempts(records)
    return RunState(iteration, run_schedule(exp).train_iters, history[-1] if history else None, exp, timeout,
                    launched=bool(records), warm_start=iteration == 0 and _warm_start(Path(exp.paths.checkpoints)),
                    kill_switch=exp.checkpoint.kill_switch_path if ledger.kill_switch_on(exp) else None)


def _warm_start(checkpoints: Path) -> bool:
    """Whether `latest` names a step-0 checkpoint whose bsops.json says it holds weights only."""
    tag = layout.latest_tag(checkpoints)
    if tag is None or layout.step_of(tag) != 0:
        return False
    try:
        meta = layout.Checkpoint(tag, 0, checkpoints / tag).meta()
    except BsopsError:
        return False
    return isinstance(meta, dict) and meta.get("weights_only") is True


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
        with out.open("rb") as handle:
            handle.seek(max(0, out.stat().st_size - 65536))
            for line in handle.read().decode(errors="replace").split("\n"):
                match = STEPD_END.search(line) or match
        if match:
            where = f"; Slurm: CANCELLED{match.group(2) or ''} at {match.group(1)} ({out})"
    except OSError:
        pass
    if last.exit_code is None:
        return f"task {last.job_id} was killed before it recorded its end{where}"
    return f"task {last.job_id} ended with exit code {last.exit_code}{where}"
