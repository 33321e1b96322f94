"""The user's index of the runs they launched: one JSON line per launch, appended when its job has started.

`bsops runs` reads it (views/runs.py) to list each run with where it stands; every launch, on Slurm
or --local, appends to it in one place (launch_plan.execute). The index lives in the user's data
folder, beside the cron chains: $BSOPS_RUNS_INDEX, else $XDG_DATA_HOME/bsops/runs.jsonl, else
~/.local/share/bsops/runs.jsonl.

A line is {"time": epoch seconds, "experiment": name, "folder": the run folder, "job": slurm, local
or resubmission, "job_id": the Slurm job id or the local launch's made-up one}. The file is
untrusted like a run's records (runfiles.py): a torn, huge or hostile line is a Problem, reported
and skipped; the rest is still listed. A launch never fails for the index: the job has started when
the line is written, so a failure to write is returned, never raised.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from bigscience_ops.runfiles import Checked, RecordFileError, append_line, build, check_str, check_time, checked_jsonl

INDEX_ENV = "BSOPS_RUNS_INDEX"
JOBS = ("slurm", "local", "resubmission")
MAX_PATH = 4096
"""The longest run folder an index line may name (PATH_MAX)."""


@dataclass(frozen=True)
class Launch:
    time: float
    experiment: str
    folder: str
    job: str
    job_id: str | None = None


RULES = {
    "time": check_time,
    "experiment": lambda v: check_str(v, 100),
    "folder": lambda v: check_str(v, MAX_PATH) or (None if os.path.isabs(v) else "expected an absolute path"),
    "job": lambda v: check_str(v, 20, choices=JOBS),
    "job_id": lambda v: check_str(v, 100, optional=True),
}


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


def read_index(path: Path | None = None) -> Checked[Launch]:
    """Every launch the index records, in file order, and a problem for each line that is not one."""
    return checked_jsonl(index_path() if path is None else Path(path),
                         lambda data: build(Launch, data, RULES, optional=("job_id",)))


def latest_by_folder(launches: list[Launch]) -> list[tuple[Launch, int]]:
    """Each run folder once: its newest launch and how many launches name it, the newest run first."""
    newest: dict[str, Launch] = {}
    counts: dict[str, int] = {}
    for launch in launches:
        counts[launch.folder] = counts.get(launch.folder, 0) + 1
        if launch.folder not in newest or launch.time >= newest[launch.folder].time:
            newest[launch.folder] = launch
    return sorted(((launch, counts[folder]) for folder, launch in newest.items()), key=lambda lc: -lc[0].time)
