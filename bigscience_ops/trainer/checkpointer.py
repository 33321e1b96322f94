"""When the trainer saves, and the save itself: the run schedule's save steps and the last step saved.

The steps come from `RunSchedule.saves` (save_interval and checkpoint.save_schedule, computed once).
A save writes each rank's RNG state and rank 0's bsops.json into `global_stepN/`, then DeepSpeed's
weights and optimizer states, and DeepSpeed moves `latest` last: `latest` only ever names a complete
checkpoint (checkpointing.py). Saving the step the folder already holds is a no-op, so the save
every stop makes (exit interval, exit duration, kill switch, signal, node phase, the end) after a
scheduled save at the same step writes nothing twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from bigscience_ops.checkpoints import layout
from bigscience_ops.schedules import SaveSchedule
from bigscience_ops.trainer import checkpointing as ckpt
from bigscience_ops.trainer.metrics import Metrics


class Checkpointer:
    """Saves `engine` into `folder` at the scheduled steps and on stop; `meta()` gives rank 0's bsops.json."""

    def __init__(self, folder: Path, saves: SaveSchedule, engine, meta: Callable[[], dict], metrics: Metrics) -> None:
        self.folder = Path(folder)
        self.saves = saves
        self.engine = engine
        self.meta = meta
        self.metrics = metrics
        self.last_saved: int | None = None

    def resumed_at(self, iteration: int) -> None:
        """The folder already holds `iteration` (the checkpoint this run started from)."""
        self.last_saved = iteration

    def step_done(self, iteration: int) -> None:
        """Save if the schedule has a checkpoint at `iteration`."""
        if self.saves.due(iteration):
            self.save(iteration)

    def save(self, iteration: int) -> None:
        """Save `iteration` unless it is the last step saved; every rank calls it (barriers, sharded states)."""
        if self.last_saved == iteration:
            return
        start = time.time()
        tag = f"global_step{iteration}"
        path = self.folder / tag
        ckpt.save_rng(path, dist.get_rank())
        if dist.get_rank() == 0:
            layout.write_meta(path, self.meta())
        dist.barrier()
        self.engine.save_checkpoint(str(self.folder), tag=tag, client_state={"iteration": iteration})
        dist.barrier()
        self.last_saved = iteration
        self.metrics.checkpoint_saved(iteration, self.folder, time.time() - start)
