"""The user's index of the runs they launched: one JSON line per launch, appended when its job has started.

`bsops runs` reads it (views/runs.py) to list each run with where it stands; every launch, on Slurm
or --local, appends to it in one place (launch_plan.execute). The index lives in the user's data
folder, beside the cron chains: $BSOPS_RUNS_INDEX, else $XDG_DATA_HOME/bsops/runs.jsonl, else
~/.local/share/bsops/runs.jsonl.

A line is {"time": epoch seconds, "experiment": name, "folder": the run folder, "job": slurm, local
or resubmission, "job_id": the Slurm job id or the local launch's made-up one}. The index only says
where runs are: what a run is (its experiment, job and state) is read from the run's own records
(views/runs.py), and a line's claims are shown only where the run has no readable record.

The file is untrusted like a run's records (runfiles.py): it is opened only as a plain file (never
through a link, never a FIFO), and each line is checked field by field: the experiment by the
experiment-name rules (config.files.check_name), the job id digits with one optional `_digits`
(a Slurm job or array task), the folder an absolute path of printable characters. A torn, huge or
hostile line is a Problem, skipped and counted; the rest is still listed. Only the newest MAX_READ
bytes of an index are read (the end of the file: lines are appended); the older lines are counted,
never parsed, and the count is reported. A launch never fails for the index: the job has started
when the line is written, so a failure to write is returned, never raised.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bigscience_ops.errors import ConfigError
from bigscience_ops.config.files import NAME_ALLOWED, check_name
from bigscience_ops.untrusted import (
    MAX_LINE, Checked, Problem, RecordFileError, append_line, build, check_str, check_time, excerpt, json_object,
    open_plain,
)

INDEX_ENV = "BSOPS_RUNS_INDEX"
JOBS = ("slurm", "local", "resubmission")
MAX_PATH = 4096
"""The longest run folder an index line may name (PATH_MAX)."""
JOB_ID = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10})?")
JOB_ID_ALLOWED = "allowed: a job id of digits, with an optional _digits (an array task), or null"
MAX_READ = 64 << 20
"""Bytes of the index read at most, the newest (its end): 150,000 launches of long folder names."""
MAX_COUNT = 1 << 30
"""Bytes of the older part of a larger index whose lines are counted (not parsed); beyond, 'at least'."""


@dataclass(frozen=True)
class Launch:
    time: float
    experiment: str
    folder: str
    job: str
    job_id: str | None = None


def check_experiment(value: Any) -> str | None:
    """None when `value` is an experiment name a config could have (config.files.check_name), else why not."""
    if not isinstance(value, str):
        return f"got a {type(value).__name__}; expected an experiment name ({NAME_ALLOWED})"
    try:
        check_name(value, "runs index")
    except ConfigError:
        return f"got {excerpt(value)}; expected an experiment name ({NAME_ALLOWED})"
    return None


def check_job_id(value: Any) -> str | None:
    """None for a Slurm job or array-task id (digits[_digits]) or None, else why not."""
    if value is None:
        return None
    if not isinstance(value, str) or not JOB_ID.fullmatch(value):
        return f"got {excerpt(value) if isinstance(value, str) else 'a ' + type(value).__name__}; {JOB_ID_ALLOWED}"
    return None


def _check_folder(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"got a {type(value).__name__}; expected text"
    if len(value) > MAX_PATH:
        return f"got {len(value)} characters; expected at most {MAX_PATH}"
    if not value.isprintable():  # controls, U+2028, bidi overrides, zero-width: a line break or a lie on the terminal
        return f"got {excerpt(value)}; expected a path of printable characters"
    return None if os.path.isabs(value) else f"got {excerpt(value)}; expected an absolute path"


RULES = {
    "time": check_time,
    "experiment": check_experiment,
    "folder": _check_folder,
    "job": lambda v: check_str(v, 20, choices=JOBS),
    "job_id": check_job_id,
}


@dataclass(frozen=True)
class IndexRead(Checked[Launch]):
    """The launches of the index's newest MAX_READ bytes, a problem for each line there that is not one, and the
    older lines that were not read."""

    unread: int = 0
    """Lines before the part read (an index larger than MAX_READ): counted, not parsed."""
    unread_bytes: int = 0
    counted_all: bool = True
    """Whether `unread` counts every older line (False: at least that many; the older part is over MAX_COUNT)."""


def index_path(env: Mapping[str, str] | None = None) -> Path:
    """$BSOPS_RUNS_INDEX, else $XDG_DATA_HOME/bsops/runs.jsonl, else ~/.local/share/bsops/runs.jsonl (as
    ops.schedule.cron.default_cron_dir picks the user's data folder)."""
    env = os.environ if env is None else env
    if env.get(INDEX_ENV):
        return Path(env[INDEX_ENV]).expanduser()
    data = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return Path(data).expanduser() / "bsops" / "runs.jsonl"


def record_launch(experiment: str, folder: Path, job: str, job_id: str | None, *, path: Path | None = None,
                  now: float | None = None) -> str | None:
    """Append one launch to the index (`path`: default index_path()); None, or why it could not be written."""
    path = index_path() if path is None else Path(path)
    line = Launch(time.time() if now is None else now, experiment, str(Path(folder).resolve()), job, job_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        append_line(path, json.dumps(asdict(line)))
    except (OSError, RecordFileError) as exc:
        return f"the runs index {path} cannot be written: {exc}"
    return None


def read_index(path: Path | None = None, limit: int | None = None) -> IndexRead:
    """Every launch of the index's newest `limit` bytes (default MAX_READ), in file order; a problem for each line
    there that is not one (or one at line 0 for a file that is not plain), and the count of the older lines not
    read."""
    path = index_path() if path is None else Path(path)
    limit = MAX_READ if limit is None else limit
    try:
        handle = open_plain(path)
    except RecordFileError as exc:
        return IndexRead(problems=[Problem(str(path), 0, exc.what)])
    if handle is None:
        return IndexRead()
    records: list[Launch] = []
    problems: list[Problem] = []
    with handle:
        size = os.fstat(handle.fileno()).st_size
        unread, unread_bytes, counted_all, number = 0, 0, True, 0
        if size > limit:
            unread, unread_bytes, counted_all = _skip_older(handle, size - limit)
            number = unread
        end = handle.tell() + limit + MAX_LINE  # a file still growing is read to where it was, give or take a line
        while handle.tell() < end and (raw := handle.readline(MAX_LINE + 1)):
            number += 1
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                size_seen = len(raw)
                while raw and not raw.endswith(b"\n") and handle.tell() < end:
                    raw = handle.readline(1 << 20)
                    size_seen += len(raw)
                problems.append(Problem(str(path), number, f"a line of {size_seen} bytes; an index line is under "
                                                           f"{MAX_LINE} bytes: not read"))
                continue
            launch, problem = _launch(str(path), number, raw)
            if launch is not None:
                records.append(launch)
            elif problem is not None:
                problems.append(problem)
    return IndexRead(records, problems, unread, unread_bytes, counted_all)


def _skip_older(handle, start: int) -> tuple[int, int, bool]:
    """Count the lines before byte `start` (up to MAX_COUNT bytes of them) and leave `handle` at the first line that
    begins at or after it: (lines skipped, bytes skipped, whether all were counted)."""
    handle.seek(start - 1)
    if handle.read(1) != b"\n":  # the rest of a line begun before `start`: skipped whole, read in bounded pieces
        while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
            pass
    skipped = handle.tell()
    handle.seek(0)
    lines, counted = 0, 0
    while counted < min(skipped, MAX_COUNT):
        chunk = handle.read(min(8 << 20, skipped - counted, MAX_COUNT - counted))
        if not chunk:
            break
        lines += chunk.count(b"\n")
        counted += len(chunk)
    handle.seek(skipped)
    return lines, skipped, counted >= skipped


def _launch(name: str, number: int, raw: bytes) -> tuple[Launch | None, Problem | None]:
    data, problem = json_object(name, number, raw)
    if data is None:
        return None, problem
    launch, why = build(Launch, data, RULES, optional=("job_id",))
    return launch, None if launch is not None else Problem(name, number, why or "not a launch")


def latest_by_folder(launches: list[Launch]) -> list[tuple[Launch, int]]:
    """Each run folder once: its newest launch and how many launches name it, the newest run first."""
    newest: dict[str, Launch] = {}
    counts: dict[str, int] = {}
    for launch in launches:
        counts[launch.folder] = counts.get(launch.folder, 0) + 1
        if launch.folder not in newest or launch.time >= newest[launch.folder].time:
            newest[launch.folder] = launch
    return sorted(((launch, counts[folder]) for folder, launch in newest.items()), key=lambda lc: -lc[0].time)
