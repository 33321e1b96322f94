"""Re-record squeue-hostile-names.txt: held jobs whose names hold the line breaks str.splitlines() splits on.

`eval "$(bash scripts/slurm-up.sh)" && PYTHONPATH=. .venv/bin/python tests/assets/slurm/record_hostile_names.py`
"""

from __future__ import annotations

from pathlib import Path

from bigscience_ops import slurm

HERE = Path(__file__).resolve().parent
NAMES = ["tr1-13B", "a\u2028b", "c\u2029d", "e\x85f", "g\x1eh", "i\x0bj", "k\x0cl", "m\nn"]


def main() -> None:
    ids = [slurm.parse_sbatch_parsable(slurm.run(
        ["sbatch", "--parsable", "--hold", f"--job-name={name}", "--time=5", "--output=/dev/null", "--wrap=true"],
        timeout=30).stdout) for name in NAMES]
    try:
        text = slurm.run(slurm.squeue_argv(job_ids=ids), timeout=30).stdout
    finally:
        slurm.cancel(ids, timeout=30)
    (HERE / "squeue-hostile-names.txt").write_bytes(text.encode("utf-8"))


if __name__ == "__main__":
    main()
