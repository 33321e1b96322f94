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
    EXIT_ERROR, EXIT_PROBLEMS, TEXT, main, overrides_argument, run_option, trainings_option,
)
from bigscience_ops.cli.ops import configured_run, run_alerting, alert_option
from bigscience_ops.errors import ConfigError
from bigscience_ops.untrusted import MAX_STEP

TABLE_STEPS = 6
"""The newest evaluated steps the table after an evaluation shows (as `bsops info` does)."""
WHAT_TO_SET = ("set eval.tasks (lm-eval task names, or task YAML files of your own) or eval.sources (held-out jsonl "
               "files by source name) in the experiment's file")


def _require_configured(exp, named: str, trainings_dir: Path | None) -> None:
    """ConfigError naming the experiment file and its eval section when that holds nothing to evaluate."""
    from bigscience_ops.experiment_files import experiment_path

    if not exp.eval.configured:
        try:
            source = str(experiment_path(named, trainings_dir))
        except ConfigError:
            source = named
        raise ConfigError(source, "eval", {}, f"nothing to evaluate: {WHAT_TO_SET}")


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
@click.option("--from", "source", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
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
    offline and recorded in <eval.hf_cache>/bsops-prefetch.json; the eval job reads that cache offline.
    """
    chosen = which.chosen()
    if source is not None and chosen != "--prefetch":
        raise click.UsageError("--from goes with --prefetch")
    for flag, given in (("--log-samples", kept.log_samples), ("--keep-cache", kept.keep_cache)):
        if given and chosen in ("--next", "--prefetch"):
            raise click.UsageError(f"{flag} goes with --step or --latest")
    if layout.given and chosen in ("--next", "--prefetch"):
        raise click.UsageError("--tensor/--pipeline go with --step or --latest; --next evaluates in the run's layout "
                               "and --prefetch scores nothing")
    if alert and chosen != "--next":
        raise click.UsageError("--alert goes with --next (the hourly job); --step and --latest report on the terminal")
    experiment, named = configured_run(exp, run, trainings_dir, overrides)  # the run, with today's eval: and alerts:
    if chosen == "--prefetch":
        _prefetch(experiment, named, source, trainings_dir)
    elif chosen == "--next":
        _next(experiment, named, alert, trainings_dir)
    else:
        _here(experiment, named, which, layout, trainings_dir, kept)


def _here(experiment, named: str, which: Which, layout: Layout, trainings_dir: Path | None,
          kept: Kept) -> None:
    from bigscience_ops.checkpoints import layout as checkpoints
    from bigscience_ops.ops.evaluate import EvalError, launcher, results, taskfiles

    from bigscience_ops.run import rollbacks

    _require_configured(experiment, named, trainings_dir)
    step = which.step
    if which.latest:
        step = checkpoints.latest_step(Path(experiment.paths.checkpoints))
        if step is None:
            raise EvalError(f"{experiment.paths.checkpoints}: no `latest` file, so no complete checkpoint to "
                            "evaluate yet; allowed: --latest once the run has saved")
    assert step is not None  # exactly one of --step/--latest/--next, checked above
    taskfiles.check_experiment(experiment)  # a refused task file is one line here, before any rank starts
    tag = f"global_step{step}"
    path = results.result_path(experiment, tag)
    before = _stamp(path)
    from bigscience_ops.ops.evaluate.prefetch import cache_env

    hf = cache_env(experiment.eval.hf_cache, offline=bool(experiment.eval.hf_cache))  # the prefetched cache, offline
    code = launcher.run_local(experiment, step, layout.tensor, layout.pipeline, env=hf, log_samples=kept.log_samples,
                              keep_cache=kept.keep_cache)  # the ranks read `experiment` itself
    written = _stamp(path) not in (None, before)
    if code != 0 and not written:
        click.echo(f"error: the evaluation of {tag} failed (exit code {code}; the ranks' output above says why); no "
                   "result written", err=True)
        sys.exit(EXIT_ERROR)
    found, problems = results.read_all(Path(experiment.paths.output))
    live = results.live(found, rollbacks.read_checked(experiment.paths.output).records)  # an abandoned branch's: out
    from bigscience_ops.ops.keep import evaluated

    live, uncounted = evaluated.counted(live, experiment)  # a result of a step never saved: named, not tabled
    problems = [*problems, *uncounted]
    click.echo(f"{tag}: {path}")
    click.echo(results.table(live, experiment.eval.references, max_steps=TABLE_STEPS).text())
    for problem in problems:
        click.echo(f"unreadable result: {problem}", err=True)
    measured = {name for result in live for name in result.metrics}
    for name in sorted(set(experiment.eval.alert_drop) - measured):  # an alert that could never fire: said
        click.echo(f"warning: eval.alert_drop: {name} is no metric of this run's results, so it never alerts; "
                   f"allowed: {', '.join(sorted(measured)) or 'none yet'}", err=True)
    mine = next((r for r in live if r.step == step), None)
    if code != 0 or (mine is not None and mine.missing):
        left_out = sorted(mine.missing) if mine is not None else []
        click.echo(f"error: the evaluation of {tag} left out {len(left_out)} configured task(s) or source(s)"
                   + (f" ({', '.join(left_out)}: see `missing` above)" if left_out else "")
                   + f"; exit code {code}", err=True)
        sys.exit(EXIT_ERROR)
    if problems:
        sys.exit(EXIT_PROBLEMS)


def _prefetch(experiment, named: str, source: Path | None, trainings_dir: Path | None) -> None:
    from bigscience_ops.ops.evaluate import prefetch

    _require_configured(experiment, named, trainings_dir)
    manifest = prefetch.prefetch(experiment, source, click.echo)
    cache = Path(experiment.eval.hf_cache).expanduser().absolute()
    click.echo(f"{len(manifest['tasks'])} task(s) ready offline in {cache} (recorded in {cache / prefetch.MANIFEST})")


def _stamp(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, inode) of the file at `path`, None when there is none: tells a result this run wrote."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_ino


def _next(experiment, named: str, alert: bool, trainings_dir: Path | None) -> None:
    from bigscience_ops.run import rollbacks
    from bigscience_ops.launch import cluster as submit
    from bigscience_ops.ops.evaluate import jobscript, results, schedule

    workdir = Path.cwd()  # the hourly job runs in the folder the experiment's relative outputs resolved against

    def submit_job(ckpt, folder: Path):
        return jobscript.submit(jobscript.render(experiment, ckpt, folder, workdir=workdir), ckpt.tag)

    def work() -> None:
        _require_configured(experiment, named, trainings_dir)
        report = schedule.run_next(experiment, submit_job, users=submit.watched_users(experiment))
        for line in report.lines:
            click.echo(line)
        found, _ = results.read_all(Path(experiment.paths.output))
        newest = results.live(found, rollbacks.read_checked(experiment.paths.output).records)
        failures = [text for text in (report.failure_text(), results.missing_alert(newest)) if text]
        if failures:
            raise schedule.ScheduleError("; ".join(failures))

    run_alerting(experiment, alert, "eval", f"bsops eval {experiment.name} --next", work)
