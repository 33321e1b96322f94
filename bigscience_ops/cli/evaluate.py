"""`bsops eval`: evaluate a checkpoint of a run here (--step, --latest), or choose and submit the next eval job
(--next, what the hourly eval job runs).

torch and lm_eval are imported by the ranks only (ops/evaluate/worker.py), never here.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from bigscience_ops.cli.base import (
    EXIT_ERROR, EXIT_PROBLEMS, TEXT, alert_option, configured_run, main, overrides_argument, run_option,
    trainings_option,
)
from bigscience_ops.untrusted import MAX_STEP

@dataclass(frozen=True)
class Which:
    """What `bsops eval` does: exactly one of --step N, --latest, --next, --prefetch."""

    step: int | None
    latest: bool
    next_job: bool
    prefetch: bool

    def chosen(self) -> str:
        """The one flag given; a UsageError for none or several."""
        given = [flag for flag, on in (("--step", self.step is not None), ("--latest", self.latest),
                                       ("--next", self.next_job), ("--prefetch", self.prefetch)) if on]
        if len(given) != 1:
            raise click.UsageError(f"got {' and '.join(given) or 'none of them'}; allowed: exactly one of --step N, "
                                   "--latest, --next, --prefetch")
        return given[0]


@dataclass(frozen=True)
class Layout:
    """--tensor/--pipeline: the TP x PP to score in instead of the checkpoint's own (None: its own)."""

    tensor: int | None
    pipeline: int | None

    @property
    def given(self) -> bool:
        return self.tensor is not None or self.pipeline is not None


@dataclass(frozen=True)
class Kept:
    """--log-samples/--keep-cache: what of lm-eval's own output is kept beside the result (--step/--latest only)."""

    log_samples: bool
    keep_cache: bool


class _EvalCommand(click.Command):
    """Hands the command the options that say one thing as one value: which checkpoint (Which), the layout (Layout),
    what is kept of lm-eval's output (Kept)."""

    def invoke(self, ctx: click.Context) -> object:
        for name, group in (("which", Which), ("layout", Layout), ("kept", Kept)):
            ctx.params[name] = group(**{f.name: ctx.params.pop(f.name) for f in dataclasses.fields(group)})
        return super().invoke(ctx)


@main.command("eval", cls=_EvalCommand)
@click.argument("exp", type=TEXT, required=False)
@run_option
@click.option("--step", type=click.IntRange(min=0, max=MAX_STEP), default=None,
              help="Evaluate the checkpoint global_stepN (complete: its bsops.json there, not newer than `latest`).")
@click.option("--latest", is_flag=True, help="Evaluate the checkpoint `latest` names.")
@click.option("--next", "next_job", is_flag=True,
              help="Submit an eval job for the newest complete checkpoint without a result (what the hourly eval "
                   "job runs): every eval.every_saves-th save and the final step, one job at a time.")
@click.option("--prefetch", is_flag=True,
              help="Download the datasets of eval.tasks' lm-eval tasks into eval.hf_cache and check that they load "
                   "offline (run it where there is network, e.g. a login node); the eval job then reads them there "
                   "with HF_DATASETS_OFFLINE=1.")
@click.option("--mirror", "source", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="With --prefetch: build the datasets from this local mirror (DIR/<dataset_path>/...) instead of "
                   "downloading them.")
@click.option("--log-samples", is_flag=True,
              help="With --step/--latest: keep lm-eval's per-sample output beside the result "
                   "(<run>/eval/global_stepN.samples/<task>.jsonl), as lm-eval's --log_samples writes it.")
@click.option("--keep-cache", is_flag=True,
              help="With --step/--latest: keep lm-eval's request cache beside the result "
                   "(<run>/eval/global_stepN.requests/<dtype>_rank0.db); evaluating the step again (more tasks, a "
                   "larger limit) scores only the requests it has not answered.")
@click.option("--tensor", type=click.IntRange(min=1, max=4096), default=None,
              help="With --step/--latest: score in this TP instead of the checkpoint's own.")
@click.option("--pipeline", type=click.IntRange(min=1, max=4096), default=None,
              help="With --step/--latest: score in this PP instead of the checkpoint's own.")
@alert_option
@trainings_option
@overrides_argument
def eval_command(exp: str | None, run: Path | None, which: Which, source: Path | None, kept: Kept, layout: Layout,
                 alert: bool, trainings_dir: Path | None, overrides: tuple[str, ...]) -> None:
    """Evaluate EXP's checkpoints on the lm-eval tasks and held-out sources of its `eval:` section.

    With --step N or --latest: the checkpoint is scored here, in its own TP/PP layout (or --tensor/--pipeline), by
    TP x PP processes under torchrun; rank 0 runs the lm-eval tasks and the bits per byte of each source, writes
    <run>/eval/global_stepN.json and TensorBoard scalars eval/<task>/<metric>, and the run's results table is
    printed (references beside). Exit 2 when the evaluation could not run or failed, 1 when some result file of
    the run cannot be read.

    With --next (the hourly job `bsops cron add EXP --jobs eval` writes): submits one Slurm eval job (eval.partition,
    eval.nodes, eval.time) for the newest complete checkpoint without a result, unless an eval job of the run is
    queued or running; records it in <run>/eval/jobs.jsonl, and a job that left the queue without its result file
    as failed (with --alert, emailed naming the step and the job's log; a checkpoint failed twice is skipped).
    A configured task or source that did not run (its data not in the cache offline, a refused task file) is named
    with why under the table; the command then exits 2 and the hourly job alerts until a later step runs them all.

    With --prefetch (on a machine with network): lm-eval's registered tasks' datasets into eval.hf_cache, checked
    offline and recorded in <eval.hf_cache>/bsops-prefetch.json; the eval job reads that cache offline. Its progress
    is printed as it goes, and it stops at eval.prefetch_minutes. With --mirror DIR, nothing a task names is read
    from outside DIR (links included), and nothing is copied when one would be.

    A checkpoint is scored only for the run it belongs to: when the run folder and the checkpoints folder both
    record a run id (bsops-run-id) and they differ, the evaluation is refused; a result file or request cache made
    for another run is reported, never counted. With eval.limit, the result is a limited one: kept apart in
    <run>/eval/limited/ (its TensorBoard tags eval-limited/...), marked in the table, `bsops info` and the plot,
    and it never replaces the step's full result. A source with more lines that are not documents than
    eval.max_bad_lines (0 by default) is left out, so the evaluation exits 2 and the hourly job alerts. The hourly
    job's failures are told by kind (a failed eval job, a task or a source left out, the pass itself), each with its
    own alert and cooldown.

    SECTION.KEY=VALUE overrides set what the evaluation takes from the experiment file today (eval.*, alerts.*,
    hub.*, backup.*) and which run it reads (paths.output); the run's model, data and checkpoints are its record's,
    so an override of them is refused. They are recorded in the experiment record the ranks read, in the result
    file (bsops.overrides) and in each eval job's line of <run>/eval/jobs.jsonl.
    """
    chosen = which.chosen()
    if source is not None and chosen != "--prefetch":
        raise click.UsageError("--mirror goes with --prefetch")
    for flag, given in (("--log-samples", kept.log_samples), ("--keep-cache", kept.keep_cache)):
        if given and chosen in ("--next", "--prefetch"):
            raise click.UsageError(f"{flag} goes with --step or --latest")
    if layout.given and chosen in ("--next", "--prefetch"):
        raise click.UsageError("--tensor/--pipeline go with --step or --latest; --next evaluates in the run's layout "
                               "and --prefetch scores nothing")
    if alert and chosen != "--next":
        raise click.UsageError("--alert goes with --next (the hourly job); --step and --latest report on the terminal")
    from bigscience_ops.ops import eval_modes

    eval_modes.check_overrides(overrides)  # before the run is read: an override that would change nothing is refused
    # the run, with today's eval: and alerts:; the hourly job reads a run whose record is torn as the file says today
    experiment, named = configured_run(exp, run, trainings_dir, overrides, fallback=chosen == "--next")
    if chosen == "--prefetch":
        click.echo(eval_modes.prefetch(experiment, named, source, lambda line: click.echo(line, err=True),
                                       overrides))
    elif chosen == "--next":
        workdir = Path.cwd()  # the hourly job runs in the folder the experiment's relative outputs resolved against
        told = eval_modes.next_pass_told(experiment, named, click.echo, workdir, alert, overrides)
        for line in told.lines:
            click.echo(line, err=True)
        if told.failed:
            sys.exit(EXIT_ERROR)
    else:
        _show(eval_modes.here(experiment, named, which.step, (layout.tensor, layout.pipeline),
                              (kept.log_samples, kept.keep_cache), overrides))


def _show(done) -> None:
    """An evaluation's outcome (eval_modes.Here): the result file, the run's table, what could not be read or will
    never alert; exit 2 when it failed or left a configured task out, 1 when a result file cannot be read."""
    if not done.written and done.code != 0:
        click.echo(f"error: the evaluation of {done.tag} failed (exit code {done.code}; the ranks' output above says "
                   "why); no result written", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(f"{done.tag}: {done.path}")
    click.echo(done.table)
    for problem in done.problems:
        click.echo(f"unreadable result: {problem}", err=True)
    for warning in done.warnings:
        click.echo(f"warning: {warning}", err=True)
    if done.failed:
        left_out = done.left_out or []
        click.echo(f"error: the evaluation of {done.tag} left out {len(left_out)} configured task(s) or source(s)"
                   + (f" ({', '.join(left_out)}: see `missing` above)" if left_out else "")
                   + f"; exit code {done.code}", err=True)
        sys.exit(EXIT_ERROR)
    if done.problems:
        sys.exit(EXIT_PROBLEMS)
