"""All Slurm knowledge, and the one place that runs Slurm commands. Callers use `slurm.NAME`:

- errors.py   SlurmError, SlurmCommandError (argv, exit code and stderr)
- output.py   parsers of real output: squeue records (Job, the state sets), durations, sbatch, scontrol, sacct
- argv.py     command lines: squeue, sbatch, scontrol, sacct, scancel, each value checked
- script.py   sbatch's own #SBATCH reader: how a value is written, how a script's options read back
- taskenv.py  TaskEnv: a task's SLURM_* variables, read once (and written by a local launch)
- names.py    bsops' own job names: the hourly jobs' reserved form `bsops.<job name>.<kind>`
- commands.py run / run_unchecked (pinned environment, a timeout always) and the queries built on them
"""

from bigscience_ops.slurm.argv import (
    SbatchOptions, begin_arg, checked_item, sacct_argv, sbatch_argv, scancel_argv, scontrol_show_config_argv, scontrol_show_job_argv,
    sinfo_partitions_argv, squeue_argv, squeue_env,
)
from bigscience_ops.slurm.commands import (
    DEFAULT_TIMEOUT_S, GETENT_TIMEOUT_S, PINNED_ENV, cancel, cancel_array, cancel_pending, cluster_needs, group_users,
    job_accounting, pinned_env, query_jobs, run, run_unchecked, show_job, submit,
)
from bigscience_ops.slurm.errors import (
    SlurmCommandError, SlurmError, SlurmOutputError, check_conf, conf_note, missing_conf, said,
)
from bigscience_ops.slurm.names import RESERVED_PREFIX, hourly_job_name, is_hourly_job_name, reserved_problem
from bigscience_ops.slurm.output import (
    ACTIVE_STATES, NEVER_STARTS, QUEUED_STATES, SQUEUE_DELIMITER, SQUEUE_FIELDS, WAITING_STATES, Job, Jobs,
    BLOCKED_REASONS, SacctRecord, TestOnlyAnswer, blocked, enforces_accounts, format_duration, has_default_partition, new_terminator,
    parse_duration, parse_sacct,
    parse_sbatch_parsable, parse_sbatch_test_only, parse_scontrol_show_job, parse_squeue, parse_time_limit,
    parse_timestamp, squeue_format, unparsed_note,
)
from bigscience_ops.slurm.script import SBATCH_PREFIX, output_path, sbatch_quote, sbatch_words, script_job_name, \
    script_options
from bigscience_ops.slurm.taskenv import LOCAL_LAUNCH, TaskEnv

__all__ = [
    "ACTIVE_STATES", "BLOCKED_REASONS", "DEFAULT_TIMEOUT_S", "GETENT_TIMEOUT_S", "LOCAL_LAUNCH", "NEVER_STARTS", "PINNED_ENV",
    "QUEUED_STATES", "RESERVED_PREFIX", "SBATCH_PREFIX", "SQUEUE_DELIMITER", "SQUEUE_FIELDS", "WAITING_STATES",
    "Job", "Jobs", "SacctRecord", "SlurmCommandError", "SlurmError", "SlurmOutputError", "TaskEnv", "TestOnlyAnswer",
    "begin_arg", "blocked", "cancel", "check_conf", "checked_item", "conf_note", "missing_conf", "said", "cancel_array", "cancel_pending", "cluster_needs", "enforces_accounts", "format_duration",
    "group_users", "has_default_partition", "hourly_job_name", "is_hourly_job_name", "job_accounting",
    "new_terminator", "output_path", "parse_duration", "parse_sacct", "parse_sbatch_parsable",
    "parse_sbatch_test_only", "parse_scontrol_show_job", "parse_squeue", "parse_time_limit", "parse_timestamp",
    "pinned_env", "query_jobs", "reserved_problem", "run", "run_unchecked", "sacct_argv", "sbatch_argv", "SbatchOptions", "sbatch_quote",
    "sbatch_words", "scancel_argv", "scontrol_show_config_argv", "scontrol_show_job_argv", "sinfo_partitions_argv", "script_job_name", "script_options", "show_job",
    "squeue_argv", "squeue_env", "squeue_format", "submit", "unparsed_note",
]
