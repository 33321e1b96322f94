"""Experiment commands: list, show, plan, render, launch."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    EXIT_ERROR,
    EXIT_PROBLEMS,
    TEXT,
    SafePath,
    dry_run_option,
    echo_detail,
    echo_json,
    echo_run_folder,
    field_alias_option,
    json_option,
    load_experiment,
    main,
    overrides_argument,
    trainings_option,
    verbose_option,
)
from bigscience_ops.errors import BsopsError
from bigscience_ops.redact import scrub
from bigscience_ops.run import log as runlog

allow_incomplete_option = click.option(
    "--allow-incomplete", is_flag=True,
    help="Go on when site values a job needs are missing (data, partition or account the cluster asks for, "
         "env_setup, alert addresses): they are printed as warnings instead.")


@main.command("list")
@trainings_option
@json_option
def list_command(trainings_dir: Path | None, as_json: bool) -> None:
    """List the experiments, local ones first, then bsops' bundled ones, with their descriptions."""
    from bigscience_ops.config.files import find_experiments

    folder = None
    if as_json:
        listed = []
        for found in find_experiments(trainings_dir):
            entry = {"name": found.name, "path": str(found.path), "bundled": found.bundled,
                     "hidden_by": str(found.shadowed_by) if found.shadowed_by is not None else None}
            if found.shadowed_by is None:
                try:
                    entry["description"] = load_experiment(str(found.path), trainings_dir).description
                except BsopsError as exc:
                    entry["invalid"] = str(exc)
            listed.append(entry)
        echo_json(listed)
        return
    for found in find_experiments(trainings_dir):
        if found.path.parent != folder:
            folder = found.path.parent
            click.echo(f"{'bundled with bsops' if found.bundled else 'local'} ({folder}):")
        if found.shadowed_by is not None:
            click.echo(f"  {found.name:<20} (hidden by the local {found.shadowed_by})")
            continue
        try:
            description = load_experiment(str(found.path), trainings_dir).description
        except BsopsError as exc:
            description = f"INVALID: {exc}"
        click.echo(f"  {found.name:<20} {description}")


@main.command()
@click.argument("exp", type=TEXT)
@overrides_argument
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
@trainings_option
def show(exp: str, overrides: tuple[str, ...], as_json: bool, trainings_dir: Path | None) -> None:
    """Show EXP's resolved config: base: merged, derived values filled in and marked."""
    from bigscience_ops.config.loading import to_dict
    from bigscience_ops.planview import show_text

    experiment, inherited = load_with_inherited(exp, trainings_dir, overrides)
    if as_json:
        click.echo(json.dumps(to_dict(experiment) | {"derived": list(experiment.derived),
                                                     "inherited_site_values": inherited}, indent=2))
    else:
        click.echo(show_text(experiment), nl=False)
        for line in _inherited_lines(exp, trainings_dir, inherited):
            click.echo(f"# {line}")


def load_with_inherited(exp: str, trainings_dir: Path | None, overrides: tuple[str, ...] = ()):
    """EXP as loaded, and the site values it takes from a base file (site_values.inherited_from), from one reading of
    the YAML."""
    from bigscience_ops.config.loading import load_with_origins
    from bigscience_ops.config.files import experiment_path
    from bigscience_ops.config.site_values import inherited_from

    experiment, origins = load_with_origins(exp, trainings_dir, overrides)
    return experiment, inherited_from(origins, experiment_path(exp, trainings_dir))


def _inherited_lines(exp: str, trainings_dir: Path | None, inherited: dict[str, str]) -> list[str]:
    """The inherited site values, and where to set them: never advice to run the command that wrote the file."""
    if not inherited:
        return []
    from bigscience_ops.config.files import experiment_path
    from bigscience_ops.resources import is_bundled

    path = experiment_path(exp, trainings_dir)
    lines = [f"site-specific values inherited from a base ({len(inherited)}): another cluster's or team's?"]
    lines += [f"  {dotted:<22} from {Path(source).name}" for dotted, source in inherited.items()]
    if is_bundled(path):
        return lines + [f"  to run it on your cluster: bsops new NAME --base {path.stem} writes your own "
                        "experiment with every one of them reset"]
    return lines + [f"  set your own value for each in {path} (null resets one)"]


def _todo_lines(site, path: Path | None = None) -> list[str]:
    """plan's to-do: one line per missing site value, and why the cluster's needs were not checked."""
    lines = []
    if site.blanks:
        where = f" in {path}" if path is not None else ""
        lines.append(f"to do before a job can run: {len(site.blanks)} value(s) to set{where} (render and launch "
                     "refuse until then):")
        lines += [f"  {blank.line()}" for blank in site.blanks]
    if site.cluster_note:
        lines.append(f"slurm.partition, slurm.account: not checked against the cluster: {site.cluster_note}")
    return lines


@contextlib.contextmanager
def _data_checked() -> Iterator[None]:
    """The data's pre-flight refusal (data/preflight.py) as one `error:` line per finding, naming its file."""
    from bigscience_ops.data.preflight import DataRefused

    try:
        yield
    except DataRefused as exc:
        for error in exc.errors:
            click.echo(f"error: {scrub(str(error))}", err=True)
        sys.exit(EXIT_ERROR)


def _echo_data(data) -> None:
    """The data check's warnings and notes (a launch that goes on)."""
    for kind, lines in (("warning", data.errors + data.warnings if data is not None else []),
                        ("note", data.notes if data is not None else [])):
        for line in lines:
            click.echo(f"{kind}: {scrub(str(line))}", err=True)


EXIT_INTERRUPTED = 130
"""A launch stopped by Ctrl-C exits as a shell's command stopped by SIGINT does."""


@contextlib.contextmanager
def _console() -> Iterator:
    """The local launch's console (launch_console.Console): a progress bar on a terminal, progress lines in a log.
    Ctrl-C ends it with the line saying what the running task saved, instead of click's `Aborted!`."""
    import shutil

    from bigscience_ops.launch.local import Interrupted
    from bigscience_ops.launch.console import Console

    console = Console(lambda text, newline: click.echo(text, nl=newline), sys.stdout.isatty(),
                      width=lambda: shutil.get_terminal_size().columns)
    try:
        yield console
    except Interrupted as exc:
        console.close()
        click.echo(scrub(str(exc)), err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        console.close()
        click.echo("stopped by Ctrl-C; run the same command again to go on (`bsops info` says where the run "
                   "stands)", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        console.close()


def _echo_overrides(experiment) -> None:
    """The command line's SECTION.KEY=VALUE assignments, in one line (none without any)."""
    from bigscience_ops.planview import overrides_lines

    for line in overrides_lines(experiment):
        click.echo(line)


def _warn_incomplete(name: str, site) -> None:
    for blank in site.blanks if site is not None else []:
        click.echo(f"warning: {name} is incomplete (--allow-incomplete): {blank.line()}", err=True)


@main.command()
@click.argument("exp", type=TEXT)
@overrides_argument
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@field_alias_option("slurm.nodes", "--nodes", metavar="N",
                    help="this many nodes all along (slurm.node_schedule set aside, as any slurm.nodes given does).")
@allow_incomplete_option
@trainings_option
def plan(exp: str, overrides: tuple[str, ...], as_json: bool, allow_incomplete: bool,
         trainings_dir: Path | None) -> None:
    """Plan EXP: parameters, memory, DP size, batch rampup, iterations, LR, tokens, days.

    Every rule that would fail or mislead the run is checked, and the site values a Slurm job needs that
    EXP does not set are listed as a to-do; exits 1 when any error is found or a value is missing
    (with --allow-incomplete only errors count).
    """
    from bigscience_ops.data.preflight import check_data
    from bigscience_ops.config.files import experiment_path
    from bigscience_ops.run.records import as_recorded
    from bigscience_ops.plan import make_plan
    from bigscience_ops.planview import data_check_data, plan_data, plan_text
    from bigscience_ops.config.site_values import missing_site_values

    experiment, inherited = load_with_inherited(exp, trainings_dir, overrides)
    experiment = as_recorded(experiment)  # a rolled-back run's skips included
    result = make_plan(experiment)
    data = check_data(experiment, result.dataset_sizes[0])  # the data's pre-flight checks, as a launch makes them
    site = missing_site_values(experiment)
    if as_json:
        click.echo(json.dumps(plan_data(result) | {
            "overrides": list(experiment.overrides),
            "data": data_check_data(data),
            "inherited_site_values": inherited,
            "missing_site_values": [{"field": b.field, "what": b.what} for b in site.blanks],
            "cluster_not_checked": site.cluster_note}, indent=2))
    else:
        click.echo(plan_text(result, experiment, data), nl=False)
        for lines in (_inherited_lines(exp, trainings_dir, inherited),
                      _todo_lines(site, experiment_path(exp, trainings_dir))):
            if lines:
                click.echo("")
                click.echo("\n".join(lines))
    if result.errors or data.refusing or site.blanks and not allow_incomplete:
        sys.exit(EXIT_PROBLEMS)


@main.command("new")
@click.argument("name", type=TEXT)
@click.option("--base", type=TEXT, default="tr1-13B", show_default=True, help="The experiment to start from.")
@click.option("--trainings-dir", type=SafePath(file_okay=False, path_type=Path), default=None,
              help="Folder to write NAME.yaml into (default: $BSOPS_TRAININGS or ./trainings).")
@dry_run_option
def new(name: str, base: str, trainings_dir: Path | None, dry_run: bool) -> None:
    """Write trainings/NAME.yaml: BASE's model and schedule, with every site-specific value reset.

    Account, partition, paths, data, tokenizer, Hub repos and alert addresses belong to a cluster and a
    team: the new file sets them to empty so nothing of BASE's site is used without being written here.
    It then lists the fields a job needs that are still blank.
    """
    from bigscience_ops.errors import ConfigError
    from bigscience_ops.config.files import check_name, local_trainings_dir
    from bigscience_ops.config.site_values import missing_site_values, new_experiment_text

    try:  # the name alone, before any path is built from it (a 300-character name is no file name)
        check_name(name, "NAME")
    except ConfigError as exc:
        shown = repr(name) if len(name) <= 120 else f"{name[:100]!r}... ({len(name)} characters)"
        raise click.UsageError(f"NAME {shown}: {exc.allowed}") from None
    # Never the bundled folder: a new experiment is the user's, beside their other files.
    directory = local_trainings_dir(trainings_dir)
    path = directory / f"{name}.yaml"
    if path.exists():
        raise click.UsageError(f"{path} exists; choose another NAME or edit it")
    text = new_experiment_text(name, base, trainings_dir)  # the base must exist before anything is written
    if dry_run:
        _new_dry_run(path, text, base, trainings_dir)
        return
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    try:
        experiment, inherited = load_with_inherited(str(path), None)
    except BsopsError:
        path.unlink()
        raise
    again = f"bsops plan {shlex.quote(name)}" + (f" --trainings-dir {shlex.quote(str(trainings_dir))}"
                                                 if trainings_dir is not None else "")
    click.echo(f"wrote {path}: {base}'s model and schedule, every site-specific value reset")
    site = missing_site_values(experiment)
    if site.blanks:
        click.echo(f"fill in these fields in {path}, then check it with: {again}")
        for blank in site.blanks:
            click.echo(f"  {blank.line()}")
    else:
        click.echo(f"check it with: {again}")
    for line in _inherited_lines(str(path), None, inherited):
        click.echo(line)


def _new_dry_run(path: Path, text: str, base: str, trainings_dir: Path | None) -> None:
    """What `new` would write, checked as it would be (a copy read from a temporary folder), and its blanks."""
    import tempfile

    from bigscience_ops.config.site_values import missing_site_values

    with tempfile.TemporaryDirectory(prefix="bsops-new-") as scratch:
        copy = Path(scratch) / path.name
        copy.write_text(text, encoding="utf-8")
        experiment = load_experiment(str(copy), trainings_dir or path.parent)
    click.echo(f"dry run: nothing written; would write {path}: {base}'s model and schedule, every site-specific "
               "value reset")
    for blank in missing_site_values(experiment).blanks:
        click.echo(f"  to fill in: {blank.line()}")


@main.command()
@click.argument("exp", type=TEXT)
@overrides_argument
@click.option("--out", type=SafePath(file_okay=False, path_type=Path), default=None,
              help="Folder for the script, experiment.json and ds_config.json (default: rendered/EXP).")
@allow_incomplete_option
@trainings_option
@dry_run_option
def render(exp: str, overrides: tuple[str, ...], out: Path | None, allow_incomplete: bool,
           trainings_dir: Path | None, dry_run: bool) -> None:
    """Render EXP's Slurm job-array script and DeepSpeed JSON (refused if the plan finds errors, or if site
    values the job needs are missing, unless --allow-incomplete)."""
    from bigscience_ops.launch import render as rendering
    from bigscience_ops.launch.launch_plan import LaunchOptions, build_launch_plan

    experiment = load_experiment(exp, trainings_dir, overrides)
    echo_run_folder(exp, trainings_dir, experiment)
    _echo_overrides(experiment)
    out = out or Path("rendered") / experiment.name
    # What a launch would submit now: the phase of the latest checkpoint, the run's recorded skips.
    with _data_checked():
        prepared = build_launch_plan(experiment, LaunchOptions(allow_incomplete=allow_incomplete), out)
    _warn_incomplete(experiment.name, prepared.site)
    _echo_data(prepared.data)
    if dry_run:
        click.echo(f"dry run: nothing written; would write into {out}: {', '.join(sorted(prepared.rendered.files))}")
        return
    script = rendering.write(prepared.rendered, out)
    click.echo(f"rendered {script}")
    again = " ".join(shlex.quote(word) for word in (exp, *overrides))
    click.echo(f"submit with: sbatch {shlex.quote(str(script))}   (or: bsops launch {again})")



def _warn_if_the_run_recorded_otherwise(experiment) -> None:
    """One warning line when the run folder's last launch trained another seed, data or model than this one will."""
    from bigscience_ops.run import opening as run_ref

    folder = Path(experiment.paths.output)
    try:
        record, found = run_ref.relaunch_differences(experiment, folder)
    except run_ref.RunRecordError as exc:
        click.echo(f"warning: {exc}; not compared with this launch", err=True)
        return
    if found:
        shown = ", ".join(map(str, found[:4])) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        click.echo(f"warning: this launch differs from the run's last launch ({record}) in {shown}: the run trains on "
                   "from its checkpoint with the new values (the data order or the model change from there)", err=True)


def _local_dry_run(experiment, allow_incomplete: bool) -> None:
    """What `launch --local` would run: the plan checked and the job rendered as the launch would, nothing written."""
    from bigscience_ops.launch.launch_plan import LaunchOptions, build_launch_plan

    with _data_checked():
        prepared = build_launch_plan(experiment, LaunchOptions(job="local", allow_incomplete=allow_incomplete,
                                                               dry_run=True))
    _warn_incomplete(experiment.name, prepared.site)
    _echo_data(prepared.data)
    click.echo(f"dry run: nothing written or run; would run {experiment.slurm.array} array task(s) here, one after "
               f"another, in {experiment.paths.output} (files: {', '.join(sorted(prepared.rendered.files))})")


@main.command()
@click.argument("exp", type=TEXT, default="tiny")
@overrides_argument
@click.option("--local", "local", is_flag=True,
              help="Run the rendered job array on this machine with Slurm's environment emulated.")
@click.option("--after-current", is_flag=True,
              help="If a job of EXP is queued, start after its whole array (afterany) instead of refusing.")
@click.option("--dry-run", is_flag=True, help="Show the run record, queue check and sbatch command (with --local: the "
                                               "tasks it would run); write, submit and run nothing.")
@field_alias_option("paths.output", "--out", metavar="DIR",
                    help="the run folder; its checkpoints, logs and tensorboard go under it unless EXP sets them.")
@field_alias_option("slurm.array", "--tasks", metavar="N",
                    help="array tasks, run one at a time (with --local: here, one after another); each resumes "
                         "from the last checkpoint.")
@allow_incomplete_option
@verbose_option
@trainings_option
def launch(exp: str, overrides: tuple[str, ...], local: bool, after_current: bool, dry_run: bool,
           allow_incomplete: bool, trainings_dir: Path | None) -> None:
    """Launch EXP (default: tiny) as a Slurm job array, one task at a time, each resuming.

    The plan is checked first and nothing invalid is submitted. A job of EXP already in the queue
    (any user of slurm.group) makes the launch refuse, unless --after-current chains after it.
    With --local the same job script runs here, its array tasks one after another.
    """
    from bigscience_ops.launch.local import launch_local
    from bigscience_ops.launch.launch_plan import LaunchOptions

    if local and after_current:
        raise click.UsageError("--after-current applies to Slurm launches, not --local")
    if "=" in exp and not Path(exp).exists():  # `bsops launch train.seed=7`: EXP left out, tiny's
        exp, overrides = "tiny", (exp, *overrides)
    experiment = load_experiment(exp, trainings_dir, overrides)
    echo_run_folder(exp, trainings_dir, experiment)
    _echo_overrides(experiment)
    _warn_if_the_run_recorded_otherwise(experiment)
    if local and dry_run:
        _local_dry_run(experiment, allow_incomplete)
        return
    if not local:
        from bigscience_ops.launch import cluster as submit

        with _data_checked():
            launch_plan = submit.plan_launch(experiment, LaunchOptions(allow_incomplete=allow_incomplete),
                                             after_current=after_current, dry_run=dry_run)
        _warn_incomplete(experiment.name, launch_plan.site)
        _echo_data(launch_plan.plan.data)
        for line in launch_plan.describe():
            click.echo(line)
        if launch_plan.queue.error is not None:
            echo_detail(launch_plan.queue.error)
        if dry_run:
            click.echo(f"dry run: nothing submitted. The job script:\n\n{launch_plan.rendered.files[launch_plan.rendered.script]}")
            return
        job = submit.submit(launch_plan)
        again = " ".join(shlex.quote(word) for word in (exp, *overrides))
        _echo_job(job, launch_plan.experiment, f"Slurm job array of {experiment.slurm.array} tasks, one at a time",
                  f"watch it with: bsops status {again}")
        return
    with _data_checked():
        with _console() as console:  # each task's end was told as it came (launch_console.task_end)
            run = launch_local(experiment, progress=console.feed, allow_incomplete=allow_incomplete)
    _echo_job(run, run.experiment, f"{len(run.tasks)} array task(s) run here, one after another",
              "training finished" if run.finished else "training not finished: run the same command again to resume")


def _echo_job(job, launched, where: str, then: str) -> None:
    """What a launch started, printed one way whatever ran it: the job (launch/jobs.Job) and the run's folders."""
    from bigscience_ops import slurm

    try:
        state = job.state()
    except slurm.SlurmError as exc:
        state = f"state unknown ({exc})"
    click.echo(f"job {job.job_id} ({where}): {'ended' if state == 'gone' else state}")
    click.echo(f"  run folder:  {launched.paths.output}")
    click.echo(f"  log:         {job.log}")
    click.echo(f"  checkpoints: {launched.paths.checkpoints}")
    click.echo(f"  tensorboard: {launched.paths.tensorboard}")
    click.echo(then)
