"""A run's evaluation results: one JSON file per evaluated checkpoint, written and read back (no torch, no lm_eval).

`bsops eval` writes `<paths.output>/eval/global_step<N>.json` (`result_path`, `write`: atomic): lm-eval's own
output of simple_evaluate (its "results", "higher_is_better", "versions", "n-shot", "configs", ...) with a
"bsops" section of what bsops adds (the checkpoint's step, iteration and consumed tokens, the bits per byte of
each held-out source, the run id it was made for, eval.limit, the command line's overrides). Everything else reads
the files back: the views (`bsops info`, `chronicle`, `plot`), the watchdog (a metric that falls against the run's
best so far: `drops`) and hub-sync.

A result belongs to the run it was made for: its bsops.run_id is the run's id (`run_id_of`: <paths.output>/
bsops-run-id, else <paths.checkpoints>/bsops-run-id), and a reader that finds another run's id reports the file as
a Problem and never counts it (`read_all`, `belonging`). A result of eval.limit examples per task is kept apart,
in eval/limited/global_step<N>.json, so that it never replaces a full one: `read_all` leaves limited results out
unless asked (the watchdog's drops never see them), and the views that show them mark them (`Table.limits`, the
plot's hollow points, TensorBoard's `eval-limited/` tags). A result in eval/ whose lm-eval config says it was
limited (written before they were kept apart) counts as limited too.

Read back, a result file is untrusted input: a file that is not plain (a link, a FIFO), larger than MAX_RESULT,
not JSON, or not of lm-eval's structure with a valid bsops section is a `Problem` naming it, and the other files
are still read (`read_all`). Its metrics are read by metrics.py ("task/metric" -> value, and which way is better).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bigscience_ops.ops.evaluate.metrics import (  # noqa: F401 - results.NAME is what the readers import
    BITS_PER_BYTE, LOWER_IS_BETTER, MAX_NAME, NOT_METRICS, ResultError, default_direction, metrics,
    metrics_and_directions, name_problem,
)
from bigscience_ops.untrusted import (
    MAX_STEP, Problem, RecordFileError, check_int, excerpt, read_small, write_atomically,
)

FOLDER = "eval"
"""The results' folder in the run folder."""
LIMITED = "limited"
"""The limited results' folder in FOLDER: results of eval.limit examples per task, kept apart from the full ones."""
FORMAT = 1
"""The bsops section's format."""
MAX_RESULT = 16 << 20
"""Bytes of a result file read at most: lm-eval's output of a few tasks (configs included) is under 1 MB."""
TAG = re.compile(r"global_step([0-9]{1,18})")
FILE = re.compile(r"global_step([0-9]{1,18})\.json")

@dataclass(frozen=True)
class Result:
    """One evaluated checkpoint, read back from its file."""

    tag: str  # global_stepN
    step: int
    iteration: int  # the checkpoint's iteration (the x of the eval curves)
    consumed_tokens: int | None
    metrics: dict[str, float]  # "task/metric" -> value
    higher_is_better: dict[str, bool]  # "task/metric" -> whether a higher value is better
    path: Path | None = None
    finished: float | None = None  # when the evaluation ended (epoch seconds), where the file says
    missing: dict[str, str] = field(default_factory=dict)  # configured task or source -> why it did not run
    run_id: str | None = None  # the run it was made for (bsops.run_id); None: written before run ids were recorded
    limit: int | None = None  # eval.limit examples per task; None: every example (a full result)
    corrupt: tuple[str, ...] = ()  # sources left out because of lines that are not documents (bsops.corrupt)

    @property
    def limited(self) -> bool:
        return self.limit is not None


@dataclass(frozen=True)
class Drop:
    """A metric of the newest result worse than the best of the earlier ones by more than the margin."""

    step: int
    iteration: int
    metric: str
    value: float
    best: float
    best_step: int
    margin: float
    higher_is_better: bool = True

    @property
    def by(self) -> float:
        """How much worse than the best (positive; inf when the value is no finite number)."""
        if not math.isfinite(self.value):
            return math.inf
        return self.best - self.value if self.higher_is_better else self.value - self.best


@dataclass(frozen=True)
class Row:
    metric: str
    higher_is_better: bool
    values: list[float | None]  # one per column of the table: None where not measured


@dataclass(frozen=True)
class Table:
    """Metrics by step: a row per metric, a column per evaluated step (oldest first), then one per reference."""

    steps: list[int]
    references: list[str]
    rows: list[Row]
    left_out: int = 0
    """Earlier evaluated steps not shown (`table`'s max_steps)."""
    missing: tuple[tuple[int, str, str], ...] = ()
    """(step, task or source, why) of each configured task or source a shown step's evaluation left out."""
    limits: tuple[int | None, ...] = ()
    """Per shown step, the eval.limit of its result (None: a full result); its column is marked."""

    @property
    def columns(self) -> list[str]:
        limits = self.limits or (None,) * len(self.steps)
        return [f"step {s}" + (f" (limit {n})" if n is not None else "") for s, n in zip(self.steps, limits)] + list(
            self.references)

    def text(self) -> str:
        """The table as aligned plain text (names are checked text, never a control character)."""
        head = ["metric", *self.columns]
        body = [[r.metric + (" (lower is better)" if not r.higher_is_better else ""), *map(shown, r.values)]
                for r in self.rows]
        widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                           enumerate(zip(line, widths))).rstrip() for line in [head, *body]]
        if self.left_out:
            lines.append(f"({self.left_out} earlier evaluated step(s) not shown)")
        if any(n is not None for n in self.limits):
            lines.append("(limit N: a limited result, eval.limit N examples per lm-eval task; not the step's full "
                         "score)")
        lines += [f"missing at step {step}: {name}: {why}" for step, name, why in self.missing]
        return "\n".join(lines)


def shown(value: float | None) -> str:
    """A metric's value as shown in tables: four decimals, a large one in four significant digits."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"


# ----------------------------------------------------------------------------- writing

def result_path(exp_or_output: Any, tag: str, limited: bool | None = None) -> Path:
    """`<paths.output>/eval/<tag>.json` of an experiment (its paths.output) or of a run folder; a limited result's
    (`limited`; None: whether the experiment sets eval.limit, a run folder's are full) `eval/limited/<tag>.json`."""
    is_exp = hasattr(exp_or_output, "paths")
    output = exp_or_output.paths.output if is_exp else exp_or_output
    if not output:
        raise ResultError(f"paths.output: got {output!r}; expected the run folder (load the experiment through bsops "
                          "so its paths are derived)")
    if not isinstance(tag, str) or not TAG.fullmatch(tag):
        raise ResultError(f"checkpoint tag: got {excerpt(str(tag))}; expected global_stepN (N a whole number)")
    if limited is None:
        limited = is_exp and exp_or_output.eval.limit is not None
    return Path(output) / FOLDER / (Path(LIMITED, f"{tag}.json") if limited else Path(f"{tag}.json"))


LM_EVAL_MODEL = "bsops"
"""The model name lm-eval's results carry in config.model for bsops' model (its `--model` name)."""


def model_name(experiment: str, tag: str) -> str:
    """The model name a checkpoint's lm-eval results carry (`model_name`), `<experiment>/<tag>`: lm-eval's
    `--output_path DIR` keeps its results and samples in DIR/<the name sanitized>, `<experiment>__<tag>`, as it
    keeps a Hub model `org/name`'s in DIR/org__name."""
    return f"{experiment}/{tag}"


def _json_safe(value: Any) -> Any:
    """What json cannot write, as lm-eval's own writer makes it: a numpy scalar as its number, a set as a list,
    anything else as its text."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def write(path: str | os.PathLike[str], result: Mapping[str, Any]) -> None:
    """Write `result` (lm-eval's output with a bsops section; its per-sample "samples" left out) as the JSON file
    `path`, atomically (runfiles.write_atomically: no reader ever sees part of it), creating the eval folder.
    One that would be larger than MAX_RESULT, which no reader would read, is a ResultError."""
    data = json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2, default=_json_safe,
                      ensure_ascii=False).encode("utf-8") + b"\n"
    if len(data) > MAX_RESULT:
        raise ResultError(f"{path}: the result is {len(data)} bytes; at most {MAX_RESULT} are read back: leave out "
                          "lm-eval's per-sample output (log_samples)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)


# ----------------------------------------------------------------------------- reading back

def _optional_int(section: Mapping[str, Any], key: str) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    why = check_int(value, 0, 2**63)
    if why is not None:
        raise ResultError(f"bsops.{key}: {why}")
    return value


def _finished(value: Any) -> float | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return when.timestamp() if when.tzinfo is not None else when.astimezone().timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def from_dict(data: Any, step: int, path: Path | None = None) -> Result:
    """The result of checkpoint `step` held in `data` (a result file's JSON); a ResultError says what is wrong."""
    if not isinstance(data, Mapping):
        raise ResultError(f"got a JSON {type(data).__name__}; expected an object (lm-eval's output)")
    section = data.get("bsops")
    if not isinstance(section, Mapping):
        raise ResultError("no bsops section (an object): not a result `bsops eval` wrote")
    if check_int(section.get("format"), FORMAT, FORMAT) is not None:
        raise ResultError(f"bsops.format: got {excerpt(repr(section.get('format')))}; expected {FORMAT}")
    named = section.get("step", step)
    if check_int(named, step, step) is not None:
        raise ResultError(f"bsops.step: got {excerpt(repr(named))}; expected {step}, the step of its file name")
    iteration = section.get("iteration", step)
    why = check_int(iteration, 0, MAX_STEP)
    if why is not None:
        raise ResultError(f"bsops.iteration: {why}")
    values, higher = metrics_and_directions(data)
    tag = path.stem if path is not None else f"global_step{step}"  # the checkpoint folder's name, as written
    missing = _missing(section.get("missing", {}))
    return Result(tag, step, iteration, _optional_int(section, "consumed_tokens"), values, higher,
                  path, _finished(section.get("finished")), missing, _run_id(section.get("run_id")),
                  _limit(section, data), tuple(n for n in _names(section.get("corrupt", []), "bsops.corrupt")
                                               if n in missing))


def _run_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not RUN_ID.fullmatch(value):
        raise ResultError(f"bsops.run_id: got {excerpt(repr(value))}; expected 32 hex digits (the run it was made "
                          "for) or null")
    return value


def _limit(section: Mapping[str, Any], data: Mapping[str, Any]) -> int | None:
    """bsops.limit, else lm-eval's own config.limit (a result written before bsops recorded it)."""
    value = section.get("limit")
    if "limit" not in section:
        config = data.get("config")
        value = config.get("limit") if isinstance(config, Mapping) else None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
    if value is None:
        return None
    why = check_int(value, 1, 10**9)
    if why is not None:
        raise ResultError(f"bsops.limit: {why}")
    return value


def _names(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or len(value) > 1000 or not all(isinstance(v, str) for v in value):
        raise ResultError(f"{what}: expected a list of at most 1000 names")
    return value


MAX_MISSING = 1000
"""Characters of a missing task's entry (a registered name or a task file's path) and of its reason."""


def _missing(value: Any) -> dict[str, str]:
    """bsops.missing: eval.tasks entry or source -> why it did not run, each one printable line (no control
    character or Unicode line break), bounded."""
    if not isinstance(value, Mapping):
        raise ResultError(f"bsops.missing: got a JSON {type(value).__name__}; expected an object of reasons")
    if len(value) > 1000:
        raise ResultError(f"bsops.missing: {len(value)} entries; expected at most 1000")
    for name, why in value.items():
        for text, what in ((name, "a task or source"), (why, "a reason")):
            if not isinstance(text, str) or len(text) > MAX_MISSING or not text.isprintable():
                raise ResultError(f"bsops.missing: {what}: expected one line of at most {MAX_MISSING} printable "
                                  "characters")
    return dict(value)


RUN_ID = re.compile(r"[0-9a-f]{32}")


def run_id_of(output: str | os.PathLike[str], checkpoints: str | os.PathLike[str] | None = None) -> str | None:
    """The id of the run whose folder is `output`: its own bsops-run-id, else its checkpoints folder's (the trainer
    writes both); None when neither has one. An id file that cannot be read is a ResultError naming it."""
    from bigscience_ops.checkpoints import layout

    try:
        found = layout.run_id(Path(output))
        if found is None and checkpoints is not None:
            found = layout.run_id(Path(checkpoints))
    except layout.CheckpointError as exc:
        raise ResultError(str(exc)) from None
    return found


def belonging(found: Sequence[Result], run_id: str | None) -> tuple[list[Result], list[Problem]]:
    """(the results made for run `run_id`, or that name no run; a Problem for each made for another run: never this
    run's). With no run id to compare, every result is kept."""
    kept, problems = [], []
    for result in found:
        if run_id is None or result.run_id is None or result.run_id == run_id:
            kept.append(result)
        else:
            problems.append(Problem(str(result.path or result.tag), 0, f"made for run {result.run_id}, not this run "
                                    f"({run_id}): another run's result, not counted"))
    return kept, problems


def read(path: str | os.PathLike[str]) -> Result | None:
    """The result file `path` (global_stepN.json) read back; None when nothing is there. A file that is not
    plain, too large, not JSON or not a result is a ResultError naming it."""
    path = Path(path)
    found = FILE.fullmatch(path.name)
    if found is None:
        raise ResultError(f"{path}: expected a file named global_stepN.json")
    try:
        raw = read_small(path, MAX_RESULT)
    except RecordFileError as exc:
        raise ResultError(f"{path}: {exc.what}") from None
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ResultError(f"{path}: not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        cut = text.lstrip().startswith("{") and not text.rstrip().endswith("}")
        cut_short = ": an object that ends mid-way (its write was cut short)" if cut else ""
        raise ResultError(f"{path}: not JSON{cut_short}") from None
    except (ValueError, RecursionError):  # a number of 5000 digits, arrays nested 100000 deep
        raise ResultError(f"{path}: not JSON that can be read (nested too deep, or a number too long)") from None
    try:
        return from_dict(data, int(found.group(1)), path)
    except ResultError as exc:
        raise ResultError(f"{path}: {exc}") from None


def read_all(output: str | os.PathLike[str], checkpoints: str | os.PathLike[str] | None = None,
             limited: bool = False) -> tuple[list[Result], list[Problem]]:
    """Every full result of the run folder `output` (eval/global_stepN.json), by step, and a problem for each file
    that cannot be read (the rest are still read) or was made for another run (run_id_of(output, checkpoints)); with
    `limited`, the limited results too (eval/limited/, and any in eval/ that lm-eval's config says was limited), else
    those are left out. No eval folder: none."""
    problems: list[Problem] = []
    try:
        run_id = run_id_of(output, checkpoints)
    except ResultError as exc:
        run_id, problems = None, [Problem(str(Path(output) / "bsops-run-id"), 0, str(exc))]
    found, unread = _read_folder(Path(output) / FOLDER)
    if limited:
        more, unread_limited = _read_folder(Path(output) / FOLDER / LIMITED)
        found, unread = sorted([*found, *more], key=lambda r: r.step), [*unread, *unread_limited]
    else:
        found = [r for r in found if not r.limited]
    kept, foreign = belonging(found, run_id)
    return kept, [*problems, *unread, *foreign]


def _read_folder(folder: Path) -> tuple[list[Result], list[Problem]]:
    if folder.is_symlink():
        return [], [Problem(str(folder), 0, "is a link; expected the folder of the evaluation results (never read "
                                            "through a link)")]
    try:
        names = sorted((int(m.group(1)), entry.name) for entry in os.scandir(folder)
                       if (m := FILE.fullmatch(entry.name)))
    except FileNotFoundError:
        return [], []
    except NotADirectoryError:
        return [], [Problem(str(folder), 0, "is not a folder; expected the folder of the evaluation results")]
    except OSError as exc:
        return [], [Problem(str(folder), 0, f"cannot be listed ({exc.strerror or exc})")]
    results, problems = [], []
    for _, name in names:
        path = folder / name
        try:
            result = read(path)
        except ResultError as exc:
            problems.append(Problem(str(path), 0, str(exc).removeprefix(f"{path}: ")))
            continue
        if result is not None:
            results.append(result)
    return results, problems


def read_live(output: str | os.PathLike[str], checkpoints: str | os.PathLike[str] | None = None,
              limited: bool = False) -> tuple[list[Result], list[Problem]]:
    """read_all, then only the results of the run's live branch (`live`, against the rollbacks the run recorded; a
    rollbacks line that is not a record is for the views to report, and costs nothing here)."""
    from bigscience_ops.run import rollbacks

    found, problems = read_all(output, checkpoints, limited)
    return live(found, rollbacks.read_checked(output).records), problems


def stamp(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, inode) of the result file at `path`, None when there is none: tells a result an evaluation
    wrote from one it found."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_ino


def live(results: Sequence[Result], rollbacks: Iterable[Any]) -> list[Result]:
    """The results of the run's live branch: a result of a step after a rollback's target, finished before that
    rollback, is of the abandoned branch (its checkpoint was set aside) until that step is evaluated again."""
    cuts = [(r.time, r.to_step) for r in rollbacks]
    return [r for r in results if not any(r.step > to_step and r.finished is not None and r.finished < when
                                          for when, to_step in cuts)]


# ----------------------------------------------------------------------------- tables and drops

def per_step(results: Sequence[Result]) -> list[Result]:
    """One result per step, oldest first: the full one where there is one, else the limited one finished last."""
    best: dict[int, Result] = {}
    for result in results:
        held = best.get(result.step)
        if held is None or (not held.limited, held.finished or 0.0) < (not result.limited, result.finished or 0.0):
            best[result.step] = result
    return [best[step] for step in sorted(best)]


def table(results: Sequence[Result], references: Mapping[str, Mapping[str, float]] | None = None,
          max_steps: int | None = None) -> Table:
    """The run's metrics by step (oldest first; the newest `max_steps` when given; per_step: a full result over a
    limited one, a limited one's column marked), each reference's values beside. Rows: the run's metrics, then those
    only a reference has, each group sorted by name."""
    ordered = per_step(results)
    left_out = max(0, len(ordered) - max_steps) if max_steps is not None else 0
    shown_results = ordered[left_out:]
    references = dict(references or {})
    run_metrics = sorted({m for r in ordered for m in r.metrics})
    others = sorted({m for values in references.values() for m in values} - set(run_metrics))
    rows = []
    for metric in run_metrics + others:
        higher = next((r.higher_is_better[metric] for r in reversed(ordered) if metric in r.higher_is_better),
                      default_direction(metric.rpartition("/")[2].partition(",")[0]))
        values: list[float | None] = [r.metrics.get(metric) for r in shown_results]
        values += [_reference_value(references[name], metric) for name in references]
        rows.append(Row(metric, higher, values))
    missing = tuple((r.step, name, why) for r in shown_results for name, why in sorted(r.missing.items()))
    return Table([r.step for r in shown_results], list(references), rows, left_out, missing,
                 tuple(r.limit for r in shown_results))


def missing_alert(results: Sequence[Result]) -> str | None:
    """The hourly job's alert text when the newest evaluated step left out a configured task or source (each named
    with why: data not in the cache, a refused task file); None when it left out none. Once a later step runs them
    all, the alert recovers."""
    return missing_alerts(results).get("tasks")


def missing_alerts(results: Sequence[Result]) -> dict[str, str]:
    """The hourly job's alert texts by kind of failure, for the newest evaluated step's left-out tasks and sources:
    "sources" for the sources left out because of lines that are not documents (bsops.corrupt), "tasks" for every
    other; {} when it left out none. Once a later step runs them all, each recovers."""
    shown = per_step(results)
    newest = shown[-1] if shown else None
    if newest is None or not newest.missing:
        return {}
    out = {}
    for kind, names in (("sources", [n for n in sorted(newest.missing) if n in newest.corrupt]),
                        ("tasks", [n for n in sorted(newest.missing) if n not in newest.corrupt])):
        if names:
            what = "source(s) with lines that are not documents" if kind == "sources" else "configured task(s) or source(s)"
            out[kind] = (f"the evaluation of {newest.tag} (step {newest.step}) left out {len(names)} {what}, so they are "
                         "not scored: " + "; ".join(f"{name}: {newest.missing[name]}" for name in names))
    return out


def _reference_value(values: Mapping[str, Any], metric: str) -> float | None:
    value = values.get(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def drops(results: Sequence[Result], alert_drop: Mapping[str, float]) -> list[Drop]:
    """For each metric of `alert_drop` ("task/metric" -> margin): the newest result holding it when its value is
    worse than the best of the earlier results by more than the margin (worse: lower where higher is better). A
    value that is no finite number (a NaN perplexity) is worse than any; such values are never the best."""
    ordered = sorted((r for r in results if not r.limited), key=lambda r: r.step)  # a limited score is no level
    out = []
    for metric, margin in alert_drop.items():
        holding = [r for r in ordered if metric in r.metrics]
        if len(holding) < 2:
            continue
        newest, earlier = holding[-1], holding[:-1]
        higher = newest.higher_is_better.get(metric, True)
        finite = [r for r in earlier if math.isfinite(r.metrics[metric])]
        if not finite:
            continue
        pick = max if higher else min
        best = pick(finite, key=lambda r: (r.metrics[metric], -r.step) if higher else (r.metrics[metric], r.step))
        value, top = newest.metrics[metric], best.metrics[metric]
        worse = not math.isfinite(value) or (top - value if higher else value - top) > margin
        if worse:
            out.append(Drop(newest.step, newest.iteration, metric, value, top, best.step, float(margin), higher))
    return out
