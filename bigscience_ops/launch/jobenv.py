"""The environment a job script starts in, built the same way for a Slurm job and a local launch.

The job inherits the launching shell's environment (sbatch --export=ALL; a local launch passes it
on), with these changes:
- `BSOPS_JOB_START_EPOCH` is dropped: each job measures exit_duration_in_mins from its own start, and
  `BSOPS_RUN_LOCK_HELD`: a job holds its run's lock itself unless its launcher says it holds it (launch.py);
- the shell's `SLURM_*` variables are dropped: a job that submits the next array (a node schedule's
  next phase) must pass on neither its own job's variables (sbatch reads some as options) nor, to a
  local launch, anything of a cluster. `SLURM_CONF`, which names the cluster, is kept for a Slurm
  job and dropped for a local one: a local task's hooks must not reach a cluster this machine knows;
- PATH starts with the folders given (a local launch's srun and scontrol shims), then this Python's
  bin folder, so the job runs this bsops; the experiment's env_setup lines run after and win.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

DROPPED = ("BSOPS_JOB_START_EPOCH", "BSOPS_RUN_LOCK_HELD")


def job_environment(environ: Mapping[str, str], *, local: bool, first_on_path: Sequence[Path] = (),
                    extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's environment from `environ` (see the module docstring), with `extra` set on top."""
    kept = ("SLURM_CONF",) if not local else ()
    env = {k: v for k, v in environ.items()
           if k not in DROPPED and (not k.startswith("SLURM_") or k in kept)}
    env["PATH"] = os.pathsep.join([*map(str, first_on_path), str(Path(sys.executable).parent),
                                   environ.get("PATH", "")])
    env.update(extra or {})
    return env
