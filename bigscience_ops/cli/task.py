"""Hidden hooks the job script runs around each array task: the failure budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import EXIT_PROBLEMS, main


@main.group(hidden=True)
def task() -> None:
    """Hooks the job script runs around each array task: the failure budget."""


def _resolved(path: Path):
    from bigscience_ops.config import from_dict

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
    """Record a task start; exit 1 without training when the failure budget is spent."""
    from bigscience_ops import ledger

    exp = _resolved(experiment_json)
    failing = ledger.begin(Path(exp.paths.output), Path(exp.paths.checkpoints), exp.slurm.failure_budget)
    if failing is not None:
        from bigscience_ops.ops import notify

        nodes = ", ".join(sorted({a.nodes for a in failing if a.nodes})) or "unknown"
        alert = (f"***ALERT: {exp.slurm.job_name}: the last {len(failing)} array tasks made no progress "
                 f"(iteration {failing[-1].start_iteration}; nodes {nodes}); not training. "
                 f"Check the nodes, add bad ones to slurm.exclude, then relaunch***")
        click.echo(alert)
        tasks = "\n".join(f"- {a.job_id} on {a.nodes or '?'}: iteration {a.start_iteration} -> "
                          f"{a.end_iteration if a.end_iteration is not None else 'killed'}, exit code {a.exit_code}"
                          for a in failing)
        click.echo(notify.send_alert(exp.alerts, f"[bsops] {exp.name}: crash loop stopped, not training",
                                     f"{alert}\n\nThe tasks:\n{tasks}\n\nThe remaining array tasks stop at once too. "
                                     f"After fixing, `bsops launch {exp.name}` starts a fresh failure budget."))
        sys.exit(EXIT_PROBLEMS)
    click.echo(f"task {ledger.slurm_job_id()} begins at iteration {ledger.latest_iteration(Path(exp.paths.checkpoints))}")


@task.command("end")
@experiment_json_option
@click.option("--exit-code", type=int, required=True, help="The training's exit code.")
def task_end(experiment_json: Path, exit_code: int) -> None:
    """Record a task end and whether it made progress."""
    from bigscience_ops import ledger

    exp = _resolved(experiment_json)
    attempt = ledger.end(Path(exp.paths.output), Path(exp.paths.checkpoints), exit_code)
    verdict = "made progress" if attempt.progressed else "made NO progress"
    click.echo(f"task {attempt.job_id} ended with exit code {exit_code} at iteration {attempt.end_iteration}: {verdict}")
