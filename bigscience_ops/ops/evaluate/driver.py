"""Rank 0's evaluation of one checkpoint: lm-eval tasks, bits per byte per source, the result file, TensorBoard.

`evaluate(exp, checkpoint, meta, scorer, log)` is what the worker's rank 0 calls once its Scorer holds the
checkpoint (the other ranks serve the Scorer's forward passes meanwhile):

1. the experiment's model as an lm-eval LM (harness.py) runs eval.tasks through `lm_eval.simple_evaluate`:
   registered names as they are (lm-eval's TaskManager scans its own task folders, about 10 s, only when
   one is named; their data comes through `datasets`, from eval.hf_cache or the user's cache, offline in
   the eval job), task YAML files read by taskfiles.py (never lm-eval's loader: task files are code, so
   `!function` and an `include:` outside the file's folder are refused and templates sandboxed unless
   eval.trust_task_code) with their relative `dataset_kwargs.data_files` made absolute against the YAML's
   folder; eval.limit examples per task; no request cache unless asked (keep_cache: lm-eval's, beside the
   result, see request_cache), no dataset request cache, per-sample output off unless asked, a local YAML
   task's `datasets` cache in a temporary folder (never the user's home), stderr by eval.bootstrap_iters
   resamples (lm-eval's default 100000) in this process;
2. bits per byte of each eval.sources file (bpb.py);
   a task that cannot be loaded (an unknown name, data not in the cache offline, a refused task file) or
   a source that cannot be scored is left out, named with its reason in the result's bsops.missing, and
   the others still run; the result is written and MissingTasks raised after (the worker exits 2, so
   `bsops eval` exits non-zero and the hourly job alerts); nothing at all evaluated is an EvalError;
3. the result, lm-eval's own output (results, configs, versions, n-shot, higher-is-better, n-samples, ...)
   with a "bsops" section (the checkpoint's step, iteration and consumed tokens, the run id it was made for,
   the layout and precision it was scored in, the bootstrap resamples, eval.limit, the command line's
   overrides, the sources' bits per byte, what is missing), written to <paths.output>/eval/<tag>.json
   (results.write: atomic; an earlier result of the step is replaced, said), or with eval.limit to
   eval/limited/<tag>.json: a limited result never replaces a full one;
4. TensorBoard scalars `eval/<task>/<metric>` at the checkpoint's iteration and `eval/<task>/<metric> vs
   tokens` at its consumed tokens (a limited result's under `eval-limited/`), in paths.tensorboard: an event
   file of the checkpoint's own, which replaces those of its earlier evaluations of the same kind (one point
   per metric, kind and step).

A source with more lines that are not documents than eval.max_bad_lines is left out (named in missing and in
bsops.corrupt), so the evaluation fails; lm-eval's request cache (keep_cache) records the run it was made for and
is refused for another (cache_of_run).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bigscience_ops.checkpoints import layout
from bigscience_ops.ops.evaluate import EvalError, results
from bigscience_ops.config.validation import TASK_FILE_SUFFIXES, is_task_file

if TYPE_CHECKING:
    from bigscience_ops.ops.evaluate.harness import BsopsLM, Scorer
    from bigscience_ops.schema import Experiment

BOOTSTRAP_ITERS = 100000
"""Resamples for the stderr of bootstrapped metrics (perplexity): lm-eval's default (eval.bootstrap_iters)."""


def _absolute(files: Any, folder: Path) -> Any:
    """data_files (a path, a list, or split -> path or list) with each relative local path made absolute."""
    if isinstance(files, str):
        return files if "://" in files or os.path.isabs(files) else str(folder / files)
    if isinstance(files, list):
        return [_absolute(f, folder) for f in files]
    if isinstance(files, dict):
        return {split: _absolute(f, folder) for split, f in files.items()}
    return files


def task_config(path: str | os.PathLike[str], cache_dir: str | None = None, trust: bool = False) -> dict:
    """A task YAML file as lm-eval's config dict (taskfiles.load: read with limits, `include:` kept in the file's
    folder and `!function` refused unless `trust`, every name checked), its relative dataset_kwargs.data_files
    made absolute against the file's folder (and, with `cache_dir`, `datasets`' cache for its local files there
    unless it names one); a trusted file's `!function` tags imported as lm-eval imports them."""
    from bigscience_ops.ops.evaluate import taskfiles

    path = Path(path)
    trust = taskfiles.trusted(path, trust)
    config = taskfiles.load(path, trust=trust)
    taskfiles.check_metrics(config, path, trust)
    kwargs = config.get("dataset_kwargs")
    if isinstance(kwargs, dict) and "data_files" in kwargs:
        kwargs = {**kwargs, "data_files": _absolute(kwargs["data_files"], path.parent)}
        if cache_dir is not None:
            kwargs.setdefault("cache_dir", cache_dir)
        config["dataset_kwargs"] = kwargs
    return taskfiles.resolve_functions(config) if trust else config


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
              log_samples: bool = False, missing: dict[str, str] | None = None, *, trust: bool = False,
              bootstrap_iters: int = BOOTSTRAP_ITERS, prefetch: str = "bsops eval prefetch EXP",
              **options: Any) -> dict:
    """lm-eval's output of simple_evaluate for `tasks` (registered names and task YAML files) on `lm` (a BsopsLM,
    or any lm-eval LM), its per-sample output ("samples") only with log_samples, task templates sandboxed unless
    `trust` (taskfiles.py). A task that cannot be loaded (no such name, its data not to be had, a refused or broken
    task file) or whose result carries a name the rules refuse is an EvalError naming it, or, given `missing`,
    entered there (eval.tasks entry -> one line why) and left out ({} when none is left). Offline (HF_DATASETS_OFFLINE
    or HF_HUB_OFFLINE), a task whose dataset is not in `datasets`' cache is one at once, `datasets` never asked
    (prefetch.not_cached).

    `options` (OPTIONS), simple_evaluate's own as lm-eval's command line names them: num_fewshot (an int) and
    use_cache (a path prefix: lm-eval's request cache, kept in PATH_rank0.db; a request answered there is not
    scored again); and bsops' own: num_fewshot_per_task (eval.tasks entry -> few-shot examples, over num_fewshot
    for that entry), model_name and model_args (what `lm_eval --model bsops --model_args` takes to score the same
    checkpoint). Few-shot examples per task: num_fewshot_per_task's value for its entry, else num_fewshot, else the
    task's own default; a task whose config says num_fewshot 0 keeps it (lm-eval's rule for --num_fewshot).

    The output also holds what lm-eval's command line adds when it saves its results file (lm_eval_saved): the
    task_hashes of each task's samples (logged always here; dropped after unless log_samples), model_name
    (lm-eval's random word when none is given), config.model_args and config.batch_size (lm.batch_size)."""
    chosen = lm_eval_options(options)  # a wrong option before any task is read
    shots_of = fewshot_choice(chosen.pop("num_fewshot_per_task"), tasks)
    model_name, model_args = chosen.pop("model_name"), chosen.pop("model_args")
    import lm_eval
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker
    from lm_eval.tasks import TaskManager

    from bigscience_ops.ops.evaluate import prefetch as fetching
    from bigscience_ops.ops.evaluate import taskfiles

    def failed(task: str, message: str) -> None:
        if missing is None:
            raise EvalError(message)
        missing[task] = one_line(message)
        log(f"skipped: {one_line(message)}")

    tracker = GeneralConfigTracker()  # lm-eval's clock of the evaluation, started as its command line starts it
    default_shots = chosen.pop("num_fewshot")
    with tempfile.TemporaryDirectory(prefix="bsops-eval-datasets-") as cache, _quiet_lm_eval(), \
            taskfiles.sandboxed_templates(trust):
        registered = [t for t in tasks if not is_task_file(t)]
        log(f"lm-eval tasks: {', '.join(tasks)}" + (" (indexing lm-eval's registered tasks)" if registered else ""))
        manager = TaskManager(include_defaults=bool(registered))
        built, owners = [], {}
        for task in tasks:
            try:
                if task in registered and task not in manager.all_tasks:
                    raise EvalError(f"eval.tasks: {task}: no such lm-eval {lm_eval.__version__} task; allowed: a "
                                    "registered task, group or tag name (`lm-eval ls tasks`), or a task YAML file "
                                    f"({'/'.join(TASK_FILE_SUFFIXES)})")
                spec = task_config(task, cache, trust) if is_task_file(task) else task
                _offline_check(fetching, task, spec, manager, prefetch)
                made = _build(manager, spec, task, prefetch)
            except EvalError as exc:
                failed(task, str(exc))
                continue
            set_fewshot(made, shots_of.get(task, default_shots), log)
            built += made
            for item in made:
                owners[_name_of(item)] = task
        if not built:
            return {}
        out = lm_eval.simple_evaluate(model=lm, tasks=built, limit=limit, task_manager=manager, log_samples=True,
                                      cache_requests=False, bootstrap_iters=bootstrap_iters, model_args=model_args,
                                      batch_size=getattr(lm, "batch_size", None), num_fewshot=None, **chosen)
    if out is None:
        raise EvalError("lm-eval returned no results (it returns them on rank 0 only, with LOCAL_RANK 0)")
    out = lm_eval_saved(dict(out), tracker, model_name, model_args)
    if not log_samples:
        out.pop("samples", None)
    for name, why in refused_names(out).items():
        _drop(out, name)
        failed(owners.get(name, name) if taskfiles.name_problem(name) is None else owners.get(name, "a task"),
               f"eval.tasks: a task's result is refused: {why}")
    return out


def _offline_check(fetching: Any, task: str, spec: str | dict, manager: Any, prefetch: str) -> None:
    """Offline, an EvalError at once for the first dataset of the eval.tasks entry `task` (its config `spec`, or a
    registered name) that is not in `datasets`' cache: `datasets` is never asked for it (no request, no retry)."""
    if not fetching.offline():
        return
    for _, path, name, cache_dir in fetching.datasets_of(task, spec, manager):
        folder = fetching.not_cached(path, cache_dir)
        if folder is not None:
            # the command that fixes it before the cache's path: a long path cuts the end of the one-line reason
            raise EvalError(f"eval.tasks: {task}: its dataset {path}" + (f" ({name})" if name else "") + " is not in "
                            f"the datasets cache, and the Hub is offline (HF_DATASETS_OFFLINE or HF_HUB_OFFLINE): not "
                            f"asked of the Hub; fetch it on a machine with network: {prefetch} (the cache: {folder})")


def fewshot_choice(per_task: Mapping[str, int] | None, tasks: list[str]) -> dict[str, int]:
    """num_fewshot_per_task checked: each key an entry of `tasks`, each value a whole number >= 0."""
    per_task = dict(per_task or {})
    for task, shots in per_task.items():
        if task not in tasks:
            raise EvalError(f"eval.num_fewshot_per_task: {task}: not an entry of eval.tasks; allowed: "
                            f"{', '.join(tasks) or 'an entry of eval.tasks'}")
        if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
            raise EvalError(f"eval.num_fewshot_per_task: {task}: {shots!r}; allowed: a whole number >= 0")
    return per_task


def set_fewshot(made: list, shots: int | None, log: Callable[[str], None]) -> None:
    """Each task of `made` (a group's or tag's member tasks too) asks `shots` few-shot examples (None: its own
    default), as lm-eval's --num_fewshot sets them: a task whose config says 0 keeps 0."""
    from lm_eval.api.group import Group

    if shots is None:
        return
    for item in made:
        for task in item.get_all_tasks() if isinstance(item, Group) else [item]:
            if task.get_config("num_fewshot") == 0 and shots != 0:
                log(f"{task.task_name}: num_fewshot stays 0, as its config says (lm-eval's rule for --num_fewshot)")
                continue
            task.set_config(key="num_fewshot", value=shots)


def lm_eval_saved(out: dict, tracker: Any, name: str | None, model_args: dict | None) -> dict:
    """`out` (simple_evaluate's output, its samples logged) with the keys lm-eval's command line adds when it saves
    a results file (EvaluationTracker.save_results_aggregated, lm-eval 0.4.13): task_hashes (a hash per task of its
    samples' doc, prompt and target hashes) and GeneralConfigTracker's fields (model_source, model_name,
    model_name_sanitized, system_instruction, chat_template, total_evaluation_time_seconds, ...); with a `name`, the
    model is bsops' (config.model `bsops`, model_name `name`)."""
    from dataclasses import asdict

    from lm_eval.utils import hash_string, sanitize_model_name

    samples = out.get("samples") if isinstance(out.get("samples"), dict) else {}
    out["task_hashes"] = {task: hash_string("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"]
                                                    for s in rows)) for task, rows in samples.items()}
    source = results.LM_EVAL_MODEL if name is not None else "CUSTOM"  # lm-eval's word for a model given built
    tracker.log_experiment_args(model_source=source, model_args=model_args or "", system_instruction=None,
                                chat_template=None, fewshot_as_multiturn=False)
    if name is not None:
        tracker.model_name, tracker.model_name_sanitized = name, sanitize_model_name(name)
        if isinstance(out.get("config"), dict):
            out["config"]["model"] = results.LM_EVAL_MODEL
    tracker.log_end_time()
    out.update(asdict(tracker))
    return out


def _name_of(item: Any) -> str:
    name = getattr(item, "group_name", None) or getattr(item, "task_name", None) or getattr(item, "name", None)
    return name if isinstance(name, str) else str(item)


def refused_names(out: dict) -> dict[str, str]:
    """Task or group name -> why, for each entry of lm-eval's output whose name or metric names break the name rules
    (taskfiles.name_problem: what reaches result files, TensorBoard, tables and mail), never quoting the name."""
    from bigscience_ops.ops.evaluate import taskfiles

    refused: dict[str, str] = {}
    for section in ("results", "groups"):
        for name, metrics in (out.get(section) or {}).items():
            problem = taskfiles.name_problem(name)
            if problem is not None:
                refused[name] = f"a task name: {problem}"
                continue
            for key in metrics if isinstance(metrics, dict) else ():
                metric, _, filtered = str(key).partition(",")
                if metric in results.NOT_METRICS:
                    continue
                for part, what in ((metric.removesuffix("_stderr"), "a metric name"), (filtered, "a filter name")):
                    problem = taskfiles.name_problem(part) if part else None
                    if problem is not None:
                        refused[name] = f"{what} of task {name}: {problem}"
    return refused


def _drop(out: dict, name: str) -> None:
    for section in ("results", "groups", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "samples",
                    "task_hashes"):
        if isinstance(out.get(section), dict):
            out[section].pop(name, None)
    if isinstance(out.get("group_subtasks"), dict):
        out["group_subtasks"].pop(name, None)


def one_line(text: str, cap: int = 400) -> str:
    """`text` as one bounded line of printable characters (a line break or control character becomes a space)."""
    flat = "".join(c if c.isprintable() else " " for c in str(text))
    flat = " ".join(flat.split())
    return flat if len(flat) <= cap else flat[:cap - 3] + "..."


def _build(manager: Any, spec: str | dict, task: str, prefetch: str = "bsops eval prefetch EXP") -> list:
    """The lm-eval Task or Group (or a tag's Tasks) of one eval.tasks entry, its data loaded, as a list; a task
    whose data cannot be had is an EvalError naming it (the cause in one line)."""
    from lm_eval.api.group import Group
    from lm_eval.api.task import Task

    try:
        built = manager._load_spec(spec)  # what TaskManager.load does per entry (lm-eval 0.4.13)
    except Exception as exc:  # datasets', huggingface_hub's, jinja's sandbox and a task's own errors alike
        cause = one_line(f"{type(exc).__name__}: {exc}", 300)
        if is_task_file(task):
            raise EvalError(f"eval.tasks: {task}: lm-eval cannot build the task ({cause}); a task file's data comes "
                            f"from its data_files, or through `datasets` (fetch it with network: {prefetch})") from None
        raise EvalError(f"eval.tasks: {task}: lm-eval cannot load it ({cause}); its data comes through `datasets`: "
                        f"fetch it on a machine with network: {prefetch}") from None
    return [built] if isinstance(built, (Task, Group)) else list(built)


def source_bits_per_byte(exp: Experiment, lm: BsopsLM, log: Callable[[str], None]
                         ) -> tuple[dict, dict[str, str], list[str]]:
    """source -> bpb.SourceBpb.to_dict() of each eval.sources file, source -> why for those not scored, and the
    sources among those that failed on lines that are not documents (more than eval.max_bad_lines)."""
    from bigscience_ops.ops.evaluate.bpb import BadLines, bits_per_byte

    scored, missing, corrupt = {}, {}, []
    for name, path in exp.eval.sources.items():
        try:
            scored[name] = bits_per_byte(path, lm, exp.eval.text_key, exp.eval.docs_per_source, log,
                                         exp.eval.max_bad_lines).to_dict()
        except EvalError as exc:
            missing[name] = one_line(f"eval.sources {name}: {exc}")
            log(f"skipped source {name}: {one_line(str(exc))}")
            if isinstance(exc, BadLines):
                corrupt.append(name)
    return scored, missing, corrupt


def result_tag(checkpoint: str | os.PathLike[str]) -> str:
    """The checkpoint's tag (global_stepN), its folder's name."""
    return Path(checkpoint).name


def bsops_section(exp: Experiment, checkpoint: Path, meta: dict, scorer: Scorer, bits: dict, missing: dict[str, str],
                  seconds: float, corrupt: list[str] = ()) -> dict:
    """The result's "bsops" section: what was evaluated, for which run (its id), in which layout and precision, with
    how many bootstrap resamples and examples per task (eval.limit), the command line's overrides, the sources' bits
    per byte, and each configured task or source that did not run, with why (`corrupt`: the sources among them
    that failed on lines that are not documents)."""
    tag = result_tag(checkpoint)
    step = layout.step_of(tag)
    parallel = meta.get("parallel") if isinstance(meta.get("parallel"), dict) else {}
    dtype = getattr(scorer, "dtype", None)
    return {
        "format": results.FORMAT, "experiment": exp.name, "tag": tag, "step": step,
        "iteration": meta.get("iteration", step),
        "consumed_samples": meta.get("consumed_train_samples"), "consumed_tokens": meta.get("consumed_tokens"),
        "layout": dict(getattr(scorer, "layout", None) or {"tensor": parallel.get("tensor"),
                                                            "pipeline": parallel.get("pipeline")}),
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "bootstrap_iters": exp.eval.bootstrap_iters,
        "num_fewshot": exp.eval.num_fewshot, "num_fewshot_per_task": dict(exp.eval.num_fewshot_per_task),
        "run_id": results.run_id_of(exp.paths.output, exp.paths.checkpoints), "limit": exp.eval.limit,
        "overrides": list(exp.overrides),
        "bits_per_byte": bits, "missing": missing, "corrupt": list(corrupt), "problems": list(missing.values()),
        "seconds": round(seconds, 3),
        "finished": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


EVENT_SUFFIX = ".{prefix}.{tag}"
"""The suffix of the event file that holds one evaluated checkpoint's scalars (the tags' prefix and its tag)."""
PREFIX, LIMITED_PREFIX = "eval", "eval-limited"
"""The TensorBoard tags' first part: a full result's, a limited result's (eval.limit: never over a full one's)."""


def write_scalars(exp: Experiment, result: dict) -> tuple[int, int]:
    """`eval/<task>/<metric>` at the checkpoint's iteration and `... vs tokens` at its consumed tokens (a limited
    result's under `eval-limited/`, beside the full ones, never over them), in a fresh event file of this checkpoint's
    own in paths.tensorboard (EVENT_SUFFIX), then the event files of its earlier evaluations of the same kind
    removed, so that a step has one point per metric and kind: (metrics written, event files replaced). None with
    logging.tensorboard off or no paths.tensorboard."""
    folder = exp.paths.tensorboard
    if not exp.logging.tensorboard or not folder:
        return 0, 0
    from torch.utils.tensorboard import SummaryWriter

    section = result["bsops"]
    prefix = LIMITED_PREFIX if section.get("limit") is not None else PREFIX
    earlier = earlier_event_files(folder, section["tag"], prefix)
    values = results.metrics(result)
    writer = SummaryWriter(log_dir=folder, filename_suffix=EVENT_SUFFIX.format(prefix=prefix, tag=section["tag"]))
    try:
        for name, value in sorted(values.items()):
            writer.add_scalar(f"{prefix}/{name}", value, section["iteration"])
            if isinstance(section.get("consumed_tokens"), int):
                writer.add_scalar(f"{prefix}/{name} vs tokens", value, section["consumed_tokens"])
        writer.flush()
    finally:
        writer.close()
    for old in earlier:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    return len(values), len(earlier)


def earlier_event_files(folder: str | os.PathLike[str], tag: str, prefix: str = PREFIX) -> list[Path]:
    """The plain event files of earlier evaluations of checkpoint `tag` (of `prefix`'s kind) in the TensorBoard
    folder."""
    suffix = EVENT_SUFFIX.format(prefix=prefix, tag=tag)
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.name.startswith("events.out.tfevents.") and e.name.endswith(suffix)
            and e.is_file(follow_symlinks=False)]


def write_samples(result_path: Path, samples: dict) -> Path:
    """lm-eval's per-sample output as its `--log_samples` writes it (EvaluationTracker.save_results_samples, lm-eval
    0.4.13): per task a file `samples_<task>_<date id>.jsonl` (the date id lm-eval's: the local time in ISO form with
    `-` for `:`), one JSON line per document with lm-eval's keys (doc_id, doc, target as text, arguments as
    {gen_args_i: {arg_j: ...}}, resps and filtered_resps as text, filter, metrics, doc_hash, prompt_hash, target_hash
    and the metrics' values), in `<tag>.samples/` beside the result file (the folder replaced whole: an earlier
    evaluation's samples do not stay)."""
    import json
    import shutil

    from lm_eval.utils import handle_non_serializable

    from bigscience_ops.untrusted import write_atomically

    folder = result_path.with_name(result_path.stem + ".samples")
    fresh = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    date_id = datetime.now().isoformat().replace(":", "-")
    for task, rows in samples.items():
        if results.name_problem(task) is not None:
            continue  # refused_names has left it out of the result
        lines = [json.dumps(lm_eval_sample(row), default=handle_non_serializable, ensure_ascii=False) for row in rows]
        write_atomically(fresh / f"samples_{task}_{date_id}.jsonl", "".join(line + "\n" for line in lines).encode())
    shutil.rmtree(folder, ignore_errors=True)
    fresh.rename(folder)
    return folder


def lm_eval_sample(sample: dict) -> dict:
    """One of lm-eval's samples as its --log_samples writes it (EvaluationTracker.save_results_samples): arguments as
    {gen_args_i: {arg_j: value}}, resps and filtered_resps with every leaf as text, target as text; `sample` is left
    as it was."""
    from lm_eval.utils import sanitize_list

    row = dict(sample)
    row["resps"] = sanitize_list(row["resps"])
    row["filtered_resps"] = sanitize_list(row["filtered_resps"])
    row["arguments"] = {f"gen_args_{i}": {f"arg_{j}": value for j, value in enumerate(arg)}
                        for i, arg in enumerate(row["arguments"])}
    row["target"] = str(row["target"])
    return row


OPTIONS = ("num_fewshot", "use_cache", "num_fewshot_per_task", "model_name", "model_args")
"""run_tasks' options: the first two simple_evaluate's own (keyword arguments of the same names), then bsops'."""


def lm_eval_options(options: dict[str, Any]) -> dict[str, Any]:
    """run_tasks' `options` checked, each of OPTIONS (none given: lm-eval's defaults, no request cache, None)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"run_tasks: {', '.join(unknown)}: not an option it passes to lm-eval; allowed: "
                        f"{', '.join(OPTIONS)}")
    num_fewshot, cache = options.get("num_fewshot"), options.get("use_cache")
    if num_fewshot is not None and (isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int)
                                    or num_fewshot < 0):
        raise EvalError(f"num_fewshot={num_fewshot!r}: allowed: a whole number >= 0")
    return {"num_fewshot": num_fewshot, "use_cache": None if cache is None else os.fspath(cache),
            **{name: options.get(name) for name in OPTIONS[2:]}}


def request_cache(result_path: Path, scorer: Any) -> Path:
    """Where `evaluate(..., keep_cache=True)` keeps lm-eval's request cache: `<tag>.requests/<dtype>` beside the
    (full) result file (lm-eval adds `_rank0.db`). One cache per checkpoint and precision: lm-eval keys a request by
    its text alone, so a cache must never answer for another model or dtype (or run: cache_of_run)."""
    dtype = getattr(scorer, "dtype", None)
    name = str(dtype).removeprefix("torch.") if dtype is not None else "default"
    return result_path.with_name(result_path.stem + ".requests") / name


def cache_of_run(folder: Path, run_id: str | None, write: bool = True) -> None:
    """Make the request cache folder `folder` this run's: its bsops-run-id written when it has none (and the run
    has one, and `write`); EvalError naming both when it records another run (or one where this run has none):
    another run's answers are never this run's."""
    from bigscience_ops.untrusted import write_atomically

    try:
        recorded = layout.run_id(folder)
    except layout.CheckpointError as exc:
        raise EvalError(f"lm-eval's request cache {folder}: {exc}") from None
    if recorded is not None and recorded != run_id:
        raise EvalError(f"lm-eval's request cache {folder} was made for run {recorded}, not this run "
                        f"({run_id or 'no run id'}); allowed: a cache this run made: move that folder away")
    if recorded is None and run_id is not None and write:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / layout.RUN_ID, (run_id + "\n").encode("utf-8"))


def bsops_model_args(exp: Experiment, tag: str, scorer: Scorer) -> dict:
    """The checkpoint as `lm_eval --model bsops --model_args` names it (the result's config.model_args): the run
    folder, the step, the layout and eval.dtype it was scored in."""
    shape = getattr(scorer, "layout", None) or {}
    return {"run": str(exp.paths.output), "step": layout.step_of(tag), "tensor": shape.get("tensor"),
            "pipeline": shape.get("pipeline"), "dtype": exp.eval.dtype}


class MissingTasks(EvalError):
    """Configured tasks or sources did not run; the result of the others is written (named here)."""


def evaluate(exp: Experiment, checkpoint: Path, meta: dict, scorer: Scorer,
             log: Callable[[str], None] = lambda line: None, log_samples: bool = False,
             keep_cache: bool = False) -> Path:
    """Evaluate the checkpoint the Scorer holds (see the module docstring); the result file's path. When a configured
    task or source did not run, the result of the others is written and MissingTasks raised after, naming them.
    keep_cache: lm-eval's request cache kept beside the result (request_cache), so that evaluating the checkpoint
    again (more tasks, another limit) scores only the requests it has not answered before."""
    from bigscience_ops.ops.evaluate.harness import build_lm

    started = time.monotonic()
    if not exp.eval.configured:
        raise EvalError(f"experiment {exp.name} has no eval.tasks and no eval.sources; nothing to evaluate")
    tag = result_tag(checkpoint)
    path = results.result_path(exp, tag)  # a folder not named global_stepN: refused before work; eval.limit: apart
    cache = request_cache(results.result_path(exp, tag, limited=False), scorer) if keep_cache else None
    if cache is not None:
        cache_of_run(cache.parent, results.run_id_of(exp.paths.output, exp.paths.checkpoints))
        log(f"lm-eval's request cache: {cache}_rank0.db")
    from bigscience_ops.ops.evaluate import prefetch as fetching

    lm = build_lm(exp, scorer, log)
    missing: dict[str, str] = {}
    result = run_tasks(lm, list(exp.eval.tasks), exp.eval.limit, log, log_samples, missing, trust=exp.eval.trust_task_code,
                       bootstrap_iters=exp.eval.bootstrap_iters, prefetch=fetching.command(exp.name),
                       use_cache=cache, model_name=results.model_name(exp.name, tag),
                       model_args=bsops_model_args(exp, tag, scorer), num_fewshot=exp.eval.num_fewshot,
                       num_fewshot_per_task=exp.eval.num_fewshot_per_task) if exp.eval.tasks else {}
    bits, unscored, corrupt = source_bits_per_byte(exp, lm, log)
    missing.update(unscored)
    if not result.get("results") and not bits:
        raise EvalError(f"nothing of {tag} could be evaluated: " + "; ".join(missing.values()))
    result["bsops"] = bsops_section(exp, Path(checkpoint), meta, scorer, bits, missing, time.monotonic() - started,
                                    corrupt)
    replaced = path.is_file()
    results.write(path, result)
    if log_samples and isinstance(result.get("samples"), dict):
        folder = write_samples(path, result["samples"])
        log(f"lm-eval's per-sample output of {len(result['samples'])} task(s) in {folder}")
    if replaced:
        log(f"replaced the earlier result file of {tag}: {path}")
    if exp.eval.limit is not None:
        log(f"a limited result (eval.limit {exp.eval.limit} examples per task), kept apart from {tag}'s full one")
    try:
        written, old = write_scalars(exp, result)
    except OSError as exc:  # the result file is written: a TensorBoard folder that cannot take an event file is told
        written, old = 0, 0
        log(f"TensorBoard scalars not written to {exp.paths.tensorboard}: {exc.strerror or exc}")
    if old:
        log(f"replaced {tag}'s TensorBoard points of {old} earlier evaluation(s) in {exp.paths.tensorboard}")
    log(f"evaluation of {tag} written to {path} ({written} metrics, {result['bsops']['seconds']:.0f} s)")
    if missing:
        raise MissingTasks(f"{len(missing)} configured task(s) or source(s) of {tag} did not run ({path} holds the "
                           "others): " + "; ".join(f"{name}: {why}" for name, why in missing.items()))
    return path
