"""`bsops eval EXP --prefetch [--from DIR]`: the datasets of eval.tasks into the shared cache eval.hf_cache, on a
machine with network (a login node, the `prepost` partition), so the eval job reads them offline on a compute node.

`prefetch(exp, source)` starts this module twice in a fresh interpreter (`datasets` and huggingface_hub read their
variables at import), telling it what it needs of the experiment (`Wanted`: its name, eval.tasks and
eval.trust_task_code, as JSON in one argument): first to fetch, with HF_HOME, HF_DATASETS_CACHE and HF_HUB_CACHE
under eval.hf_cache, then to verify with HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1 as the eval job runs: each
dataset is loaded offline the way lm-eval loads it (`datasets.load_dataset(dataset_path, dataset_name)`) and its
splits' rows counted. What is there is recorded in `<eval.hf_cache>/bsops-prefetch.json` (task -> dataset, config,
rows per split, when), replaced whole.

Which datasets: every lm-eval task eval.tasks names (a group's or tag's member tasks included, from lm-eval's own
task index) and every task file whose dataset_path is not one of `datasets`' local file formats (json, csv, ...:
those read their data_files, nothing to fetch). With `--from DIR` nothing is downloaded: DIR is a local mirror
holding each dataset's files as its repo does (DIR/EleutherAI/lambada_openai/..., a config's in a sub-folder of
its name when there is one), built into the cache under the dataset's own name, so that the offline load by name
finds it (tests, and sites that copy datasets in by hand).

`cache_env(hf_cache, offline)` is the environment the eval job and `bsops eval --step` give the ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bigscience_ops.ops.evaluate import EvalError

MANIFEST = "bsops-prefetch.json"
LOCAL_BUILDERS = frozenset({"json", "csv", "parquet", "text", "arrow", "pandas", "webdataset", "imagefolder",
                            "audiofolder"})
"""dataset_path values that read a task's own data_files: nothing to fetch."""
FETCH_TIMEOUT_S = 6 * 3600
VERIFY_TIMEOUT_S = 3600


class PrefetchError(EvalError):
    """A dataset could not be fetched or verified: names the task, and what to do."""


@dataclass(frozen=True)
class Wanted:
    """What the prefetch's child needs of the experiment."""

    experiment: str
    tasks: tuple[str, ...]
    """eval.tasks: lm-eval task, group or tag names, and task files."""
    trust_task_code: bool
    """eval.trust_task_code: whether a task file may name Python (`!function`)."""

    def argument(self) -> str:
        """The child's --wanted argument, in the `=` form: a task named like an option stays a value."""
        return f"--wanted={json.dumps(asdict(self))}"

    @classmethod
    def parse(cls, text: str) -> Wanted:
        data = json.loads(text)
        return cls(data["experiment"], tuple(data["tasks"]), data["trust_task_code"] is True)


def cache_env(hf_cache: str | os.PathLike[str] | None, offline: bool) -> dict[str, str]:
    """The Hugging Face variables for a cache folder (none without one) and, with `offline`, no network."""
    env: dict[str, str] = {}
    if hf_cache:
        root = Path(hf_cache).expanduser().absolute()
        env.update(HF_HOME=str(root), HF_DATASETS_CACHE=str(root / "datasets"), HF_HUB_CACHE=str(root / "hub"))
    if offline:
        env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    return env


def command(exp_name: str) -> str:
    return f"bsops eval {exp_name} --prefetch"


def prefetch(exp: Any, source: Path | None = None, log: Callable[[str], None] = print) -> dict:
    """Fetch (or build from the mirror `source`) and verify eval.tasks' datasets in eval.hf_cache; the manifest."""
    if not exp.eval.hf_cache:
        raise PrefetchError(f"experiment {exp.name}: eval.hf_cache is not set; allowed: a folder shared by the login "
                            "and compute nodes (the eval job reads the datasets there, offline)")
    cache = Path(exp.eval.hf_cache).expanduser().absolute()
    cache.mkdir(parents=True, exist_ok=True)
    wanted = Wanted(exp.name, tuple(exp.eval.tasks), exp.eval.trust_task_code)
    argv = [sys.executable, "-m", __name__, wanted.argument()]
    steps = [("fetch", [*argv, "--fetch"] + ([f"--from={source}"] if source else []), False, FETCH_TIMEOUT_S),
             ("verify", [*argv, "--verify"], True, VERIFY_TIMEOUT_S)]
    for what, args, offline, timeout in steps:
        env = {**os.environ, **cache_env(cache, offline), "TQDM_DISABLE": "1"}
        if not offline:
            env.pop("HF_DATASETS_OFFLINE", None)
            env.pop("HF_HUB_OFFLINE", None)
        try:
            done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, errors="replace")
        except subprocess.TimeoutExpired:
            raise PrefetchError(f"{what}: did not end within {timeout} s") from None
        for line in done.stdout.split("\n"):  # not splitlines(): a dataset name may hold U+2028
            log(line)
        if done.returncode != 0:
            errors = [line.removeprefix("error: ") for line in done.stderr.split("\n") if line.startswith("error: ")]
            tail = done.stderr.strip().split("\n")
            reason = "; ".join(errors) or (tail[-1][:400] if tail else "no message")
            raise PrefetchError(f"{what} failed (exit code {done.returncode}): {reason}")
    return json.loads((cache / MANIFEST).read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- the child (datasets, lm_eval)

def needs(wanted: Wanted) -> list[tuple[str, str, str | None]]:
    """(task, dataset_path, dataset_name) of each dataset eval.tasks reads through `datasets` by name."""
    from bigscience_ops.ops.evaluate import taskfiles
    from bigscience_ops.validation import is_task_file

    out: list[tuple[str, str, str | None]] = []

    def add(task: str, config: dict) -> None:
        path = config.get("dataset_path")
        if isinstance(path, str) and path not in LOCAL_BUILDERS and not os.path.isabs(path):
            name = config.get("dataset_name")
            out.append((task, path, name if isinstance(name, str) else None))

    registered = [t for t in wanted.tasks if not is_task_file(t)]
    for task in wanted.tasks:
        if is_task_file(task):
            add(task, taskfiles.load(task, trust=wanted.trust_task_code))
    if registered:
        from lm_eval.tasks import TaskManager
        from lm_eval.tasks._yaml_loader import load_yaml

        manager = TaskManager()
        index = manager.task_index

        def expand(name: str, seen: set[str]) -> None:
            entry = index.get(name)
            if entry is None or name in seen:
                if entry is None:
                    raise PrefetchError(f"eval.tasks: {name}: no such lm-eval task; allowed: a registered task, group "
                                        "or tag name (`lm-eval ls tasks`)")
                return
            seen.add(name)
            if entry.tags and entry.yaml_path is None:  # a tag: its tasks
                for member in sorted(entry.tags):
                    expand(member, seen)
                return
            config = load_yaml(entry.yaml_path, resolve_func=False) if entry.yaml_path else (entry.cfg or {})
            if "group" in config and isinstance(config.get("task"), list):
                for member in config["task"]:
                    if isinstance(member, str):
                        expand(member, seen)
                    elif isinstance(member, dict) and isinstance(member.get("task"), str) and member["task"] in index:
                        expand(member["task"], seen)
                return
            add(name, config)

        for task in registered:
            expand(task, set())
    return out


def _from_mirror(source: Path, path: str, name: str | None, cache: str) -> None:
    """Build dataset `path` (config `name`) from the mirror's files into the cache under the dataset's own name."""
    from datasets.load import dataset_module_factory, get_dataset_builder_class

    folder = source / path
    if name and (folder / name).is_dir():
        folder = folder / name
    if not folder.is_dir():
        raise PrefetchError(f"--from {source}: no folder {path}" + (f" (or {path}/{name})" if name else "")
                            + " holding the dataset's files")
    module = dataset_module_factory(str(folder))
    builder_cls = get_dataset_builder_class(module)
    kwargs = {k: v for k, v in module.builder_kwargs.items() if k != "repo_id"}
    kwargs["dataset_name"] = path.split("/")[-1]
    builder = builder_cls(cache_dir=cache, config_name=name or "default", hash=module.hash, **kwargs)
    builder.repo_id = path  # the cache folder named as a download from the Hub names it (namespace___name)
    builder._cache_dir = builder._build_cache_dir()
    builder.download_and_prepare()


def _fetch(wanted: Wanted, source: Path | None) -> None:
    import datasets

    for task, path, name in needs(wanted):
        print(f"{task}: fetching {path}" + (f" ({name})" if name else "") + (f" from {source}" if source else ""),
              flush=True)
        if source is not None:
            _from_mirror(source, path, name, str(datasets.config.HF_DATASETS_CACHE))
        else:
            datasets.load_dataset(path, name)


def _verify(wanted: Wanted) -> None:
    import datasets

    from bigscience_ops.untrusted import write_atomically

    tasks = {}
    for task, path, name in needs(wanted):
        try:
            loaded = datasets.load_dataset(path, name)
        except Exception as exc:  # noqa: BLE001 - datasets' many kinds
            raise PrefetchError(f"{task}: {path} is not in the cache offline after the fetch "
                                f"({type(exc).__name__})") from None
        rows = {str(split): int(part.num_rows) for split, part in loaded.items()}
        tasks[task] = {"dataset_path": path, "dataset_name": name, "rows": rows}
        print(f"{task}: {path}" + (f" ({name})" if name else "") + f" offline: {rows}", flush=True)
    cache = Path(os.environ["HF_HOME"])
    manifest = {"experiment": wanted.experiment, "cache": str(cache), "tasks": tasks,
                "verified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_atomically(cache / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))


def main(argv: list[str] | None = None) -> int:
    from bigscience_ops.errors import BsopsError

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--wanted", required=True, help="Wanted.argument()'s JSON")
    parser.add_argument("--from", dest="source", type=Path, default=None)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--fetch", action="store_true")
    mode.add_argument("--verify", action="store_true")
    args = parser.parse_args(argv)
    try:
        wanted = Wanted.parse(args.wanted)
        if args.fetch:
            _fetch(wanted, args.source)
        else:
            _verify(wanted)
    except BsopsError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - datasets' and huggingface_hub's errors: one line
        print(f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
