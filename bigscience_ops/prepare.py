"""The start every launch shares, local or on Slurm: the run schedule, the phase, the checked plan, the data.

`prepare_launch` computes the experiment's RunSchedule once, picks the node phase the latest
checkpoint is in (with a node schedule: the job asks for that phase's node count), and makes the
plan of the experiment as launched, refusing it while the run's kill switch exists (its tasks would
not train), when the plan finds errors, or when site values the job needs are missing
(site_values.missing_site_values: a local launch needs data, a Slurm job also what the cluster asks
for; `allow_incomplete` lets it through, listed in `site`). launch.py runs the result on this
machine, submit.py sends it to Slurm; both render it with the plan made here, and both build missing
bundled data with data.corpus.ensure_data.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.errors import BsopsError, PlanError
from bigscience_ops.ledger import kill_switch_on, latest_iteration
from bigscience_ops.node_schedule import Phase, for_phase
from bigscience_ops.plan import Plan, make_plan
from bigscience_ops.run_schedule import RunSchedule, run_schedule
from bigscience_ops.schema import Experiment
from bigscience_ops.site_values import SiteCheck, check_complete


class KillSwitchOn(BsopsError):
    """The run's kill switch exists: every task of a launch would end at once without training."""


@dataclass(frozen=True)
class PreparedLaunch:
    experiment: Experiment  # as launched: slurm.nodes is the phase's node count under a node schedule
    schedule: RunSchedule
    plan: Plan  # of `experiment`; holds no errors
    iteration: int  # the latest checkpoint's (0 before the first save)
    phase: Phase | None  # the node schedule's phase the launch trains in (None without a schedule)
    site: SiteCheck | None = None  # the site values found missing (allowed through) and the cluster note


def prepare_launch(exp: Experiment, schedule: RunSchedule | None = None, *, slurm_job: bool | None = True,
                   allow_incomplete: bool = False) -> PreparedLaunch:
    """The experiment as the next launch runs it, with its plan; raises PlanError when the plan finds errors and
    site_values.IncompleteExperiment when site values a job needs are missing (unless `allow_incomplete`).

    `slurm_job`: True for a Slurm job, False for a local launch, None to skip the site check (the next array
    of a run already launched). Raises KillSwitchOn while the run's kill switch file exists."""
    if kill_switch_on(exp):
        switch = str(exp.checkpoint.kill_switch_path)
        raise KillSwitchOn(f"the kill switch {switch} exists: every task would end at once without training. "
                           f"Remove it (rm {shlex.quote(switch)}) to launch {exp.name} again")
    iteration = latest_iteration(Path(exp.paths.checkpoints))
    schedule = schedule or run_schedule(exp)
    phase = None
    if exp.slurm.node_schedule:
        phase = schedule.phase_of_iteration(iteration)
        exp = for_phase(exp, phase)
    plan = make_plan(exp, schedule)
    if plan.errors:
        raise PlanError(plan.errors)
    site = None if slurm_job is None else check_complete(exp, slurm_job=slurm_job, allow_incomplete=allow_incomplete)
    return PreparedLaunch(exp, schedule, plan, iteration, phase, site)
