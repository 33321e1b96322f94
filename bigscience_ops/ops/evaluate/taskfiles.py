"""Task YAML files are code: read from where the experiment says, with limits, and gated (no torch, no lm_eval
at import).

An lm-eval task YAML can run Python: `!function utils.process` imports a module (from the YAML's folder, else
anything importable), `include:` pulls in another file (lm-eval follows any path, the system's password file
included), `class:` builds a Python task, and the Jinja templates of `doc_to_text` & co. are rendered by lm-eval
in a Jinja environment that is not sandboxed (`{{ cycler.__init__.__globals__.os }}` reaches the os module). So
`bsops eval` reads the task files of eval.tasks here, never through lm-eval's loader:

- a task file and each file it includes is a plain file (never read through a link, never a FIFO) of at most
  MAX_TASK_FILE bytes, UTF-8, YAML within typedyaml's limits (nesting, values built with aliases counted per
  use, text once aliases are expanded), at most MAX_FILES files in all;
- `include:` must stay inside the task file's own folder (below it is fine) or lm-eval's own installed task
  folder (lm_eval/tasks: a registered task's YAML, `lm_eval_tasks_folder`), each resolved with its links first, so
  a link never leads out of either; `!function` tags are refused, in an included lm-eval file too: both unless
  `eval.trust_task_code: true`, which gives lm-eval's own behaviour (an include anywhere, a `!function` imported
  from the YAML's folder or the Python path);
- every name that becomes a result's key, a TensorBoard tag or a table row (a task's or group's name, a tag,
  a metric of metric_list, a filter of filter_list, a group's members and aggregated metrics) obeys the rule
  of eval.tasks entries (results.name_problem), wherever it was set;
- an error names the file, the line and what was wrong, never what the file holds (a YAML error's quoted
  token is left out);
- a metric is one of lm-eval's own (`check_metrics`: an unknown name or `hf_evaluate: true` makes lm-eval fetch
  and run a metric script through Hugging Face `evaluate`), unless trusted;
- `sandboxed_templates()` renders lm-eval's Jinja templates in jinja2's SandboxedEnvironment (no attribute
  starting with `_`, no unsafe callables, `*` and `**` of bounded size) while the tasks run, unless trusted.

The config dict `load` returns is what lm-eval's loader would have built (includes merged as it merges them:
in order, the file's own keys last), handed to lm-eval's TaskManager as an inline config.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bigscience_ops.ops.evaluate import EvalError
from bigscience_ops.ops.evaluate.results import name_problem
from bigscience_ops.untrusted import RecordFileError, open_plain
from bigscience_ops.typedyaml import MAX_DEPTH, MAX_EXPANDED_CHARS, MAX_NODES, expanded_chars

MAX_TASK_FILE = 1 << 20
"""Bytes of one task YAML file read at most (lm-eval's own task files are under 10 kB)."""
MAX_FILES = 16
"""Task files read for one eval.tasks entry, its includes counted."""
TRUST = "eval.trust_task_code: true"
MAX_TEMPLATE_REPEAT = 1 << 20
"""The largest text or list a sandboxed template may build with `*`, and the largest `**` exponent's result."""


class TaskFileError(EvalError):
    """A task file is refused: names the file and what is wrong, never what it holds."""


@dataclass(frozen=True)
class FunctionRef:
    """A `!function module.name` tag of a trusted task file, resolved by lm-eval only when the task is built."""

    spec: str
    folder: str


def _position(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"


class _Loader(yaml.SafeLoader):
    """yaml's SafeLoader (lm-eval reads task files with the C-accelerated one, same resolvers) with typedyaml's
    limits, and `!function` kept as a FunctionRef when trusted, refused otherwise."""

    def __init__(self, stream: str, path: Path, trust: bool) -> None:
        super().__init__(stream)
        self._path, self._trust, self._built, self._depth = path, trust, 0, 0

    def construct_object(self, node, deep=False):
        self._built += 1
        if self._built > MAX_NODES:
            raise TaskFileError(f"{self._path}: more than {MAX_NODES} values (aliases counted per use) at "
                                f"{_position(node.start_mark)}; allowed: a task file within bsops' limits")
        return super().construct_object(node, deep)

    def compose_node(self, parent, index):
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise TaskFileError(f"{self._path}: nested deeper than {MAX_DEPTH} levels at "
                                f"{_position(self.peek_event().start_mark)}")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _function(loader: _Loader, node: yaml.Node) -> FunctionRef:
    if not loader._trust:
        raise TaskFileError(f"{loader._path}: a !function tag at {_position(node.start_mark)} would import and run "
                            f"Python code named by the task file; allowed: no !function tag, unless the experiment "
                            f"says {TRUST} (task files are then code the team trusts)")
    spec = loader.construct_scalar(node)
    if not isinstance(spec, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", spec):
        raise TaskFileError(f"{loader._path}: the !function tag at {_position(node.start_mark)} names no "
                            "module.function; allowed: a dotted Python name")
    return FunctionRef(spec, str(loader._path.parent))


_Loader.add_constructor("!function", _function)


def _read(path: Path) -> str:
    """The text of the plain file `path` (runfiles.open_plain: no link, no FIFO), at most MAX_TASK_FILE bytes of
    UTF-8."""
    try:
        handle = open_plain(path)
    except RecordFileError as exc:
        raise TaskFileError(f"{exc.path}: {exc.what}; a task file is code and is read only as the plain file "
                            "the experiment names") from None
    if handle is None:
        raise TaskFileError(f"{path}: does not exist; allowed: an lm-eval task YAML file")
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size > MAX_TASK_FILE:
            raise TaskFileError(f"{path}: {size} bytes; allowed: a task file of at most {MAX_TASK_FILE} "
                                "bytes (lm-eval's own are under 10 kB; data belongs in data_files)")
        data = handle.read(MAX_TASK_FILE + 1)
    if len(data) > MAX_TASK_FILE:
        raise TaskFileError(f"{path}: more than {MAX_TASK_FILE} bytes; allowed: at most {MAX_TASK_FILE}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFileError(f"{path}: not UTF-8 (byte offset {exc.start}); allowed: a UTF-8 YAML file") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in words of the parser only: its quoted token (text of the file) left out."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
    words = re.split(r"['\"`]", str(problem))[0].strip().rstrip(":,") or type(exc).__name__
    return f"{words} at {_position(getattr(exc, 'problem_mark', None))}"


def _parse(path: Path, trust: bool) -> dict:
    text = _read(path)
    loader = _Loader(text, path, trust)
    try:
        root = loader.get_single_node()
        if root is not None and expanded_chars(root, {}) > MAX_EXPANDED_CHARS:
            raise TaskFileError(f"{path}: more than {MAX_EXPANDED_CHARS} characters once its aliases are expanded")
        data = loader.construct_document(root) if root is not None else None
    except TaskFileError:
        raise
    except yaml.YAMLError as exc:
        raise TaskFileError(f"{path}: not valid YAML ({_yaml_problem(exc)})") from None
    except (RecursionError, ValueError, TypeError) as exc:  # an integer of thousands of digits, an unhashable key
        raise TaskFileError(f"{path}: not YAML within bsops' limits ({type(exc).__name__})") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise TaskFileError(f"{path}: holds a YAML {type(data).__name__}; allowed: a mapping (an lm-eval task config)")
    return data


def _inside(path: Path, folder: Path) -> bool:
    real = Path(os.path.realpath(path))
    return real == folder or folder in real.parents


def lm_eval_tasks_folder() -> Path | None:
    """The installed lm-eval's own task folder (lm_eval/tasks, resolved; None without lm-eval), found without
    importing lm-eval: a task file may `include:` a registered task's YAML from there (`include:
    .../lm_eval/tasks/lambada/lambada_openai.yaml`, then its own task name and changes), as lm-eval's own task files
    include each other. What such a file holds is checked as any task file's is (no `!function` unless trusted)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("lm_eval")
    except (ImportError, ValueError):
        return None
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(os.path.realpath(Path(places[0]) / "tasks")) if places else None


def trusted(path: str | os.PathLike[str], trust: bool) -> bool:
    """Whether the task file `path` may name Python: with eval.trust_task_code (`trust`), or when it is one of bsops'
    bundled task files (corpus/eval/ of a bundled corpus folder: bsops' own code, as its package is)."""
    from bigscience_ops import resources

    folder = Path(os.path.realpath(Path(path).parent))
    return trust or any(folder == Path(os.path.realpath(place / "eval")) for place in resources.candidates("corpus"))


def load(path: str | os.PathLike[str], *, trust: bool = False) -> dict:
    """The task file `path` as lm-eval's config dict, includes merged (see the module docstring); `!function` tags
    are FunctionRefs (only when `trusted`: `trust`, or a bundled task file). Raises TaskFileError naming the file and
    what is wrong."""
    path = Path(path)
    trust = trusted(path, trust)
    folder = Path(os.path.realpath(path.parent))
    lm_eval_tasks = lm_eval_tasks_folder()
    seen: list[Path] = []

    def one(file: Path, via: Path | None) -> dict:
        if len(seen) >= MAX_FILES:
            raise TaskFileError(f"{path}: includes more than {MAX_FILES} files; allowed: at most {MAX_FILES}")
        real = Path(os.path.realpath(file))
        if real in seen:
            raise TaskFileError(f"{via}: includes {file}, which includes it again (a loop)")
        if via is not None and not trust and not _inside(file, folder) and not (
                lm_eval_tasks is not None and _inside(file, lm_eval_tasks)):
            own = f", or lm-eval's own task files in {lm_eval_tasks}" if lm_eval_tasks is not None else ""
            raise TaskFileError(f"{via}: include: {file} is outside the task file's folder {folder}; allowed: "
                                f"files in that folder (or below it){own}, unless the experiment says {TRUST}")
        seen.append(real)
        config = _parse(file, trust)
        if "include" not in config:
            return config
        includes = config.pop("include")
        merged: dict = {}
        for entry in includes if isinstance(includes, list) else [includes]:
            if not isinstance(entry, str) or not entry or "\0" in entry:
                raise TaskFileError(f"{file}: include: expects a file name (or a list of them); allowed: paths "
                                    "relative to the file's folder")
            target = Path(entry).expanduser()
            included = one(target if target.is_absolute() else file.parent / target, file)
            included.pop("task_list", None)  # lm-eval: a task_list is the included file's own
            merged.update(included)
        merged.update(config)
        return merged

    config = one(path, None)
    check_names(config, path)
    return config


def check_experiment(exp: Any) -> None:
    """Every task file of exp's eval.tasks loads under exp's eval.trust_task_code (`bsops eval run --step/--latest`
    asks before any rank starts); TaskFileError for the first that does not."""
    from bigscience_ops.config.validation import is_task_file

    for task in exp.eval.tasks:
        if is_task_file(task):
            load(task, trust=exp.eval.trust_task_code)


# ----------------------------------------------------------------------------- names

def _check(name: Any, field: str, path: Path) -> None:
    problem = name_problem(name)
    if problem is not None:
        raise TaskFileError(f"{path}: {field}: {problem} (a name reaches result files, TensorBoard tags, tables and "
                            "alert mail)")


def check_names(config: dict, path: Path, where: str = "") -> None:
    """Every name of `config` (a task or group config, and a group's inline members) obeys name_problem's rule."""
    task = config.get("task")
    if "group" in config:
        _check(config["group"], f"{where}group", path)
    if isinstance(task, str) or "group" not in config:
        _check(task, f"{where}task", path)
    for i, tag in enumerate(config["tag"] if isinstance(config.get("tag"), list) else
                            ([config["tag"]] if "tag" in config else [])):
        _check(tag, f"{where}tag[{i}]", path)
    for key in ("metric_list", "aggregate_metric_list"):
        entries = config.get(key) or []
        entries = entries if isinstance(entries, list) else [entries]
        for i, entry in enumerate(entries):
            if isinstance(entry, dict) and "metric" in entry and not isinstance(entry["metric"], FunctionRef):
                _check(entry["metric"], f"{where}{key}[{i}].metric", path)
    filters = config.get("filter_list") or []
    for i, entry in enumerate(filters if isinstance(filters, list) else [filters]):
        if isinstance(entry, dict) and "name" in entry:
            _check(entry["name"], f"{where}filter_list[{i}].name", path)
    if isinstance(task, list):
        for i, member in enumerate(task):
            if isinstance(member, dict):
                check_names(member, path, f"{where}task[{i}].")
            else:
                _check(member, f"{where}task[{i}]", path)


# ----------------------------------------------------------------------------- lm-eval's side (the ranks' only)

def check_metrics(config: dict, path: Path, trust: bool) -> None:
    """Unless `trust`: every metric of metric_list is one of lm-eval's own (its metric registry), never one lm-eval
    would fetch through Hugging Face `evaluate` (`hf_evaluate: true`, or a name it does not know: `evaluate.load`
    downloads a metric's Python script from the Hub, or runs one from a folder of that name, and imports it)."""
    if trust:
        return
    import lm_eval.api.metrics  # noqa: F401 - registers lm-eval's metrics
    from lm_eval.api.registry import metric_registry

    known = set(metric_registry.keys())
    entries = config.get("metric_list") or []
    for i, entry in enumerate(entries if isinstance(entries, list) else [entries]):
        if not isinstance(entry, dict):
            continue
        if entry.get("hf_evaluate"):
            raise TaskFileError(f"{path}: metric_list[{i}].hf_evaluate: a metric of Hugging Face `evaluate` is a Python "
                                f"script it fetches and runs; allowed: lm-eval's own metrics, unless the experiment "
                                f"says {TRUST}")
        if isinstance(entry.get("metric"), str) and entry["metric"] not in known:
            raise TaskFileError(f"{path}: metric_list[{i}].metric is not one of lm-eval's metrics, so lm-eval would "
                                f"fetch and run it through Hugging Face `evaluate`; allowed: {', '.join(sorted(known))}, "
                                f"unless the experiment says {TRUST}")


def resolve_functions(value: Any) -> Any:
    """`value` with each FunctionRef imported as lm-eval imports a `!function` (lm_eval's own loader's function:
    a module file in the YAML's folder first, then the Python path). Only a trusted task file holds any."""
    if isinstance(value, FunctionRef):
        from lm_eval.tasks._yaml_loader import _import_func_in_yml

        try:
            return _import_func_in_yml(value.spec, Path(value.folder))
        except Exception as exc:  # noqa: BLE001 - the imported module's own errors alike
            raise TaskFileError(f"{value.folder}: !function {value.spec} cannot be imported "
                                f"({type(exc).__name__})") from None
    if isinstance(value, dict):
        return {k: resolve_functions(v) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_functions(v) for v in value]
    return value


def sandboxed_environment() -> Any:
    """jinja2's SandboxedEnvironment with lm-eval's template settings and filter, its `*` and `**` bounded."""
    from jinja2 import BaseLoader, StrictUndefined
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import SandboxedEnvironment

    class Bounded(SandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise SecurityError(f"a template raises to the power {right}; allowed: at most 64")
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(times, int) \
                            and len(seq) * times > MAX_TEMPLATE_REPEAT:
                        raise SecurityError(f"a template repeats a sequence to {len(seq) * times} items; allowed: "
                                            f"at most {MAX_TEMPLATE_REPEAT}")
            return super().call_binop(context, operator, left, right)

    from lm_eval import utils

    env = Bounded(loader=BaseLoader, undefined=StrictUndefined, keep_trailing_newline=True)
    env.filters.update(utils.env.filters)
    return env


@contextlib.contextmanager
def sandboxed_templates(trust: bool) -> Iterator[None]:
    """Inside: lm-eval renders task templates (lm_eval.utils.apply_template's `env`) sandboxed, unless `trust`."""
    from lm_eval import utils

    if trust:
        yield
        return
    saved = utils.env
    utils.env = sandboxed_environment()
    try:
        yield
    finally:
        utils.env = saved
