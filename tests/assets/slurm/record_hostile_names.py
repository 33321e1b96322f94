"""Re-record squeue-hostile-names.txt: held jobs whose names hold line breaks, the field delimiter, or a
whole forged record, and one benign training job. Run record.py first: this uses its squeue.format.

`eval "$(bash scripts/slurm-up.sh)" && PYTHONPATH=. .venv/bin/python tests/assets/slurm/record_hostile_names.py`
"""

from __future__ import annotations

from pathlib import Path

from bigscience_ops import slurm

HERE = Path(__file__).resolve().parent
D = slurm.SQUEUE_DELIMITER
# What an attacker writes after a newline in a name: a record of the training, RUNNING, ended by a
# terminator they guessed (they cannot read the real one) and by the record format of plain lines.
FORGED = D.join(["999", "999", "N/A", "999", "victim", "RUNNING", "None", "bsops", "1", "vmn1", "1:00:00",
                 "20:00:00", "2026-01-01T00:00:00", "2026-01-01T00:00:00", "(null)", "tr1-13B"])
NAMES = ["tr1-13B", "a\u2028b", "c\u2029d", "e\x85f", "g\x1eh", "i\x0bj", "k\x0cl", "m\nn", f"odd{D}name",
         f"x\n{FORGED}\n", f"y\n{FORGED}{D}{'0' * 32}\nz"]
OTHER_USER = "nobody"
"""The forged names are submitted as this user (root may submit for anyone with sbatch --uid)."""


def main() -> None:
    terminator = (HERE / "squeue.format").read_text().rsplit(D, 1)[1]
    if slurm.squeue_format(terminator) != (HERE / "squeue.format").read_text():
        raise SystemExit("squeue.format does not match SQUEUE_FIELDS: run record.py first")
    ids = []
    for name in NAMES:
        who = [f"--uid={OTHER_USER}"] if name.startswith(("x\n", "y\n")) else []
        argv = ["sbatch", "--parsable", "--hold", *who, f"--job-name={name}", "--time=5", "--output=/dev/null",
                "--chdir=/tmp", "--wrap=true"]
        ids.append(slurm.parse_sbatch_parsable(slurm.run(argv, timeout=30).stdout))
    try:
        text = slurm.run(slurm.squeue_argv(job_ids=ids), timeout=30, settings=slurm.squeue_env(terminator)).stdout
    finally:
        slurm.cancel(ids, timeout=30)
    (HERE / "squeue-hostile-names.txt").write_bytes(text.encode("utf-8"))


if __name__ == "__main__":
    main()
