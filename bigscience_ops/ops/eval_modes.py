"""What `bsops eval` does in each of its modes, below the CLI: evaluate a checkpoint here (`here`), choose and
submit the next eval job (`next_pass`, the hourly job), fetch the tasks' datasets (`prefetch`). Each is handed the
run as run.open gave it (the record, with today's `eval:` and `alerts:`), checks first that there is something to
evaluate, and returns or tells what to show; the CLI prints it and picks the exit code.

It stands above ops/evaluate and ops/keep (a result counts only for a step the run has a checkpoint of,
keep/evaluated), as hourly_jobs.py does, and nothing in ops/ imports it. No torch here: the ranks import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.errors import ConfigError
from bigscience_ops.schema import Experiment

TABLE_STEPS = 6
"""The newest evaluated steps the table after an evaluation shows (as `bsops info` does)."""
WHAT_TO_SET = ("set eval.tasks (lm-eval task names, or task YAML files of your own) or eval.sources (held-out jsonl "
               "files by source name) in the experiment's file")


def require_configured(exp: Experiment, source: str) -> None:
    """ConfigError naming `source` (the experiment file) and its eval section when that holds nothing to evaluate."""
    if not exp.eval.configured:
        raise ConfigError(source, "eval", {}, f"nothing to evaluate: {WHAT_TO_SET}")


@dataclass(frozen=True)
class Here:
    """How an evaluation here went, and the run's results table after it."""

    tag: str
    path: Path
    code: int
    """The ranks' exit code."""
    written: bool
    """The ranks wrote the step's result file."""
    table: str = ""
    problems: list[str] = field(default_factory=list)
    """Result files of the run that cannot be read, or of steps it has no checkpoint of."""
    warnings: list[str] = field(default_factory=list)
    left_out: list[str] | None = None
    """The configured tasks or sources the step's result lacks (None: no result of the step to say)."""

    @property
    def failed(self) -> bool:
        """The evaluation failed or left out a configured task or source."""
        return self.code != 0 or bool(self.left_out)


def here(exp: Experiment, source: str, step: int | None, layout: tuple[int | None, int | None],
         kept: tuple[bool, bool] = (False, False)) -> Here:
    """Evaluate global_step`step` (None: the one `latest` names) of `exp` on this machine, in its own TP/PP layout or
    `layout` (tensor, pipeline), keeping lm-eval's samples and request cache as `kept` says (log_samples,
    keep_cache); then read the run's results as the table shows them. Raises EvalError before any rank starts."""
    from bigscience_ops.checkpoints import layout as checkpoints
    from bigscience_ops.ops.evaluate import EvalError, launcher, results, taskfiles
    from bigscience_ops.ops.evaluate.prefetch import cache_env
    from bigscience_ops.ops.keep import evaluated

    require_configured(exp, source)
    taskfiles.check_experiment(exp)  # a refused task file is one line here, before any rank starts
    if step is None:
        step = checkpoints.latest_step(Path(exp.paths.checkpoints))
        if step is None:
            raise EvalError(f"{exp.paths.checkpoints}: no `latest` file, so no complete checkpoint to evaluate yet; "
                            "allowed: --latest once the run has saved")
    tag = f"global_step{step}"
    hf = cache_env(exp.eval.hf_cache, offline=bool(exp.eval.hf_cache))  # the prefetched cache, offline
    path = results.result_path(exp, tag)
    before = results.stamp(path)
    code = launcher.run_local(exp, step, layout[0], layout[1], env=hf, log_samples=kept[0],
                              keep_cache=kept[1])  # the ranks read `exp` itself
    written = results.stamp(path) not in (None, before)
    if code != 0 and not written:
        return Here(tag, path, code, False)
    live, problems = results.read_live(exp.paths.output)
    live, uncounted = evaluated.counted(live, exp)  # a result of a step never saved: named, not tabled
    problems = [*problems, *uncounted]
    measured = {name for result in live for name in result.metrics}
    warnings = [f"eval.alert_drop: {name} is no metric of this run's results, so it never alerts; allowed: "
                f"{', '.join(sorted(measured)) or 'none yet'}"
                for name in sorted(set(exp.eval.alert_drop) - measured)]  # an alert that could never fire: said
    mine = next((r for r in live if r.step == step), None)
    return Here(tag, path, code, written, results.table(live, exp.eval.references, max_steps=TABLE_STEPS).text(),
                [str(p) for p in problems], warnings, sorted(mine.missing) if mine is not None else None)


def next_pass(exp: Experiment, source: str, echo: Callable[[str], None], workdir: Path) -> None:
    """One pass of the hourly eval job: the next checkpoint's eval job submitted (schedule.run_next) unless one of
    the run's is queued or running, its lines told with `echo`. Raises ScheduleError naming a failed job or a
    configured task the newest result left out: the hourly job alerts on it."""
    from bigscience_ops.launch import jobs
    from bigscience_ops.launch.cluster import watched_users
    from bigscience_ops.ops.evaluate import jobscript, results, schedule

    require_configured(exp, source)

    def submit_job(ckpt, folder: Path):
        return jobscript.submit(jobscript.render(exp, ckpt, folder, workdir=workdir), ckpt.tag)

    run = schedule.EvalRun(exp.name, Path(exp.paths.output), Path(exp.paths.checkpoints),
                           jobs.SlurmJob(schedule.job_name(exp), tuple(watched_users(exp))), schedule.chooser(exp))
    report = schedule.run_next(run, submit_job)
    for line in report.lines:
        echo(line)
    newest, _ = results.read_live(run.output)
    failures = [text for text in (report.failure_text(), results.missing_alert(newest)) if text]
    if failures:
        raise schedule.ScheduleError("; ".join(failures))


def prefetch(exp: Experiment, source: str, mirror: Path | None, echo: Callable[[str], None]) -> str:
    """eval.tasks' datasets into eval.hf_cache (from `mirror`, a local copy, when given), checked offline; the line
    that says what is ready where."""
    from bigscience_ops.ops.evaluate import prefetch as fetching

    require_configured(exp, source)
    manifest = fetching.prefetch(exp, mirror, echo)
    cache = Path(exp.eval.hf_cache).expanduser().absolute()
    return f"{len(manifest['tasks'])} task(s) ready offline in {cache} (recorded in {cache / fetching.MANIFEST})"
