"""Re-record the real Slurm output the parser tests read (tests/assets/slurm/README.md):

`eval "$(bash scripts/slurm-up.sh)" && PYTHONPATH=. .venv/bin/python tests/assets/slurm/record.py`

Submits one job per interesting state to the single-node test cluster, waits until Slurm reports each
state, saves what squeue / scontrol / sbatch printed, and cancels the jobs. Takes about 15 s. squeue's
format, with the record terminator drawn for this recording, goes to squeue.format (record_hostile_names.py
uses the same one; run it after this script).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bigscience_ops import slurm

HERE = Path(__file__).resolve().parent
LONG_NAME = "tr1-13B-round3-a-job-name-longer-than-forty-characters"
PARTITION = os.environ.get("BSOPS_SLURM_PARTITION", "bsops")


def sbatch(*args: str, name: str, command: str = "sleep 300") -> str:
    argv = ["sbatch", "--parsable", f"--job-name={name}", "--time=5", "--output=/dev/null", *args,
            f"--wrap={command}"]
    return slurm.parse_sbatch_parsable(slurm.run(argv, timeout=30).stdout)


TERMINATOR = slurm.new_terminator()


def squeue(ids: list[str]) -> str:
    return slurm.run(slurm.squeue_argv(job_ids=ids), timeout=30, settings=slurm.squeue_env(TERMINATOR)).stdout


def main() -> int:
    ids: dict[str, str] = {}
    ids["array"] = sbatch("--array=1-5%1", name=LONG_NAME)
    ids["dependency"] = sbatch(f"--dependency=afterany:{ids['array']}", name="rec-dependency")
    ids["chained_array"] = sbatch("--array=1-5%1", f"--dependency=afterany:{ids['array']}", name=LONG_NAME)
    ids["begin"] = sbatch("--begin=now+2hours", name="rec-begin")
    ids["failed"] = sbatch(name="rec-failed", command="exit 3")
    ids["held_user"] = sbatch("--hold", name="rec-held-user")
    ids["held_admin"] = sbatch(name="rec-held-admin", command="sleep 300")
    slurm.run(["scontrol", "hold", ids["held_admin"]], timeout=30)
    slurm.run(["scontrol", "uhold", ids["held_user"]], timeout=30)
    ids["partition_down"] = sbatch(f"--partition={PARTITION}-down", name="rec-partition-down")
    # Every CPU of the cluster (2 nodes of 8): one task of the array already holds one.
    ids["resources"] = sbatch("--nodes=2", "--cpus-per-task=8", name="rec-resources")
    ids["priority"] = sbatch("--nodes=2", "--cpus-per-task=8", name="rec-priority")
    ids["odd_name"] = sbatch("--begin=now+1hour", name="rec name with spaces | and a pipe")
    time.sleep(2)
    ids["never"] = sbatch(f"--dependency=afterok:{ids['failed']}", name="rec-never-satisfied")
    test_only = slurm.run(["sbatch", "--test-only", "--time=5", "--array=1-3%1", "--job-name=rec-test-only",
                           "--wrap=true"], timeout=30)

    want = {"array": "JobArrayTaskLimit", "dependency": "Dependency", "chained_array": "Dependency", "begin": "BeginTime",
            "held_user": "JobHeldUser", "held_admin": "JobHeldAdmin", "partition_down": "PartitionDown",
            "resources": "Resources", "priority": "Priority", "never": "DependencyNeverSatisfied"}
    deadline = time.monotonic() + 30
    while True:
        text = squeue(list(ids.values()))
        reasons = {j.array_job_id: j.reason for j in slurm.parse_squeue(text, TERMINATOR) if j.state == "PENDING"}
        missing = {k: reasons.get(ids[k]) for k, r in want.items() if reasons.get(ids[k]) != r}
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1)
    if missing:
        print(f"record: states not reached within 30 s: {missing}", file=sys.stderr)

    (HERE / "squeue.txt").write_text(text)
    (HERE / "squeue.format").write_text(slurm.squeue_format(TERMINATOR))
    shown = slurm.run(slurm.scontrol_show_job_argv(ids["array"]), timeout=30).stdout
    shown += slurm.run(slurm.scontrol_show_job_argv(ids["never"]), timeout=30).stdout
    (HERE / "scontrol_show_job.txt").write_text(shown)
    (HERE / "sbatch_test_only.stderr").write_text(test_only.stderr)
    try:
        slurm.run(slurm.scontrol_show_job_argv("99999999"), timeout=30)
    except slurm.SlurmCommandError as exc:
        (HERE / "scontrol_unknown_job.stderr").write_text(exc.stderr)
    (HERE / "ids.json").write_text(json.dumps(ids, indent=1) + "\n")
    slurm.cancel(list(ids.values()), timeout=30)
    print(f"record: wrote {HERE}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
