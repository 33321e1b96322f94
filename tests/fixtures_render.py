"""Stand-ins for srun, scontrol and torchrun, to run a rendered job script on a machine without Slurm."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

SHIMS = {
    # Emulate just what the job script uses; each shim records its argv, one JSON list per line.
    "scontrol": 'printf "%s\\n" node-a node-b\n',
    "srun": textwrap.dedent("""\
        while [[ $1 == --* ]]; do shift; done
        SLURM_PROCID=0 "$@"
        """),
    "torchrun": 'python3 -c \'import json, sys; print(json.dumps(sys.argv[1:]))\' "$@" >> "$SHIM_LOG"\n',
}


def install_shims(tmp_path: Path, torchrun_exit: int = 0) -> dict[str, str]:
    """Shims for srun/scontrol/torchrun on PATH, with bsops of this interpreter; returns the env."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    for name, body in SHIMS.items():
        if name == "torchrun":
            body += f"exit {torchrun_exit}\n"
        (shims / name).write_text("#!/bin/bash\n" + body)
        (shims / name).chmod(0o755)
    path = f"{shims}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "SHIM_LOG": str(tmp_path / "argv.jsonl"),
            "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "1"}
