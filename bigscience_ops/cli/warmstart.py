"""`bsops warm-start`: the first checkpoint of a deeper experiment, from a trained shallower run.

torch is imported inside the command only (to write DeepSpeed's engine-state files).
"""

from __future__ import annotations

from pathlib import Path

import click

from bigscience_ops.cli.base import load_experiment, main, trainings_option


def _rendered(path: Path):
    """A run's resolved experiment.json (what bsops render writes)."""
    import json

    from bigscience_ops.config import from_dict

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"{path}: unreadable ({exc}); expected an experiment name, its YAML file or the "
                                 "experiment.json bsops render writes", param_hint="EXP")
    return from_dict(data, str(path))


@main.command("warm-start")
@click.option("--from", "source", required=True, metavar="RUN[:STEP]",
              help="The trained run: a run folder, its checkpoints folder or an experiment name; STEP picks "
                   "global_stepSTEP (default: the checkpoint 'latest' names).")
@click.argument("exp")
@trainings_option
def warm_start_command(source: str, exp: str, trainings_dir: Path | None) -> None:
    """Write step 0 of EXP, a deeper model, from the weights of a shallower run (Gopher G.3.3).

    EXP is an experiment name, its YAML file, or a rendered run's experiment.json.

    EXP's block i starts as the source's block floor(i * L / L') (L source blocks, L' of EXP); the
    embedding and the final LayerNorm are copied. Width, heads, FFN size, vocabulary, position
    embedding and TP must match. The new run starts with fresh schedules, optimizer state and data
    position: launch EXP as usual and it loads these weights.
    """
    from bigscience_ops.checkpoints import warm_start

    experiment = _rendered(Path(exp)) if exp.endswith(".json") else load_experiment(exp, trainings_dir)
    run, step = warm_start.parse_from(source)
    found = warm_start.find_source(warm_start.source_checkpoints(run, trainings_dir), step, source)
    result = warm_start.build(experiment, found, log=click.echo)
    src_layers = found.meta["model"]["num_layers"]
    click.echo(f"{found.path} ({src_layers} blocks, iteration {found.meta.get('iteration')}) -> {result.target} "
               f"({len(result.mapping)} blocks from source blocks {result.mapping})")
