"""A run's evaluation results: one JSON file per evaluated checkpoint, written and read back (no torch, no lm_eval).

`bsops eval` writes `<paths.output>/eval/global_step<N>.json` (`result_path`, `write`: atomic): lm-eval's own
output of simple_evaluate (its "results", "higher_is_better", "versions", "n-shot", "configs", ...) with a
"bsops" section of what bsops adds (the checkpoint's step, iteration and consumed tokens, the bits per byte of
each held-out source). Everything else reads the files back: the views (`bsops info`, `chronicle`, `plot`), the
watchdog (a metric that falls against the run's best so far: `drops`) and hub-sync.

Read back, a result file is untrusted input: a file that is not plain (a link, a FIFO), larger than MAX_RESULT,
not JSON, or not of lm-eval's structure with a valid bsops section is a `Problem` naming it, and the other files
are still read (`read_all`). A metric is "task/metric": lm-eval's `results[task]["acc,none"]` is `task/acc` (the
",none" filter dropped, another filter kept: `acc,strict-match`); stderr entries and values that are no number
("N/A") are left out; a source's bits per byte is `source/bits_per_byte`. Whether higher is better comes from
lm-eval's "higher_is_better" section, else from the metric's name (perplexities and bits per byte: lower).
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

from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import (
    MAX_STEP, Problem, RecordFileError, check_int, excerpt, read_small, write_atomically,
)
from bigscience_ops.schema import METRIC_NAME

FOLDER = "eval"
"""The results' folder in the run folder."""
FORMAT = 1
"""The bsops section's format."""
MAX_RESULT = 16 << 20
"""Bytes of a result file read at most: lm-eval's output of a few tasks (configs included) is under 1 MB."""
TAG = re.compile(r"global_step([0-9]{1,18})")
FILE = re.compile(r"global_step([0-9]{1,18})\.json")
MAX_NAME = 200
"""Characters of a task, metric, filter or source name."""
NOT_METRICS = frozenset({"name", "alias", "sample_len", "sample_count", "samples"})
"""The keys of an lm-eval task's results that are no metric."""
LOWER_IS_BETTER = frozenset({"perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "ppl", "bpb",
                             "loss", "nll"})
"""Metrics better when lower, where the file does not say (lm-eval's higher_is_better section says first)."""
BITS_PER_BYTE = "bits_per_byte"


class ResultError(BsopsError):
    """A result is not what bsops writes or reads: names the value and what is allowed."""


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

    @property
    def columns(self) -> list[str]:
        return [f"step {s}" for s in self.steps] + list(self.references)

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

def result_path(exp_or_output: Any, tag: str) -> Path:
    """`<paths.output>/eval/<tag>.json` of an experiment (its paths.output) or of a run folder."""
    output = exp_or_output.paths.output if hasattr(exp_or_output, "paths") else exp_or_output
    if not output:
        raise ResultError(f"paths.output: got {output!r}; expected the run folder (load the experiment through bsops "
                          "so its paths are derived)")
    if not isinstance(tag, str) or not TAG.fullmatch(tag):
        raise ResultError(f"checkpoint tag: got {excerpt(str(tag))}; expected global_stepN (N a whole number)")
    return Path(output) / FOLDER / f"{tag}.json"


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


# ----------------------------------------------------------------------------- metrics

def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def name_problem(name: Any) -> str | None:
    """Why `name` cannot be a task, group, source, metric or filter name (what reaches result files, TensorBoard
    tags, tables and alert mail: eval.tasks entries' rule, schema.METRIC_NAME, at most MAX_NAME characters), never
    quoting more than the one character that is wrong; None when it can."""
    if not isinstance(name, str):
        return f"got a {type(name).__name__}; expected text"
    if len(name) > MAX_NAME:
        return f"got {len(name)} characters; allowed: at most {MAX_NAME}"
    problem = METRIC_NAME.problem(name)
    return None if problem is None else f"{problem}; allowed: {METRIC_NAME.allowed}"


def _name(value: Any, what: str) -> str:
    why = name_problem(value)
    if why is not None:
        raise ResultError(f"{what}: {why}")
    return value


def _default_direction(metric: str) -> bool:
    return metric not in LOWER_IS_BETTER


def metrics_and_directions(result: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, bool]]:
    """("task/metric" -> value, "task/metric" -> higher is better) of lm-eval's output `result` and its bsops
    section's bits per byte. A structure that is not lm-eval's (results not an object of objects, a name that is
    not text) is a ResultError; a value that is no number (stderr "N/A", null) is left out."""
    if not isinstance(result, Mapping):
        raise ResultError(f"the result: got a JSON {type(result).__name__}; expected an object")
    tasks = result.get("results", {})
    if not isinstance(tasks, Mapping):
        raise ResultError(f"results: got a JSON {type(tasks).__name__}; expected an object of tasks")
    stated = result.get("higher_is_better", {})
    if not isinstance(stated, Mapping):
        raise ResultError(f"higher_is_better: got a JSON {type(stated).__name__}; expected an object of tasks")
    values: dict[str, float] = {}
    higher: dict[str, bool] = {}
    for task, entry in tasks.items():
        _name(task, "results: a task name")
        if not isinstance(entry, Mapping):
            raise ResultError(f"results {task}: got a JSON {type(entry).__name__}; expected an object of "
                              "metrics")
        directions = stated.get(task, {})
        if not isinstance(directions, Mapping):
            raise ResultError(f"higher_is_better {task}: got a JSON {type(directions).__name__}; expected an "
                              "object of metrics")
        for key, value in entry.items():
            if not isinstance(key, str):
                raise ResultError(f"results {task}: a metric name: got a {type(key).__name__}; expected text")
            metric, _, filtered = key.partition(",")
            if metric in NOT_METRICS:
                continue
            _name(metric.removesuffix("_stderr"), f"results {task}: a metric name")
            if filtered:
                _name(filtered, f"results {task}: a filter name")
            if metric.endswith("_stderr") or not _number(value):
                continue
            name = f"{task}/{metric}" if filtered in ("", "none") else f"{task}/{metric},{filtered}"
            values[name] = float(value)
            direction = directions.get(metric)
            higher[name] = direction if isinstance(direction, bool) else _default_direction(metric)
    for source, bpb in _bits_per_byte(result).items():
        values[f"{source}/{BITS_PER_BYTE}"] = bpb
        higher[f"{source}/{BITS_PER_BYTE}"] = False
    return values, higher


def metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """"task/metric" -> value of lm-eval's output `result` (and its bsops section's bits per byte)."""
    return metrics_and_directions(result)[0]


def _bits_per_byte(result: Mapping[str, Any]) -> dict[str, float]:
    section = result.get("bsops", {})
    if not isinstance(section, Mapping):
        raise ResultError(f"bsops: got a JSON {type(section).__name__}; expected an object")
    sources = section.get(BITS_PER_BYTE, {})
    if not isinstance(sources, Mapping):
        raise ResultError(f"bsops.bits_per_byte: got a JSON {type(sources).__name__}; expected an object of sources")
    out = {}
    for source, entry in sources.items():
        _name(source, "bsops.bits_per_byte: a source name")
        value = entry.get(BITS_PER_BYTE) if isinstance(entry, Mapping) else None
        if not _number(value):
            raise ResultError(f"bsops.bits_per_byte {source}: expected an object with bits_per_byte, a "
                              "number")
        out[source] = float(value)
    return out


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
    return Result(tag, step, iteration, _optional_int(section, "consumed_tokens"), values, higher,
                  path, _finished(section.get("finished")), _missing(section.get("missing", {})))


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


def read_all(output: str | os.PathLike[str]) -> tuple[list[Result], list[Problem]]:
    """Every result file of the run folder `output` (eval/global_stepN.json), by step, and a problem for each file
    that cannot be read (the rest are still read). No eval folder: none."""
    folder = Path(output) / FOLDER
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


def read_live(output: str | os.PathLike[str]) -> tuple[list[Result], list[Problem]]:
    """read_all, then only the results of the run's live branch (`live`, against the rollbacks the run recorded; a
    rollbacks line that is not a record is for the views to report, and costs nothing here)."""
    from bigscience_ops.run import rollbacks

    found, problems = read_all(output)
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

def table(results: Sequence[Result], references: Mapping[str, Mapping[str, float]] | None = None,
          max_steps: int | None = None) -> Table:
    """The run's metrics by step (oldest first; the newest `max_steps` when given), each reference's values beside.
    Rows: the run's metrics, then those only a reference has, each group sorted by name."""
    ordered = sorted(results, key=lambda r: r.step)
    left_out = max(0, len(ordered) - max_steps) if max_steps is not None else 0
    shown_results = ordered[left_out:]
    references = dict(references or {})
    run_metrics = sorted({m for r in ordered for m in r.metrics})
    others = sorted({m for values in references.values() for m in values} - set(run_metrics))
    rows = []
    for metric in run_metrics + others:
        higher = next((r.higher_is_better[metric] for r in reversed(ordered) if metric in r.higher_is_better),
                      _default_direction(metric.rpartition("/")[2].partition(",")[0]))
        values: list[float | None] = [r.metrics.get(metric) for r in shown_results]
        values += [_reference_value(references[name], metric) for name in references]
        rows.append(Row(metric, higher, values))
    missing = tuple((r.step, name, why) for r in shown_results for name, why in sorted(r.missing.items()))
    return Table([r.step for r in shown_results], list(references), rows, left_out, missing)


def missing_alert(results: Sequence[Result]) -> str | None:
    """The hourly job's alert text when the newest evaluated step left out a configured task or source (each named
    with why: data not in the cache, a refused task file); None when it left out none. Once a later step runs them
    all, the alert recovers."""
    newest = max(results, key=lambda r: r.step, default=None)
    if newest is None or not newest.missing:
        return None
    return (f"the evaluation of {newest.tag} (step {newest.step}) left out {len(newest.missing)} configured task(s) or "
            "source(s), so they are not scored: " + "; ".join(f"{name}: {why}" for name, why in
                                                              sorted(newest.missing.items())))


def _reference_value(values: Mapping[str, Any], metric: str) -> float | None:
    value = values.get(metric)
    return float(value) if _number(value) else None


def drops(results: Sequence[Result], alert_drop: Mapping[str, float]) -> list[Drop]:
    """For each metric of `alert_drop` ("task/metric" -> margin): the newest result holding it when its value is
    worse than the best of the earlier results by more than the margin (worse: lower where higher is better). A
    value that is no finite number (a NaN perplexity) is worse than any; such values are never the best."""
    ordered = sorted(results, key=lambda r: r.step)
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
