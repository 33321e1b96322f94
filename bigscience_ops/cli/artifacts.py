"""`bsops convert`, `bsops logs`, `bsops plot`: what a run produces, taken out of the cluster or looked at.

torch, transformers' formats and matplotlib are imported inside the commands only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import load_experiment, main, trainings_option


@main.command("convert")
@click.argument("exp")
@trainings_option
@click.option("--step", type=click.IntRange(min=0), default=None,
              help="Convert global_stepN (default: the checkpoint 'latest' names).")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder to write the transformers model into (new or empty).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True,
              help="Precision of the written weights.")
@click.option("--overwrite", is_flag=True, help="Write into --out even when it is not empty.")
@click.option("--max-shard-size", default="5GB", show_default=True,
              help="Largest weight file, as transformers takes it (5GB, 500MB, 2GiB, or bytes): past it the "
                   "weights are split into model-0000k-of-0000n.safetensors with model.safetensors.index.json. "
                   "At most 50GB with --push (the Hub's limit per file).")
@click.option("--push", is_flag=True,
              help="Upload the folder to hub.checkpoints_repo as global_stepN/ (one folder per step).")
@click.option("--remote", default=None, help="With --push: any git remote URL instead of the Hub.")
def convert_command(exp: str, trainings_dir: Path | None, step: int | None, out: Path, dtype: str, overwrite: bool,
                    max_shard_size: str, push: bool, remote: str | None) -> None:
    """Convert EXP's DeepSpeed checkpoint into a transformers GPT-2 model.

    TP shards and pipeline stages are merged and the vocabulary padding removed, one layer at a time;
    the folder holds model.safetensors (or, past --max-shard-size, its shards and index),
    config.json and the experiment's tokenizer, and loads with GPT2LMHeadModel.from_pretrained and
    AutoTokenizer.from_pretrained.
    """
    from bigscience_ops.checkpoints import convert

    experiment = load_experiment(exp, trainings_dir)
    if push:
        convert.check_push(experiment, remote, max_shard_size)
    bar = click.progressbar(length=1, label="converting layers", file=sys.stderr) if sys.stderr.isatty() else None

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.length = total
            bar.update(done - bar.pos)

    result = convert.convert(experiment, out, step=step, dtype=dtype, overwrite=overwrite, progress=progress,
                             max_shard_size=max_shard_size)
    if bar is not None:
        bar.render_finish()
    c = result.config
    click.echo(f"{result.tag} -> {result.out}: GPT-2 with {c['n_layer']} layers, hidden {c['n_embd']}, "
               f"{c['n_head']} heads, vocabulary {c['vocab_size']}, {result.num_parameters:,} parameters ({dtype})")
    weights = [name for name in result.files if name.endswith(".safetensors")]
    if len(weights) > 1:
        click.echo(f"weights in {len(weights)} shards of at most {max_shard_size}: {weights[0]} ... {weights[-1]}, "
                   f"indexed by {convert.WEIGHTS_INDEX}")
    if push:
        commit = convert.push(experiment, result, remote)
        click.echo(f"pushed {result.tag}/ to {experiment.hub.checkpoints_repo or remote}: {commit}")


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
