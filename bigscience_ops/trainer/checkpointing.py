"""Checkpoint decisions and records: what to resume from, whether it fits this model, bsops.json, RNG.

DeepSpeed writes the weights and optimizer states in its layout (`global_stepN/`, `latest`). Next
to them each checkpoint holds `bsops.json` (iteration, consumed samples and tokens, the LR
schedule, the model shape, TP/PP/DP, the resolved config) and `rng_state_<rank>.pt`, written
before DeepSpeed updates `latest`: `latest` only ever names a complete checkpoint.

When to save, and the save itself, are checkpointer.py's; reading the folder (tags, `latest`) is
checkpoints/layout.py's. This module is pure Python apart from the RNG helpers, so decisions are
unit-testable.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.checkpoints import layout
from bigscience_ops.checkpoints.layout import META, CheckpointError


@dataclass(frozen=True)
class Resume:
    tag: str
    path: Path
    meta: dict


def find_resume(checkpoints: Path) -> Resume | None:
    """The checkpoint `latest` names, or None for a folder that holds no checkpoint yet."""
    checkpoints = Path(checkpoints)
    if not checkpoints.is_dir():
        return None
    tags = [c.tag for c in layout.list_checkpoints(checkpoints)]
    latest = checkpoints / layout.LATEST
    tag = layout.latest_tag(checkpoints)
    if tag is None:
        if tags:
            raise CheckpointError(
                f"{checkpoints}: holds {', '.join(tags[-3:])} but no 'latest' file; refusing to start from scratch. "
                f"Write the tag to resume from into {latest} (e.g. {tags[-1]}), or move the folder away to start over")
        return None
    path = checkpoints / tag
    if not path.is_dir():
        raise CheckpointError(f"{latest}: names {tag!r}, which is not a checkpoint folder in {checkpoints}; "
                              f"available: {', '.join(tags) or 'none'}")
    layout.latest_checkpoint(checkpoints)  # one rule for links in a run: a global_stepN that is one is refused
    meta_file = path / META
    if not meta_file.is_file():
        raise CheckpointError(f"{path}: no {META}: not written by bsops' trainer, or the save did not finish; "
                              f"point {latest} at a complete checkpoint")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{meta_file}: unreadable ({exc}); point {latest} at a complete checkpoint") from None
    return Resume(tag, path, meta)


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


def save_rng(path: Path, rank: int) -> None:
    import numpy as np
    import torch

    from bigscience_ops.trainer.tensor_parallel import rng_tracker_states

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": rng_tracker_states()}  # this TP rank's attention-dropout generator
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    Path(path).mkdir(parents=True, exist_ok=True)
    torch.save(state, rng_file(path, rank))


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
