"""`bsops eval`: one subcommand per thing it does (lm-eval's `run`/`ls`/`validate` habit), the work in
ops/evaluate/commands.py:

  bsops eval run EXP (--step N | --latest)   evaluate a checkpoint here ([--json] [--dry-run])
  bsops eval next EXP [--alert] [--dry-run]   choose and submit the next eval job (what the hourly eval job runs)
  bsops eval prefetch EXP [--mirror DIR]      fetch the lm-eval tasks' datasets into the shared cache ([--dry-run])
  bsops eval table EXP [--json]               the run's results table, read only

The last release's spelling, one command with exclusive flags (`bsops eval EXP --step N`, `--latest`, `--next`,
`--prefetch`), is still read this release, hidden: it runs the subcommand it means and says the new spelling in
one line on stderr (as base.RENAMED does for a renamed option). Hourly job scripts written before say
`bsops eval EXP --trainings-dir DIR --next --alert`; `bsops cron add` now writes `bsops eval next EXP ...`.

torch and lm_eval are imported by the ranks only (ops/evaluate/worker.py), never here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    EXIT_ERROR, EXIT_PROBLEMS, TEXT, alert_option, configured_run, dry_run_option, echo_json, json_option, main,
    open_run_saying, overrides_argument, run_option, trainings_option,
)
from bigscience_ops.untrusted import MAX_STEP

OLD_MODES = {"--step": "run", "--latest": "run", "--next": "next", "--prefetch": "prefetch"}
"""The last release's exclusive flags of `bsops eval EXP`, and the subcommand each is now."""
OLD_ALLOWED = "exactly one of --step N, --latest, --next, --prefetch"


def old_spelling(args: list[str], subcommands: dict[str, click.Command]) -> list[str]:
    """`args` of `bsops eval` in the last release's spelling (EXP or an option first, one of OLD_MODES among them)
    spelled with the subcommand it means, said in one line on stderr; the new spelling is returned as it is. A first
    word that is no subcommand and no old spelling is a UsageError naming the subcommands. Nothing after `--` is
    read."""
    if not args or args[0] in subcommands or args[0] in ("-h", "--help"):
        return args
    cut = args.index("--") if "--" in args else len(args)
    flags = [arg.partition("=")[0] for arg in args[:cut] if arg.partition("=")[0] in OLD_MODES]
    modes = {OLD_MODES[flag] for flag in flags}
    if not modes and args[0].startswith("-"):
        raise click.UsageError(f"got {args[0]} before a subcommand; allowed: a subcommand first "
                               f"({', '.join(subcommands)}), then its options (e.g. bsops eval run --run DIR --latest)")
    if not modes:
        raise click.UsageError(f"got {args[0]!r}: not a subcommand of bsops eval; allowed: {', '.join(subcommands)} "
                               f"(e.g. bsops eval run EXP --latest)")
    if len(modes) > 1:
        raise click.UsageError(f"got {' and '.join(dict.fromkeys(flags))}; allowed: {OLD_ALLOWED}")
    [mode] = modes
    flag = flags[0]
    new = f"bsops eval {mode} EXP" + (f" {flag}" if mode == "run" else "")
    rewrite = " (`bsops cron add EXP --jobs eval` writes an hourly job's script anew)" if mode == "next" else ""
    click.echo(f"note: bsops eval EXP {flag} is now {new}; the old spelling goes in the next release{rewrite}",
               err=True)
    kept = [arg for arg in args[:cut] if arg not in ("--next", "--prefetch")]
    return [mode, *kept, *args[cut:]]


class _EvalGroup(click.Group):
    """`bsops eval`: its subcommands, and the last release's spelling read as the subcommand it means."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            args = old_spelling(args, self.commands)
        except click.UsageError as exc:
            exc.ctx = ctx  # the error names `bsops eval --help`
            raise
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the order of use: run, next, prefetch, table


class _Subcommand(click.Command):
    """A subcommand of `bsops eval`: an option of another one is refused naming the subcommand it goes with."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            group = ctx.parent.command if ctx.parent is not None else None
            siblings = group.commands if isinstance(group, click.Group) else {}
            owners = [name for name, command in siblings.items()
                      if any(exc.option_name in p.opts for p in command.params if isinstance(p, click.Option))]
            if not owners:
                raise
            own = sorted(o for p in self.params if isinstance(p, click.Option) for o in p.opts if o.startswith("--"))
            raise click.UsageError(f"got {exc.option_name}: it goes with bsops eval {' or '.join(owners)}, not bsops "
                                   f"eval {self.name}; allowed here: {', '.join(own)}", ctx) from None


@main.group("eval", cls=_EvalGroup)
def eval_group() -> None:
    """Evaluate EXP's checkpoints on the lm-eval tasks and held-out sources of its `eval:` section.

    \b
      bsops eval run EXP --latest         score the checkpoint `latest` names, here (or --step N)
      bsops eval next EXP                 submit the next eval job (what the hourly eval job runs)
      bsops eval prefetch EXP             fetch the tasks' datasets into eval.hf_cache (where there is network)
      bsops eval table EXP                print the run's results table, evaluating nothing

    The last release's spelling (bsops eval EXP --step N, --latest, --next, --prefetch) still works this release
    and says the new one on stderr.
    """


def _the_run(func):
    """EXP, --run, --trainings-dir and the trailing SECTION.KEY=VALUE overrides: what every subcommand reads the run
    with. Place it below @eval_group.command()."""
    for decorate in (overrides_argument, trainings_option, run_option,
                     click.argument("exp", type=TEXT, required=False)):
        func = decorate(func)
    return func


@eval_group.command("run", cls=_Subcommand)
@click.option("--step", type=click.IntRange(min=0, max=MAX_STEP), default=None,
              help="Evaluate the checkpoint global_stepN (complete: its bsops.json there, not newer than `latest`).")
@click.option("--latest", is_flag=True, help="Evaluate the checkpoint `latest` names.")
@click.option("--log-samples", is_flag=True,
              help="Keep lm-eval's per-sample output beside the result, as lm-eval's --log_samples writes it "
                   "(<run>/eval/global_stepN.samples/samples_<task>_<date>.jsonl).")
@click.option("--keep-cache", is_flag=True,
              help="Keep lm-eval's request cache beside the result (<run>/eval/global_stepN.requests/<dtype>_rank0.db);"
                   " evaluating the step again (more tasks, a larger limit) scores only the requests it has not "
                   "answered.")
@click.option("--tensor", type=click.IntRange(min=1, max=4096), default=None,
              help="Score in this TP instead of the checkpoint's own.")
@click.option("--pipeline", type=click.IntRange(min=1, max=4096), default=None,
              help="Score in this PP instead of the checkpoint's own.")
@json_option
@dry_run_option
@_the_run
def run_command(exp: str | None, run: Path | None, step: int | None, latest: bool, log_samples: bool,
                keep_cache: bool, tensor: int | None, pipeline: int | None, as_json: bool, dry_run: bool,
                trainings_dir: Path | None, overrides: tuple[str, ...]) -> None:
    """Evaluate one checkpoint of EXP here: exactly one of --step N or --latest.

    The checkpoint is scored in its own TP/PP layout (or --tensor/--pipeline) by TP x PP processes under torchrun;
    rank 0 runs the lm-eval tasks and the bits per byte of each source, writes <run>/eval/global_stepN.json and
    TensorBoard scalars eval/<task>/<metric>, and the run's results table is printed (references beside); with
    --json, all of that as one JSON object on stdout (the ranks' lines then go to stderr). Exit 2 when the
    evaluation could not run, failed or left a configured task or source out (named under the table), 1 when some
    result file of the run cannot be read. With --dry-run, every check made before a rank starts, then which
    checkpoint, layout and processes it would use and what it would write; nothing is started or written.

    A checkpoint is scored only for the run it belongs to: when the run folder and the checkpoints folder both
    record a run id (bsops-run-id) and they differ, the evaluation is refused; a result file or request cache made
    for another run is reported, never counted. With eval.limit, the result is a limited one: kept apart in
    <run>/eval/limited/ (its TensorBoard tags eval-limited/...), marked in the table, `bsops info` and the plot,
    and it never replaces the step's full result. A source with more lines that are not documents than
    eval.max_bad_lines (0 by default) is left out, so the evaluation exits 2.

    SECTION.KEY=VALUE overrides set what the evaluation takes from the experiment file today (eval.*, alerts.*,
    hub.*, backup.*) and which run it reads (paths.output); the run's model, data and checkpoints are its record's,
    so an override of them is refused. They are recorded in the experiment record the ranks read and in the result
    file (bsops.overrides).
    """
    given = [flag for flag, on in (("--step", step is not None), ("--latest", latest)) if on]
    if len(given) != 1:
        raise click.UsageError(f"got {' and '.join(given) or 'neither'}; allowed: exactly one of --step N, --latest")
    from bigscience_ops.ops.evaluate import commands
    from bigscience_ops.ops.keep import evaluated

    commands.check_overrides(overrides)  # before the run is read: an override that would change nothing is refused
    experiment, named = _configured(exp, run, trainings_dir, overrides, as_json)
    if dry_run:
        plan = commands.would_run(experiment, named, step, (tensor, pipeline), (log_samples, keep_cache), overrides)
        if as_json:
            echo_json(plan)
        else:
            click.echo("\n".join(commands.would_run_lines(plan)))
        return
    done = commands.here(experiment, named, step, (tensor, pipeline), (log_samples, keep_cache), overrides,
                         counted=evaluated.counted, ranks_stdout_to_stderr=as_json)
    _show(done, as_json)


@eval_group.command("next", cls=_Subcommand)
@alert_option
@dry_run_option
@_the_run
def next_command(exp: str | None, run: Path | None, alert: bool, dry_run: bool, trainings_dir: Path | None,
                 overrides: tuple[str, ...]) -> None:
    """Submit an eval job for EXP's newest complete checkpoint without a result: what the hourly eval job runs
    (`bsops cron add EXP --jobs eval` writes it).

    Every eval.every_saves-th save and the final step are evaluated, one job at a time: one Slurm eval job
    (eval.partition, eval.nodes, eval.time) unless an eval job of the run is queued or running; it is recorded in
    <run>/eval/jobs.jsonl, and a job that left the queue without its result file as failed (with --alert, emailed
    naming the step and the job's log; a checkpoint failed twice is skipped). A configured task or source that did
    not run (its data not in the cache offline, a refused task file) is named with why; the command then exits 2
    and the hourly job alerts until a later step runs them all. The hourly job's failures are told by kind (a failed
    eval job, a task or a source left out, the pass itself), each with its own alert and cooldown.

    With --dry-run, the same decision is made and said, with the job script it would submit; nothing is written,
    recorded, submitted or sent. SECTION.KEY=VALUE overrides: as for `bsops eval run`; they are recorded in each
    eval job's line of <run>/eval/jobs.jsonl.
    """
    if alert and dry_run:
        raise click.UsageError("got --alert and --dry-run: --alert sends, --dry-run sends nothing; allowed: one of "
                               "them")
    from bigscience_ops.ops.evaluate import commands

    commands.check_overrides(overrides)
    # the run, with today's eval: and alerts:; the hourly job reads a run whose record is torn as the file says today
    experiment, named = configured_run(exp, run, trainings_dir, overrides, fallback=True)
    workdir = Path.cwd()  # the hourly job runs in the folder the experiment's relative outputs resolved against
    told = commands.next_pass_told(experiment, named, click.echo, workdir, alert, overrides, dry_run)
    for line in told.lines:
        click.echo(line, err=True)
    if told.failed:
        sys.exit(EXIT_ERROR)


@eval_group.command("prefetch", cls=_Subcommand)
@click.option("--mirror", "source", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Build the datasets from this local mirror (DIR/<dataset_path>/...) instead of downloading them.")
@dry_run_option
@_the_run
def prefetch_command(exp: str | None, run: Path | None, source: Path | None, dry_run: bool,
                     trainings_dir: Path | None, overrides: tuple[str, ...]) -> None:
    """Download the datasets of EXP's eval.tasks (lm-eval's registered tasks) into eval.hf_cache and check that they
    load offline: run it where there is network, e.g. a login node; the eval job then reads them there with
    HF_DATASETS_OFFLINE=1.

    What is ready is recorded in <eval.hf_cache>/bsops-prefetch.json. Its progress is printed as it goes, and it
    stops at eval.prefetch_minutes. With --mirror DIR, nothing a task names is read from outside DIR (links
    included), and nothing is copied when one would be. With --dry-run, its checks, then what it would fetch from
    where into which cache and what the cache records now; nothing is fetched or written.
    """
    from bigscience_ops.ops.evaluate import commands

    commands.check_overrides(overrides)
    experiment, named = configured_run(exp, run, trainings_dir, overrides)
    if dry_run:
        click.echo("\n".join(commands.would_prefetch(experiment, named, source, overrides)))
        return
    click.echo(commands.prefetch(experiment, named, source, lambda line: click.echo(line, err=True), overrides))


@eval_group.command("table", cls=_Subcommand)
@json_option
@_the_run
def table_command(exp: str | None, run: Path | None, as_json: bool, trainings_dir: Path | None,
                  overrides: tuple[str, ...]) -> None:
    """Print EXP's results table without evaluating anything: the newest evaluated steps (a limited result marked),
    eval.references beside, the configured tasks or sources a step left out named under it. Reads only.

    Exit 1 when some result file of the run cannot be read, is another run's or is of a step the run has no
    checkpoint of (each named on stderr, left out of the table).
    """
    from bigscience_ops.ops.evaluate import commands
    from bigscience_ops.ops.keep import evaluated

    commands.check_overrides(overrides)
    experiment, _ = _configured(exp, run, trainings_dir, overrides, as_json)
    shown = commands.tabled(experiment, evaluated.counted, overrides)
    if as_json:
        echo_json(shown.as_json())
    elif shown.results:
        click.echo(shown.table.text())
    else:
        click.echo(f"no evaluation results in {shown.folder} yet (bsops eval run EXP --latest writes one)")
    if not as_json:
        _problems(shown.problems, shown.warnings)
    if shown.problems:
        sys.exit(EXIT_PROBLEMS)


def _configured(exp: str | None, run: Path | None, trainings_dir: Path | None, overrides: tuple[str, ...],
                as_json: bool):
    """base.configured_run, which run folder it is said on stderr where stdout is JSON."""
    opened = open_run_saying(exp, run, trainings_dir, err=as_json, overrides=overrides)
    return opened.configured(), opened.named


def _problems(problems: list[str], warnings: list[str]) -> None:
    for problem in problems:
        click.echo(f"unreadable result: {problem}", err=True)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def _show(done, as_json: bool) -> None:
    """An evaluation's outcome (commands.Here): the result file, the run's table, what could not be read or will
    never alert (as JSON with `as_json`); exit 2 when it failed or left a configured task out, 1 when a result file
    cannot be read."""
    if as_json:
        echo_json(done.as_json())
    if not done.written and done.code != 0:
        click.echo(f"error: the evaluation of {done.tag} failed (exit code {done.code}; the ranks' output above says "
                   "why); no result written", err=True)
        sys.exit(EXIT_ERROR)
    if not as_json:
        click.echo(f"{done.tag}: {done.path}")
        click.echo(done.tabled.table.text())
        _problems(done.tabled.problems, [*done.tabled.warnings, *done.warnings])
    if done.failed:
        left_out = done.left_out or []
        click.echo(f"error: the evaluation of {done.tag} left out {len(left_out)} configured task(s) or source(s)"
                   + (f" ({', '.join(left_out)}: see `missing` above)" if left_out else "")
                   + f"; exit code {done.code}", err=True)
        sys.exit(EXIT_ERROR)
    if done.tabled.problems:
        sys.exit(EXIT_PROBLEMS)
