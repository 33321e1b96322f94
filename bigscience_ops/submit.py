"""Submitting an experiment to the cluster: never overlap a running training, chain on the whole array.

A launch renders the job into a run record (`<output>/launches/<time>/`: script, experiment.json,
ds_config.json, and after submission sbatch.json with the argv and Slurm's answer), checks the
queue for a job of the same name (for every user of the experiment's group), refuses if one is
there or, with after_current, depends on its whole array with afterany, then submits.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops import ledger, render as rendering, slurm
from bigscience_ops.config import Experiment
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.status import QUEUED_STATES


class LaunchError(BsopsError):
    """The launch would overlap a training, or cannot be recorded."""


@dataclass(frozen=True)
class LaunchPlan:
    experiment: Experiment
    run_dir: Path
    rendered: rendering.Rendered
    argv: list[str]
    queued: list[slurm.Job]  # jobs of this experiment already in the queue
    after: list[str]  # whole array ids the launch waits for

    @property
    def script(self) -> Path:
        return self.run_dir / self.rendered.script

    def describe(self) -> list[str]:
        lines = [f"run record: {self.run_dir}"]
        for job in self.queued:
            lines.append(f"queued already: {job.job_id} {job.state.lower()} ({job.reason}) user {job.user}")
        if self.after:
            lines.append(f"chained after the whole array(s) {', '.join(self.after)} (afterany): no overlap")
        lines.append("sbatch command: " + " ".join(self.argv))
        return lines


def watched_users(exp: Experiment) -> list[str]:
    """Whose jobs count as this training's: every user of slurm.group, or just the current user."""
    return slurm.group_users(exp.slurm.group) if exp.slurm.group else [getpass.getuser()]


def plan_launch(exp: Experiment, *, after_current: bool = False, now: dt.datetime | None = None) -> LaunchPlan:
    """Render into a new run-record folder (not yet written) and decide the sbatch argv."""
    now = now or dt.datetime.now()
    run_dir = Path(exp.paths.output) / "launches" / now.strftime("%Y%m%d-%H%M%S")
    rendered = rendering.render(exp, run_dir)  # raises PlanError: nothing invalid is submitted
    jobs = slurm.query_jobs(users=watched_users(exp), name=exp.slurm.job_name)
    queued = [j for j in jobs if j.name == exp.slurm.job_name and j.state in QUEUED_STATES]
    if queued and not after_current:
        listing = "; ".join(f"{j.job_id} {j.state.lower()} (user {j.user})" for j in queued)
        raise LaunchError(f"{exp.slurm.job_name!r} is already in the queue: {listing}. Two trainings must never "
                          f"overlap: pass --after-current to start after the whole array, or scancel it first")
    after = sorted({j.array_job_id for j in queued}, key=int)
    argv = slurm.sbatch_argv(run_dir / rendered.script, after_any=after)
    return LaunchPlan(exp, run_dir, rendered, argv, queued, after)


def submit(plan: LaunchPlan) -> str:
    """Write the run record, submit, record Slurm's answer and start a fresh failure budget."""
    if plan.run_dir.exists():
        raise LaunchError(f"run record {plan.run_dir} already exists; launch again in a second")
    from bigscience_ops.launch import ensure_data

    ensure_data(plan.experiment)
    rendering.write(plan.rendered, plan.run_dir)
    Path(plan.experiment.paths.logs).mkdir(parents=True, exist_ok=True)  # sbatch --output needs it
    record = plan.run_dir / "sbatch.json"
    # The job inherits this environment (sbatch --export=ALL): put this bsops and its Python first on
    # PATH, so the job runs the same installation; the experiment's env_setup lines run after and win.
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    try:
        job_id = slurm.submit(plan.argv, env=env)
    except slurm.SlurmError as exc:
        record.write_text(json.dumps({"argv": plan.argv, "error": str(exc)}, indent=2) + "\n")
        raise
    record.write_text(json.dumps({"argv": plan.argv, "job_id": job_id, "after": plan.after,
                                  "submitted": dt.datetime.now().isoformat(timespec="seconds")}, indent=2) + "\n")
    ledger.mark_launch(Path(plan.experiment.paths.output), job_id)
    return job_id
