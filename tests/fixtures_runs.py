"""A run folder's records written as the views read them, for the view tests that need no training."""

from __future__ import annotations

import json
from pathlib import Path


def complete_checkpoint(exp, step: int) -> None:
    """A complete checkpoint folder as `bsops rollback` and `info` read it (bsops.json), and `latest` naming it."""
    folder = Path(exp.paths.checkpoints) / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "bsops.json").write_text(json.dumps({"iteration": step}))
    (Path(exp.paths.checkpoints) / "latest").write_text(f"global_step{step}")
