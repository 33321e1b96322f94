"""The experiment files tests write next to the bundled ones: `base: tiny` with a run folder, or shrunk to seconds.

`tiny_yaml(run, *sections)` is tiny with its run folder at `run` and one line per extra section;
`SHRUNK_MODEL` is the 2-layer 64-wide model every launch-level test trains (bundled corpus and
tokenizer, so tiny's vocabulary); `shrunk_tiny_yaml` is the whole shrunk experiment of the local
launch tests, and `small_trainings` a trainings folder holding it as small.yaml beside tiny.yaml (its base).
`processes_mentioning` finds what a launch left running.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SHRUNK_MODEL = "model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 64}\n"


def tiny_yaml(run: str | os.PathLike, *sections: str) -> str:
    """`base: tiny` with paths.output `run`, then `sections` (each a whole YAML line, e.g. "slurm: {array: 1}\\n")."""
    return f"base: tiny\npaths: {{output: {json.dumps(str(run))}}}\n" + "".join(sections)


def shrunk_tiny_yaml(purpose: str, log_interval: int, extra: str = "") -> str:
    """An experiment file `base: tiny` on the bundled corpus, shrunk to seconds for launch-level tests:
    PP=2 over 2 "nodes", a 4 -> 8 rampup, saves every 10 steps, each task exits at step 15."""
    return f"""
base: tiny
description: tiny shrunk for the {purpose} test
{SHRUNK_MODEL}batch: {{global_batch_size: 8, micro_batch_size: 2, rampup: {{start: 4, increment: 2, samples: 40}}}}
train: {{samples: 200}}
lr_schedule: {{warmup_samples: 40}}
checkpoint: {{save_interval: 10, exit_interval: 15}}
logging: {{log_interval: {log_interval}, eval_interval: 10, eval_iters: 1}}
{extra}data:
  blend: [{{prefix: {REPO}/corpus/build/tiny_text_document}}]
  tokenizer: {{kind: json, json_file: {REPO}/corpus/tokenizer.json}}
"""


def small_trainings(folder: Path, small: str) -> Path:
    """`folder` made a trainings folder: a copy of the bundled tiny.yaml (the base) and `small` as small.yaml."""
    folder.mkdir()
    (folder / "tiny.yaml").write_text((REPO / "trainings" / "tiny.yaml").read_text())
    (folder / "small.yaml").write_text(small)
    return folder


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line holds `text` (a run's folder: what of its launch is still running)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found
