"""The eval scheduler as an hourly job (ops/hourly_job.py): `bsops eval next EXP --alert` every hour (a script written
before the subcommands says `bsops eval EXP --next --alert`, which still works this release).

It submits the eval jobs themselves, named `bsops.<training job name>.eval` (schedule.job_name); the scheduler is
named `...eval-next` so that neither the cron runner nor the scheduler's own queue check takes one for the other.
Opt-in: it spends GPU hours, which a run that sets eval: for `bsops eval run --step` by hand may not want every hour."""

from __future__ import annotations

from bigscience_ops.ops.hourly_job import HourlyJob, Missing
from bigscience_ops.schema import Experiment


def _tasks(exp: Experiment) -> Missing | None:
    if exp.eval.configured:
        return None
    return "eval.tasks", "something to evaluate: eval.tasks (lm-eval task names or task YAML files) or eval.sources"


EVAL_NEXT = HourlyJob(
    "eval", "eval-next", "eval next", "00:10:00", "eval scheduler",
    ("It submits an eval job (eval.partition, eval.nodes, eval.time) for the newest complete checkpoint without",
     "a result, one at a time, and emails the on-call people when an eval job failed."),
    needs=_tasks, arguments=("--alert",), opt_in=True)

JOBS = (EVAL_NEXT,)
