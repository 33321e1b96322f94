"""When the trainer saves, and the save itself: a commit. The run schedule's save steps and the last step saved.

The steps come from `RunSchedule.saves` (save_interval and checkpoint.save_schedule, computed once).
A save of step N, on every rank:
1. rank 0 sets aside a global_stepN folder an earlier attempt left (checkpoints/set_aside.py: moved, not deleted);
2. each rank writes its RNG state, rank 0 bsops.json (saying it commits with a manifest), then DeepSpeed writes
   the weights and optimizer states (`DeepSpeedState.save`, which leaves `latest` alone and tells each rank the
   files it wrote);
3. each rank fsyncs its files and records their sizes and xxh3_128 hashes (DeepSpeed's as they are written,
   the small RNG and record files read back: checkpoints/manifest.py);
4. the records are gathered on rank 0, which writes the manifest atomically (every file, size, hash, the
   iteration, run id, layout, whether the optimizer state is in it) and only then `latest`, atomically.
A rank that dies or hits a full disk before step 4 leaves a folder without a manifest: no command counts it, and
the next resume sets it aside and takes the checkpoint `latest` still names (checkpoints/resume.py).
Saving the step the folder already holds is a no-op, so the save every stop makes (exit interval, exit duration,
kill switch, signal, node phase, the end) after a scheduled save at the same step writes nothing twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch.distributed as dist

from bigscience_ops.checkpoints import layout, manifest, set_aside
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.schedules import SaveSchedule
from bigscience_ops.trainer import checkpointing as ckpt
from bigscience_ops.trainer.metrics import Metrics


class Saver(Protocol):
    def save(self, folder: Path, tag: str, client_state: dict,
             after_each: Callable[[Path], None] | None = None) -> dict[Path, manifest.FileRecord]:
        """Write this rank's part of folder/tag; each file it wrote, fsynced, with its size and hash
        (trainer/deepspeed_state.py)."""


class Checkpointer:
    """Saves through `saver` into `folder` at the scheduled steps and on stop; `meta()` gives rank 0's bsops.json,
    `about()` the manifest's run id, experiment, layout and whether the optimizer state is saved."""

    def __init__(self, folder: Path, saves: SaveSchedule, saver: Saver, meta: Callable[[], dict],
                 about: Callable[[], dict], metrics: Metrics,
                 fault: Callable[[int], Callable[[Path], None] | None] = lambda iteration: None) -> None:
        self.fault = fault  # the debug switch BSOPS_KILL_IN_SAVE (faults.Faults.killer)
        self.folder = Path(folder)
        self.saves = saves
        self.saver = saver
        self.meta = meta
        self.about = about
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
        rank = dist.get_rank()
        if rank == 0 and (path.exists() or path.is_symlink()):
            set_aside.set_aside(self.folder, path, f"{tag} of an earlier attempt was still there when the run saved "
                                                   "that step again")
        dist.barrier()
        try:
            small = [ckpt.save_rng(path, rank)]
            if rank == 0:
                layout.write_meta(path, {**self.meta(), layout.COMMIT_KEY: manifest.MANIFEST})
                small.append(path / layout.META)
            dist.barrier()
            written = self.saver.save(self.folder, tag, {"iteration": iteration}, self.fault(iteration))
            written.update({p: manifest.record_file(p) for p in small})
            records = {_inside(path, p): rec for p, rec in written.items()}
        except (OSError, CheckpointError) as exc:
            detail = f"{exc.strerror} ({exc.filename or path})" if isinstance(exc, OSError) and exc.strerror else exc
            raise CheckpointError(f"saving {tag} failed on rank {rank}: {detail}; the save did not commit: `latest` "
                                  f"still names {_latest(self.folder)}, which the next launch resumes from (free the "
                                  "space, then launch again)") from None
        parts: list[dict | None] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, records)
        if rank == 0:
            self._commit(path, tag, iteration, parts)
        dist.barrier()
        self.last_saved = iteration
        self.metrics.checkpoint_saved(iteration, self.folder, time.time() - start)

    def _commit(self, path: Path, tag: str, iteration: int, parts: list[dict | None]) -> None:
        """Rank 0, once every rank recorded its files: the manifest, then `latest`."""
        files: dict[str, manifest.FileRecord] = {}
        for part in parts:
            files.update(part or {})
        for rel in manifest.files_on_disk(path):  # written by no rank's checkpoint engine: rank 0 vouches for it
            if rel not in files:
                files[rel] = manifest.record_file(path / rel)
        gone = [rel for rel in files if not (path / rel).is_file()]
        if gone:
            raise CheckpointError(f"saving {tag}: {', '.join(gone[:3])} recorded by a rank but not in {path}; the save "
                                  "did not commit")
        about = self.about()
        manifest.commit(path, manifest.Manifest(tag, iteration, about["run_id"], about["experiment"], about["layout"],
                                                about["optimizer"], files, time.time()))
        layout.write_latest(self.folder, tag)


def _latest(folder: Path) -> str:
    try:
        return layout.latest_tag(folder) or "nothing (the run starts from scratch)"
    except CheckpointError:
        return "no readable checkpoint (the next resume falls back to the newest verified one)"


def _inside(folder: Path, file: Path) -> str:
    """`file` relative to the checkpoint folder; a file written elsewhere is a CheckpointError."""
    try:
        return Path(file).resolve().relative_to(Path(folder).resolve()).as_posix()
    except ValueError:
        raise CheckpointError(f"DeepSpeed wrote {file} outside the checkpoint folder {folder}; the manifest lists the "
                              "folder's files only, so this save cannot be committed") from None
