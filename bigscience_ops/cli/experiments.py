"""Experiment commands: list, show, plan, render, launch."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    EXIT_PROBLEMS,
    load_experiment,
    main,
    trainings_option,
)
from bigscience_ops.errors import BsopsError


@main.command("list")
@trainings_option
def list_command(trainings_dir: Path | None) -> None:
    """List the experiments and their one-line descriptions."""
    from bigscience_ops.config import default_trainings_dir, list_experiments

    directory = trainings_dir or default_trainings_dir()
    for name in list_experiments(directory):
        try:
            description = load_experiment(name, directory).description
        except BsopsError as exc:
            description = f"INVALID: {exc}"
        click.echo(f"{name:<20} {description}")


@main.command()
@click.argument("exp")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
@trainings_option
def show(exp: str, as_json: bool, trainings_dir: Path | None) -> None:
    """Show EXP's resolved config: base: merged, derived values filled in and marked."""
    from bigscience_ops.config import to_dict
    from bigscience_ops.planview import show_text

    experiment = load_experiment(exp, trainings_dir)
    inherited = inherited_site_values(exp, trainings_dir)
    if as_json:
        click.echo(json.dumps(to_dict(experiment) | {"derived": list(experiment.derived),
                                                     "inherited_site_values": inherited}, indent=2))
    else:
        click.echo(show_text(experiment), nl=False)
        for line in _inherited_lines(inherited):
            click.echo(f"# {line}")


def inherited_site_values(exp: str, trainings_dir: Path | None) -> dict[str, str]:
    from bigscience_ops.site_values import inherited_site_values as inherited

    return inherited(exp, trainings_dir)


def _inherited_lines(inherited: dict[str, str]) -> list[str]:
    if not inherited:
        return []
    lines = [f"site-specific values inherited from a base ({len(inherited)}): another cluster's or team's?"]
    lines += [f"  {dotted:<22} from {Path(source).name}" for dotted, source in inherited.items()]
    return lines + ["  set them in the experiment's own file (bsops new EXP --base BASE writes one that resets them)"]


@main.command()
@click.argument("exp")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="Plan for this many nodes all along, instead of slurm.nodes or slurm.node_schedule.")
@trainings_option
def plan(exp: str, as_json: bool, nodes: int | None, trainings_dir: Path | None) -> None:
    """Plan EXP: parameters, memory, DP size, batch rampup, iterations, LR, tokens, days.

    Every rule that would fail or mislead the run is checked; exits 1 when any error is found.
    """
    from bigscience_ops.plan import make_plan
    from bigscience_ops.planview import plan_data, plan_text

    experiment = load_experiment(exp, trainings_dir)
    if nodes is not None:
        experiment = dataclasses.replace(experiment, slurm=dataclasses.replace(experiment.slurm, nodes=nodes,
                                                                                node_schedule=[]))
    result = make_plan(experiment)
    inherited = inherited_site_values(exp, trainings_dir)
    if as_json:
        click.echo(json.dumps(plan_data(result) | {"inherited_site_values": inherited}, indent=2))
    else:
        click.echo(plan_text(result, experiment), nl=False)
        lines = _inherited_lines(inherited)
        if lines:
            click.echo("")
            click.echo("\n".join(lines))
    if result.errors:
        sys.exit(EXIT_PROBLEMS)




@main.command("new")
@click.argument("name")
@click.option("--base", default="tr1-13B", show_default=True, help="The experiment to start from.")
@click.option("--trainings-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder to write NAME.yaml into (default: $BSOPS_TRAININGS or ./trainings).")
def new(name: str, base: str, trainings_dir: Path | None) -> None:
    """Write trainings/NAME.yaml: BASE's model and schedule, with every site-specific value reset.

    Account, partition, paths, data, Hub repos and alert addresses belong to a cluster and a team:
    the new file sets them to empty so nothing of BASE's site is used without being written here.
    """
    import os
    import shlex

    from bigscience_ops.site_values import new_experiment_text

    # Never the bundled folder: a new experiment is the user's, beside their other files.
    directory = trainings_dir or Path(os.environ.get("BSOPS_TRAININGS") or "trainings")
    path = directory / f"{name}.yaml"
    if path.exists():
        raise click.UsageError(f"{path} exists; choose another NAME or edit it")
    from bigscience_ops.config import NAME, NAME_ALLOWED

    if not NAME.fullmatch(name):
        raise click.UsageError(f"NAME {name!r}: {NAME_ALLOWED}")
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(new_experiment_text(name, base), encoding="utf-8")
    try:
        load_experiment(str(path), None)
    except BsopsError:
        path.unlink()
        raise
    click.echo(f"wrote {path}: fill in the site-specific values, then: bsops plan {shlex.quote(str(path))}")
    for line in _inherited_lines(inherited_site_values(str(path), None)):
        click.echo(line)


@main.command()
@click.argument("exp")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the script, experiment.json and ds_config.json (default: rendered/EXP).")
@trainings_option
def render(exp: str, out: Path | None, trainings_dir: Path | None) -> None:
    """Render EXP's Slurm job-array script and DeepSpeed JSON (refused if the plan finds errors)."""
    from bigscience_ops import render as rendering
    from bigscience_ops.prepare import prepare_launch

    experiment = load_experiment(exp, trainings_dir)
    out = out or Path("rendered") / experiment.name
    prepared = prepare_launch(experiment)  # what a launch would submit now: the phase of the latest checkpoint
    script = rendering.write(rendering.render(prepared.experiment, out, prepared.plan), out)
    click.echo(f"rendered {script}")
    click.echo(f"submit with: sbatch {shlex.quote(str(script))}   (or: bsops launch {shlex.quote(exp)})")






@main.command()
@click.argument("exp", default="tiny")
@click.option("--local", "local", is_flag=True,
              help="Run the rendered job array on this machine with Slurm's environment emulated.")
@click.option("--after-current", is_flag=True,
              help="If a job of EXP is queued, start after its whole array (afterany) instead of refusing.")
@click.option("--dry-run", is_flag=True, help="Show the run record, queue check and sbatch command; submit nothing.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --local: run folder (default: the experiment's paths.output, runs/EXP).")
@click.option("--tasks", type=click.IntRange(min=1), default=None,
              help="With --local: array tasks to run (default: slurm.array); each resumes from the last checkpoint.")
@trainings_option
def launch(exp: str, local: bool, after_current: bool, dry_run: bool, out: Path | None, tasks: int | None,
           trainings_dir: Path | None) -> None:
    """Launch EXP (default: tiny) as a Slurm job array, one task at a time, each resuming.

    The plan is checked first and nothing invalid is submitted. A job of EXP already in the queue
    (any user of slurm.group) makes the launch refuse, unless --after-current chains after it.
    With --local the same job script runs here, its array tasks one after another.
    """
    from bigscience_ops.launch import launch_local

    experiment = load_experiment(exp, trainings_dir)
    if not local:
        from bigscience_ops import submit

        if out is not None or tasks is not None:
            raise click.UsageError("--out and --tasks apply to --local only")
        launch_plan = submit.plan_launch(experiment, after_current=after_current, dry_run=dry_run)
        for line in launch_plan.describe():
            click.echo(line)
        if dry_run:
            click.echo(f"dry run: nothing submitted. The job script:\n\n{launch_plan.rendered.files[launch_plan.rendered.script]}")
            return
        job_id = submit.submit(launch_plan)
        click.echo(f"submitted job array {job_id} ({experiment.slurm.array} tasks, one at a time)")
        click.echo(f"watch it with: bsops status {shlex.quote(exp)}    log: {Path(experiment.paths.logs) / 'main_log.txt'}")
        return
    if after_current or dry_run:
        raise click.UsageError("--after-current and --dry-run apply to Slurm launches, not --local")
    result = launch_local(experiment, out, tasks, progress=click.echo)
    for task in result.tasks:
        click.echo(f"array task {task.array_task_id}: exit {task.returncode} in {task.seconds:.0f} s ({task.output})")
    click.echo(f"run folder: {result.run_dir}")
    click.echo(f"  log:         {result.main_log}")
    click.echo(f"  checkpoints: {result.checkpoints}")
    click.echo(f"  tensorboard: {result.tensorboard}")
    if not result.finished:
        click.echo("training not finished: run the same command again to resume")
