"""Re-record the sacct, sinfo and scontrol show config answers tests/slurm/test_slurm_output.py reads
(tests/assets/slurm/README.md):

`eval "$(bash scripts/slurm-up.sh)" && PYTHONPATH=. .venv/bin/python tests/assets/slurm/record_answers.py`

The test cluster keeps no accounting database (AccountingStorageType=accounting_storage/none), but it writes
job completions (JobCompType=jobcomp/filetxt), which `sacct --completion` prints in the layout `slurm.sacct_argv`
asks for: JobID|State|ExitCode, --parsable2, no header. Submits a job that completes, one that exits 3, a
two-task array, one cancelled while it runs and one its time limit ends; waits until each has ended; saves
sacct's answer to sacct_completion.txt and the ids to sacct_ids.json. Takes about two minutes (the time limit).
Also saves `sinfo_partitions_argv()`'s answer (sinfo_partitions.txt), `scontrol show config`'s
(scontrol_show_config.txt), what `slurm.cluster_needs` reads, and `scontrol --oneliner show job` of a held
job whose name holds spaces and a pipe (scontrol_show_job_spaces.txt).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bigscience_ops import slurm

HERE = Path(__file__).resolve().parent
SPACED_NAME = "rec name with spaces | and a pipe"


def sbatch(*args: str, name: str, command: str) -> str:
    argv = ["sbatch", "--parsable", f"--job-name={name}", "--output=/dev/null", "--chdir=/tmp", *args,
            f"--wrap={command}"]
    return slurm.parse_sbatch_parsable(slurm.run(argv, timeout=30).stdout)


def main() -> int:
    (HERE / "sinfo_partitions.txt").write_text(slurm.run(slurm.sinfo_partitions_argv(), timeout=30).stdout)
    (HERE / "scontrol_show_config.txt").write_text(slurm.run(slurm.scontrol_show_config_argv(), timeout=30).stdout)
    held = sbatch("--hold", "--time=5", name=SPACED_NAME, command="true")
    (HERE / "scontrol_show_job_spaces.txt").write_text(
        slurm.run(slurm.scontrol_show_job_argv(held), timeout=30).stdout)
    slurm.cancel([held], timeout=30)
    ids = {
        "completed": sbatch("--time=5", name="rec-sacct-ok", command="true"),
        "failed": sbatch("--time=5", name="rec-sacct-failed", command="exit 3"),
        "array": sbatch("--time=5", "--array=1-2", name="rec-sacct-array", command="true"),
        "cancelled": sbatch("--time=5", name="rec-sacct-cancelled", command="sleep 300"),
        "timeout": sbatch("--time=1", name="rec-sacct-timeout", command="sleep 300"),
    }
    deadline = time.monotonic() + 30
    while not any(j.state == "RUNNING" for j in slurm.query_jobs(job_ids=[ids["cancelled"]], timeout=30)):
        if time.monotonic() > deadline:
            print("the job to cancel never ran", file=sys.stderr)
            return 1
        time.sleep(0.5)
    slurm.cancel([ids["cancelled"]], timeout=30)
    deadline = time.monotonic() + 300
    while slurm.query_jobs(job_ids=list(ids.values()), timeout=30):
        if time.monotonic() > deadline:
            print("the jobs did not end within 300 s", file=sys.stderr)
            return 1
        time.sleep(2)
    time.sleep(2)  # the completion record is written as the job ends
    argv = ["sacct", "--completion", "--noheader", "--parsable2", "--format=JobID,State,ExitCode",
            "--jobs=" + ",".join(ids.values())]
    (HERE / "sacct_completion.txt").write_text(slurm.run(argv, timeout=30).stdout)
    (HERE / "sacct_ids.json").write_text(json.dumps(ids, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
