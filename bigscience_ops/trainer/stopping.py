"""Why training stops: one function decides, before the first step and after every step.

`Stopper.reason` returns the reason as the text the trainer logs (then it saves and exits 0, and
the next array task resumes), or None to train on. In the order checked:
- the end of training (`FINISHED`);
- after a step: the exit interval, and the boundary of the next node phase (the next array task
  trains at the new node count);
- on all ranks at once (one all-reduce, so every rank stops at the same step): the kill switch
  file, SIGUSR1 (Slurm's warning before the time limit) or SIGTERM, and, after a step, the exit
  duration measured from the Slurm job start.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bigscience_ops.schedule.nodes import Phase
from bigscience_ops.schema import CheckpointConfig

FINISHED = "training finished"


class Signals:
    """SIGUSR1 (Slurm's warning signal) and SIGTERM set a flag; the loop saves and exits."""

    def __init__(self) -> None:
        self.received: int | None = None
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signum


def any_rank(device: torch.device, *flags: bool) -> list[bool]:
    """Each flag OR-ed over all ranks (one all-reduce on the engine's device)."""
    t = torch.tensor([int(f) for f in flags], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def kill_switch_path(checkpoint: CheckpointConfig) -> Path | None:
    return Path(checkpoint.kill_switch_path) if checkpoint.kill_switch_path else None


class Stopper:
    """The stop rules of one task; creating it installs the signal handlers."""

    def __init__(self, checkpoint: CheckpointConfig, train_iters: int, next_phase: Phase | None, job_start: float,
                 device: torch.device) -> None:
        self.checkpoint = checkpoint
        self.train_iters = train_iters
        self.next_phase = next_phase  # None in the last (or only) node phase
        self.job_start = job_start  # seconds since the epoch
        self.device = device
        self.kill_switch = kill_switch_path(checkpoint)
        self.signals = Signals()

    def reason(self, iteration: int, consumed_samples: int, stepped: bool) -> str | None:
        """Why to stop at `iteration` (`stepped`: this task has trained a step), or None to train on."""
        if iteration >= self.train_iters:
            return FINISHED
        ck = self.checkpoint
        if stepped and ck.exit_interval is not None and iteration % ck.exit_interval == 0:
            return f"exit interval {ck.exit_interval} reached: saved and exiting"
        if stepped and self.next_phase is not None and consumed_samples >= self.next_phase.start_samples:
            return (f"node schedule: {self.next_phase.describe()} begins: saved and exiting, the next array task "
                    f"trains at {self.next_phase.nodes} nodes")
        over_time = stepped and (time.time() - self.job_start) / 60.0 > ck.exit_duration_in_mins
        killed, signalled, timed_out = any_rank(self.device, self.kill_switch is not None and self.kill_switch.exists(),
                                                self.signals.received is not None, over_time)
        if killed:
            return f"kill switch {self.kill_switch} found: saved and exiting"
        if signalled:
            return "signal received: saved and exiting"
        if timed_out:
            return f"exit duration of {ck.exit_duration_in_mins} min since the job start reached: saved and exiting"
        return None
