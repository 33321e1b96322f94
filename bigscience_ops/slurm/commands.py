"""The one place that runs Slurm commands (with a pinned environment and a timeout), and the queries
built on it: squeue, sbatch, scontrol, sacct, scancel, and the users of a Unix group."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from bigscience_ops.slurm.argv import (
    checked_item, sacct_argv, scancel_argv, scontrol_show_config_argv, scontrol_show_job_argv, sinfo_partitions_argv,
    squeue_argv, squeue_env,
)
from bigscience_ops.slurm.errors import SlurmCommandError, SlurmError, check_conf
from bigscience_ops.slurm.output import (
    Jobs, SacctRecord, enforces_accounts, has_default_partition, new_terminator, parse_sacct, parse_sbatch_parsable,
    parse_scontrol_show_job, parse_squeue,
)
from bigscience_ops.slurm.taskenv import LOCAL_LAUNCH

DEFAULT_TIMEOUT_S = 60.0
"""Slurm clients retry an absent controller for about a minute; a hung one must not hang a cron job."""


# Environment variables through which a user's shell changes what Slurm's clients print or select:
# output formats, sort orders, default filters, time format, interactive prompts. bsops parses the
# output, so it never lets them through.
_USER_OUTPUT_PREFIXES = ("SQUEUE_", "SINFO_", "SACCT_", "SCONTROL_", "SCANCEL_", "SPRIO_", "SSHARE_", "SDIAG_")
_USER_OUTPUT_VARIABLES = frozenset({"SLURM_TIME_FORMAT", "SLURM_BITSTR_LEN", "SLURM_CLUSTERS"})
_LOCAL_LAUNCH_VARIABLES = frozenset({LOCAL_LAUNCH, "BSOPS_MASTER_PORT"})
"""What `bsops launch --local` gives the job script it runs, found in a shell that also submits: sbatch hands the
submitting environment to the job (--export=ALL), whose tasks would then all meet on one fixed port."""
_DROPPED_VARIABLES = _USER_OUTPUT_VARIABLES | _LOCAL_LAUNCH_VARIABLES
PINNED_ENV = {"SLURM_TIME_FORMAT": "standard"}
"""What every Slurm command runs with: ISO timestamps (`2021-08-16T03:52:02`), as the parsers read."""
_UNDECODABLE = "surrogateescape"
"""How bytes that are not text in the locale's encoding are read (a job name is any user's bytes): kept as
surrogate escapes, never a UnicodeDecodeError; the squeue parser sets such a job aside, and text read back
(a scrontab) is written back byte for byte."""


def pinned_env(env: Mapping[str, str] | None = None, settings: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """`env` (default: this process's) without the variables that change Slurm's output or would pass a local
    launch's port to a job (_LOCAL_LAUNCH_VARIABLES), plus PINNED_ENV and bsops' own `settings` for this
    command (squeue's format: `argv.squeue_env`)."""
    source = os.environ if env is None else env
    clean = {k: v for k, v in source.items()
             if not k.startswith(_USER_OUTPUT_PREFIXES) and k not in _DROPPED_VARIABLES}
    return {**clean, **PINNED_ENV, **(settings or {})}


def run(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S, env: Mapping[str, str] | None = None,
        settings: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command with a pinned environment (`pinned_env(env, settings)`); with run_unchecked,
    the only place in bsops that does. Raises SlurmCommandError on failure, at once when SLURM_CONF names
    a file that does not exist."""
    argv = [str(a) for a in argv]
    if not argv or argv[0] not in _COMMANDS:
        raise ValueError(f"slurm.run runs only {', '.join(sorted(_COMMANDS))}; got argv {argv!r}")
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    check_conf(argv, env)  # a SLURM_CONF naming no file would keep the client retrying for a minute
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors=_UNDECODABLE, timeout=timeout,
                              env=pinned_env(env, settings), stdin=subprocess.DEVNULL, check=False)
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
    check_conf(argv, env)
    stdin = subprocess.DEVNULL if input is None else None
    try:
        return subprocess.run(argv, capture_output=True, text=True, errors=_UNDECODABLE, timeout=timeout,
                              env=pinned_env(env), input=input, stdin=stdin, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmCommandError(argv, None, str(exc), "could not run") from exc


_COMMANDS = frozenset({"sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct", "srun", "scrontab"})


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
    entries = [e for e in _getent("group", checked_item("group", group), timeout=timeout) if len(e) >= 4]
    if not entries:
        raise SlurmError(f"group {group!r} does not exist on this machine (`getent group {group}` found "
                         f"nothing); set the experiment's slurm.group to an existing group")
    name, _, gid, members = entries[0][:4]
    users = {m for m in members.split(",") if m}
    users |= {e[0] for e in _getent("passwd", timeout=timeout) if len(e) >= 4 and e[3] == gid}
    return sorted(users)


def query_jobs(*, users: Sequence[str] = (), name: str | None = None, job_ids: Sequence[str] = (),
               timeout: float = DEFAULT_TIMEOUT_S) -> Jobs:
    """One squeue call for these users' jobs (all users when empty), parsed without truncation; records
    end with a terminator drawn for this call (`output.squeue_format`), so no job name forges one. Raises
    SlurmError when squeue fails, and SlurmOutputError when it exits 0 with output that does not parse (a site
    wrapper, a cut answer): the queue is then unknown, never empty."""
    argv = squeue_argv(users=users, name=name, job_ids=job_ids)
    terminator = new_terminator()
    proc = run(argv, timeout=timeout, settings=squeue_env(terminator))
    if "error" in proc.stderr.lower():
        # squeue exits 0 on e.g. an unknown --user; an empty answer would then read as "no job".
        raise SlurmCommandError(argv, proc.returncode, proc.stderr, "reported an error")
    return parse_squeue(proc.stdout, terminator)  # output that is not squeue's as asked: SlurmOutputError


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


def cluster_needs(timeout: float = DEFAULT_TIMEOUT_S) -> tuple[bool, bool]:
    """(a job needs --partition, a job needs --account) on this cluster: sinfo marks no default partition;
    `scontrol show config` says AccountingStorageEnforce takes associations. Raises SlurmError."""
    partitions = run(sinfo_partitions_argv(), timeout=timeout).stdout
    config = run(scontrol_show_config_argv(), timeout=timeout).stdout
    return not has_default_partition(partitions), enforces_accounts(config)
