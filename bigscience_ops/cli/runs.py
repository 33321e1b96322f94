"""`bsops runs`: the runs this user launched, each with where it stands (views/runs.py)."""

from __future__ import annotations

import datetime as dt
import json
import shlex

import click

from bigscience_ops.cli.base import main


@main.command("runs")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON (times in epoch seconds).")
def runs_command(as_json: bool) -> None:
    """The runs you launched, newest first: experiment, state, iteration, last launch, job, folder, last alert.

    Every launch (on Slurm or --local) is recorded in your runs index ($BSOPS_RUNS_INDEX, else
    $XDG_DATA_HOME/bsops/runs.jsonl, else ~/.local/share/bsops/runs.jsonl); each run's state is read from
    its folder alone. Name a run by its folder in any other command: bsops info FOLDER.
    """
    from bigscience_ops.views import runs

    result = runs.list_runs()
    if as_json:
        click.echo(json.dumps(runs.runs_data(result), indent=1))
        return
    if not result.rows:
        click.echo(f"no runs launched yet ({result.index} lists none): bsops launch EXP adds one")
    else:
        click.echo(f"{len(result.rows)} run(s) in {result.index}, newest first:")
        click.echo(f"  {'EXPERIMENT':<20} {'STATE':<13} {'ITERATION':<15} {'LAUNCHED':<16} {'JOB':<22} FOLDER")
    for row in result.rows:
        iteration = "?" if row.iteration is None else f"{row.iteration}/{row.total}"
        when = dt.datetime.fromtimestamp(row.launched).strftime("%Y-%m-%d %H:%M")
        job = row.job + (f" {row.job_id}" if row.job_id else "")
        click.echo(f"  {row.experiment:<20} {row.state:<13} {iteration:<15} {when:<16} {job:<22} "
                   f"{shlex.quote(row.folder)}")
        click.echo(f"      {row.detail}")
        if row.last_alert:
            click.echo(f"      last alert: {row.last_alert}")
        for problem in row.problems:
            click.echo(f"      could not read: {problem}")
    for problem in result.problems:
        click.echo(f"skipped (not a launch): {problem}")
