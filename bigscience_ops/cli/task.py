"""Hidden hooks the job script runs around each array task: the failure budget, the node schedule, and
the ends of a run (finished, or stopped by its kill switch) that make the array's other tasks pointless."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import EXIT_PROBLEMS, main
from bigscience_ops.errors import BsopsError

# `task begin` exits with run_records.EXIT_NOT_TRAINING (which render.py writes into the job script) when the
# task has nothing to train: the training is finished (a leftover task of a generously sized array), the run's
# kill switch exists, or its allocation is not its node phase's (the run goes on in an array at the new size).
# The job script then ends without training and without counting a failure.


@main.group(hidden=True)
def task() -> None:
    """Hooks the job script runs around each array task: the failure budget and the node schedule."""


def _resolved(path: Path):
    from bigscience_ops.config.loading import from_dict

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise click.BadParameter(f"{path}: not JSON ({exc}); expected the experiment.json bsops render writes")
    return from_dict(data, str(path))


experiment_json_option = click.option(
    "--experiment", "experiment_json", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The run's experiment.json, as rendered.")


@task.command("begin")
@experiment_json_option
def task_begin(experiment_json: Path) -> None:
    """Record a task start; exit 1 without training when the failure budget is spent, 3 when the training is
    finished, the kill switch exists, or the task's allocation is not the node count of the run's phase (the
    run is handed to an array of that size)."""
    from bigscience_ops import slurm
    from bigscience_ops.run import ledger
    from bigscience_ops.run.records import EXIT_NOT_TRAINING, read_records

    exp = _resolved(experiment_json)
    task_env = slurm.TaskEnv.from_env()
    records = read_records(exp)
    iteration = records.iteration
    if _finished(exp, iteration):
        click.echo(f"not training: the training finished at iteration {iteration}; task {ledger.slurm_job_id()} "
                   "ends at once (no nodes used, no failure counted)")
        _cancel_pending(exp, task_env, "the training is finished")
        sys.exit(EXIT_NOT_TRAINING)
    if records.kill_switch is not None:
        click.echo(f"not training: the kill switch {records.kill_switch} exists; task "
                   f"{ledger.slurm_job_id()} ends at once (no failure counted). Remove it, then `bsops launch "
                   f"{exp.name}` to go on")
        _cancel_pending(exp, task_env, "the run is stopped by its kill switch")
        sys.exit(EXIT_NOT_TRAINING)
    if _other_phase(exp, task_env):
        click.echo("not training: this task's node count is not that of the node phase the run is in (the node "
                   "schedule line above); no failure counted")
        sys.exit(EXIT_NOT_TRAINING)
    for skipped in ledger.skipped_lines(Path(exp.paths.output)):
        click.echo(f"warning: passed over a ledger line that is no record: {skipped}")
    failing = ledger.begin(Path(exp.paths.output), Path(exp.paths.checkpoints), exp.slurm.failure_budget)
    if failing is not None:
        _stop_crash_loop(exp, failing, task_env)
        sys.exit(EXIT_PROBLEMS)
    refused = _data_refused(exp)
    if refused:  # recorded as a task that began and never ended: a crash loop of them spends the failure budget
        for line in refused:
            click.echo(f"error: {line}")
        click.echo(f"not training: the data would fail the run ({len(refused)} finding(s) above); fix it, then "
                   f"`bsops launch {exp.name}`")
        sys.exit(EXIT_PROBLEMS)
    click.echo(f"task {ledger.slurm_job_id()} begins at iteration {ledger.latest_iteration(Path(exp.paths.checkpoints))}")


def _data_refused(exp) -> list[str]:
    """The data's pre-flight errors (data/preflight.py) at the task's start: files gone or changed since the launch."""
    from bigscience_ops.data.preflight import check_data
    from bigscience_ops.plan import make_plan

    return [str(e) for e in check_data(exp, make_plan(exp).dataset_sizes[0]).refusing]


def _stop_crash_loop(exp, failing: list, task_env) -> None:
    """Alert once (email), then cancel the rest of the array so no task waits for nodes only to stop."""
    from bigscience_ops import slurm
    from bigscience_ops.run import ledger
    from bigscience_ops.ops.tell import channels

    from bigscience_ops.ops.tell.quoting import quote_untrusted as q  # the ledger's words: never a link in an alert

    output = Path(exp.paths.output)
    nodes = q(", ".join(sorted({a.nodes for a in failing if a.nodes})), 1000, mark=False) or "unknown"
    alert = (f"***ALERT: {exp.slurm.job_name}: the last {len(failing)} array tasks made no progress "
             f"(iteration {failing[-1].start_iteration}; nodes {nodes}); not training. "
             f"Check the nodes, add bad ones to slurm.exclude, then relaunch***")
    click.echo(alert)
    if ledger.stopped(ledger.read(output / ledger.LEDGER_NAME)):
        click.echo("the rest of the array was stopped and the alert sent already")
        return
    ledger.mark_stop(output)
    tasks = "\n".join(f"- {q(a.job_id, mark=False)} on {q(a.nodes or '?', 1000, mark=False)}: iteration "
                      f"{a.start_iteration} -> "
                      f"{a.end_iteration if a.end_iteration is not None else '?'}, "
                      + ("killed before it recorded its end" if a.ended is None else f"exit code {a.exit_code}")
                      for a in failing)
    array = task_env.array_job_id
    in_slurm = bool(array) and not task_env.local
    then = (f"The rest of array {array} is cancelled now (scancel {array}), this task included, so no task waits "
            f"for nodes only to stop." if in_slurm else "This task stops.")
    subject = f"[bsops] {exp.name}: crash loop stopped, not training"
    # Email first: cancelling the array ends this very process.
    click.echo(channels.send_alert(exp.alerts, subject, f"{alert}\n\nThe tasks:\n{tasks}\n\n{then} After fixing, "
                                                      f"`bsops launch {exp.name}` starts a fresh failure budget."))
    if not in_slurm:
        return
    from bigscience_ops.launch.cluster import watched_users
    from bigscience_ops.launch.jobs import SlurmJob

    try:
        ids = SlurmJob(exp.slurm.job_name, tuple(watched_users(exp)), array).cancel()
    except slurm.SlurmError as exc:
        failure = f"***ALERT: the rest of array {array} could not be cancelled: {exc}; run `scancel {array}`***"
        click.echo(failure)
        click.echo(channels.send_alert(exp.alerts, f"[bsops] {exp.name}: cancel the crash-looping array", failure))
        return
    if not ids:
        click.echo(f"array {array} of {exp.slurm.job_name!r} is not in the queue: nothing to cancel")


@task.command("end")
@experiment_json_option
@click.option("--exit-code", type=int, required=True, help="The training's exit code.")
def task_end(experiment_json: Path, exit_code: int) -> None:
    """Record a task end and whether it made progress."""
    from bigscience_ops import slurm
    from bigscience_ops.run import ledger
    from bigscience_ops.run.records import read_records

    exp = _resolved(experiment_json)
    task_env = slurm.TaskEnv.from_env()
    attempt = ledger.end(Path(exp.paths.output), Path(exp.paths.checkpoints), exit_code)
    verdict = "made progress" if attempt.progressed else "made NO progress"
    click.echo(f"task {attempt.job_id} ended with exit code {exit_code} at iteration {attempt.end_iteration}: {verdict}")
    if exit_code == 0 and _finished(exp, attempt.end_iteration or 0):
        _cancel_pending(exp, task_env, "the training is finished")  # the array's remaining tasks have nothing to train
    elif exit_code == 0 and read_records(exp).kill_switch is not None:
        _cancel_pending(exp, task_env, "the run is stopped by its kill switch")
    elif exit_code == 0:
        _other_phase(exp, task_env)  # the training stopped at a node phase's boundary: the next task runs at the new size


def _finished(exp, iteration: int) -> bool:
    from bigscience_ops.schedule.run import run_schedule

    return run_schedule(exp).finished(iteration)


def _cancel_pending(exp, task_env, why: str) -> None:
    """Nothing is left to train (`why`): cancel the array's pending tasks so none waits for nodes only to end."""
    from bigscience_ops import slurm
    from bigscience_ops.launch.cluster import watched_users
    from bigscience_ops.launch.jobs import SlurmJob

    array = task_env.array_job_id
    if not array or task_env.local:
        return
    try:
        ids = SlurmJob(exp.slurm.job_name, tuple(watched_users(exp)), array).cancel(pending_only=True)
    except slurm.SlurmError as exc:
        click.echo(f"the pending tasks of array {array} could not be cancelled ({' '.join(str(exc).split())[:200]}); "
                   "each will end at once without training")
        return
    if ids:
        click.echo(f"{why}: cancelled the pending tasks of array {array} ({', '.join(ids)})")


def _other_phase(exp, task_env) -> bool:
    """Whether this task's allocation differs from the run's node phase; if so, the rest of the array is
    resubmitted at the phase's size (once per array) and this says so."""
    from bigscience_ops.launch import cluster as submit

    mismatch = submit.check_allocation(exp)
    if mismatch is None:
        return False
    if task_env.local:  # the local launcher sizes each task itself
        click.echo(f"node schedule: {mismatch.describe()}")
        return True
    try:
        job_id = submit.resubmit_for_phase(exp, mismatch)
    except BsopsError as exc:
        alert = (f"***ALERT: {exp.slurm.job_name}: node schedule: {mismatch.describe()}, and the array could not be "
                 f"resubmitted at {mismatch.phase.nodes} nodes: {exc}; run `bsops launch {exp.name}`***")
        click.echo(alert)
        from bigscience_ops.ops.tell import channels

        click.echo(channels.send_alert(exp.alerts, f"[bsops] {exp.name}: relaunch at {mismatch.phase.nodes} nodes", alert))
        return True
    click.echo(f"node schedule: {mismatch.describe()}: the rest of the array continues as job {job_id} at "
               f"{mismatch.phase.nodes} nodes")
    return True
