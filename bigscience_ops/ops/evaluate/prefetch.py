"""`bsops eval prefetch EXP [--mirror DIR]`: the datasets of eval.tasks into the shared cache eval.hf_cache, on a
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
those read their data_files, nothing to fetch). With `--mirror DIR` nothing is downloaded: DIR is a local mirror
holding each dataset's files as its repo does (DIR/EleutherAI/lambada_openai/..., a config's in a sub-folder of
its name when there is one), built into the cache under the dataset's own name, so that the offline load by name
finds it (tests, and sites that copy datasets in by hand).

A mirror is read only inside DIR: every folder a task names (its dataset_path, with its dataset_name) is resolved,
links included, and compared with DIR, and so is every file below it (a link that leads out of DIR, a FIFO or a
device is refused), for every task before anything is copied: a refusal leaves nothing in the shared cache.

The children's output is passed on line by line as it comes (each dataset as it starts, then every PROGRESS_S a
line saying how much of the cache it has written), and the whole prefetch has one deadline, eval.prefetch_minutes:
past it the child's process group is stopped and the prefetch fails, naming the deadline.

`cache_env(hf_cache, offline)` is the environment the eval job and `bsops eval run --step` give the ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import queue
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bigscience_ops.ops.evaluate import EvalError

MANIFEST = "bsops-prefetch.json"
LOCAL_BUILDERS = frozenset({"json", "csv", "parquet", "text", "arrow", "pandas", "webdataset", "imagefolder",
                            "audiofolder"})
"""dataset_path values that read a task's own data_files: nothing to fetch."""
PROGRESS_S = 30
"""Seconds between the child's lines while it copies one dataset."""
STOP_GRACE_S = 10
"""After the deadline, how long the child's process group has to end after SIGTERM before SIGKILL."""
MAX_MIRROR_ENTRIES = 100_000
"""Files and folders below one dataset's folder of a mirror looked at, at most."""


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
    return f"bsops eval prefetch {exp_name}"


def prefetch(exp: Any, source: Path | None = None, log: Callable[[str], None] = print,
             deadline_s: float | None = None) -> dict:
    """Fetch (or build from the mirror `source`) and verify eval.tasks' datasets in eval.hf_cache, the children's
    lines told with `log` as they come, all of it within `deadline_s` seconds (default: eval.prefetch_minutes); the
    manifest. A cache folder this call made is removed again when the fetch fails and leaves it empty."""
    if not exp.eval.hf_cache:
        raise PrefetchError(f"experiment {exp.name}: eval.hf_cache is not set; allowed: a folder shared by the login "
                            "and compute nodes (the eval job reads the datasets there, offline)")
    cache = Path(exp.eval.hf_cache).expanduser().absolute()
    made = not cache.exists()
    cache.mkdir(parents=True, exist_ok=True)
    wanted = Wanted(exp.name, tuple(exp.eval.tasks), exp.eval.trust_task_code)
    argv = [sys.executable, "-m", __name__, wanted.argument()]
    limit = exp.eval.prefetch_minutes * 60 if deadline_s is None else deadline_s
    deadline = time.monotonic() + limit
    steps = [("fetch", [*argv, "--fetch"] + ([f"--mirror={source}"] if source else []), False),
             ("verify", [*argv, "--verify"], True)]
    try:
        for what, args, offline in steps:
            env = {**os.environ, **cache_env(cache, offline), "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
            if not offline:
                env.pop("HF_DATASETS_OFFLINE", None)
                env.pop("HF_HUB_OFFLINE", None)
            code, stderr = run_streamed(args, env, deadline, log)
            if code is None:
                raise PrefetchError(f"{what}: not done by the deadline, eval.prefetch_minutes "
                                    f"({_minutes(limit)}): stopped; allowed: a larger eval.prefetch_minutes, or fewer "
                                    "or smaller datasets")
            if code != 0:
                errors = [line.removeprefix("error: ") for line in stderr if line.startswith("error: ")]
                reason = "; ".join(errors) or (stderr[-1][:400] if stderr else "no message")
                raise PrefetchError(f"{what} failed (exit code {code}): {reason}")
    except BaseException:
        if made:
            _remove_if_empty(cache)
        raise
    return json.loads((cache / MANIFEST).read_text(encoding="utf-8"))


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} minute(s)"


def _remove_if_empty(folder: Path) -> None:
    """`folder` and the empty folders below it removed, when no file is in any of them (nothing else is touched)."""
    for root, dirs, files in os.walk(folder, topdown=False):
        if files:
            return
        try:
            os.rmdir(root)
        except OSError:
            return


def run_streamed(argv: list[str], env: dict[str, str], deadline: float, log: Callable[[str], None]
                 ) -> tuple[int | None, list[str]]:
    """Run `argv` in a process group of its own, each line of its stdout told with `log` as it comes, until it ends
    or the monotonic `deadline` passes (then the group is stopped: SIGTERM, SIGKILL after STOP_GRACE_S): (its exit
    code, None past the deadline; the last lines of its stderr)."""
    from collections import deque

    from bigscience_ops.launch import processes

    proc = processes.start(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    tail: deque[str] = deque(maxlen=200)

    def pump_out() -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def pump_err() -> None:
        for line in proc.stderr:
            tail.append(line.rstrip("\n"))

    readers = [threading.Thread(target=pump_out, daemon=True), threading.Thread(target=pump_err, daemon=True)]
    for reader in readers:
        reader.start()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                processes.stop_tree(proc, STOP_GRACE_S)
                return None, list(tail)
            try:
                line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                break
            log(line)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        processes.stop_tree(proc, STOP_GRACE_S)
        return None, list(tail)
    except BaseException:
        processes.stop_tree(proc, STOP_GRACE_S)
        raise
    finally:
        for reader in readers:
            reader.join(timeout=5)
    return proc.returncode, list(tail)


# ----------------------------------------------------------------------------- the child (datasets, lm_eval)

def needs(wanted: Wanted) -> list[tuple[str, str, str | None]]:
    """(task, dataset_path, dataset_name) of each dataset eval.tasks reads through `datasets` by name."""
    from bigscience_ops.ops.evaluate import taskfiles
    from bigscience_ops.config.validation import is_task_file

    manager = None
    if any(not is_task_file(t) for t in wanted.tasks):
        from lm_eval.tasks import TaskManager

        manager = TaskManager()
    out = []
    for task in wanted.tasks:
        spec = taskfiles.load(task, trust=wanted.trust_task_code) if is_task_file(task) else task
        out += [(owner, path, name) for owner, path, name, _ in datasets_of(task, spec, manager)]
    return out


def datasets_of(task: str, spec: str | dict, manager: Any) -> list[tuple[str, str, str | None, str | None]]:
    """(task, dataset_path, dataset_name, dataset_kwargs' cache_dir) of each dataset the eval.tasks entry `task`
    reads through `datasets` by name: `spec` is a task file's config, or a registered task, group or tag name whose
    member tasks are found in lm-eval's task index (`manager`, a TaskManager)."""
    out: list[tuple[str, str, str | None, str | None]] = []

    def add(owner: str, config: dict) -> None:
        path = config.get("dataset_path")
        if isinstance(path, str) and path not in LOCAL_BUILDERS and not os.path.isabs(path):
            name = config.get("dataset_name")
            kwargs = config.get("dataset_kwargs") if isinstance(config.get("dataset_kwargs"), dict) else {}
            cache_dir = kwargs.get("cache_dir") if isinstance(kwargs.get("cache_dir"), str) else None
            out.append((owner, path, name if isinstance(name, str) else None, cache_dir))

    if isinstance(spec, dict):
        add(task, spec)
        return out
    from lm_eval.tasks._yaml_loader import load_yaml

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

    expand(spec, set())
    return out


def offline() -> bool:
    """Whether `datasets` is offline (HF_DATASETS_OFFLINE or HF_HUB_OFFLINE, as it read them at import)."""
    import datasets.config

    return bool(datasets.config.HF_HUB_OFFLINE)


def not_cached(path: str, cache_dir: str | None = None) -> Path | None:
    """The datasets cache folder (`cache_dir`, else HF_DATASETS_CACHE) when the Hub dataset `path` (org/name) is not
    in it, None when it is or when `path` is no Hub name (a local folder). Offline, `datasets.load_dataset` finds a
    Hub dataset only there (datasets' CachedDatasetModuleFactory: a folder <org>___<name in snake case>/<config>/
    <version>/<hash>); this looks the same way, without asking the Hub anything."""
    import datasets.config
    from datasets.naming import camelcase_to_snakecase

    if os.path.isdir(path) or path.count("/") > 1 or "://" in path:
        return None
    folder = Path(os.path.expanduser(str(cache_dir or datasets.config.HF_DATASETS_CACHE)))
    parts = path.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    root = folder / "___".join(parts)
    with contextlib.suppress(OSError):
        for config in root.iterdir():
            for version in config.iterdir() if config.is_dir() else ():
                if version.is_dir() and any(found.is_dir() for found in version.iterdir()):
                    return None
    return folder


def mirror_folder(source: Path, task: str, path: str, name: str | None) -> Path:
    """The folder of the mirror `source` holding dataset `path` (config `name`), resolved, once it and everything
    below it are known to stay inside `source`: a PrefetchError naming the task and the value otherwise (a `..`,
    an absolute path, a link that leads out, a FIFO or device among its files)."""
    root = source.resolve()
    folder = source / path
    if name and (folder / name).is_dir():
        folder = folder / name
    shown = path + (f" (or {path}/{name})" if name else "")
    allowed = f"allowed: a folder inside {root}, its files plain files or links that stay inside it"
    try:
        resolved = folder.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise PrefetchError(f"--mirror {source}: {task}: dataset_path {shown} cannot be resolved ({exc}); {allowed}") from None
    if not resolved.is_relative_to(root):
        raise PrefetchError(f"--mirror {source}: {task}: dataset_path {shown} leads to {resolved}, outside the mirror; "
                            f"{allowed}")
    if not resolved.is_dir():
        raise PrefetchError(f"--mirror {source}: no folder {shown} holding the dataset's files")
    for entry in _below(resolved, task):
        try:
            target = entry.resolve()
        except (OSError, RuntimeError):
            target = entry  # a loop of links: refused below as no plain file
        if not target.is_relative_to(root):
            raise PrefetchError(f"--mirror {source}: {task}: {entry} leads to {target}, outside the mirror; {allowed}")
        mode = target.stat().st_mode if target.exists() else 0
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise PrefetchError(f"--mirror {source}: {task}: {entry} is not a plain file or folder (a FIFO, a device or "
                                f"a broken link); {allowed}")
    return resolved


def _below(folder: Path, task: str) -> Iterator[Path]:
    """Every entry below `folder` (links not followed into), at most MAX_MIRROR_ENTRIES."""
    count = 0
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            count += 1
            if count > MAX_MIRROR_ENTRIES:
                raise PrefetchError(f"{task}: {folder} holds more than {MAX_MIRROR_ENTRIES} files and folders; allowed: "
                                    "a dataset's files as its repo holds them")
            yield Path(root) / name


def _from_mirror(folder: Path, path: str, name: str | None, cache: str) -> None:
    """Build dataset `path` (config `name`) from the mirror's checked `folder` into the cache under the dataset's own
    name."""
    from datasets.load import dataset_module_factory, get_dataset_builder_class

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

    needed = needs(wanted)
    print(f"{len(needed)} dataset(s) to fetch" + (f" from {source}" if source else ""), flush=True)
    folders: list[Path | None] = [None] * len(needed)
    if source is not None:
        refused = []
        for i, need in enumerate(needed):
            try:
                folders[i] = mirror_folder(source, *need)
            except PrefetchError as exc:
                refused.append(str(exc))
        if refused:  # every task's folder named, and nothing copied for any of them
            raise PrefetchError(f"{len(refused)} task(s) refused, nothing copied: " + "; ".join(refused))
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    for (task, path, name), folder in zip(needed, folders):  # every mirror folder checked before anything is copied
        print(f"{task}: fetching {path}" + (f" ({name})" if name else "") + (f" from {folder}" if folder else ""),
              flush=True)
        with _progress(f"{task}: {path}", cache):
            if folder is not None:
                _from_mirror(folder, path, name, str(cache))
            else:
                datasets.load_dataset(path, name)


class _progress:
    """Inside: a line every PROGRESS_S seconds saying how long the copy has run and how much the cache holds."""

    def __init__(self, label: str, cache: Path) -> None:
        self.label, self.cache, self.done = label, cache, threading.Event()
        self.thread = threading.Thread(target=self._tell, daemon=True)

    def __enter__(self) -> None:
        self.started = time.monotonic()
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=5)

    def _tell(self) -> None:
        while not self.done.wait(PROGRESS_S):
            size = 0
            for root, _, files in itertools.islice(os.walk(self.cache), MAX_MIRROR_ENTRIES):
                for name in files:
                    with contextlib.suppress(OSError):
                        size += os.lstat(os.path.join(root, name)).st_size
            print(f"{self.label}: still copying after {time.monotonic() - self.started:.0f} s; the cache holds "
                  f"{size / 2**20:.1f} MiB", flush=True)


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
    parser.add_argument("--mirror", dest="source", type=Path, default=None)
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
