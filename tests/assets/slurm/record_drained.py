"""Re-record squeue-drained.txt: a training array whose next task pends on drained and down nodes, on a SECOND
Slurm cluster of its own (never the shared test cluster's nodes, which other tests use at the same time):

`PYTHONPATH=. .venv/bin/python tests/assets/slurm/record_drained.py`   (as root; about 20 s)

Starts munged, slurmctld and two slurmd under a temporary folder, on ports of their own (SlurmctldPort 16817,
slurmd 16901-16902, its own munge socket), so it runs beside scripts/slurm-up.sh's cluster. Submits what a
training submits (`--array=1-3%1`, one node) and two plain jobs; once task 1 runs, drains one node and sets the
other DOWN (as an administrator does with a bad GPU), cancels task 1, and waits until squeue gives the pending
tasks their reasons; saves squeue's answer, with the record terminator of squeue.format (tests replay it with
fixtures_slurm.replay_squeue), to squeue-drained.txt and the ids to drained_ids.json; then stops that cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bigscience_ops import slurm

HERE = Path(__file__).resolve().parent
NAME = "rec-drained-training"
CTLD_PORT, SLURMD_PORT = 16817, 16901


def conf_text(folder: Path, host: str, nodes: list[str]) -> str:
    lines = [
        "ClusterName=bsopsdrain", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={CTLD_PORT}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={folder}/munge/munge.socket", f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool/slurmd-%n", f"SlurmctldPidFile={folder}/run/slurmctld.pid",
        f"SlurmdPidFile={folder}/run/slurmd-%n.pid", f"SlurmctldLogFile={folder}/log/slurmctld.log",
        f"SlurmdLogFile={folder}/log/slurmd-%n.log", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "MpiDefault=none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=2", "SlurmdParameters=config_overrides",
        "ReturnToService=2", "MinJobAge=300", "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0",
        *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={SLURMD_PORT + i} CPUs=2 State=UNKNOWN"
          for i, n in enumerate(nodes)),
        f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    host = socket.gethostname().split(".")[0]
    nodes = [f"{host}drn1", f"{host}drn2"]
    folder = Path(tempfile.mkdtemp(prefix="bsops-slurm-drained-"))
    for sub in ("etc", "state", "spool", "log", "run", "munge"):
        (folder / sub).mkdir()
    (folder / "munge").chmod(0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = folder / "etc" / "slurm.conf"
    conf.write_text(conf_text(folder, host, nodes))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    terminator = (HERE / "squeue.format").read_text().rsplit(slurm.SQUEUE_DELIMITER, 1)[1]
    daemons = [["munged", f"--key-file={key}", f"--socket={folder}/munge/munge.socket",
                f"--pid-file={folder}/run/munged.pid", f"--log-file={folder}/log/munged.log",
                f"--seed-file={folder}/munge/munge.seed", "--force"],
               ["slurmctld", "-f", str(conf)], *(["slurmd", "-f", str(conf), "-N", n] for n in nodes)]
    try:
        for argv in daemons:
            subprocess.run(argv, env=env, check=True, timeout=60)

        def slurm_run(argv: list[str], **kw) -> str:
            return slurm.run(argv, timeout=30, env=env, **kw).stdout

        deadline = time.monotonic() + 60
        while "idle" not in slurm_run(["sinfo", "-h", "-o", "%T"]):
            if time.monotonic() > deadline:
                raise SystemExit(f"record: the second cluster's nodes did not become idle; see {folder}/log")
            time.sleep(0.5)

        def sbatch(*args: str, name: str) -> str:
            return slurm.parse_sbatch_parsable(slurm_run(["sbatch", "--parsable", f"--job-name={name}", "--time=30",
                                                          "--output=/dev/null", "--chdir=/tmp", *args,
                                                          "--wrap=sleep 600"]))

        ids = {"array": sbatch("--array=1-3%1", "--nodes=1", name=NAME)}
        while not any(j.state == "RUNNING" for j in slurm.parse_squeue(
                slurm_run(slurm.squeue_argv(job_ids=[ids["array"]]), settings=slurm.squeue_env(terminator)),
                terminator)):
            time.sleep(0.5)
        slurm_run(["scontrol", "update", f"nodename={nodes[0]}", "state=drain", "reason=bad gpu"])
        slurm_run(["scontrol", "update", f"nodename={nodes[1]}", "state=down", "reason=bad gpu"])
        slurm_run(["scancel", f"{ids['array']}_1"])
        ids["named_node"] = sbatch(f"--nodelist={nodes[1]}", name="rec-drained-named-node")
        ids["plain"] = sbatch(name="rec-drained-plain")
        deadline = time.monotonic() + 60
        while True:
            text = slurm_run(slurm.squeue_argv(job_ids=list(ids.values())), settings=slurm.squeue_env(terminator))
            jobs = slurm.parse_squeue(text, terminator)
            if len(jobs) == 3 and all(j.state == "PENDING" and j.reason not in ("None", "Priority") for j in jobs):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"record: no pending reasons within 60 s: {[(j.job_id, j.reason) for j in jobs]}")
            time.sleep(1)
        (HERE / "squeue-drained.txt").write_text(text)
        (HERE / "drained_ids.json").write_text(json.dumps({**ids, "nodes": nodes}, indent=1) + "\n")
        for job in jobs:
            print(f"record: {job.job_id} {job.state} {job.reason!r}", file=sys.stderr)
    finally:
        for pidfile in sorted((folder / "run").glob("*.pid")):
            try:
                os.kill(int(pidfile.read_text().strip()), 15)
            except (OSError, ValueError):
                pass
        time.sleep(1)
        shutil.rmtree(folder, ignore_errors=True)
    print(f"record: wrote {HERE / 'squeue-drained.txt'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
