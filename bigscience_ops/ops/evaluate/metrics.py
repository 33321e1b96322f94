"""The metrics of an evaluation result: lm-eval's output and bsops' bits per byte as "task/metric" -> value, and
the rule every name that becomes a result key, a TensorBoard tag, a table row or alert text obeys (no torch, no
lm_eval).

A metric is "task/metric": lm-eval's `results[task]["acc,none"]` is `task/acc` (the ",none" filter dropped, another
filter kept: `acc,strict-match`); stderr entries and values that are no number ("N/A") are left out; a source's bits
per byte is `source/bits_per_byte`. Whether higher is better comes from lm-eval's "higher_is_better" section, else
from the metric's name (perplexities and bits per byte: lower). results.py reads result files with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bigscience_ops.errors import BsopsError
from bigscience_ops.schema import METRIC_NAME

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


def default_direction(metric: str) -> bool:
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
            higher[name] = direction if isinstance(direction, bool) else default_direction(metric)
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
