"""Submitting an experiment to the cluster: never overlap a running training, chain on the whole array.

A launch renders the job into a run record (`<output>/launches/<time>/`: script, experiment.json,
ds_config.json, and after submission sbatch.json with the argv and Slurm's answer), checks the
queue for a job of the same name (for every user of the experiment's group), refuses if one is
there or, with after_current, depends on its whole array with afterany, then submits.

Node schedules: a launch runs at the node count of the phase the latest checkpoint is in. The
tasks of one array share one node count, so when the run enters a phase of another size (the
trainer saves and exits at the boundary), the task hooks cancel the array's pending tasks and
submit the rest of the array at the new size, chained afterany on the old array (`resubmit_for_phase`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import getpass
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops import ledger, render as rendering, slurm
from bigscience_ops.errors import BsopsError
from bigscience_ops.node_schedule import Phase
from bigscience_ops.prepare import prepare_launch
from bigscience_ops.run_schedule import run_schedule
from bigscience_ops.schema import Experiment
from bigscience_ops.site_values import SiteCheck


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
    phase: Phase | None = None  # the node schedule's phase the launch trains in (None without a schedule)
    queue_note: str = ""  # what the queue check found, or why it could not be made (a dry run goes on without it)
    queue_error: slurm.SlurmError | None = None  # why the queue could not be checked (its detail for --verbose)
    site: SiteCheck | None = None  # site values missing but allowed through (--allow-incomplete), the cluster note

    @property
    def script(self) -> Path:
        return self.run_dir / self.rendered.script

    def describe(self) -> list[str]:
        lines = [f"run record: {self.run_dir}"]
        if self.phase is not None:
            lines.append(f"node schedule: the latest checkpoint is in {self.phase.describe()}: "
                         f"launching at {self.phase.nodes} nodes")
        if self.queue_note:
            lines.append(self.queue_note)
        for job in self.queued:
            lines.append(f"queued already: {job.job_id} {job.state.lower()} ({job.reason}) user {job.user}")
        if self.after:
            lines.append(f"chained after the whole array(s) {', '.join(self.after)} (afterany): no overlap")
        lines.append("sbatch command: " + " ".join(self.argv))
        return lines


def watched_users(exp: Experiment) -> list[str]:
    """Whose jobs count as this training's: every user of slurm.group, or just the current user."""
    return slurm.group_users(exp.slurm.group) if exp.slurm.group else [getpass.getuser()]


def plan_launch(exp: Experiment, *, after_current: bool = False, now: dt.datetime | None = None,
                dry_run: bool = False, allow_incomplete: bool = False, resubmission: bool = False) -> LaunchPlan:
    """Render into a new run-record folder (not yet written) and decide the sbatch argv.

    With a node schedule the job asks for the node count of the phase the latest checkpoint is in. A
    dry run goes on when Slurm cannot be asked, and says why in its queue line. Missing site values
    are refused (site_values.IncompleteExperiment) unless `allow_incomplete`; a `resubmission` (the
    next array of a run already launched) is not checked again.
    """
    now = now or dt.datetime.now()
    # Raises PlanError or IncompleteExperiment: nothing invalid or incomplete is submitted.
    prepared = prepare_launch(exp, slurm_job=None if resubmission else True, allow_incomplete=allow_incomplete)
    exp, phase = prepared.experiment, prepared.phase
    run_dir = Path(exp.paths.output) / "launches" / now.strftime("%Y%m%d-%H%M%S")
    rendered = rendering.render(exp, run_dir, prepared.plan)
    try:
        users = watched_users(exp)
        if prepared.site is not None and prepared.site.cluster_error is not None:
            raise prepared.site.cluster_error  # the controller did not answer sinfo just now: squeue would wait again
        jobs = slurm.query_jobs(users=users, name=exp.slurm.job_name)
    except slurm.SlurmError as exc:
        if not dry_run:
            raise
        where = "" if "SLURM_CONF" in str(exc) else f" ({slurm.conf_note()})"
        argv = slurm.sbatch_argv(run_dir / rendered.script, after_any=[])
        return LaunchPlan(exp, run_dir, rendered, argv, [], [], phase,
                          f"queue not checked: {exc}{where}; a real launch needs the queue", exc, prepared.site)
    queued = [j for j in jobs if j.name == exp.slurm.job_name and j.state in slurm.QUEUED_STATES]
    note = (f"queue checked: no job named {exp.slurm.job_name!r} of {', '.join(users)} is queued" if not queued
            else f"queue checked: {len(queued)} job(s) named {exp.slurm.job_name!r} already queued")
    if queued and not after_current:
        listing = "; ".join(f"{j.job_id} {j.state.lower()} (user {j.user})" for j in queued)
        raise LaunchError(f"{exp.slurm.job_name!r} is already in the queue: {listing}. Two trainings must never "
                          f"overlap: pass --after-current to start after the whole array, or scancel it first")
    after = sorted({j.array_job_id for j in queued}, key=int)
    argv = slurm.sbatch_argv(run_dir / rendered.script, after_any=after)
    return LaunchPlan(exp, run_dir, rendered, argv, queued, after, phase, note, None, prepared.site)


def submit(plan: LaunchPlan, *, fresh_budget: bool = True) -> str:
    """Write the run record, submit, record Slurm's answer and (unless told not to) start a fresh failure budget."""
    if plan.run_dir.exists():
        raise LaunchError(f"run record {plan.run_dir} already exists; launch again in a second")
    from bigscience_ops.data.corpus import ensure_data  # numpy: only a real submission builds data

    ensure_data(plan.experiment)
    rendering.write(plan.rendered, plan.run_dir)
    Path(plan.experiment.paths.logs).mkdir(parents=True, exist_ok=True)  # sbatch --output needs it
    record = plan.run_dir / "sbatch.json"
    # The job inherits this environment (sbatch --export=ALL): put this bsops and its Python first on
    # PATH, so the job runs the same installation; the experiment's env_setup lines run after and win.
    # A job submitting the next array (a node schedule's next phase) passes on neither its start time nor
    # its own SLURM_* job variables (sbatch reads some as options); SLURM_CONF names the cluster.
    env = {k: v for k, v in os.environ.items()
           if k != "BSOPS_JOB_START_EPOCH" and (not k.startswith("SLURM_") or k == "SLURM_CONF")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    try:
        job_id = slurm.submit(plan.argv, env=env)
    except slurm.SlurmError as exc:
        record.write_text(json.dumps({"argv": plan.argv, "error": str(exc)}, indent=2) + "\n")
        raise
    record.write_text(json.dumps({"argv": plan.argv, "job_id": job_id, "after": plan.after,
                                  "submitted": dt.datetime.now().isoformat(timespec="seconds")}, indent=2) + "\n")
    if fresh_budget:
        ledger.mark_launch(Path(plan.experiment.paths.output), job_id)
    return job_id


@dataclass(frozen=True)
class Mismatch:
    """An array task whose allocation is not the node count of the phase the run is in."""

    allocated: int
    phase: Phase
    iteration: int

    def describe(self) -> str:
        return (f"this task has {self.allocated} nodes, but the run (iteration {self.iteration}) is in "
                f"{self.phase.describe()}")


def allocated_nodes(env: Mapping[str, str], default: int) -> int:
    """The job's node count as Slurm tells the batch script (slurm.TaskEnv.num_nodes), else `default`."""
    counted = slurm.TaskEnv.from_env(env).num_nodes
    return default if counted is None else counted


def check_allocation(exp: Experiment, env: Mapping[str, str] | None = None) -> Mismatch | None:
    """A node-scheduled run's task with another node count than its phase's (a finished run never mismatches)."""
    env = os.environ if env is None else env
    if not exp.slurm.node_schedule:
        return None
    schedule = run_schedule(exp)
    iteration = ledger.latest_iteration(Path(exp.paths.checkpoints))
    if schedule.finished(iteration):
        return None
    phase = schedule.phase_of_iteration(iteration)
    allocated = allocated_nodes(env, exp.slurm.nodes)
    return None if allocated == phase.nodes else Mismatch(allocated, phase, iteration)


def resubmit_for_phase(exp: Experiment, mismatch: Mismatch, env: Mapping[str, str] | None = None) -> str:
    """Hand the run to a new array at the phase's node count; returns its job id (the earlier one if done already).

    Cancels the pending tasks of this task's array (they would start at the old size), then submits the
    rest of the array (SLURM_ARRAY_TASK_MAX - SLURM_ARRAY_TASK_ID tasks, at least one) chained afterany on
    this array, which this task still belongs to: the new array starts when this task ends.
    """
    env = os.environ if env is None else env
    output = Path(exp.paths.output)
    task = slurm.TaskEnv.from_env(env)
    array = task.array_job_id or task.job_id
    if not array:
        raise LaunchError(f"{mismatch.describe()}; not inside a Slurm job (no SLURM_ARRAY_JOB_ID): run "
                          f"`bsops launch {exp.name}`, which asks for the phase's node count")
    done = ledger.resized(ledger.read(output / ledger.LEDGER_NAME), array)
    if done is not None:
        return done
    users = watched_users(exp)
    pending = [j for j in slurm.query_jobs(users=users, name=exp.slurm.job_name)
               if j.array_job_id == array and j.name == exp.slurm.job_name and j.state == "PENDING"]
    if pending:  # squeue names the pending rest `164_[2-4%1]`; scancel takes `164_[2-4]`
        slurm.cancel([re.sub(r"%\d+\]$", "]", j.job_id) for j in pending])
    try:
        last, this = int(task.array_task_max or ""), int(task.array_task_id or "")
        remaining = max(1, last - this)
    except ValueError:
        remaining = exp.slurm.array
    rest = dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, array=remaining))
    job_id = submit(plan_launch(rest, after_current=True, resubmission=True), fresh_budget=False)
    ledger.mark_resize(output, array, mismatch.phase.nodes, mismatch.iteration, job_id)
    return job_id
