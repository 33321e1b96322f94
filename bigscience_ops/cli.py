"""The `bsops` command line: each command parses, calls one library function, prints, exits.

Heavy modules (torch, deepspeed) are never imported here or by the ops commands.
"""

from __future__ import annotations

import click

from bigscience_ops import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bsops")
def main() -> None:
    """Run GPT pretraining on Slurm: plan, render, launch and watch experiments.

    Experiments are YAML files in trainings/ (or --trainings-dir / $BSOPS_TRAININGS).
    """


# --- data commands ---
