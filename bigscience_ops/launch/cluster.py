"""The Slurm executor: a LaunchPlan sent to the cluster, never overlapping a running training.

A launch's run record is `<output>/launches/<time>/` (the job script, experiment.json,
ds_config.json, and after submission sbatch.json with the argv and Slurm's answer). Before anything
is written the queue is checked for a job of the same name (for every user of the experiment's
group): the launch refuses if one is there or, with after_current, depends on its whole array with
afterany. launch_plan.execute then checks the data, writes the record and submits.

Node schedules: a launch runs at the node count of the phase the latest checkpoint is in. The
tasks of one array share one node count, so when the run enters a phase of another size (the
trainer saves and exits at the boundary), the task hooks cancel the array's pending tasks and
submit the rest of the array at the new size, chained afterany on the old array (`resubmit_for_phase`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import getpass
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.run import ledger
from bigscience_ops.launch import jobs
from bigscience_ops.launch import render as rendering
from bigscience_ops.run import log as runlog
from bigscience_ops.errors import BsopsError, LaunchError
from bigscience_ops.launch.jobenv import job_environment
from bigscience_ops.launch.launch_plan import LaunchOptions, LaunchPlan, build_launch_plan, execute
from bigscience_ops.launch.jobs import Started
from bigscience_ops.schedule.nodes import Phase
from bigscience_ops.run.records import read_records
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schema import Experiment
from bigscience_ops.config.site_values import SiteCheck


@dataclass(frozen=True)
class QueueCheck:
    """What the queue said about the experiment's job name, and the sbatch argv that follows from it."""

    argv: list[str]
    queued: list[slurm.Job]  # jobs of this experiment already in the queue
    after: list[str]  # whole array ids the launch waits for
    note: str = ""  # what the queue check found, or why it could not be made (a dry run goes on without it)
    error: slurm.SlurmError | None = None  # why the queue could not be checked (its detail for --verbose)


@dataclass(frozen=True)
class SlurmLaunch:
    """A LaunchPlan with its queue check: everything a dry run shows, nothing written yet."""

    plan: LaunchPlan
    queue: QueueCheck

    @property
    def experiment(self) -> Experiment:
        return self.plan.experiment

    @property
    def run_dir(self) -> Path:
        return self.plan.record_dir

    @property
    def rendered(self) -> rendering.Rendered:
        return self.plan.rendered

    @property
    def phase(self) -> Phase | None:
        return self.plan.phase

    @property
    def site(self) -> SiteCheck | None:
        return self.plan.site

    @property
    def argv(self) -> list[str]:
        return self.queue.argv

    @property
    def after(self) -> list[str]:
        return self.queue.after

    @property
    def queue_note(self) -> str:
        return self.queue.note

    def describe(self) -> list[str]:
        lines = [f"run record: {self.run_dir}"]
        if self.phase is not None:
            lines.append(f"node schedule: the latest checkpoint is in {self.phase.describe()}: "
                         f"launching at {self.phase.nodes} nodes")
        if self.queue.note:
            lines.append(self.queue.note)
        for job in self.queue.queued:
            lines.append(f"queued already: {job.job_id} {job.state.lower()} ({job.reason}) user {job.user}")
        if self.queue.after:
            lines.append(f"chained after the whole array(s) {', '.join(self.queue.after)} (afterany): no overlap")
        lines.append("sbatch command: " + " ".join(self.queue.argv))
        return lines


def watched_users(exp: Experiment) -> list[str]:
    """Whose jobs count as this training's: every user of slurm.group, or just the current user."""
    return slurm.group_users(exp.slurm.group) if exp.slurm.group else [getpass.getuser()]


def record_dir(exp: Experiment, now: dt.datetime) -> Path:
    """A launch's run record: <output>/launches/<time>/."""
    return Path(exp.paths.output) / "launches" / now.strftime("%Y%m%d-%H%M%S")


def check_queue(plan: LaunchPlan, *, after_current: bool = False, dry_run: bool = False) -> QueueCheck:
    """The queue's jobs of the same name and the argv that waits for them (after_current) or a LaunchError.

    A dry run goes on when Slurm cannot be asked, and says why in its note."""
    exp, script = plan.experiment, plan.script
    try:
        users = watched_users(exp)
        if plan.site is not None and plan.site.cluster_error is not None:
            raise plan.site.cluster_error  # the controller did not answer sinfo just now: squeue would wait again
        job = jobs.SlurmJob(exp.slurm.job_name, tuple(users))
        queued = job.records(job.ask())
    except slurm.SlurmError as exc:
        if not dry_run:
            raise
        where = "" if "SLURM_CONF" in str(exc) else f" ({slurm.conf_note()})"
        return QueueCheck(slurm.sbatch_argv(script), [], [],
                          f"queue not checked: {exc}{where}; a real launch needs the queue", exc)
    note = (f"queue checked: no job named {exp.slurm.job_name!r} of {', '.join(users)} is queued" if not queued
            else f"queue checked: {len(queued)} job(s) named {exp.slurm.job_name!r} already queued")
    if queued and not after_current:
        listing = "; ".join(f"{j.job_id} {j.state.lower()} (user {j.user})" for j in queued)
        raise LaunchError(f"{exp.slurm.job_name!r} is already in the queue: {listing}. Two trainings must never "
                          f"overlap: pass --after-current to start after the whole array, or scancel it first")
    after = sorted({j.array_job_id for j in queued}, key=int)
    return QueueCheck(slurm.sbatch_argv(script, slurm.SbatchOptions(after_any=after)), queued, after, note)


def plan_launch(exp: Experiment, options: LaunchOptions = LaunchOptions(), *, after_current: bool = False,
                dry_run: bool = False, now: dt.datetime | None = None) -> SlurmLaunch:
    """The launch of `exp` on Slurm, rendered into a new run-record folder (not yet written), and its queue check.

    With a node schedule the job asks for the node count of the phase the latest checkpoint is in.
    Missing site values are refused (site_values.IncompleteExperiment) unless options.allow_incomplete;
    a resubmission (options.job) is not checked again.
    """
    options = dataclasses.replace(options, dry_run=options.dry_run or dry_run)
    plan = build_launch_plan(exp, options, record_dir(exp, now or dt.datetime.now()))
    return SlurmLaunch(plan, check_queue(plan, after_current=after_current, dry_run=dry_run))


@dataclass(frozen=True)
class SlurmExecutor:
    """Writes the run record and submits it with sbatch (launch_plan.execute calls the two in order)."""

    queue: QueueCheck
    fresh_budget: bool = True
    """Start a fresh failure budget (a user's launch; not the resubmission of a running array)."""

    def write(self, plan: LaunchPlan) -> Path:
        if plan.record_dir.exists():
            raise LaunchError(f"run record {plan.record_dir} already exists; launch again in a second")
        script = rendering.write(plan.rendered, plan.record_dir)
        Path(plan.experiment.paths.logs).mkdir(parents=True, exist_ok=True)  # sbatch --output needs it
        return script

    def claim(self, plan: LaunchPlan) -> contextlib.nullcontext:
        """Nothing: each array task's job script takes the run's lock on the cluster."""
        return contextlib.nullcontext()

    def start(self, plan: LaunchPlan, script: Path, started: Started = lambda job, job_id: None) -> jobs.SlurmJob:
        """Submit, record Slurm's answer (sbatch.json) and, unless told not to, start a fresh failure budget."""
        record = plan.record_dir / "sbatch.json"
        argv = self.queue.argv
        exp = plan.experiment
        try:
            job = jobs.submit(script, slurm.SbatchOptions(after_any=self.queue.after), name=exp.slurm.job_name,
                              env=job_environment(os.environ, local=False),
                              log=runlog.main_log(exp.paths.logs))
        except slurm.SlurmError as exc:
            record.write_text(json.dumps({"argv": argv, "error": str(exc)}, indent=2) + "\n")
            raise
        job_id = job.job_id or ""
        record.write_text(json.dumps({"argv": argv, "job_id": job_id, "after": self.queue.after,
                                      "submitted": dt.datetime.now().isoformat(timespec="seconds")}, indent=2) + "\n")
        if self.fresh_budget:
            ledger.mark_launch(Path(plan.experiment.paths.output), job_id)
        started("slurm" if self.fresh_budget else "resubmission", job_id)
        return job


def submit(launch: SlurmLaunch, *, fresh_budget: bool = True) -> jobs.SlurmJob:
    """Check the data, write the run record, submit; the job array's handle."""
    return execute(launch.plan, SlurmExecutor(launch.queue, fresh_budget))


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
    iteration = read_records(exp).iteration
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
    this_array = jobs.SlurmJob(exp.slurm.job_name, tuple(users), array)
    pending = [j for j in this_array.records(this_array.ask()) if j.array_job_id == array and j.state == "PENDING"]
    if pending:  # squeue names the pending rest `164_[2-4%1]`; scancel takes `164_[2-4]`
        slurm.cancel([re.sub(r"%\d+\]$", "]", j.job_id) for j in pending])
    try:
        last, this = int(task.array_task_max or ""), int(task.array_task_id or "")
        remaining = max(1, last - this)
    except ValueError:
        remaining = exp.slurm.array
    job_id = submit(plan_launch(exp, LaunchOptions(job="resubmission", array=remaining), after_current=True),
                    fresh_budget=False).job_id or ""
    ledger.mark_resize(output, array, mismatch.phase.nodes, mismatch.iteration, job_id)
    return job_id
