"""A task's environment: the SLURM_* variables a job's batch script (and what it runs) is given, read once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

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
