"""`bsops logs`, `plot`, `info` and `chronicle`: the views package's looks at a run (log, curves, state, timeline).

matplotlib is imported inside the plot command only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    TEXT, FiniteFloat, SafePath, dry_run_option, echo_json, json_option, main, open_run_saying, run_option,
    trainings_option,
)


@main.command("logs")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("-n", "--lines", "lines", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many of the last lines to print.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing lines as they are appended (Ctrl-C stops).")
@click.option("--from-clone", type=SafePath(file_okay=False, path_type=Path), default=None,
              help="Read main_log.txt from this clone of the logs repo instead of the run folder.")
@click.option("--interval", type=FiniteFloat(0, 3600, low_open=True, unit="seconds"), default=1.0, show_default=True,
              help="With --follow: seconds between checks for new lines.")
@json_option
def logs_command(exp: str | None, run: Path | None, trainings_dir: Path | None, lines: int, follow: bool,
                 from_clone: Path | None, interval: float, as_json: bool) -> None:
    """Print the tail of EXP's main_log.txt (the run folder's, else hub-sync's clone of the logs repo).

    The log is printed as text: its escape sequences and control characters (colours, clear-screen, a terminal
    hyperlink, a bidi override) are shown escaped, as `\\x1b[2J`, never passed to the terminal."""
    from bigscience_ops.run import log as runlog

    if as_json and follow:
        raise click.UsageError("got --json and --follow; allowed: one of them (--json prints the last lines as one "
                               "document, --follow keeps printing)")
    experiment = open_run_saying(exp, run, trainings_dir, err=True).experiment  # stdout is the log's lines
    path = runlog.find_log(experiment, from_clone)
    last, offset = runlog.tail(path, lines)
    if as_json:  # the lines as the log holds them: JSON escapes what a terminal would run
        echo_json({"log": str(path), "lines": list(last)})
        return
    for line in last:
        click.echo(runlog.for_terminal(line))  # the log's escape sequences shown, never run by the terminal
    if not follow:
        return
    sys.stdout.flush()
    try:
        for line in runlog.follow(path, offset, interval=interval):
            click.echo(runlog.for_terminal(line))
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass


@main.command("plot")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--out", type=SafePath(dir_okay=False, path_type=Path), required=True, help="The PNG file to write.")
@click.option("--from-clone", "tensorboard_dir", type=SafePath(file_okay=False, path_type=Path), default=None,
              help="Read the event files from this clone of the tensorboard repo (or any folder of them) instead of "
                   "the run folder; the run's own folders are unchanged.")
@dry_run_option
def plot_command(exp: str | None, run: Path | None, trainings_dir: Path | None, out: Path,
                 tensorboard_dir: Path | None, dry_run: bool) -> None:
    """Draw EXP's training loss, validation loss, learning rate, batch size and grad norm against tokens.

    When the run's checkpoints were evaluated (`bsops eval`: <run>/eval/global_stepN.json), eval panels follow,
    against the same consumed tokens: one per kind of metric, each on its own axis (accuracies and scores,
    perplexities on a log scale, bits per byte, other lower-is-better metrics), eval.references as dotted levels.
    """
    from bigscience_ops.views import plot

    experiment = open_run_saying(exp, run, trainings_dir).experiment
    result = plot.plot(experiment, out, tensorboard_dir, dry_run=dry_run)
    counts = ", ".join(f"{name} {len(s.values)}" for name, s in result.series.items())
    click.echo(("dry run: nothing written; would draw " if dry_run else "") + f"{result.out}: points per panel: {counts} (from {len(result.event_files)} event file(s))")
    for problem in result.problems:  # an unreadable eval result file: said, and the plot drawn without it
        click.echo(f"warning: not drawn: {problem}", err=True)


@main.command("info")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON (times in epoch seconds, sizes in bytes).")
def info_command(exp: str | None, run: Path | None, trainings_dir: Path | None, as_json: bool) -> None:
    """EXP's run at a glance, from its folder alone (no Slurm needed).

    The last iteration with its loss and throughput, the latest and complete checkpoints, the array
    tasks since the last launch (nodes, iterations, exit, times), the last backup, the evaluation
    results, open alerts and the disk used. The run is shown as it recorded itself; its backup and
    eval settings (backup.dest, eval.references) are its experiment file's today, as status takes them.
    """
    import json

    from bigscience_ops.views import runinfo

    experiment = configured(open_run_saying(exp, run, trainings_dir, err=as_json))
    info = runinfo.run_info(experiment)
    click.echo(json.dumps(runinfo.info_data(info), indent=1) if as_json else runinfo.info_text(info))


@main.command("chronicle")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--out", type=SafePath(dir_okay=False, path_type=Path), default=None,
              help="Write the Markdown to this file instead of printing it.")
@json_option
@dry_run_option
def chronicle_command(exp: str | None, run: Path | None, trainings_dir: Path | None, out: Path | None,
                      as_json: bool, dry_run: bool) -> None:
    """EXP's run chronicle as Markdown: launches, array tasks with nodes, iterations and exits, saves,
    node phases, failure-budget stops, training-health findings and the alert emails, by day; backups and
    evaluation results as the experiment file's backup and eval settings find them today."""
    from bigscience_ops.ops.keep import chronicle

    if as_json and out is not None:
        raise click.UsageError(f"got --json and --out {out}; allowed: one of them (--json prints the events, --out "
                               "writes the Markdown)")
    experiment = configured(open_run_saying(exp, run, trainings_dir, err=out is None))  # stdout: the Markdown
    if as_json:
        found = chronicle.read(experiment)
        echo_json({"experiment": experiment.name, "events": [
            {"when": e.when, "kind": e.kind, "text": e.text, "details": e.details, "iteration": e.iteration}
            for e in found.events], "problems": [str(p) for p in found.problems],
            "evaluations": [{"tag": r.tag, "iteration": r.iteration, "consumed_tokens": r.consumed_tokens,
                             "metrics": r.metrics} for r in found.evaluations]})
        return
    text = chronicle.markdown(experiment)
    if dry_run:
        click.echo(f"dry run: nothing written; would write {out} ({len(text)} characters of Markdown)"
                   if out is not None else text, nl=out is not None)
        return
    if out is None:
        click.echo(text, nl=False)
        return
    out.write_text(text, encoding="utf-8")
    click.echo(f"wrote {out}")


def configured(opened):
    """The run as recorded, with the alerts, hub, backup and eval sections of its experiment file as it is today
    (run.open takes them, as status and the hourly jobs do): a backup configured after the launch is shown, and where
    a record names another store or references, they are not read. With no experiment file of the run's name here,
    one line says so and those sections are shown empty (no store read, no reference)."""
    if opened.settings_problem is not None:
        click.echo(f"note: {opened.settings_problem}; the run is shown without backup and evaluation settings",
                   err=True)
    return opened.experiment
