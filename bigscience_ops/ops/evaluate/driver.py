"""Rank 0's evaluation of one checkpoint: lm-eval tasks, bits per byte per source, the result file, TensorBoard.

`evaluate(exp, checkpoint, meta, scorer, log)` is what the worker's rank 0 calls once its Scorer holds the
checkpoint (the other ranks serve the Scorer's forward passes meanwhile):

1. the experiment's model as an lm-eval LM (harness.py) runs eval.tasks through `lm_eval.simple_evaluate`:
   registered names as they are (lm-eval's TaskManager scans its own task folders, about 10 s, only when
   one is named; their data comes through `datasets`, so from the user's cache or mirror, and
   HF_DATASETS_OFFLINE is honoured by `datasets` itself), task YAML files loaded as task config dicts
   (lm-eval's own loader: `include` and `!function` work) with their relative
   `dataset_kwargs.data_files` made absolute against the YAML's folder; eval.limit examples per task;
   no request or response cache, per-sample output off, a local YAML task's `datasets` cache in a
   temporary folder (never the user's home), stderr by BOOTSTRAP_ITERS resamples in this process;
2. bits per byte of each eval.sources file (bpb.py);
   a task that cannot be loaded (an unknown name, data not in the cache offline, a broken task file) or
   a source that cannot be scored is a line in the result's bsops.problems and the others still run;
   nothing at all evaluated is an EvalError (the worker exits 2, the hourly job alerts);
3. the result, lm-eval's own output (results, configs, versions, n-shot, higher-is-better, n-samples, ...)
   with a "bsops" section (the checkpoint's step, iteration and consumed tokens, the layout it was scored
   in, the sources' bits per byte), written to <paths.output>/eval/<tag>.json (results.write: atomic);
4. TensorBoard scalars `eval/<task>/<metric>` at the checkpoint's iteration and `eval/<task>/<metric> vs
   tokens` at its consumed tokens, in paths.tensorboard (an event file of the evaluation's own).
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bigscience_ops.checkpoints import layout
from bigscience_ops.ops.evaluate import EvalError, results
from bigscience_ops.validation import TASK_FILE_SUFFIXES, is_task_file

if TYPE_CHECKING:
    from bigscience_ops.ops.evaluate.harness import BsopsLM, Scorer
    from bigscience_ops.schema import Experiment

BOOTSTRAP_ITERS = 1000
"""Resamples for the stderr of bootstrapped metrics (perplexity); lm-eval's default 100000 costs minutes."""


def _absolute(files: Any, folder: Path) -> Any:
    """data_files (a path, a list, or split -> path or list) with each relative local path made absolute."""
    if isinstance(files, str):
        return files if "://" in files or os.path.isabs(files) else str(folder / files)
    if isinstance(files, list):
        return [_absolute(f, folder) for f in files]
    if isinstance(files, dict):
        return {split: _absolute(f, folder) for split, f in files.items()}
    return files


def task_config(path: str | os.PathLike[str], cache_dir: str | None = None) -> dict | str:
    """A task YAML file as lm-eval's config dict, its relative dataset_kwargs.data_files made absolute against
    the file's folder (and, with `cache_dir`, `datasets`' cache for its local files there unless it names one).
    A group file (no single `task` name) is handed to lm-eval as its path."""
    from lm_eval.tasks._yaml_loader import load_yaml

    path = Path(path)
    if not path.is_file():
        raise EvalError(f"eval.tasks: task file {path} does not exist; a task file is an lm-eval task YAML")
    try:
        config = load_yaml(path, resolve_func=True)
    except Exception as exc:  # yaml's, lm-eval's and an imported !function's errors alike
        raise EvalError(f"eval.tasks: task file {path} cannot be read as an lm-eval task YAML: "
                        f"{type(exc).__name__}: {exc}") from None
    if not isinstance(config.get("task"), str):
        return str(path)
    config = copy.copy(config)
    kwargs = config.get("dataset_kwargs")
    if isinstance(kwargs, dict) and "data_files" in kwargs:
        kwargs = {**kwargs, "data_files": _absolute(kwargs["data_files"], path.parent)}
        if cache_dir is not None:
            kwargs.setdefault("cache_dir", cache_dir)
        config["dataset_kwargs"] = kwargs
    return config


@contextlib.contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """lm-eval without progress bars (TQDM_DISABLE) and with its bootstrap in this process (DISABLE_MULTIPROC:
    no pool forked from a process that holds the model and a process group); the environment put back after."""
    saved = {name: os.environ.get(name) for name in ("TQDM_DISABLE", "DISABLE_MULTIPROC")}
    os.environ.update({"TQDM_DISABLE": "1", "DISABLE_MULTIPROC": "1"})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_tasks(lm: Any, tasks: list[str], limit: int | None = None, log: Callable[[str], None] = lambda line: None,
              log_samples: bool = False, problems: list[str] | None = None) -> dict:
    """lm-eval's output of simple_evaluate for `tasks` (registered names and task YAML files) on `lm` (a BsopsLM,
    or any lm-eval LM), its per-sample output ("samples") only with log_samples. A task that cannot be loaded
    (no such name, its data not to be had, a broken task file) is an EvalError naming it, or, given `problems`,
    a line appended there and the task left out ({} when none is left)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    def failed(message: str) -> None:
        if problems is None:
            raise EvalError(message)
        problems.append(message)
        log(f"skipped: {message}")

    with tempfile.TemporaryDirectory(prefix="bsops-eval-datasets-") as cache, _quiet_lm_eval():
        registered = [t for t in tasks if not is_task_file(t)]
        log(f"lm-eval tasks: {', '.join(tasks)}" + (" (indexing lm-eval's registered tasks)" if registered else ""))
        manager = TaskManager(include_defaults=bool(registered))
        built = []
        for task in tasks:
            try:
                if task in registered and task not in manager.all_tasks:
                    raise EvalError(f"eval.tasks: {task}: no such lm-eval {lm_eval.__version__} task; allowed: a "
                                    "registered task, group or tag name (`lm-eval ls tasks`), or a task YAML file "
                                    f"({'/'.join(TASK_FILE_SUFFIXES)})")
                built += _build(manager, task_config(task, cache) if is_task_file(task) else task, task)
            except EvalError as exc:
                failed(str(exc))
        if not built:
            return {}
        out = lm_eval.simple_evaluate(model=lm, tasks=built, limit=limit, task_manager=manager, log_samples=log_samples,
                                      cache_requests=False, use_cache=None, bootstrap_iters=BOOTSTRAP_ITERS)
    if out is None:
        raise EvalError("lm-eval returned no results (it returns them on rank 0 only, with LOCAL_RANK 0)")
    return {k: v for k, v in dict(out).items() if log_samples or k != "samples"}


def _build(manager: Any, spec: str | dict, task: str) -> list:
    """The lm-eval Task or Group (or a tag's Tasks) of one eval.tasks entry, its data loaded, as a list; a task
    whose data cannot be had is an EvalError naming it."""
    from lm_eval.api.group import Group
    from lm_eval.api.task import Task

    try:
        built = manager._load_spec(spec)  # what TaskManager.load does per entry (lm-eval 0.4.13)
    except Exception as exc:  # datasets', huggingface_hub's, yaml's and a task's own errors alike
        raise EvalError(f"eval.tasks: {task}: lm-eval cannot load it: {type(exc).__name__}: {exc}; a registered "
                        "task's data comes through `datasets`, from your cache or a mirror (HF_ENDPOINT; offline "
                        "with HF_DATASETS_OFFLINE=1 once cached), a task file's from its data_files") from None
    return [built] if isinstance(built, (Task, Group)) else list(built)


def source_bits_per_byte(exp: Experiment, lm: BsopsLM, log: Callable[[str], None]) -> tuple[dict, list[str]]:
    """source -> bpb.SourceBpb.to_dict() of each eval.sources file, and the sources that could not be scored."""
    from bigscience_ops.ops.evaluate.bpb import bits_per_byte

    scored, problems = {}, []
    for name, path in exp.eval.sources.items():
        try:
            scored[name] = bits_per_byte(path, lm, exp.eval.text_key, exp.eval.docs_per_source, log).to_dict()
        except EvalError as exc:
            problems.append(f"eval.sources {name}: {exc}")
            log(f"skipped source {name}: {exc}")
    return scored, problems


def result_tag(checkpoint: str | os.PathLike[str]) -> str:
    """The checkpoint's tag (global_stepN), its folder's name."""
    return Path(checkpoint).name


def bsops_section(exp: Experiment, checkpoint: Path, meta: dict, scorer: Scorer, bits: dict, problems: list[str],
                  seconds: float) -> dict:
    """The result's "bsops" section: what was evaluated, in which layout, and the sources' bits per byte."""
    tag = result_tag(checkpoint)
    step = layout.step_of(tag)
    parallel = meta.get("parallel") if isinstance(meta.get("parallel"), dict) else {}
    return {
        "format": results.FORMAT, "experiment": exp.name, "tag": tag, "step": step,
        "iteration": meta.get("iteration", step),
        "consumed_samples": meta.get("consumed_train_samples"), "consumed_tokens": meta.get("consumed_tokens"),
        "layout": dict(getattr(scorer, "layout", None) or {"tensor": parallel.get("tensor"),
                                                            "pipeline": parallel.get("pipeline")}),
        "bits_per_byte": bits, "problems": problems, "seconds": round(seconds, 3),
        "finished": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write_scalars(exp: Experiment, result: dict) -> int:
    """`eval/<task>/<metric>` at the checkpoint's iteration and `... vs tokens` at its consumed tokens, in an
    event file of its own in paths.tensorboard; how many metrics were written (none with logging.tensorboard
    off or no paths.tensorboard)."""
    folder = exp.paths.tensorboard
    if not exp.logging.tensorboard or not folder:
        return 0
    from torch.utils.tensorboard import SummaryWriter

    section = result["bsops"]
    values = results.metrics(result)
    writer = SummaryWriter(log_dir=folder, filename_suffix=".eval")
    try:
        for name, value in sorted(values.items()):
            writer.add_scalar(f"eval/{name}", value, section["iteration"])
            if isinstance(section.get("consumed_tokens"), int):
                writer.add_scalar(f"eval/{name} vs tokens", value, section["consumed_tokens"])
        writer.flush()
    finally:
        writer.close()
    return len(values)


def evaluate(exp: Experiment, checkpoint: Path, meta: dict, scorer: Scorer,
             log: Callable[[str], None] = lambda line: None) -> Path:
    """Evaluate the checkpoint the Scorer holds (see the module docstring); the result file's path."""
    from bigscience_ops.ops.evaluate.harness import build_lm

    started = time.monotonic()
    if not exp.eval.configured:
        raise EvalError(f"experiment {exp.name} has no eval.tasks and no eval.sources; nothing to evaluate")
    path = results.result_path(exp, result_tag(checkpoint))  # a folder not named global_stepN: refused before work
    lm = build_lm(exp, scorer, log)
    problems: list[str] = []
    result = run_tasks(lm, list(exp.eval.tasks), exp.eval.limit, log, problems=problems) if exp.eval.tasks else {}
    bits, unscored = source_bits_per_byte(exp, lm, log)
    problems += unscored
    if not result.get("results") and not bits:
        raise EvalError(f"nothing of {result_tag(checkpoint)} could be evaluated: " + "; ".join(problems))
    result["bsops"] = bsops_section(exp, Path(checkpoint), meta, scorer, bits, problems, time.monotonic() - started)
    results.write(path, result)
    try:
        written = write_scalars(exp, result)
    except OSError as exc:  # the result file is written: a TensorBoard folder that cannot take an event file is told
        written = 0
        log(f"TensorBoard scalars not written to {exp.paths.tensorboard}: {exc.strerror or exc}")
    log(f"evaluation of {result['bsops']['tag']} written to {path} ({written} metrics, "
        f"{result['bsops']['seconds']:.0f} s)")
    return path
