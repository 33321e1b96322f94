"""`bsops convert`, `warm-start`, `rollback` and `verify`: what the checkpoints package makes of a run's checkpoints.

A transformers model folder from a checkpoint, or the first checkpoint of a deeper experiment from a
trained shallower run. torch and transformers' formats are imported inside the commands only.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    EXIT_PROBLEMS, TEXT, SafePath, dry_run_option, echo_run_folder, load_experiment, main, open_run_saying, run_option,
    trainings_option,
)


@main.command("convert")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--step", type=click.IntRange(min=0), default=None,
              help="Convert global_stepN (default: the checkpoint 'latest' names).")
@click.option("--out", "out", type=SafePath(file_okay=False, path_type=Path), required=True,
              help="Folder to write the transformers model into (new or empty).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True,
              help="Precision of the written weights.")
@click.option("--overwrite", is_flag=True, help="Write into --out even when it is not empty.")
@click.option("--max-shard-size", type=TEXT, default="5GB", show_default=True,
              help="Largest weight file, as transformers takes it (5GB, 500MB, 2GiB, or bytes): past it the "
                   "weights are split into model-0000k-of-0000n.safetensors with model.safetensors.index.json. "
                   "At most 50GB with --push (the Hub's limit per file).")
@click.option("--push", is_flag=True,
              help="Upload the folder to hub.checkpoints_repo as global_stepN/ (one folder per step).")
@click.option("--remote", type=TEXT, default=None, help="With --push: any git remote URL instead of the Hub.")
@dry_run_option
def convert_command(exp: str | None, run: Path | None, trainings_dir: Path | None, step: int | None, out: Path,
                    dtype: str, overwrite: bool, max_shard_size: str, push: bool, remote: str | None,
                    dry_run: bool) -> None:
    """Convert EXP's DeepSpeed checkpoint into a transformers GPT-2 model.

    TP shards and pipeline stages are merged and the vocabulary padding removed, one layer at a time;
    the folder holds model.safetensors (or, past --max-shard-size, its shards and index),
    config.json and the experiment's tokenizer, and loads with GPT2LMHeadModel.from_pretrained and
    AutoTokenizer.from_pretrained.
    """
    from bigscience_ops.checkpoints import convert

    opened = open_run_saying(exp, run, trainings_dir)
    experiment = opened.experiment  # the model and tokenizer the run trained with
    if push:
        from bigscience_ops.run.opening import RunRecordError

        try:  # where the weights and the token go: the experiment file's hub section, never the record's
            experiment = opened.configured()
        except RunRecordError as exc:
            raise RunRecordError(f"--push: {exc}") from None
        convert.check_push(experiment, remote, max_shard_size)
    bar = click.progressbar(length=1, label="converting layers", file=sys.stderr) if sys.stderr.isatty() else None

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.length = total
            bar.update(done - bar.pos)

    result = convert.convert(experiment, out, step=step, dtype=dtype, overwrite=overwrite, progress=progress,
                             max_shard_size=max_shard_size, dry_run=dry_run)
    if bar is not None:
        bar.render_finish()
    c = result.config
    if dry_run:
        pushed = f", then push it to {experiment.hub.checkpoints_repo or remote} as {result.tag}/" if push else ""
        click.echo(f"dry run: nothing written or pushed; would convert {result.tag} into {result.out}: GPT-2 with "
                   f"{c['n_layer']} layers, hidden {c['n_embd']}, {c['n_head']} heads, vocabulary {c['vocab_size']} "
                   f"({dtype}){pushed}")
        return
    click.echo(f"{result.tag} -> {result.out}: GPT-2 with {c['n_layer']} layers, hidden {c['n_embd']}, "
               f"{c['n_head']} heads, vocabulary {c['vocab_size']}, {result.num_parameters:,} parameters ({dtype})")
    weights = [name for name in result.files if name.endswith(".safetensors")]
    if len(weights) > 1:
        click.echo(f"weights in {len(weights)} shards of at most {max_shard_size}: {weights[0]} ... {weights[-1]}, "
                   f"indexed by {convert.WEIGHTS_INDEX}")
    if push:
        from bigscience_ops.ops.keep import hubsync

        # Every file of the folder (the shards and their index too), one folder per step: global_stepN/.
        convert.check_pushable(result)
        commit = hubsync.publish_folder(hubsync.settings(experiment), result.out, result.tag, remote=remote)
        click.echo(f"pushed {result.tag}/ to {experiment.hub.checkpoints_repo or remote}: {commit}")


def _rendered(path: Path):
    """A run's resolved experiment.json (what bsops render writes)."""
    import json

    from bigscience_ops.config.loading import from_dict

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"{path}: unreadable ({exc}); expected an experiment name, its YAML file or the "
                                 "experiment.json bsops render writes", param_hint="EXP")
    return from_dict(data, str(path))


@main.command("warm-start")
@click.option("--from", "source", type=TEXT, required=True, metavar="RUN[:STEP]",
              help="The trained run: a run folder, its checkpoints folder or an experiment name; STEP picks "
                   "global_stepSTEP (default: the checkpoint 'latest' names).")
@click.argument("exp", type=TEXT)
@trainings_option
@dry_run_option
def warm_start_command(source: str, exp: str, trainings_dir: Path | None, dry_run: bool) -> None:
    """Write step 0 of EXP, a deeper model, from the weights of a shallower run (Gopher G.3.3).

    EXP is an experiment name, its YAML file, or a rendered run's experiment.json.

    EXP's block i starts as the source's block floor(i * L / L') (L source blocks, L' of EXP); the
    embedding and the final LayerNorm are copied. Width, heads, FFN size, vocabulary, position
    embedding and TP must match. The new run starts with fresh schedules, optimizer state and data
    position: launch EXP as usual and it loads these weights.
    """
    from bigscience_ops.checkpoints import warm_start

    if exp.endswith(".json"):
        experiment = _rendered(Path(exp))
        click.echo(f"run folder: {experiment.paths.output} (paths.output of {exp})", err=True)
    else:
        experiment = load_experiment(exp, trainings_dir)
        echo_run_folder(exp, trainings_dir, experiment)
    run, step = warm_start.parse_from(source)
    found = warm_start.find_source(warm_start.source_checkpoints(run, trainings_dir), step, source)
    result = warm_start.build(experiment, found, log=click.echo, dry_run=dry_run)
    src_layers = found.meta["model"]["num_layers"]
    click.echo(("dry run: nothing written; would warm-start " if dry_run else "") + f"{found.path} ({src_layers} blocks, iteration {found.meta.get('iteration')}) -> {result.target} "
               f"({len(result.mapping)} blocks from source blocks {result.mapping})")


@main.command("rollback")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--step", "to_step", type=click.IntRange(min=0), required=True,
              help="The step to go back to: a complete checkpoint at or before the one `latest` names.")
@click.option("--skip", type=TEXT, default=None, metavar="A-B",
              help="Iterations A to B (after --step) to step over when the run trains them again: their data is "
                   "consumed, no update is made (Megatron's --skip-train-iteration-range).")
@click.option("--force", is_flag=True, help="Roll back although the ledger shows a task that began and never ended.")
@dry_run_option
def rollback_command(exp: str | None, run: Path | None, trainings_dir: Path | None, to_step: int, skip: str | None,
                     force: bool, dry_run: bool) -> None:
    """Move EXP's run back to global_step<STEP>, setting the later checkpoints aside (nothing is deleted).

    `latest` names the target afterwards; the later checkpoints move into
    <checkpoints>/rolled-back-<time>/, which retention never touches; the event and the skipped range
    go into <run>/rollbacks.jsonl, which plan, render and the trainer read from then on. Then relaunch.
    """
    from bigscience_ops.run import ledger
    from bigscience_ops.run import lock as run_lock
    from bigscience_ops.run import rollback

    opened = open_run_saying(exp, run, trainings_dir)
    experiment = opened.experiment
    # The run's lock: a local launch or an array task that trains it now refuses the rollback, naming itself.
    with contextlib.nullcontext() if dry_run else run_lock.hold(Path(experiment.paths.output), "bsops rollback"):
        task = ledger.running(ledger.read(Path(experiment.paths.output) / ledger.LEDGER_NAME))
        if task is not None and not force:
            raise rollback.RollbackError(
                f"array task {task.job_id} began at iteration {task.start_iteration} and has not ended: a rollback "
                "now would race its saves. scancel the job first (or, if it was killed without an end record, pass "
                "--force)")
        done = rollback.rollback(experiment, to_step, skip, dry_run=dry_run)
    record = done.record
    if dry_run:
        in_use = run_lock.holder(Path(experiment.paths.output))
        click.echo("dry run: nothing moved or written" + (f" (the run is in use by {in_use}: the rollback would be "
                                                          "refused now)" if in_use else ""))
        click.echo(f"latest would go: global_step{record.from_step} -> global_step{record.to_step}")
        if done.moved:
            click.echo(f"would set aside (nothing deleted): {', '.join(done.moved)} in {record.set_aside}")
        if record.skip:
            click.echo(f"iterations {record.skip} would be stepped over (data consumed, no update)")
        return
    click.echo(f"latest: global_step{record.from_step} -> global_step{record.to_step}")
    if done.moved:
        click.echo(f"set aside (nothing deleted): {', '.join(done.moved)} in {record.set_aside}")
    if record.skip:
        click.echo(f"iterations {record.skip} will be stepped over (data consumed, no update): recorded in "
                   f"{Path(experiment.paths.output) / 'rollbacks.jsonl'}")
    click.echo(f"relaunch with: {_relaunch(exp, opened)}")


def _relaunch(exp: str | None, opened) -> str:
    """The launch that resumes the run: EXP's; for a run named by its folder, its experiment, with --local --out
    FOLDER where a local launch wrote the record."""
    import shlex

    name = shlex.quote(str(exp) if opened.yaml is not None else opened.experiment.name)
    local = opened.record is not None and opened.record.parent == opened.folder
    out = f" --local --out {shlex.quote(str(opened.folder))}" if opened.by_folder and local else ""
    return f"bsops launch {name}{out}"


@main.command("verify")
@click.argument("exp", type=TEXT, required=False)
@run_option
@trainings_option
@click.option("--step", type=click.IntRange(min=0), default=None, help="Check global_stepN alone (default: every one).")
@click.option("--sizes-only", is_flag=True,
              help="Check each file's size only (a stat each), not its content: fast on a large run.")
@click.option("--adopt", is_flag=True,
              help="Write the manifest of each checkpoint saved before manifests once its zip archives check out "
                   "(refused while a task of the run trains).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@dry_run_option
def verify_command(exp: str | None, run: Path | None, trainings_dir: Path | None, step: int | None, sizes_only: bool,
                   adopt: bool, as_json: bool, dry_run: bool) -> None:
    """Check EXP's checkpoints against their manifests: every file there, of its size and content.

    One line per checkpoint: verified; damaged (the first file that is not as saved, and how); not committed (a
    save in progress or cut short, which the next training task sets aside); saved before manifests (--adopt
    writes their manifests after checking their zip archives, as a training task does for the checkpoints it
    resumes from). Then the checkpoints a resume set aside, and why. Exits 0 when every committed checkpoint
    verifies, 1 when one does not. Reads only: nothing is unpickled, moved or deleted.
    """
    import json

    from bigscience_ops.checkpoints import audit
    from bigscience_ops.run import lock as run_lock
    from bigscience_ops.run.log import for_terminal

    opened = open_run_saying(exp, run, trainings_dir, err=as_json)
    experiment = opened.experiment
    checkpoints = Path(experiment.paths.checkpoints)

    def shown(finding: audit.Finding) -> None:
        if not as_json:
            click.echo(for_terminal(f"{finding.tag}: {finding.state}" + (f": {finding.detail}" if finding.detail
                                                                          else "")))

    def check() -> audit.Audit:
        return audit.audit(checkpoints, hashes=not sizes_only, adopt=adopt and not dry_run, step=step, progress=shown)

    if adopt and not dry_run:  # writes manifests: never beside a task that trains (and saves) the run
        with run_lock.hold(Path(experiment.paths.output), "bsops verify --adopt"):
            found = check()
    else:
        found = check()
    if dry_run and adopt and not as_json:
        click.echo("dry run: no manifest written; --adopt would write those of the checkpoints saved before "
                   "manifests whose zip archives check out")
    if as_json:
        click.echo(json.dumps(audit.as_data(found), indent=1))
    else:
        if not found.findings:
            click.echo(f"{checkpoints}: no checkpoint" + (f" global_step{step}" if step is not None else ""))
        for record in found.set_aside:
            click.echo(for_terminal(f"set aside {record.tag} (in {record.folder}): {record.reason}"))
        for problem in found.problems:
            click.echo(for_terminal(f"set-aside.jsonl: {problem}"))
    if not found.ok:
        sys.exit(EXIT_PROBLEMS)
