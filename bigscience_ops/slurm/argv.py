"""Slurm command lines: squeue, sbatch, scontrol, sacct, scancel argv builders, each value checked."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bigscience_ops.slurm.output import parse_time_limit, squeue_format


def squeue_argv(*, users: Sequence[str] = (), name: str | None = None,
                job_ids: Sequence[str] = ()) -> list[str]:
    """One headerless squeue query; its format comes from `squeue_env()`, never from argv (which any
    user reads in /proc), so the record terminator stays secret."""
    argv = ["squeue", "--noheader"]
    if users:
        argv.append("--user=" + ",".join(_checked_list("users", users)))
    if name is not None:
        argv.append("--name=" + checked_item("name", name))
    if job_ids:
        argv.append("--jobs=" + ",".join(_checked_list("job_ids", job_ids)))
    return argv


def squeue_env(terminator: str) -> dict[str, str]:
    """The environment that gives squeue_argv() its format: SQUEUE_FORMAT, records ended by `terminator`
    (delimited fields, so long names are never cut to a column width)."""
    return {"SQUEUE_FORMAT": squeue_format(terminator)}


@dataclass(frozen=True)
class SbatchOptions:
    """What an sbatch command line asks beyond the script's own #SBATCH lines (each checked by sbatch_argv)."""

    job_name: str | None = None
    array_tasks: int | None = None
    """`--array=1-N%1`: N tasks, one at a time."""
    after_any: Sequence[str] = ()
    """Whole job ids to wait for (afterany). An array task id such as 711114_4 is refused: a dependency on one
    task lets the rest of the old array overlap the new one; pass 711114."""
    after_ok: Sequence[str] = ()
    begin: str | None = None
    """sbatch's --begin (begin_arg makes one from a datetime)."""
    partition: str | None = None
    time_limit: str | None = None
    exclude: Sequence[str] = ()
    hold: bool = False
    test_only: bool = False
    """`--test-only`: Slurm says when the job would start and submits nothing (no --parsable)."""
    extra: Sequence[str] = ()
    """Further options, passed as they are, before the script."""


def sbatch_argv(script: str | os.PathLike[str], options: SbatchOptions = SbatchOptions(),
                script_args: Sequence[str] = ()) -> list[str]:
    """sbatch argv: the options (each value checked), --parsable (unless a test only), the script, its args."""
    o = options
    argv = ["sbatch"] if o.test_only else ["sbatch", "--parsable"]
    if o.test_only:
        argv.append("--test-only")
    if o.job_name is not None:
        argv.append("--job-name=" + checked_item("job_name", o.job_name, comma=True))
    if o.array_tasks is not None:
        if isinstance(o.array_tasks, bool) or not isinstance(o.array_tasks, int) or o.array_tasks < 1:
            raise ValueError(f"array_tasks must be a whole number >= 1; got {o.array_tasks!r}")
        argv.append(f"--array=1-{o.array_tasks}%1")
    deps = [f"afterany:{':'.join(_whole_job_ids('after_any', o.after_any))}"] if o.after_any else []
    deps += [f"afterok:{':'.join(_whole_job_ids('after_ok', o.after_ok))}"] if o.after_ok else []
    if deps:
        argv.append("--dependency=" + ",".join(deps))
    if o.begin is not None:
        argv.append("--begin=" + checked_item("begin", o.begin))
    if o.partition is not None:
        argv.append("--partition=" + checked_item("partition", o.partition))
    if o.time_limit is not None:
        parse_time_limit(o.time_limit)
        argv.append(f"--time={o.time_limit}")
    if o.exclude:
        argv.append("--exclude=" + ",".join(_checked_list("exclude", o.exclude)))
    if o.hold:
        argv.append("--hold")
    argv += [str(a) for a in o.extra]
    argv.append(os.fspath(script))
    argv += [str(a) for a in script_args]
    return argv


def begin_arg(when: datetime) -> str:
    """sbatch --begin takes local wall-clock time."""
    return when.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def sinfo_partitions_argv() -> list[str]:
    """`sinfo --noheader --format=%P`: one partition a line, the default one marked `name*`."""
    return ["sinfo", "--noheader", "--format=%P"]


def scontrol_show_config_argv() -> list[str]:
    """`scontrol show config`: the controller's settings, `Key = value` a line."""
    return ["scontrol", "show", "config"]


def scontrol_show_job_argv(job_id: str) -> list[str]:
    """`scontrol --oneliner show job ID`: one line of Key=Value per job (per task for arrays)."""
    return ["scontrol", "--oneliner", "show", "job", checked_item("job_id", job_id)]


def sacct_argv(job_id: str) -> list[str]:
    """`sacct` for one job's accounting: JobID, State and ExitCode of the job and its steps, '|' between."""
    return ["sacct", "--noheader", "--parsable2", "--format=JobID,State,ExitCode", f"--jobs={job_id}"]


def scancel_argv(job_ids: Sequence[str], *, signal: str | None = None, batch_only: bool = False) -> list[str]:
    """scancel argv; with `signal` it only signals (e.g. USR1 to the batch shell with batch_only)."""
    if not job_ids:
        raise ValueError("scancel needs at least one job id; got none")
    argv = ["scancel"]
    if signal is not None:
        argv.append("--signal=" + checked_item("signal", signal))
    if batch_only:
        argv.append("--batch")
    return argv + _checked_list("job_ids", job_ids)


def checked_item(what: str, value: str, *, comma: bool = False) -> str:
    """One option value: non-empty, one line, and without ',' where Slurm would read a list."""
    text = str(value)
    if not text or "\n" in text or ("," in text and not comma):
        banned = "newlines" if comma else "',' or newlines"
        raise ValueError(f"{what} must be a non-empty single value without {banned}; got {value!r}")
    return text


def _checked_list(what: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str):
        raise ValueError(f"{what} must be a list of values, not the string {values!r}")
    return [checked_item(what, v) for v in values]


def _whole_job_ids(what: str, ids: Sequence[str]) -> list[str]:
    out = []
    for job_id in _checked_list(what, ids):
        if not re.fullmatch(r"\d+", job_id):
            whole = job_id.split("_", 1)[0]
            raise ValueError(
                f"{what}: {job_id!r} is not a whole job id; a dependency on one array task lets the rest "
                f"of that array overlap the new job. Use the array's id (e.g. {whole!r}).")
        out.append(job_id)
    return out
