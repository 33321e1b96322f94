"""A run folder's records written as the views read them, for the view tests that need no training."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from bigscience_ops.checkpoints import layout, manifest

LAYOUT = {"tensor": 1, "pipeline": 1, "data": 1, "zero_stage": 0, "precision": "fp32"}


def commit_checkpoint(folder: Path, iteration: int | None = None, *, optimizer: bool = True) -> manifest.Manifest:
    """Commit a checkpoint folder a test wrote by hand as the trainer commits a save: a manifest of every file in it
    now (sizes and hashes). Without it the folder is a save that did not finish, which no command counts. A folder
    committed already (a trained checkpoint a test changed) keeps what its manifest said of the run."""
    folder = Path(folder)
    files = {rel: manifest.record_file(folder / rel) for rel in manifest.files_on_disk(folder)}
    step = layout.step_of(folder.name) if iteration is None else iteration
    before = manifest.read(folder) if (folder / manifest.MANIFEST).is_file() else None
    if before is not None:
        made = dataclasses.replace(before, files=files, iteration=step if iteration is not None else before.iteration)
    else:
        made = manifest.Manifest(folder.name, step, "", "test", dict(LAYOUT), optimizer, files, time.time())
    manifest.commit(folder, made)
    return made


def complete_checkpoint(exp, step: int) -> None:
    """A complete checkpoint folder as `bsops rollback` and `info` read it (bsops.json and a committed manifest),
    and `latest` naming it."""
    folder = Path(exp.paths.checkpoints) / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "bsops.json").write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder, step)
    (Path(exp.paths.checkpoints) / "latest").write_text(f"global_step{step}")
