"""Re-record sbatch-parsable.txt, what `sbatch --parsable` prints for a job script, one answer a line (three
submissions in a row), which tests/fixtures_slurm.py's `replay_sbatch` stand-in prints in turn:

`eval "$(bash scripts/slurm-up.sh)" && PYTHONPATH=. .venv/bin/python tests/assets/slurm/record_sbatch.py`

The jobs are submitted held (they never run) to the test cluster, as bsops submits a job script (a file, with
--parsable), and cancelled at once.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from bigscience_ops import slurm

HERE = Path(__file__).resolve().parent


def main() -> int:
    answers, ids = [], []
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "rec.slurm"
        script.write_text("#!/bin/bash\n#SBATCH --job-name=rec-sbatch-parsable\ntrue\n")
        try:
            for _ in range(3):
                argv = ["sbatch", "--parsable", "--hold", "--time=2", "--output=/dev/null", f"--chdir={folder}",
                        str(script)]
                out = slurm.run(argv, timeout=30).stdout
                answers.append(out)
                ids.append(slurm.parse_sbatch_parsable(out))
        finally:
            if ids:
                slurm.cancel(ids, timeout=30)
    (HERE / "sbatch-parsable.txt").write_text("".join(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
