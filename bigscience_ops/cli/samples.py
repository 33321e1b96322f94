"""`bsops samples`: which samples, documents and text the trainer consumed at an iteration (views/samples.py).

No torch: numpy and the tokenizer load inside the command.
"""

from __future__ import annotations

from pathlib import Path

import click

from bigscience_ops.cli.base import TEXT, main, open_run_saying, run_option, trainings_option


@main.command("samples")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--iteration", "-i", type=click.IntRange(min=1), required=True, help="The training iteration (1-based).")
@click.option("--rank", "ranks", type=click.IntRange(min=0), multiple=True,
              help="Only this data-parallel rank (repeatable; default: every rank).")
@click.option("--micro-batch-index", "micro_batches", type=click.IntRange(min=0), multiple=True,
              help="Only this micro-batch of each rank (repeatable; default: all).")
@click.option("--dp", type=click.IntRange(min=1), default=None,
              help="Data-parallel size to assume instead of the one main_log.txt records for the iteration.")
@click.option("--micro-batch-size", type=click.IntRange(min=1), default=None,
              help="Micro-batch size to assume instead of the one main_log.txt records.")
@click.option("--no-text", is_flag=True, help="Token ids only: do not load the tokenizer.")
@click.option("--chars", type=click.IntRange(min=0), default=300, show_default=True,
              help="Characters of each document's text shown (0: all; --json always has all).")
@click.option("--json", "as_json", is_flag=True, help="Print the samples as JSON (token ids, documents, text).")
def samples_command(exp: str | None, run: Path | None, trainings_dir: Path | None, iteration: int,
                    ranks: tuple[int, ...], micro_batches: tuple[int, ...], dp: int | None, micro_batch_size: int | None,
                    no_text: bool, chars: int, as_json: bool) -> None:
    """The samples EXP's training consumed at an iteration, per data-parallel rank and micro-batch.

    For each: its global sample index, the blend entry and sample it comes from, the documents and
    token offsets it was cut from, its token ids and the text decoded with the experiment's
    tokenizer. The tokens are those trained (cut to the curriculum's length). The DP and micro-batch
    size are those of the task that trained the iteration (its start line in main_log.txt), else the
    node phase's. After a loss spike: `bsops samples EXP --iteration N` shows the text to skip.
    """
    import json

    from bigscience_ops.views import samples

    # The run as it recorded itself (its rollbacks' skips included); where the YAML differs, one line on stderr.
    experiment = open_run_saying(exp, run, trainings_dir, err=True, say_folder=False).experiment
    result = samples.iteration_samples(experiment, iteration, dp=dp,
                                       micro_batch_size=micro_batch_size, ranks=ranks or None,
                                       micro_batches=micro_batches or None, text=not no_text)
    if as_json:
        click.echo(json.dumps(samples.samples_data(result), ensure_ascii=False, indent=1))
    else:
        for line in samples.samples_text(result, chars):
            click.echo(line)
