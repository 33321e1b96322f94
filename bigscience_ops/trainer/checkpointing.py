"""Checkpoint decisions and records: what to resume from, whether it fits this model, bsops.json, RNG.

DeepSpeed writes the weights and optimizer states in its layout (`global_stepN/`); next to them each
checkpoint holds `bsops.json` (iteration, consumed samples and tokens, the LR schedule, the model shape,
TP/PP/DP, the resolved config), `rng_state_<rank>.pt`, and the manifest that commits it (checkpointer.py).

Before anything reads the checkpoints, every rank calls `resolve_resume`: rank 0 surveys the folder, each
rank checks its share of the candidate's files against the manifest (sizes and xxh3_128 hashes, so the
cost is about the checkpoint's bytes divided by the ranks, read once more before DeepSpeed loads them),
the results are gathered, and the first checkpoint that passes is the one `latest` names afterwards
(checkpoints/resume.py decides; what fails is set aside, never deleted, each with one line naming the file
and the reason). `find_resume` then reads that checkpoint's records.

When to save, and the save itself, are checkpointer.py's; reading the folder (tags, `latest`) is
checkpoints/layout.py's. The decisions are pure Python apart from the collectives and the RNG helpers.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.checkpoints import layout, manifest, resume, set_aside
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.checkpoints.manifest import Manifest


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
