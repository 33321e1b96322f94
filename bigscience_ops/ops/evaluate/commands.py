"""What each `bsops eval` subcommand does, below the CLI: `here` (`eval run`: evaluate a checkpoint on this machine),
`next_pass` and `next_pass_told` (`eval next`: choose and submit the next eval job, the hourly job with its failures
told; with `dry_run`, say what would be submitted and write, submit and send nothing), `prefetch` (`eval prefetch`:
fetch the tasks' datasets) and `tabled` (`eval table`: the run's results table, read only). Each is handed the run as
run.open gave it (the record, with today's `eval:` and `alerts:`), checks first that there is something to do, and
returns or tells what to show; the CLI prints it and picks the exit code.

The command line's SECTION.KEY=VALUE overrides apply to what an evaluation takes from the experiment file today
(OVERRIDABLE: the eval, alerts, hub and backup sections) and to which run is read (paths.output); the run's model,
data and checkpoints are its record's, so an override of them would change nothing and is refused
(`check_overrides`). They are recorded wherever the evaluation leaves a record: the experiment record the ranks
read (its `overrides` field), the result file's bsops.overrides, and each eval job's jobs.jsonl line.

The hourly job's failures are told by kind (FAILURES), each its own job-failed alert (`eval-job`, `eval-tasks`,
`eval-sources`, `eval-pass`) with its own cooldown: a new kind of failure is mailed at once, never held back by
the cooldown of another, and each recovers by itself.

Which results of a run count (those of steps it has a checkpoint of, on scratch or in the backup store) is
ops/keep/evaluated's rule, and ops/keep reads this package's result files: so the tables here take that rule as
`counted`, handed in by the caller (the CLI passes keep/evaluated.counted), and this package never imports ops/keep.
No torch here: the ranks import it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bigscience_ops.errors import BsopsError, ConfigError
from bigscience_ops.schema import Experiment

TABLE_STEPS = 6
"""The newest evaluated steps the table after an evaluation shows (as `bsops info` does)."""
WHAT_TO_SET = ("set eval.tasks (lm-eval task names, or task YAML files of your own) or eval.sources (held-out jsonl "
               "files by source name) in the experiment's file")
OVERRIDABLE = ("eval", "alerts", "hub", "backup", "paths.output")
"""What `bsops eval`'s SECTION.KEY=VALUE overrides may set (a section, or one field): today's settings of the run,
and which run it is."""
FAILURES = {
    "job": "an eval job left the queue without its result",
    "tasks": "the newest result left out a configured task or source",
    "sources": "a source failed on lines that are not documents (eval.max_bad_lines)",
    "pass": "the pass itself could not run (the run, the queue, a submission)",
}
"""The hourly eval job's kinds of failure: each is told as the job-failed alert of job `eval-<kind>`."""
LEGACY_JOB = "eval"
"""The one job name every eval failure was told under before FAILURES: recovered once nothing fails."""


def require_configured(exp: Experiment, source: str) -> None:
    """ConfigError naming `source` (the experiment file) and its eval section when that holds nothing to evaluate."""
    if not exp.eval.configured:
        raise ConfigError(source, "eval", {}, f"nothing to evaluate: {WHAT_TO_SET}")


def check_overrides(overrides: Sequence[str]) -> None:
    """ConfigError naming the first override that sets something an evaluation does not take from the command line
    (anything but OVERRIDABLE): the run is evaluated as it recorded itself."""
    for text in overrides:
        key = text.partition("=")[0].strip()
        if key not in OVERRIDABLE and key.partition(".")[0] not in OVERRIDABLE:
            raise ConfigError("the command line", key, text.partition("=")[2],
                              "bsops eval reads the run as it recorded itself (its model, data and checkpoints), so "
                              "this override would change nothing; allowed: overrides of eval.*, alerts.*, hub.*, "
                              "backup.* (the settings the evaluation takes from the experiment file today) and "
                              "paths.output (which run)")


def with_overrides(exp: Experiment, overrides: Sequence[str]) -> Experiment:
    """`exp` recording this command line's overrides (the `overrides` field the ranks' record and results carry)."""
    from bigscience_ops.config.loading import Overrides, apply_overrides

    return apply_overrides(exp, Overrides(command_line=tuple(overrides)))


Counting = Callable[[Sequence[Any], Experiment], tuple[list[Any], list[Any]]]
"""Which of a run's results count, and a problem for each that does not (keep/evaluated.counted's signature: the
caller hands it in, see above)."""


@dataclass(frozen=True)
class Tabled:
    """The run's results as the table shows them: the table, and what could not be counted or will never alert."""

    folder: Path
    """<paths.output>/eval/: where the run's result files are."""
    table: Any
    """results.Table: the newest TABLE_STEPS evaluated steps (a limited result marked), references beside."""
    results: int
    """How many results count (0: nothing evaluated yet)."""
    problems: list[str] = field(default_factory=list)
    """Result files of the run that cannot be read, of another run, or of steps it has no checkpoint of."""
    warnings: list[str] = field(default_factory=list)
    live: tuple[Any, ...] = ()
    """The counted results (results.Result), oldest first as read."""

    def as_json(self) -> dict[str, Any]:
        """What the text shows, as JSON: the table's columns and rows (a value JSON has no number for, nan or inf,
        as the text shows it), the problems and warnings."""
        return {"folder": str(self.folder), "results": self.results, "table": table_json(self.table),
                "problems": list(self.problems), "warnings": list(self.warnings)}


def table_json(table: Any) -> dict[str, Any]:
    """results.Table as JSON: its columns as the text heads them, a row per metric, the steps left out and missing."""
    def value(number: float | None) -> float | str | None:
        return number if number is None or math.isfinite(number) else str(number)

    return {"steps": list(table.steps), "references": list(table.references), "columns": table.columns,
            "limits": list(table.limits) or [None] * len(table.steps),
            "rows": [{"metric": row.metric, "higher_is_better": row.higher_is_better,
                      "values": [value(v) for v in row.values]} for row in table.rows],
            "left_out": table.left_out,
            "missing": [{"step": step, "name": name, "why": why} for step, name, why in table.missing]}


def tabled(exp: Experiment, counted: Counting, overrides: Sequence[str] = ()) -> Tabled:
    """The run's results table (`bsops eval table`, and after `here`): the result files of its live branch that
    `counted` counts, the newest TABLE_STEPS steps with eval.references beside; an eval.alert_drop metric no result
    measures is a warning (it could never alert). Reads only."""
    from bigscience_ops.ops.evaluate import results

    check_overrides(overrides)
    live, problems = results.read_live(exp.paths.output, exp.paths.checkpoints, limited=True)
    live, uncounted = counted(live, exp)  # a result of a step never saved: named, not tabled
    measured = {name for result in live for name in result.metrics}
    warnings = [f"eval.alert_drop: {name} is no metric of this run's results, so it never alerts; allowed: "
                f"{', '.join(sorted(measured)) or 'none yet'}"
                for name in sorted(set(exp.eval.alert_drop) - measured)]  # an alert that could never fire: said
    return Tabled(Path(exp.paths.output) / results.FOLDER, results.table(live, exp.eval.references,
                                                                          max_steps=TABLE_STEPS),
                  len(live), [str(p) for p in (*problems, *uncounted)], warnings, tuple(live))


@dataclass(frozen=True)
class Here:
    """How an evaluation here went, and the run's results table after it."""

    tag: str
    path: Path
    code: int
    """The ranks' exit code."""
    written: bool
    """The ranks wrote the step's result file."""
    tabled: Tabled | None = None
    """The run's results after it (None: the evaluation failed and wrote nothing)."""
    warnings: list[str] = field(default_factory=list)
    left_out: list[str] | None = None
    """The configured tasks or sources the step's result lacks (None: no result of the step to say)."""

    @property
    def failed(self) -> bool:
        """The evaluation failed or left out a configured task or source."""
        return self.code != 0 or bool(self.left_out)

    def as_json(self) -> dict[str, Any]:
        """What the text shows, as JSON: the result file, the ranks' exit code, the run's table, what was left out."""
        shown = self.tabled.as_json() if self.tabled is not None else {"table": None, "problems": [], "warnings": []}
        return {"tag": self.tag, "path": str(self.path), "exit_code": self.code, "written": self.written,
                "failed": self.failed, "left_out": self.left_out, "table": shown["table"],
                "problems": shown["problems"], "warnings": [*shown["warnings"], *self.warnings]}


def here(exp: Experiment, source: str, step: int | None, layout: tuple[int | None, int | None],
         kept: tuple[bool, bool] = (False, False), overrides: Sequence[str] = (), *, counted: Counting,
         ranks_stdout_to_stderr: bool = False) -> Here:
    """Evaluate global_step`step` (None: the one `latest` names) of `exp` on this machine, in its own TP/PP layout or
    `layout` (tensor, pipeline), keeping lm-eval's samples and request cache as `kept` says (log_samples,
    keep_cache), the command line's `overrides` recorded; then read the run's results as the table shows them
    (`tabled`, with `counted`; a limited result marked). With `ranks_stdout_to_stderr` the ranks' lines go to stderr
    (stdout is the caller's JSON). Raises EvalError before any rank starts (checkpoints of another run among the
    reasons)."""
    from bigscience_ops.ops.evaluate import launcher, results
    from bigscience_ops.ops.evaluate.prefetch import cache_env

    exp, step = _checked(exp, source, step, kept, overrides)
    tag = f"global_step{step}"
    hf = cache_env(exp.eval.hf_cache, offline=bool(exp.eval.hf_cache))  # the prefetched cache, offline
    path = results.result_path(exp, tag)  # eval.limit: eval/limited/, apart from the full results
    before = results.stamp(path)
    quiet = {"ranks_stdout_to_stderr": True} if ranks_stdout_to_stderr else {}
    code = launcher.run_local(exp, step, layout[0], layout[1], env=hf, log_samples=kept[0],
                              keep_cache=kept[1], **quiet)  # the ranks read `exp` itself
    written = results.stamp(path) not in (None, before)
    if code != 0 and not written:
        return Here(tag, path, code, False)
    shown = tabled(exp, counted)
    warnings = []
    if exp.eval.limit is not None:
        warnings.append(f"eval.limit {exp.eval.limit}: a limited result, kept apart in {path.parent}; the table marks "
                        "it, it never replaces the step's full result, and eval.alert_drop never compares it")
    limited = exp.eval.limit is not None
    mine = next((r for r in shown.live if r.step == step and r.limited == limited), None)
    return Here(tag, path, code, written, shown, warnings, sorted(mine.missing) if mine is not None else None)


def _checked(exp: Experiment, source: str, step: int | None, kept: tuple[bool, bool], overrides: Sequence[str]
             ) -> tuple[Experiment, int]:
    """What `here` checks before any rank starts, and its dry run too: something to evaluate, the overrides, the task
    files, the run's own checkpoints, the step (None: the one `latest` names), another run's request cache. Returns
    the experiment with its overrides recorded, and the step."""
    from bigscience_ops.checkpoints import layout as checkpoints
    from bigscience_ops.ops.evaluate import EvalError, launcher, results, taskfiles

    require_configured(exp, source)
    check_overrides(overrides)
    exp = with_overrides(exp, overrides)
    taskfiles.check_experiment(exp)  # a refused task file is one line here, before any rank starts
    run_id = launcher.same_run(exp)
    if step is None:
        step = checkpoints.resume_step(Path(exp.paths.checkpoints))  # what `latest` names when it is complete
        if step is None:
            raise EvalError(f"{exp.paths.checkpoints}: no complete checkpoint to evaluate yet; allowed: --latest once "
                            "the run has saved")
    if kept[1]:  # another run's request cache: refused before any rank starts (the ranks check it again)
        from bigscience_ops.ops.evaluate.driver import cache_of_run

        full = results.result_path(exp, f"global_step{step}", limited=False)
        cache_of_run(full.with_name(full.stem + ".requests"), run_id, write=False)
    return exp, step


def would_run(exp: Experiment, source: str, step: int | None, layout: tuple[int | None, int | None],
              kept: tuple[bool, bool] = (False, False), overrides: Sequence[str] = ()) -> dict[str, Any]:
    """`here`'s dry run: every check it makes before a rank starts (the checkpoint complete and the run's, the
    layout one the model takes, its layer files there), then what it would do: which checkpoint in which layout on
    how many processes, what it scores, and what it would write. Starts nothing and writes nothing."""
    from bigscience_ops.ops.evaluate import launcher, results

    exp, step = _checked(exp, source, step, kept, overrides)
    target = launcher.checkpoint(exp, step, layout[0], layout[1])
    path = results.result_path(exp, target.tag)
    beside = path.with_name(path.stem)
    return {"tag": target.tag, "checkpoint": str(target.path), "tensor": target.tensor, "pipeline": target.pipeline,
            "processes": target.tensor * target.pipeline, "tasks": list(exp.eval.tasks),
            "sources": sorted(exp.eval.sources), "limit": exp.eval.limit, "result": str(path),
            "replaces": path.exists(), "samples": str(beside) + ".samples" if kept[0] else None,
            "request_cache": str(beside) + ".requests" if kept[1] else None}


def would_run_lines(plan: dict[str, Any]) -> list[str]:
    """`would_run`'s answer as the text says it."""
    scored = ", ".join([*plan["tasks"], *(f"{s} (bits per byte)" for s in plan["sources"])])
    lines = [f"dry run: would evaluate {plan['tag']} ({plan['checkpoint']}) in TP={plan['tensor']} "
             f"PP={plan['pipeline']}: {plan['processes']} process(es) under torchrun here",
             f"on: {scored}" + (f" (eval.limit {plan['limit']} examples per task)" if plan["limit"] else ""),
             f"writing {plan['result']}" + (" (replacing the result there)" if plan["replaces"] else "")]
    lines += [f"keeping {what} in {plan[key]}" for key, what in (("samples", "lm-eval's per-sample output"),
                                                                ("request_cache", "lm-eval's request cache"))
              if plan[key]]
    return [*lines, "nothing started, nothing written"]


def next_pass(exp: Experiment, source: str, echo: Callable[[str], None], workdir: Path,
              overrides: Sequence[str] = (), dry_run: bool = False) -> dict[str, str]:
    """One pass of the hourly eval job: the next checkpoint's eval job submitted (next_eval.run_next) unless one of
    the run's is queued or running, its lines told with `echo`, the command line's `overrides` recorded with it.
    Returns what failed, by kind of FAILURES ("job": a failed job; "tasks", "sources": what the newest result left
    out); {} when nothing did. Raises BsopsError when the pass itself cannot run (the "pass" kind). With `dry_run`,
    the same decision, the job it would submit rendered and shown (its script's text), and nothing written,
    recorded or submitted."""
    from bigscience_ops.launch import jobs
    from bigscience_ops.launch.cluster import watched_users
    from bigscience_ops.ops.evaluate import jobscript, launcher, results, next_eval

    require_configured(exp, source)
    check_overrides(overrides)
    exp = with_overrides(exp, overrides)
    launcher.same_run(exp)  # another run's checkpoints: never submitted, never filed as this run's

    def submit_job(ckpt, folder: Path):
        return jobscript.submit(jobscript.render(exp, ckpt, folder, workdir=workdir), ckpt.tag)

    def preview(ckpt, folder: Path) -> list[str]:
        job = jobscript.render(exp, ckpt, folder, workdir=workdir)  # rendered only: nothing written
        return [f"the job {job.name}: its script {job.script} and the experiment its ranks read {job.experiment} "
                f"(neither written), its log in {job.log_folder}. The job script:", "", job.text.rstrip("\n")]

    run = next_eval.EvalRun(exp.name, Path(exp.paths.output), Path(exp.paths.checkpoints),
                           jobs.SlurmJob(next_eval.job_name(exp), tuple(watched_users(exp))), next_eval.chooser(exp),
                           exp.eval.limit is not None, tuple(overrides))
    report = next_eval.run_next(run, submit_job, preview=preview if dry_run else None)
    for line in report.lines:
        echo(line)
    newest, _ = results.read_live(run.output, run.checkpoints, limited=run.limited)
    found = {"job": report.failure_text(), **results.missing_alerts(newest)}
    return {kind: text for kind, text in found.items() if text}


@dataclass(frozen=True)
class Told:
    """How one alerting pass of the hourly eval job went."""

    lines: tuple[str, ...]
    """What to show on stderr: each failure (`error: ...`), then what its alert did."""
    failures: dict[str, str]
    """What failed, by kind of FAILURES (scrubbed of the Hub token and the SMTP password)."""
    told: bool = True
    """False when an alert or a recovery could not be sent (the next pass tries again)."""

    @property
    def failed(self) -> bool:
        return bool(self.failures) or not self.told


def next_pass_told(exp: Experiment, source: str, echo: Callable[[str], None], workdir: Path, alert: bool,
                   overrides: Sequence[str] = (), dry_run: bool = False) -> Told:
    """`next_pass`, its failures told with `alert` as the watchdog tells its alerts: each kind of FAILURES is the
    job-failed alert of job `eval-<kind>` (tell/job_alerts.tell_job: sent at once, then at most once per
    alerts.cooldown_minutes while that kind keeps failing, one recovery when it stops), so a new kind of failure is
    never held back by another's cooldown. A `dry_run` (next_pass's) tells no one: it must not be given `alert`."""
    from bigscience_ops.ops.tell import job_alerts
    from bigscience_ops.redact import env_secrets, scrub

    teller = job_alerts.Teller(exp.name, exp.alerts, exp.paths.logs, (exp.hub.token_env, exp.alerts.smtp_password_env))
    try:
        found = next_pass(exp, source, echo, workdir, overrides, dry_run)
    except (BsopsError, OSError) as exc:
        found = {"pass": str(exc)}
    failures = {kind: scrub(text, env_secrets(teller.secrets)) for kind, text in found.items()}
    lines = [f"error: {text}" for text in failures.values()]
    told = True
    if alert and not dry_run:
        command = f"bsops eval next {exp.name}"
        for kind in FAILURES:
            ok, said = job_alerts.tell_job(teller, f"eval-{kind}", command, failures.get(kind))
            told, lines = told and ok, [*lines, *said]
        if not failures:  # the one key of every eval failure before they had kinds: its recovery, once
            ok, said = job_alerts.tell_job(teller, LEGACY_JOB, command, None)
            told, lines = told and ok, [*lines, *said]
    return Told(tuple(lines), failures, told)


def would_prefetch(exp: Experiment, source: str, mirror: Path | None, overrides: Sequence[str] = ()) -> list[str]:
    """`prefetch`'s dry run: its checks (something to evaluate, eval.hf_cache set), then what it would fetch from
    where into which cache, and what the cache records as ready now. Fetches and writes nothing."""
    from bigscience_ops.ops.evaluate import prefetch as fetching
    from bigscience_ops.untrusted import read_small

    require_configured(exp, source)
    check_overrides(overrides)
    if not exp.eval.hf_cache:
        raise fetching.PrefetchError(f"experiment {exp.name}: eval.hf_cache is not set; allowed: a folder shared by "
                                     "the login and compute nodes (the eval job reads the datasets there, offline)")
    cache = Path(exp.eval.hf_cache).expanduser().absolute()
    tasks = list(exp.eval.tasks)
    lines = [f"dry run: would fetch the datasets of {len(tasks)} task(s) ({', '.join(tasks) or 'none'}) "
             f"{f'from the mirror {mirror}' if mirror else 'from the network'} into {cache}"
             f"{'' if cache.exists() else ' (made)'}, check that each loads offline and record them in "
             f"{cache / fetching.MANIFEST}, within eval.prefetch_minutes ({exp.eval.prefetch_minutes})"]
    manifest = cache / fetching.MANIFEST
    try:
        data = read_small(manifest, 4 << 20)
        recorded = json.loads(data) if data is not None else None
    except (OSError, ValueError, BsopsError) as exc:
        recorded = exc
    ready = recorded.get("tasks") if isinstance(recorded, dict) else None
    if recorded is None:
        lines.append(f"nothing recorded in {cache} yet")
    elif isinstance(ready, (list, dict)):
        lines.append(f"{manifest} records {len(ready)} task(s) ready now")
    else:
        why = f" ({recorded})" if isinstance(recorded, Exception) else ""
        lines.append(f"{manifest} cannot be read as a record bsops wrote{why}; it would be written anew")
    return [*lines, "nothing fetched, nothing written"]


def prefetch(exp: Experiment, source: str, mirror: Path | None, echo: Callable[[str], None],
             overrides: Sequence[str] = ()) -> str:
    """eval.tasks' datasets into eval.hf_cache (from `mirror`, a local copy, when given), checked offline within
    eval.prefetch_minutes, the child's lines told with `echo` as they come; the line that says what is ready where."""
    from bigscience_ops.ops.evaluate import prefetch as fetching

    require_configured(exp, source)
    check_overrides(overrides)
    manifest = fetching.prefetch(exp, mirror, echo)
    cache = Path(exp.eval.hf_cache).expanduser().absolute()
    return f"{len(manifest['tasks'])} task(s) ready offline in {cache} (recorded in {cache / fetching.MANIFEST})"
