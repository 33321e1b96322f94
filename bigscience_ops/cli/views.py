"""`bsops logs` and `bsops plot`: the views package's looks at a run (its log, its training curves).

matplotlib is imported inside the plot command only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import load_experiment, main, trainings_option


@main.command("logs")
@click.argument("exp")
@trainings_option
@click.option("-n", "--lines", "lines", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many of the last lines to print.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing lines as they are appended (Ctrl-C stops).")
@click.option("--from-clone", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Read main_log.txt from this clone of the logs repo instead of the run folder.")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="With --follow: seconds between checks for new lines.")
def logs_command(exp: str, trainings_dir: Path | None, lines: int, follow: bool, from_clone: Path | None,
                 interval: float) -> None:
    """Print the tail of EXP's main_log.txt (the run folder's, else hub-sync's clone of the logs repo)."""
    from bigscience_ops.views import logs

    experiment = load_experiment(exp, trainings_dir)
    path = logs.find_log(experiment, from_clone)
    last, offset = logs.tail(path, lines)
    for line in last:
        click.echo(line)
    if not follow:
        return
    sys.stdout.flush()
    try:
        for line in logs.follow(path, offset, interval=interval):
            click.echo(line)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass


@main.command("plot")
@click.argument("exp")
@trainings_option
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The PNG file to write.")
@click.option("--tensorboard-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Read the event files here instead of paths.tensorboard (e.g. a clone of the tensorboard repo).")
def plot_command(exp: str, trainings_dir: Path | None, out: Path, tensorboard_dir: Path | None) -> None:
    """Draw EXP's training loss, validation loss, learning rate, batch size and grad norm against tokens."""
    from bigscience_ops.views import plot

    experiment = load_experiment(exp, trainings_dir)
    result = plot.plot(experiment, out, tensorboard_dir)
    counts = ", ".join(f"{name} {len(s.values)}" for name, s in result.series.items())
    click.echo(f"{result.out}: points per panel: {counts} (from {len(result.event_files)} event file(s))")
