"""`bsops runs`: the runs this user launched, each with where it stands (views/runs.py)."""

from __future__ import annotations

import datetime as dt
import json
import shlex

import click

from bigscience_ops.cli.base import main
from bigscience_ops.views.runs import MAX_ROWS  # no torch, no numpy: the index and run records' readers


@main.command("runs")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON (times in epoch seconds).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=MAX_ROWS, show_default=True,
              help="Open and list at most this many run folders, the newest launches first (the others are counted).")
def runs_command(as_json: bool, limit: int) -> None:
    """The runs you launched, newest first: experiment, state, iteration, last launch, job, folder, last alert.

    Every launch (on Slurm or --local) is recorded in your runs index ($BSOPS_RUNS_INDEX, else
    $XDG_DATA_HOME/bsops/runs.jsonl, else ~/.local/share/bsops/runs.jsonl). The index only says where runs
    are: each run's experiment, job and state are read from its own folder, and an index line that claims
    another experiment or job is flagged. Index lines that are not launches are skipped and counted. Name a
    run by its folder in any other command: bsops info FOLDER.
    """
    from bigscience_ops.ops.tell.quoting import defang_block
    from bigscience_ops.views import runs

    result = runs.list_runs(limit=limit)
    if as_json:
        click.echo(json.dumps(runs.runs_data(result), indent=1))
        return
    said = defang_block  # what quotes a run's files or the index (a problem's excerpt, an alert): never a live link
    if not result.rows and result.index_read:
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
        click.echo(f"      {said(row.detail)}")
        if not row.from_record:
            click.echo("      experiment and job as the index says: the run has no record to read them from")
        if row.index_says:
            click.echo(f"      index says: {', '.join(row.index_says)}; shown as the run's own record says")
        if row.launches > 1:
            click.echo(f"      launched {row.launches} times (index lines naming this folder)")
        if row.last_alert:
            click.echo(f"      last alert: {said(row.last_alert)}")
        for problem in row.problems:
            click.echo(f"      could not read: {said(problem)}")
    for problem in result.problems if result.index_read else ():
        click.echo(f"skipped (not a launch): {said(problem)}")
    for note in result.notes():
        click.echo(said(note))
