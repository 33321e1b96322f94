"""All Slurm knowledge: argv builders, parsers of real tool output, and the one place that runs Slurm commands."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bigscience_ops.errors import BsopsError

_TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (as sbatch --time)"


class SlurmError(BsopsError):
    """A Slurm command failed or answered something unparseable."""


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


# --- running commands ----------------------------------------------------------------------------

DEFAULT_TIMEOUT_S = 60.0
"""Slurm clients retry an absent controller for about a minute; a hung one must not hang a cron job."""


class SlurmCommandError(SlurmError):
    """A Slurm command exited non-zero, timed out, or could not be started: carries argv, code, stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, problem: str) -> None:
        self.argv, self.returncode, self.stderr = list(argv), returncode, stderr
        # Unprintable characters (the squeue delimiter) are shown escaped, the rest shell-quoted.
        command = " ".join(shlex.quote(a) if a.isprintable() else repr(a) for a in self.argv)
        detail = stderr.strip() or "(no output on stderr)"
        super().__init__(f"`{command}` {problem}: {detail}")


# Environment variables through which a user's shell changes what Slurm's clients print or select:
# output formats, sort orders, default filters, time format, interactive prompts. bsops parses the
# output, so it never lets them through.
_USER_OUTPUT_PREFIXES = ("SQUEUE_", "SINFO_", "SACCT_", "SCONTROL_", "SCANCEL_", "SPRIO_", "SSHARE_", "SDIAG_")
_USER_OUTPUT_VARIABLES = frozenset({"SLURM_TIME_FORMAT", "SLURM_BITSTR_LEN", "SLURM_CLUSTERS"})
PINNED_ENV = {"SLURM_TIME_FORMAT": "standard"}
"""What every Slurm command runs with: ISO timestamps (`2021-08-16T03:52:02`), as the parsers read."""


def pinned_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) without the variables that change Slurm's output, plus PINNED_ENV."""
    source = os.environ if env is None else env
    clean = {k: v for k, v in source.items()
             if not k.startswith(_USER_OUTPUT_PREFIXES) and k not in _USER_OUTPUT_VARIABLES}
    return {**clean, **PINNED_ENV}


def run(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S, env: Mapping[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command with a pinned environment (`pinned_env(env)`); with run_unchecked, the only
    place in bsops that does. Raises SlurmCommandError on failure."""
    argv = [str(a) for a in argv]
    if not argv or argv[0] not in _COMMANDS:
        raise ValueError(f"slurm.run runs only {', '.join(sorted(_COMMANDS))}; got argv {argv!r}")
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=pinned_env(env),
                              stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError as exc:
        raise SlurmCommandError(argv, None, str(exc),
                                f"could not start: {argv[0]} is not on PATH (install the Slurm client "
                                f"or run scripts/slurm-up.sh)") from exc
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise SlurmCommandError(argv, None, stderr,
                                f"did not answer within {timeout:g} s (is slurmctld reachable?)") from exc
    if proc.returncode != 0:
        raise SlurmCommandError(argv, proc.returncode, proc.stderr, f"exited with code {proc.returncode}")
    return proc


def run_unchecked(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S, env: Mapping[str, str] | None = None,
                  input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one Slurm client whose exit code and output the caller reads (`scrontab -l` exits 1 when
    the user has no crontab), with a pinned environment and `input` on stdin. argv[0] may be the
    client's path (`shutil.which`'s answer). Raises SlurmCommandError only when it cannot run:
    it does not start, or does not answer within `timeout`."""
    argv = [str(a) for a in argv]
    if not argv or Path(argv[0]).name not in _COMMANDS:
        raise ValueError(f"slurm.run_unchecked runs only {', '.join(sorted(_COMMANDS))}; got argv {argv!r}")
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    stdin = subprocess.DEVNULL if input is None else None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=pinned_env(env),
                              input=input, stdin=stdin, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmCommandError(argv, None, str(exc), "could not run") from exc


_COMMANDS = frozenset({"sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct", "srun", "scrontab"})


# --- argv builders -------------------------------------------------------------------------------

SQUEUE_DELIMITER = "\x1f"
"""ASCII unit separator: no job name, partition or node list contains it, unlike spaces or '|'."""

# (field, squeue --format code). The name is last so that even a name containing the delimiter parses.
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
SQUEUE_FORMAT = SQUEUE_DELIMITER.join(code for _, code in SQUEUE_FIELDS)


def squeue_argv(*, users: Sequence[str] = (), name: str | None = None,
                job_ids: Sequence[str] = ()) -> list[str]:
    """One squeue query, delimited and headerless, so long names are never cut to a column width."""
    argv = ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}"]
    if users:
        argv.append("--user=" + ",".join(_checked_list("users", users)))
    if name is not None:
        argv.append("--name=" + _checked_item("name", name))
    if job_ids:
        argv.append("--jobs=" + ",".join(_checked_list("job_ids", job_ids)))
    return argv


def sbatch_argv(script: str | os.PathLike[str], *, job_name: str | None = None,
                array_tasks: int | None = None, after_any: Sequence[str] = (),
                after_ok: Sequence[str] = (), begin: str | None = None,
                partition: str | None = None, time_limit: str | None = None,
                exclude: Sequence[str] = (), hold: bool = False, test_only: bool = False,
                extra: Sequence[str] = (), script_args: Sequence[str] = ()) -> list[str]:
    """sbatch argv: `--array=1-N%1` (one task at a time), dependencies on whole jobs, --parsable.

    `after_any`/`after_ok` take job ids; an array task id such as 711114_4 is refused, because a
    dependency on one task lets the rest of the old array overlap the new one: pass 711114.
    """
    argv = ["sbatch"] if test_only else ["sbatch", "--parsable"]
    if test_only:
        argv.append("--test-only")
    if job_name is not None:
        argv.append("--job-name=" + _checked_item("job_name", job_name, comma=True))
    if array_tasks is not None:
        if isinstance(array_tasks, bool) or not isinstance(array_tasks, int) or array_tasks < 1:
            raise ValueError(f"array_tasks must be a whole number >= 1; got {array_tasks!r}")
        argv.append(f"--array=1-{array_tasks}%1")
    deps = [f"afterany:{':'.join(_whole_job_ids('after_any', after_any))}"] if after_any else []
    deps += [f"afterok:{':'.join(_whole_job_ids('after_ok', after_ok))}"] if after_ok else []
    if deps:
        argv.append("--dependency=" + ",".join(deps))
    if begin is not None:
        argv.append("--begin=" + _checked_item("begin", begin))
    if partition is not None:
        argv.append("--partition=" + _checked_item("partition", partition))
    if time_limit is not None:
        parse_time_limit(time_limit)
        argv.append(f"--time={time_limit}")
    if exclude:
        argv.append("--exclude=" + ",".join(_checked_list("exclude", exclude)))
    if hold:
        argv.append("--hold")
    argv += [str(a) for a in extra]
    argv.append(os.fspath(script))
    argv += [str(a) for a in script_args]
    return argv


def begin_arg(when: datetime) -> str:
    """sbatch --begin takes local wall-clock time."""
    return when.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def scontrol_show_job_argv(job_id: str) -> list[str]:
    """`scontrol --oneliner show job ID`: one line of Key=Value per job (per task for arrays)."""
    return ["scontrol", "--oneliner", "show", "job", _checked_item("job_id", job_id)]


def sacct_argv(job_id: str) -> list[str]:
    """`sacct` for one job's accounting: JobID, State and ExitCode of the job and its steps, '|' between."""
    return ["sacct", "--noheader", "--parsable2", "--format=JobID,State,ExitCode", f"--jobs={job_id}"]


def scancel_argv(job_ids: Sequence[str], *, signal: str | None = None, batch_only: bool = False) -> list[str]:
    """scancel argv; with `signal` it only signals (e.g. USR1 to the batch shell with batch_only)."""
    if not job_ids:
        raise ValueError("scancel needs at least one job id; got none")
    argv = ["scancel"]
    if signal is not None:
        argv.append("--signal=" + _checked_item("signal", signal))
    if batch_only:
        argv.append("--batch")
    return argv + _checked_list("job_ids", job_ids)


def _checked_item(what: str, value: str, *, comma: bool = False) -> str:
    """One option value: non-empty, one line, and without ',' where Slurm would read a list."""
    text = str(value)
    if not text or "\n" in text or ("," in text and not comma):
        banned = "newlines" if comma else "',' or newlines"
        raise ValueError(f"{what} must be a non-empty single value without {banned}; got {value!r}")
    return text


def _checked_list(what: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str):
        raise ValueError(f"{what} must be a list of values, not the string {values!r}")
    return [_checked_item(what, v) for v in values]


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


# --- parsers of real output ----------------------------------------------------------------------

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
ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"})
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "RESIZING"})
QUEUED_STATES = ACTIVE_STATES | WAITING_STATES  # a job in any of these still holds its place in the queue


class Jobs(list):
    """squeue's jobs, and `unparsed`: the lines that did not parse. Any user names their jobs, and a
    name may hold line breaks or anything else: such a line is skipped and counted, so one hostile
    entry never hides the rest of the queue."""

    def __init__(self, jobs: Sequence[Job] = (), unparsed: Sequence[str] = ()) -> None:
        super().__init__(jobs)
        self.unparsed: tuple[str, ...] = tuple(unparsed)


def parse_squeue(text: str) -> Jobs:
    """Parse the output of `squeue_argv()`, split on `\\n` only (a job name may hold U+2028, U+0085 or
    U+001E, where str.splitlines() would break); a line that does not fit goes to `Jobs.unparsed`."""
    jobs, unparsed = [], []
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            jobs.append(_squeue_job(line))
        except ValueError:
            unparsed.append(line)
    return Jobs(jobs, unparsed)


def _squeue_job(line: str) -> Job:
    parts = line.split(SQUEUE_DELIMITER, len(SQUEUE_FIELDS) - 1)
    if len(parts) != len(SQUEUE_FIELDS):
        raise ValueError(f"{len(parts)} fields, expected {len(SQUEUE_FIELDS)} separated by {SQUEUE_DELIMITER!r}")
    f = dict(zip((name for name, _ in SQUEUE_FIELDS), parts))
    return Job(
        job_id=f["job_id"], array_job_id=f["array_job_id"],
        array_task=None if f["array_task"] in ("N/A", "") else f["array_task"],
        name=f["name"], user=f["user"], state=f["state"], reason=f["reason"],
        partition=f["partition"], num_nodes=int(f["num_nodes"]), nodes=f["nodes"],
        elapsed_s=parse_duration(f["elapsed"]),
        time_limit_min=None if f["time_limit"] in ("UNLIMITED", "INFINITE", "NOT_SET")
        else parse_time_limit(f["time_limit"]),
        start_time=parse_timestamp(f["start_time"]), submit_time=parse_timestamp(f["submit_time"]),
        dependency=None if f["dependency"] in ("(null)", "") else f["dependency"],
    )


def unparsed_note(jobs: Sequence[Job]) -> str | None:
    """'2 queue entries did not parse and were skipped: ...' for a Jobs with unparsed lines, else None."""
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


# --- sbatch's #SBATCH reader ---------------------------------------------------------------------
#
# sbatch reads the `#SBATCH` lines of a script with its own parser (src/sbatch/opt.c), not bash's:
# words split on whitespace, '...' and "..." group, a backslash escapes the next character even
# inside quotes, an unquoted `#` ends the line, and a quote left open is a fatal error. bsops
# writes every #SBATCH value with `sbatch_quote` and reads job names back with the same rules;
# tests/test_cluster_sbatch_parser.py holds both against `sbatch -vv`.

_SBATCH_PLAIN = re.compile(r"[A-Za-z0-9._@+,:/%=&|*\[\]()-]+")
SBATCH_PREFIX = "#SBATCH"


def sbatch_quote(value: object) -> str:
    """`value` written for an `#SBATCH --opt=VALUE` line so that sbatch's parser reads back exactly it:
    bare when it holds nothing the parser treats specially, else in single quotes with `\\` and `'`
    escaped by a backslash. Raises ValueError for a value the line cannot hold (empty, or a line break
    or other control character)."""
    text = str(value)
    bad = re.search(r"[\x00-\x1f\x7f\x85\u2028\u2029]", text)
    if not text or bad:
        what = "it is empty" if not text else f"U+{ord(bad.group()):04X} at position {bad.start()}"
        raise ValueError(f"{text!r} cannot be an #SBATCH value: {what}; allowed: one line of printable text")
    if _SBATCH_PLAIN.fullmatch(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sbatch_words(text: str) -> list[str]:
    """The words sbatch's parser makes of what follows `#SBATCH` on one line; ValueError on an open quote."""
    words: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos >= end:
            return words
        word: list[str] = []
        quote, escaped = "", False
        while pos < end and (quote or not text[pos].isspace()):
            char = text[pos]
            pos += 1
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                continue
            elif quote:
                if char == quote:
                    quote = ""
                    continue
            elif char in "'\"":
                quote = char
                continue
            elif char == "#":  # the rest of the line is a comment
                return words + ["".join(word)] if word else words
            word.append(char)
        if quote:
            raise ValueError(f"unmatched {quote} in {text.strip()!r} (sbatch refuses the script)")
        words.append("".join(word))


def script_options(script: Path) -> list[str]:
    """The words of a job script's #SBATCH lines, read up to its first command as sbatch does.
    Raises ValueError where sbatch would refuse a line (an open quote), OSError where the file cannot be read."""
    words = []
    for line in script.read_text(encoding="utf-8", errors="replace").split("\n"):
        if line.startswith(SBATCH_PREFIX):
            words += sbatch_words(line[len(SBATCH_PREFIX):])
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return words


def script_job_name(script: Path) -> str:
    """The --job-name (or -J) of a job script's #SBATCH lines as sbatch reads it (the last one wins);
    the file's stem without one. Raises ValueError where sbatch would refuse the script's options."""
    words, name = script_options(script), None
    for i, word in enumerate(words):
        if word.startswith("--job-name="):
            name = word.removeprefix("--job-name=")
        elif word in ("--job-name", "-J") and i + 1 < len(words):
            name = words[i + 1]
        elif word.startswith("-J") and word != "-J":
            name = word[2:]
    return name if name else script.stem


def output_path(folder: str | os.PathLike[str], pattern: str) -> str:
    """`folder/pattern` for --output: a `%` of the folder doubled, so Slurm's %-patterns expand only in
    `pattern`. Raises ValueError for a backslash, which turns the patterns off and is dropped by Slurm."""
    text = os.fspath(folder)
    if "\\" in text:
        raise ValueError(f"--output folder {text!r} holds a backslash: Slurm drops it and stops expanding "
                         f"{pattern!r}; allowed: a folder path without backslash")
    return text.replace("%", "%%") + "/" + pattern


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


# --- a task's environment ------------------------------------------------------------------------

LOCAL_LAUNCH = "BSOPS_LOCAL_LAUNCH"
"""Set by `bsops launch --local`, which emulates a task's SLURM_* variables with made-up ids."""


@dataclass(frozen=True)
class TaskEnv:
    """What Slurm tells a job's batch script (and what it runs) through its SLURM_* variables, read
    once by from_env(). A value is None where its variable is unset (outside Slurm), else as Slurm wrote it."""

    job_id: str | None = None
    """SLURM_JOB_ID: this job's own id (an array task's own number, not ARRAY_TASK)."""
    array_job_id: str | None = None
    """SLURM_ARRAY_JOB_ID: the whole array's id, what scancel and dependencies name."""
    array_task_id: str | None = None
    """SLURM_ARRAY_TASK_ID: this task's index in the array."""
    array_task_max: str | None = None
    """SLURM_ARRAY_TASK_MAX: the array's last index."""
    node_list: str = ""
    """SLURM_JOB_NODELIST in Slurm's compressed form (`r7i4n[1-7],r8i0n0`); empty outside a job."""
    num_nodes: int | None = None
    """SLURM_JOB_NUM_NODES, else SLURM_NNODES, the first that is a whole number (decimal digits)."""
    local: bool = False
    """The ids are made up (LOCAL_LAUNCH is set): nothing may scancel them on a real cluster."""
    array_task_min: str | None = None
    """SLURM_ARRAY_TASK_MIN: the array's first index."""
    job_name: str | None = None
    """SLURM_JOB_NAME: the job's --job-name."""
    submit_dir: str | None = None
    """SLURM_SUBMIT_DIR: the folder sbatch ran in, where the job starts."""
    cpus_per_task: str | None = None
    """SLURM_CPUS_PER_TASK: the job's --cpus-per-task."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TaskEnv:
        """The task environment in `env` (default: this process's)."""
        env = os.environ if env is None else env
        counts = (env.get(key, "").strip() for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"))
        return cls(job_id=env.get("SLURM_JOB_ID"), array_job_id=env.get("SLURM_ARRAY_JOB_ID"),
                   array_task_id=env.get("SLURM_ARRAY_TASK_ID"), array_task_max=env.get("SLURM_ARRAY_TASK_MAX"),
                   node_list=env.get("SLURM_JOB_NODELIST", ""),
                   num_nodes=next((int(count) for count in counts if count.isdecimal()), None),
                   local=bool(env.get(LOCAL_LAUNCH)), array_task_min=env.get("SLURM_ARRAY_TASK_MIN"),
                   job_name=env.get("SLURM_JOB_NAME"), submit_dir=env.get("SLURM_SUBMIT_DIR"),
                   cpus_per_task=env.get("SLURM_CPUS_PER_TASK"))

    def to_env(self) -> dict[str, str]:
        """The SLURM_* variables Slurm would set for this task (what a local launch emulates); from_env reads
        them back to an equal TaskEnv."""
        values = {"SLURM_JOB_ID": self.job_id, "SLURM_ARRAY_JOB_ID": self.array_job_id,
                  "SLURM_ARRAY_TASK_ID": self.array_task_id, "SLURM_ARRAY_TASK_MIN": self.array_task_min,
                  "SLURM_ARRAY_TASK_MAX": self.array_task_max, "SLURM_JOB_NODELIST": self.node_list or None,
                  "SLURM_JOB_NAME": self.job_name, "SLURM_SUBMIT_DIR": self.submit_dir,
                  "SLURM_CPUS_PER_TASK": self.cpus_per_task}
        if self.num_nodes is not None:
            values["SLURM_JOB_NUM_NODES"] = values["SLURM_NNODES"] = str(self.num_nodes)
        if self.local:
            values[LOCAL_LAUNCH] = "1"
        return {key: value for key, value in values.items() if value is not None}

    @property
    def task_id(self) -> str | None:
        """The task as squeue names it: `ARRAY_TASK` in an array, else the job's id; None outside Slurm."""
        if self.array_job_id:
            return f"{self.array_job_id}_{self.array_task_id or ''}"
        return self.job_id


# --- queries -------------------------------------------------------------------------------------

GETENT_TIMEOUT_S = 30.0


def _getent(database: str, *keys: str, timeout: float = GETENT_TIMEOUT_S) -> list[list[str]]:
    """`getent DATABASE [KEY]` as split records; [] when the key is unknown (exit code 2)."""
    argv = ["getent", database, *keys]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmCommandError(argv, None, str(exc), "could not run (is getent on PATH, is NSS answering?)") from exc
    if proc.returncode == 2:
        return []
    if proc.returncode != 0:
        raise SlurmCommandError(argv, proc.returncode, proc.stderr, f"exited with code {proc.returncode}")
    return [line.split(":") for line in proc.stdout.split("\n") if line.strip()]


def group_users(group: str, timeout: float = GETENT_TIMEOUT_S) -> list[str]:
    """Users of a Unix group, for squeue --user: its members from `getent group NAME` (answered by
    NSS, also where SSSD does not enumerate), and the users whose primary group it is among those
    `getent passwd` lists (where enumeration is off, the local ones)."""
    entries = [e for e in _getent("group", _checked_item("group", group), timeout=timeout) if len(e) >= 4]
    if not entries:
        raise SlurmError(f"group {group!r} does not exist on this machine (`getent group {group}` found "
                         f"nothing); set the experiment's slurm.group to an existing group")
    name, _, gid, members = entries[0][:4]
    users = {m for m in members.split(",") if m}
    users |= {e[0] for e in _getent("passwd", timeout=timeout) if len(e) >= 4 and e[3] == gid}
    return sorted(users)


def query_jobs(*, users: Sequence[str] = (), name: str | None = None,
               timeout: float = DEFAULT_TIMEOUT_S) -> list[Job]:
    """One squeue call for these users' jobs (all users when empty), parsed without truncation."""
    argv = squeue_argv(users=users, name=name)
    proc = run(argv, timeout=timeout)
    if "error" in proc.stderr.lower():
        # squeue exits 0 on e.g. an unknown --user; an empty answer would then read as "no job".
        raise SlurmCommandError(argv, proc.returncode, proc.stderr, "reported an error")
    return parse_squeue(proc.stdout)


def submit(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S, env: Mapping[str, str] | None = None) -> str:
    """Run an sbatch argv from `sbatch_argv()` and return the new job id (env: what the job inherits)."""
    if "--parsable" not in argv:
        raise ValueError(f"submit() needs an sbatch argv with --parsable; got {list(argv)!r}")
    return parse_sbatch_parsable(run(argv, timeout=timeout, env=env).stdout)


def show_job(job_id: str, timeout: float = DEFAULT_TIMEOUT_S) -> list[dict[str, str]]:
    """`scontrol show job` as dicts (one per array task); raises SlurmCommandError for unknown ids."""
    return parse_scontrol_show_job(run(scontrol_show_job_argv(job_id), timeout=timeout).stdout)


def job_accounting(job_id: str, timeout: float = DEFAULT_TIMEOUT_S) -> SacctRecord | None:
    """Slurm's accounting record of job (or array task) `job_id` itself, not its steps; None when sacct
    has none. Raises SlurmCommandError where sacct fails (a cluster that keeps no accounting)."""
    records = parse_sacct(run(sacct_argv(job_id), timeout=timeout).stdout)
    return next((record for record in records if record.job_id == job_id), None)


def cancel(job_ids: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S) -> None:
    run(scancel_argv(job_ids), timeout=timeout)


def cancel_pending(array_job_id: str, job_name: str, users: Sequence[str] = (),
                   timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Cancel the PENDING tasks of array `array_job_id` (never a running one), only when it is a job named
    `job_name`; returns the ids cancelled."""
    pending = [j for j in query_jobs(users=users, name=job_name, timeout=timeout)
               if j.array_job_id == array_job_id and j.name == job_name and j.state == "PENDING"]
    if pending:
        run(["scancel", "--state=PENDING", array_job_id], timeout=timeout)
    return [j.job_id for j in pending]


def cancel_array(array_job_id: str, job_name: str, users: Sequence[str] = (),
                 timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Cancel the queued tasks of array `array_job_id`, but only when it is a job named `job_name`
    (an id from the environment must never cancel someone else's job); returns the ids cancelled."""
    ours = [j for j in query_jobs(users=users, name=job_name, timeout=timeout)
            if j.array_job_id == array_job_id and j.name == job_name]
    if ours:
        cancel([array_job_id], timeout=timeout)
    return [j.job_id for j in ours]
