"""Parsers of real Slurm output: squeue's delimited records, durations and time limits, sbatch's answers,
`scontrol --oneliner show job`, sacct. Pure: text in, values out; every line is split on `\n` only."""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bigscience_ops.slurm.errors import SlurmError, SlurmOutputError

_TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (as sbatch --time)"


def parse_time_limit(text: str) -> int:
    """Minutes in a Slurm time limit, rounded up as Slurm does; raises ValueError naming the formats."""
    value = str(text).strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not match:
        raise ValueError(f"time limit {text!r} is not one of {_TIME_FORMATS}")
    days, a, b, c = match.groups()
    if days is not None:
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
    elif c is not None:
        hours, minutes, seconds = int(a), int(b), int(c)
    elif b is not None:
        hours, minutes, seconds = 0, int(a), int(b)
    else:
        hours, minutes, seconds = 0, int(a), 0
    if (days is not None or c is not None) and (minutes > 59 or seconds > 59):
        raise ValueError(f"time limit {text!r}: minutes and seconds must be below 60")
    total = (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)
    if total <= 0:
        raise ValueError(f"time limit {text!r} must be at least one minute")
    return total


SQUEUE_DELIMITER = "\x1f"
"""ASCII unit separator between squeue's fields: no partition, node list or state holds it."""

# (field, squeue --format code). Every field but the name is Slurm's or the admin's (ids, states, node and
# partition names, times); the name is any user's free text, so it comes last, framed by the terminator.
SQUEUE_FIELDS: tuple[tuple[str, str], ...] = (
    ("job_id", "%i"),         # 711114_4, 682842_[1-5%1], 712
    ("array_job_id", "%F"),   # 711114 (the job's own id when not an array)
    ("array_task", "%K"),     # 4, [1-5%1] shown as 1-5%1, N/A
    ("own_id", "%A"),         # the numeric id of this very record
    ("user", "%u"),
    ("state", "%T"),          # RUNNING, PENDING, COMPLETING, ...
    ("reason", "%r"),         # None, Dependency, BeginTime, JobArrayTaskLimit, ...
    ("partition", "%P"),
    ("num_nodes", "%D"),
    ("nodes", "%N"),          # r7i4n[1-7],r8i0n0 ; empty while pending
    ("elapsed", "%M"),        # 18:15:59, 1-02:03:04
    ("time_limit", "%l"),     # 20:00:00, UNLIMITED
    ("start_time", "%S"),     # actual start, or the expected start of a pending job, or N/A
    ("submit_time", "%V"),
    ("dependency", "%E"),     # afterany:1_*(unfulfilled), (null)
    ("name", "%j"),
)


def new_terminator() -> str:
    """A fresh random record terminator for one squeue query (128 bits, hex)."""
    return secrets.token_hex(16)


def squeue_format(terminator: str) -> str:
    """squeue's --format for SQUEUE_FIELDS, each record ended by DELIMITER + `terminator`.

    Slurm accepts any text in a job name, a real newline included, and squeue prints it raw: a name
    such as `x\\n<16 forged fields>` would read as a second job if records were lines. Records therefore
    end with a random terminator chosen per query and passed in squeue's environment (SQUEUE_FORMAT),
    which other users cannot read, unlike its argv: no name can contain it, so no name can end a
    record or start one, and the name (the last field) is read exactly, whatever it holds."""
    if not re.fullmatch(r"[0-9a-f]{16,}", terminator):
        raise ValueError(f"squeue terminator must be at least 16 lowercase hex digits; got {terminator!r}")
    return SQUEUE_DELIMITER.join([*(code for _, code in SQUEUE_FIELDS), terminator])


@dataclass(frozen=True)
class Job:
    """One line of squeue: a job, an array task, or the pending rest of an array (`682842_[2-5%1]`)."""

    job_id: str
    """The id as Slurm prints it: 712, 711114_4, 682842_[2-5%1]."""
    array_job_id: str
    """The whole array's id (a plain job's own id): what a dependency must name."""
    array_task: str | None
    """The task index or pending range (`4`, `2-5%1`); None for a plain job."""
    name: str
    user: str
    state: str
    reason: str
    """Why it is pending (`Dependency`, `BeginTime`, ...); `None` when running."""
    partition: str
    num_nodes: int
    nodes: str
    """Node list in Slurm's compressed form (`r7i4n[1-7],r8i0n0`); empty while pending."""
    elapsed_s: int
    time_limit_min: int | None
    """None when UNLIMITED."""
    start_time: datetime | None
    """Start of a running job; the scheduler's expected start of a pending one; None if unknown."""
    submit_time: datetime | None
    dependency: str | None
    """Remaining dependency as squeue prints it (`afterany:682842_*(unfulfilled)`), None if none."""

    @property
    def is_array(self) -> bool:
        return self.array_task is not None


# Pending reasons that will not clear on their own: a person has to act (release, cancel, fix).
NEVER_STARTS = frozenset({
    "DependencyNeverSatisfied", "JobHeldAdmin", "JobHeldUser", "PartitionDown", "PartitionInactive",
    "BadConstraints", "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
    "PartitionNodeLimit", "PartitionTimeLimit",
})
# Pending reasons (squeue's %r, as Slurm 22.05 prints them: tests/assets/slurm/squeue-drained.txt) of nodes an
# administrator must bring back: down, drained, reserved (maintenance) or otherwise not available. A task waits on
# them for as long as they stay so; no waiting clears them. Matched at the start of the reason, which may go on
# with the nodes (`ReqNodeNotAvail, UnavailableNodes:n[1-2]`). PartitionDown and PartitionInactive are NEVER_STARTS.
BLOCKED_REASONS = (
    "ReqNodeNotAvail",  # ", UnavailableNodes:n1" or ", Reserved for maintenance"
    "Nodes required for job are DOWN, DRAINED",  # "... or reserved for jobs in higher priority partitions"
    "NodeDown",
    "FrontEndDown",
)


def blocked(reason: str) -> bool:
    """Whether a pending job's reason is one of BLOCKED_REASONS: nodes that only an administrator brings back."""
    return reason.startswith(BLOCKED_REASONS)


ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"})
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "RESIZING"})
QUEUED_STATES = ACTIVE_STATES | WAITING_STATES  # a job in any of these still holds its place in the queue


class Jobs(list):
    """squeue's jobs, and `unparsed`: the jobs set aside. Any user names their jobs, and a name may hold line
    breaks or anything else: such a job is skipped and counted, so one hostile name never hides the rest of
    the queue (a name can only be the last field, framed by the terminator: it never breaks a record)."""

    def __init__(self, jobs: Sequence[Job] = (), unparsed: Sequence[str] = ()) -> None:
        super().__init__(jobs)
        self.unparsed: tuple[str, ...] = tuple(unparsed)


_HOSTILE_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
"""Control characters, Unicode line breaks and bytes that were not text (surrogate escapes): in no name bsops
gives a job (config refuses them)."""


def parse_squeue(text: str, terminator: str) -> Jobs:
    """Parse squeue's output for `squeue_format(terminator)`. Records are split on the terminator, never
    on line breaks, so a job name holding `\\n`, U+2028 or a whole forged record stays inside its own
    job's record. A job whose name holds a control character or a line break (no job of bsops has one)
    goes to `Jobs.unparsed` and the others are kept.

    Everything before a name is Slurm's own text (ids, states, times, partitions), so a record whose fields
    do not parse, or text that is not a whole record (a cut answer, a header, a wrapper's own output, a
    missing terminator), means the output is not squeue's as asked: SlurmOutputError, the queue is unknown.
    Reading such output as "these jobs, and no other" would tell the on-call person a running training is gone."""
    end = SQUEUE_DELIMITER + terminator + "\n"
    *records, rest = text.split(end)
    jobs, unparsed = [], []
    for number, record in enumerate(records, start=1):
        try:
            job = _squeue_job(record)
        except ValueError as exc:
            raise SlurmOutputError("squeue", f"record {number} of {len(records)}: {exc}", record) from None
        if _HOSTILE_NAME.search(job.name):
            unparsed.append(f"job {job.job_id} of {job.user} named {job.name}")
        else:
            jobs.append(job)
    if rest.strip():
        where = f"after record {len(records)}" if records else "and no record at all"
        raise SlurmOutputError("squeue", f"{len(rest)} characters {where} do not end with this query's "
                                         "record terminator: the answer was cut, or it is not squeue's", rest)
    return Jobs(jobs, unparsed)


_PREFIX = {  # what Slurm prints in each field before the name; anything else is not squeue's record
    "job_id": re.compile(r"\d+(?:_(?:\d+|\[[\d,%\-]+\])|\+\d+)?"), "array_job_id": re.compile(r"\d+"),
    "array_task": re.compile(r"N/A|[\d,%\-]+"), "own_id": re.compile(r"\d+"),
    "state": re.compile(r"[A-Z_]+"), "num_nodes": re.compile(r"\d+"),
}


_OVER_A_YEAR = "INVALID"
"""What squeue prints for a duration below zero or above a year (its _print_secs): a time limit of more than a
year is kept as no limit (None), such an elapsed time as 0."""


def _squeue_job(record: str) -> Job:
    """One record; ValueError naming the field that is not what squeue prints there."""
    parts = record.split(SQUEUE_DELIMITER, len(SQUEUE_FIELDS) - 1)
    if len(parts) != len(SQUEUE_FIELDS):
        raise ValueError(f"{len(parts)} fields, expected {len(SQUEUE_FIELDS)} separated by {SQUEUE_DELIMITER!r}")
    f = dict(zip((name for name, _ in SQUEUE_FIELDS), parts))
    for key, _ in SQUEUE_FIELDS[:-1]:
        pattern = _PREFIX.get(key)
        if "\n" in f[key] or (pattern is not None and not pattern.fullmatch(f[key])):
            raise ValueError(f"field {key} is {f[key][:80]!r}, not what squeue prints there")
    try:
        return Job(
            job_id=f["job_id"], array_job_id=f["array_job_id"],
            array_task=None if f["array_task"] in ("N/A", "") else f["array_task"],
            name=f["name"], user=f["user"], state=f["state"], reason=f["reason"],
            partition=f["partition"], num_nodes=int(f["num_nodes"]), nodes=f["nodes"],
            elapsed_s=0 if f["elapsed"] == _OVER_A_YEAR else parse_duration(f["elapsed"]),
            time_limit_min=None if f["time_limit"] in ("UNLIMITED", "INFINITE", "NOT_SET", _OVER_A_YEAR)
            else parse_time_limit(f["time_limit"]),
            start_time=parse_timestamp(f["start_time"]), submit_time=parse_timestamp(f["submit_time"]),
            dependency=None if f["dependency"] in ("(null)", "") else f["dependency"],
        )
    except ValueError as exc:
        raise ValueError(f"job {f['job_id']}: {exc}") from None


def unparsed_note(jobs: Sequence[Job]) -> str | None:
    """'2 squeue entries did not parse and were skipped: ...' for a Jobs with jobs set aside (hostile names), else
    None."""
    unparsed = getattr(jobs, "unparsed", ())
    if not unparsed:
        return None
    shown = "; ".join(repr(line[:80]) for line in unparsed[:3])
    counted = "1 squeue entry did not parse and was" if len(unparsed) == 1 else \
        f"{len(unparsed)} squeue entries did not parse and were"
    return f"{counted} skipped: {shown}"


def parse_duration(text: str) -> int:
    """Seconds in a squeue/scontrol duration: `0:05`, `18:15:59`, `1-02:03:04`."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not match:
        raise ValueError(f"duration {text!r} is not [D-][HH:]MM:SS")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_duration(seconds: float) -> str:
    """Slurm's way of writing a duration: `18:15:59`, `1-02:03:04` (negative values clamp to 0)."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}" if days else clock


def parse_timestamp(text: str) -> datetime | None:
    """A Slurm local time `2021-08-16T03:52:02`; None for N/A, Unknown, None."""
    value = text.strip()
    if value in ("N/A", "Unknown", "None", "(null)", ""):
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")


def parse_sbatch_parsable(stdout: str) -> str:
    """The job id from `sbatch --parsable` (`712` or `712;cluster`)."""
    first = stdout.strip().split("\n")[0].strip() if stdout.strip() else ""
    job_id = first.split(";", 1)[0]
    if not re.fullmatch(r"\d+", job_id):
        raise SlurmError(f"sbatch --parsable answered {stdout!r}; expected a job id such as '712'")
    return job_id


@dataclass(frozen=True)
class TestOnlyAnswer:
    """What `sbatch --test-only` predicts."""

    job_id: str
    start_time: datetime
    processors: int
    nodes: str
    partition: str


def parse_sbatch_test_only(stderr: str) -> TestOnlyAnswer:
    """Parse `sbatch: Job 6 to start at 2026-11-22T03:46:42 using 1 processors on nodes vm in partition p`."""
    match = re.search(r"Job (\d+) to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)",
                      stderr)
    if not match:
        raise SlurmError(f"sbatch --test-only answered {stderr.strip()!r}; expected "
                         f"'Job N to start at T using P processors on nodes L in partition P'")
    job_id, start, procs, nodes, partition = match.groups()
    when = parse_timestamp(start)
    if when is None:
        raise SlurmError(f"sbatch --test-only gave no start time: {stderr.strip()!r}")
    return TestOnlyAnswer(job_id, when, int(procs), nodes, partition)


_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=")


def parse_scontrol_show_job(text: str) -> list[dict[str, str]]:
    """`scontrol --oneliner show job` output -> one dict per job line (values may contain spaces)."""
    records = []
    for line in text.split("\n"):  # not splitlines(): a job name may hold U+2028 or U+001E
        if not line.strip():
            continue
        keys = list(_KEY.finditer(line))
        if not keys or keys[0].group(1) != "JobId":
            raise SlurmError(f"scontrol show job line does not start with JobId=: {line[:200]!r}")
        record = {}
        for i, match in enumerate(keys):
            end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
            record[match.group(1)] = line[match.end():end].strip()
        records.append(record)
    return records


@dataclass(frozen=True)
class SacctRecord:
    """One line of `sacct_argv()`'s output: a job (or array task) or one of its steps (`100_3.batch`)."""

    job_id: str
    state: str
    """COMPLETED, FAILED, TIMEOUT, CANCELLED, OUT_OF_MEMORY, NODE_FAIL, ..."""
    exit_code: str
    """`code:signal` as sacct prints it (`0:15`)."""


def parse_sacct(text: str) -> list[SacctRecord]:
    """Parse `sacct --parsable2` output of JobID, State, ExitCode; lines of another shape are skipped."""
    records = []
    for line in text.split("\n"):
        parts = line.split("|")
        if len(parts) == 3:
            records.append(SacctRecord(*parts))
    return records


ENFORCING = {"associations", "limits", "qos", "safe", "wckeys"}  # each implies associations (slurm.conf(5))


def has_default_partition(sinfo_stdout: str) -> bool:
    """Whether `sinfo --noheader --format=%P` marks a default partition (`name*`)."""
    return any(line.strip().endswith("*") for line in sinfo_stdout.split("\n"))


def enforces_accounts(config_stdout: str) -> bool:
    """Whether `scontrol show config` says jobs need an association (an account): AccountingStorageEnforce."""
    for line in config_stdout.split("\n"):
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageEnforce":
            return bool(ENFORCING & {v.strip().lower() for v in value.split(",")})
    return False
