"""One launch, planned once, and carried out by one of two executors in the same order.

`build_launch_plan` makes the immutable LaunchPlan from three things: the experiment as loaded,
the run folder's records (run/records.py: latest iteration, kill switch, recorded skips; read once, and only
while no other launch, rollback or trainer holds the folder) and the command's options. It refuses while the
kill switch exists, when the plan finds errors, or when site values the job needs are missing
(site_values.check_complete; `allow_incomplete` lets them through, listed in `site`), and renders the job
before anything is written.

`execute` carries a plan out with a RunExecutor (cluster.SlurmExecutor sends it to Slurm, local.LocalExecutor
runs it on this machine), always in this order: the executor claims the run (a local launch holds its folder),
the data is checked (a missing bundled corpus is built), the run record and the job script are written, then
the job is submitted or run, and its Job (jobs.py) returned. So a launch goes to the run folder twice, reading
it to plan and writing it to start, never back and forth.

The experiment is transformed in two places only: the config's own derivation (derivation.derive) and
`config.apply_overrides`, which applies what a launch changes: the run folder (`launch --local --out`),
the skips the run's rollbacks recorded, the node count of the phase the latest checkpoint is in,
the number of array tasks (a node schedule's resubmission) and a local launch's rendezvous port.
"""

from __future__ import annotations

import shlex
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bigscience_ops.launch import render as rendering
from bigscience_ops.launch.jobs import Job, Started
from bigscience_ops.data.preflight import DataCheck, check_data
from bigscience_ops.errors import BsopsError, PlanError
from bigscience_ops.schedule.nodes import Phase
from bigscience_ops.plan import Plan, make_plan
from bigscience_ops.config.loading import Overrides, apply_overrides
from bigscience_ops.run.records import RunRecords, read_records, read_when_free
from bigscience_ops.schedule.run import RunSchedule, run_schedule
from bigscience_ops.schema import Experiment
from bigscience_ops.config.site_values import SiteCheck, check_complete

JOBS = ("slurm", "local", "resubmission")
SHARED_WITH = {"slurm": "Slurm job"}
"""The holder of the run folder a launch of that kind plans beside (run/records.read_when_free): a Slurm launch
leaves the run's own Slurm tasks to its queue check; a local launch plans beside nothing."""


class KillSwitchOn(BsopsError):
    """The run's kill switch exists: every task of a launch would end at once without training."""


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class LaunchOptions:
    """What the command asked for."""

    job: str = "slurm"
    """slurm (a job submitted now), local (run on this machine) or resubmission (the next array of a run
    already launched: its site values are not checked again)."""
    array: int | None = None
    """slurm.array of a node schedule's resubmission: the tasks left to the run."""
    master_port: int | None = None
    allow_incomplete: bool = False
    dry_run: bool = False
    """Nothing is written or submitted: the run folder is read even while another process holds it."""
    holding: bool = False
    """The launch holds the run folder already (a local launch planning its next task): its records are read as
    they are."""


@dataclass(frozen=True)
class LaunchPlan:
    experiment: Experiment
    """As launched: every override applied."""
    schedule: RunSchedule
    plan: Plan
    """Of `experiment`; holds no errors."""
    records: RunRecords
    phase: Phase | None
    """The node schedule's phase the launch trains in (None without a schedule)."""
    site: SiteCheck | None
    """The site values found missing (allowed through) and the cluster note; None when not checked."""
    record_dir: Path
    """Where the job script, experiment.json and ds_config.json go."""
    rendered: rendering.Rendered
    data: DataCheck | None = None
    """The data's pre-flight checks (data/preflight.py): notes and warnings to show; it holds no refusing error."""

    @property
    def iteration(self) -> int:
        return self.records.iteration

    @property
    def script(self) -> Path:
        return self.record_dir / self.rendered.script


def build_launch_plan(exp: Experiment, options: LaunchOptions = LaunchOptions(), record_dir: Path | None = None,
                      schedule: RunSchedule | None = None) -> LaunchPlan:
    """The launch of `exp` with `options`, its job rendered for `record_dir` (default: the run folder).

    Raises KillSwitchOn, PlanError, site_values.IncompleteExperiment (unless options.allow_incomplete), or
    preflight.DataRefused when the data would fail the run (a missing file, token ids beyond the vocabulary,
    another tokenizer): all before anything is written.
    `schedule`: the run schedule computed already (a local launch's next task), else computed here.
    """
    if options.job not in JOBS:
        raise ValueError(f"LaunchOptions.job: got {options.job!r}; allowed: {', '.join(JOBS)}")
    located = apply_overrides(exp, Overrides(array=options.array, master_port=options.master_port))
    records = (read_records(located) if options.job == "resubmission" or options.dry_run or options.holding
               else read_when_free(located, SHARED_WITH.get(options.job)))
    if records.kill_switch is not None:
        raise KillSwitchOn(f"the kill switch {records.kill_switch} exists: every task would end at once without "
                           f"training. Remove it (rm {shlex.quote(records.kill_switch)}) to launch {exp.name} again")
    recorded = apply_overrides(located, Overrides(skips=records.skips))
    schedule = schedule or run_schedule(recorded)
    phase = schedule.phase_of_iteration(records.iteration) if recorded.slurm.node_schedule else None
    launched = apply_overrides(recorded, Overrides(nodes=phase.nodes if phase else None))
    plan = make_plan(launched, schedule)
    if plan.errors:
        raise PlanError(plan.errors)
    _refuse_what_cannot_resume(launched, plan)
    site = None if options.job == "resubmission" else check_complete(
        launched, slurm_job=options.job == "slurm", allow_incomplete=options.allow_incomplete)
    data = check_data(launched, plan.dataset_sizes[0])
    refusal = data.refusal()
    if refusal is not None:
        raise refusal
    record_dir = Path(record_dir) if record_dir is not None else Path(launched.paths.output)
    return LaunchPlan(launched, schedule, plan, records, phase, site, record_dir,
                      rendering.render(launched, record_dir, plan), data)


def _refuse_what_cannot_resume(exp: Experiment, plan) -> None:
    """A relaunch whose model or TP/PP layout cannot load the run's checkpoint is refused here, naming the fields
    that differ, before a record is written or a job queued (a layout DeepSpeed's universal checkpoint converts
    stays allowed: checkpoints/resume.relaunch_refusal)."""
    import dataclasses

    from bigscience_ops.checkpoints import resume
    from bigscience_ops.sizing import GPTShape

    p = exp.parallel
    why = resume.relaunch_refusal(Path(exp.paths.checkpoints), dataclasses.asdict(GPTShape.from_experiment(exp)),
                                  p.tensor, p.pipeline, max(1, int(plan.dp)), p.zero_stage, exp.model.vocab_size)
    if why is not None:
        raise PlanError([f"the run's checkpoints cannot be resumed by this launch: {why}"])


# ----------------------------------------------------------------------------- carrying it out

class RunExecutor(Protocol):
    """Where a launch plan runs (launch/cluster.py's SlurmExecutor, launch/local.py's LocalExecutor): the run's
    claim, then the same files written in the same order, then the start."""

    def claim(self, plan: LaunchPlan) -> AbstractContextManager[object]:
        """Held while the launch writes and starts: a local launch's hold on the run folder (run/lock.py); nothing on
        Slurm, whose array tasks take the run's lock themselves."""

    def write(self, plan: LaunchPlan) -> Path:
        """Write the run record and the job script; returns the script."""

    def start(self, plan: LaunchPlan, script: Path, started: Started) -> Job:
        """Submit or run the written job; call `started(kind, job_id)` once it has started."""


def execute(plan: LaunchPlan, executor: RunExecutor) -> Job:
    """Claim the run, check the data, write the run record and script, then submit or run: the same order for every
    executor. Once the job has started, the launch goes into the user's runs index (runs_index.py; `bsops runs`).
    The run folder is read once, by build_launch_plan, and written here: a launch goes to run/ twice, never back
    and forth."""
    from bigscience_ops.run import index as runs_index
    from bigscience_ops.data.corpus import ensure_data  # numpy: only a launch that runs builds data

    def started(job: str, job_id: str) -> None:
        # The job runs already: an index that cannot be written costs its line, never the launch.
        runs_index.record_launch(plan.experiment.name, Path(plan.experiment.paths.output), job, job_id)

    with executor.claim(plan):
        ensure_data(plan.experiment)
        script = executor.write(plan)
        return executor.start(plan, script, started)
