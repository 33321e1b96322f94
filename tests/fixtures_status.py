"""Recorded watchdog inputs shared by the status tests: the seed on-call report's running task, a log line."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from bigscience_ops import slurm

# A Megatron iteration line as tr1-13B logged it.
ITERATION = (" iteration   168000/  311541 | consumed samples:    153013584 | elapsed time per iteration (ms): "
             "42000.0 | learning rate: 5.997E-05 | global batch size:  2048 | lm loss: 2.291E+00 |")


def seed_job(**changes: object) -> slurm.Job:
    """The running task from the tr1-13B on-call report."""
    job = slurm.Job(
        job_id="711114_4", array_job_id="711114", array_task="4", name="tr1-13B-round3", user="stas",
        state="RUNNING", reason="None", partition="gpu_p13", num_nodes=48,
        nodes="r7i4n[1-7],r7i7n[1-8],r8i0n0", elapsed_s=65759, time_limit_min=1200,
        start_time=datetime(2021, 8, 16, 3, 52, 2), submit_time=datetime(2021, 8, 12), dependency=None)
    return replace(job, **changes)
