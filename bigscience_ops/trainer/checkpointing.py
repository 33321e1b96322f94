"""The trainer's checkpoints: what to resume from, whether it fits this model, when to save and the save itself.

DeepSpeed writes the weights and optimizer states in its layout (`global_stepN/`); next to them each
checkpoint holds `bsops.json` (iteration, consumed samples and tokens, the LR schedule, the model shape,
TP/PP/DP, the resolved config), `rng_state_<rank>.pt`, and the manifest that commits it.

Resume. Before anything reads the checkpoints, every rank calls `resolve_resume`: rank 0 surveys the folder, each
rank checks its share of the candidate's files against the manifest (sizes and xxh3_128 hashes, so the
cost is about the checkpoint's bytes divided by the ranks, read once more before DeepSpeed loads them),
the results are gathered, and the first checkpoint that passes is the one `latest` names afterwards
(checkpoints/resume.py decides; what fails is set aside, never deleted, each with one line naming the file
and the reason). `find_resume` then reads that checkpoint's records, and `check_compatible` refuses one written
by another model or TP/PP layout.

Save: a commit (`Checkpointer`). The steps come from `RunSchedule.saves` (save_interval and
checkpoint.save_schedule, computed once). A save of step N, on every rank:
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

Reading the folder (tags, `latest`) is checkpoints/layout.py's. The decisions are pure Python apart from the
collectives and the RNG helpers; torch is imported where it is used.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bigscience_ops.checkpoints import layout, manifest, resume, set_aside
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.checkpoints.manifest import Manifest
from bigscience_ops.schedule.batch_lr import SaveSchedule
from bigscience_ops.trainer.metrics import Metrics


# ----------------------------------------------------------------------------- resume

@dataclass(frozen=True)
class Resume:
    tag: str
    path: Path
    meta: dict
    manifest: Manifest


def find_resume(checkpoints: Path) -> Resume | None:
    """The checkpoint `latest` names (resolve_resume made sure it is committed and verified), or None for a folder
    that holds no checkpoint yet."""
    checkpoints = Path(checkpoints)
    if not checkpoints.is_dir():
        return None
    named = layout.latest_checkpoint(checkpoints)
    if named is None:
        tags = [c.tag for c in layout.list_checkpoints(checkpoints)]
        if tags:
            raise CheckpointError(f"{checkpoints}: holds {', '.join(tags[-3:])} but no 'latest' file, and none of them "
                                  "was resolved as a checkpoint to resume from; refusing to start from scratch")
        return None
    found = named.manifest()
    if found is None:
        raise CheckpointError(f"{named.path}: no {manifest.MANIFEST}: {resume.UNFINISHED}")
    return Resume(named.tag, named.path, named.meta(), found)


def resolve_resume(checkpoints: Path, say: Callable[[str], None]) -> None:
    """Make `latest` name a checkpoint this run can resume from, or leave none when it has none; every rank calls
    it (collectives). What cannot be resumed from is set aside by rank 0, one line each; a run that had a committed
    checkpoint and has none left that verifies is a CheckpointError on every rank, and nothing is moved."""
    import torch.distributed as dist

    checkpoints = Path(checkpoints)
    rank, world = dist.get_rank(), dist.get_world_size()
    shared: list[resume.Survey | None] = [resume.survey(checkpoints) if rank == 0 and checkpoints.is_dir() else None]
    dist.broadcast_object_list(shared, src=0)
    found = shared[0]
    if found is None or (not found.candidates and not found.latest_problem):
        return

    def check(cand: resume.Candidate) -> str | None:
        if cand.state == resume.LEGACY:
            why: list[str | None] = [resume.adopt(checkpoints, cand.ckpt) if rank == 0 else None]
            dist.broadcast_object_list(why, src=0)
            return why[0]
        mine = resume.shares(cand.manifest, world)[rank]
        checked = manifest.verify(cand.ckpt.path, cand.manifest, only=mine, extras=rank == 0)
        bad = [str(m) for m in checked.mismatches]
        every: list[list[str] | None] = [None] * world
        dist.all_gather_object(every, bad)
        problems = sorted(p for part in every for p in part or [])
        return f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "") if problems else None

    outcome = resume.decide(found, check)
    if rank == 0:
        _act(checkpoints, found, outcome, say)
    dist.barrier()
    if outcome.refused:
        raise CheckpointError(resume.refusal(outcome, checkpoints))


def _act(checkpoints: Path, found: resume.Survey, outcome: resume.Outcome, say: Callable[[str], None]) -> None:
    """Rank 0 carries out the decision: set aside, then point `latest` (or, with nothing to resume, set it aside)."""
    for cand, why in outcome.set_aside:
        moved = set_aside.set_aside(checkpoints, cand.ckpt.path, why)
        say(f"> checkpoint {cand.tag} set aside, not resumed from (moved to {moved.folder}): {why}")
    for note in outcome.notes:
        say(f"> {note}")
    latest = checkpoints / layout.LATEST
    if outcome.chosen is not None:
        if outcome.chosen.state == resume.LEGACY:
            say(f"> {outcome.chosen.tag} was saved before manifests: its zip archives check out, its manifest is "
                "written now (adopted)")
        if found.latest != outcome.chosen.tag or found.latest_problem:
            layout.write_latest(checkpoints, outcome.chosen.tag)
            say(f"> latest now names {outcome.chosen.tag}")
    elif not outcome.refused and (latest.exists() or latest.is_symlink()):
        moved = set_aside.set_aside(checkpoints, latest, "names no checkpoint that can be resumed from")
        say(f"> latest set aside (moved to {moved.folder}): no checkpoint of the run ever committed")


def check_compatible(resume: Resume, shape: dict, tensor: int, pipeline: int) -> None:
    """Refuse a checkpoint written with another model shape or model-parallel layout."""
    saved_shape = resume.meta.get("model", {})
    diffs = [f"model.{k}: checkpoint {saved_shape.get(k)!r}, config {v!r}" for k, v in shape.items()
             if saved_shape.get(k) != v and k not in ("hidden_dropout", "attention_dropout")]
    parallel = resume.meta.get("parallel", {})
    for key, value in (("tensor", tensor), ("pipeline", pipeline)):
        if parallel.get(key) != value:
            diffs.append(f"parallel.{key}: checkpoint {parallel.get(key)!r}, config {value!r}")
    if diffs:
        raise CheckpointError(f"{resume.path} was written by a different model or TP/PP layout: " + "; ".join(diffs)
                              + ". Resume with the config it was written with, or use a new checkpoints folder")


def rng_file(path: Path, rank: int) -> Path:
    return Path(path) / f"rng_state_{rank:03d}.pt"


def save_rng(path: Path, rank: int) -> Path:
    import numpy as np
    import torch

    from bigscience_ops.trainer.tensor_parallel import rng_tracker_states

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": rng_tracker_states()}  # this TP rank's attention-dropout generator
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    Path(path).mkdir(parents=True, exist_ok=True)
    file = rng_file(path, rank)
    torch.save(state, file)
    return file


def load_rng(path: Path, rank: int) -> bool:
    """Restore this rank's RNG state; False when the checkpoint has none for it (another world size)."""
    import numpy as np
    import torch

    file = rng_file(path, rank)
    if not file.is_file():
        return False
    state = torch.load(file, weights_only=False)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if state.get("tracker"):  # absent in checkpoints written before the tracker: it keeps its fresh seed
        from bigscience_ops.trainer.tensor_parallel import set_rng_tracker_states

        set_rng_tracker_states(state["tracker"])
    return True


# ----------------------------------------------------------------------------- save

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
        import torch.distributed as dist

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
            small = [save_rng(path, rank)]
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
