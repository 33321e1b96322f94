"""What every command shares: the group, exit codes, error handling, the experiment options."""

from __future__ import annotations

from pathlib import Path

import click

from bigscience_ops import __version__
from bigscience_ops.errors import BsopsError
from bigscience_ops.redact import scrub

EXIT_PROBLEMS = 1  # the command ran and found problems (plan errors, alerts)
EXIT_ERROR = 2  # the command could not do its work (bad input, a tool failed)


class _Group(click.Group):
    """Turns library errors into one clear message and an exit code, with no traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BsopsError as exc:
            click.echo(f"error: {scrub(str(exc))}", err=True)
            ctx.exit(EXIT_ERROR)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bsops")
def main() -> None:
    """Run GPT pretraining on Slurm: plan, render, launch and watch experiments.

    An experiment is a YAML file trainings/NAME.yaml (found in --trainings-dir, $BSOPS_TRAININGS,
    ./trainings, or the bundled trainings/); EXP is its NAME or a path to the file.

    \b
    First steps:
      bsops list                 the experiments
      bsops plan tiny            sizes, memory, batch rampup, steps, days; every rule checked
      bsops render tiny          the Slurm job script and DeepSpeed JSON
      bsops launch tiny --local  train it on this machine
    """


def trainings_option(func):
    return click.option(
        "--trainings-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
        help="Folder of experiment YAML files (default: $BSOPS_TRAININGS, ./trainings, or the bundled one).",
    )(func)


def load_experiment(name: str, trainings_dir: Path | None):
    """The experiment NAME (or path), loaded without importing anything heavy at CLI start."""
    from bigscience_ops import config

    return config.load_experiment(name, trainings_dir)


def default_cron_dir() -> Path:
    import os

    env = os.environ.get("BSOPS_CRON_DIR")
    from bigscience_ops.resources import bundled

    return Path(env) if env else bundled("cron")


cron_dir_option = click.option(
    "--cron-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Folder with cron.hourly/, cron.daily/ and cron.yaml (default: $BSOPS_CRON_DIR or the bundled cron/).")
