"""Reshape on resume: a checkpoint written with one TP/PP/DP layout, loaded with another.

DeepSpeed refuses to load a ZeRO checkpoint with another DP size, and the layer files of one TP
layout hold other shards than another's. Its answer is the universal checkpoint: every parameter
in full, with its fp32 weights and Adam moments, in `zero/<parameter name>/{fp32,exp_avg,exp_avg_sq,step}.pt`,
which any layout slices again at load (`checkpoint: {load_universal: true}`).

This module
- decides whether a resume changes the layout and refuses what cannot be converted
  (`reshape_plan`, pure Python: one line per cause, naming the old and the new layout);
- describes the bundled trainer's parameters to DeepSpeed's converter (`universal_info`): which
  are replicated over TP, which are row-parallel (merged along dim 1; the rest are column-parallel,
  dim 0), which is the vocabulary (padded per TP size) and which is shared by the first and last
  pipeline stages (the tied embedding);
- converts `global_stepN` once into `global_stepN_universal` with the installed DeepSpeed's
  `deepspeed.checkpoint.ds_to_universal` (`convert`). The converter reads that description from
  the checkpoint's `mp_rank_*_model_states.pt`; they are small engine-state files, so the
  converter reads copies carrying the description from a staging folder, and the source
  checkpoint is never modified. The universal folder is complete when its bsops.json exists
  (written last); `latest_universal` names it.

Padding of the vocabulary: the universal word embedding keeps the source's padded rows (the
model is unchanged when the new padded size is the same or larger; the new rows are zeros, as
Megatron pads). When the new layout pads to fewer rows, the surplus padding rows are cut
(`fit_vocabulary`); rows of real tokens are never cut.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.checkpoints.layout import META, UNIVERSAL_SUFFIX, CheckpointError, write_meta
from bigscience_ops.errors import BsopsError

SUFFIX = UNIVERSAL_SUFFIX
LATEST_UNIVERSAL = "latest_universal"
WORD_EMBEDDINGS = "tied_modules.word_embeddings.word_embeddings.weight"
CONVERT_TIMEOUT_S = 6 * 3600


class ReshapeError(CheckpointError):
    """A checkpoint cannot be resumed with the new layout: one line per cause, old and new layout named."""


class ConversionError(BsopsError):
    """DeepSpeed's converter failed: carries its argv, exit code and the end of its output."""


@dataclass(frozen=True)
class Layout:
    tensor: int
    pipeline: int
    data: int
    zero_stage: int

    def __str__(self) -> str:
        return f"TP={self.tensor} PP={self.pipeline} DP={self.data} ZeRO-{self.zero_stage}"


@dataclass(frozen=True)
class Reshape:
    """A resume that changes the layout: from `old` (the checkpoint's) to `new`."""

    old: Layout
    new: Layout


def saved_layout(meta: dict) -> Layout:
    """The layout a checkpoint was written with, from its bsops.json."""
    parallel = meta.get("parallel", {})
    zero = meta.get("experiment", {}).get("parallel", {}).get("zero_stage", 0)
    return Layout(parallel.get("tensor", 1), parallel.get("pipeline", 1), parallel.get("data", 1), zero)


IGNORED_SHAPE_KEYS = ("hidden_dropout", "attention_dropout")
SHAPE_DEFAULTS = {"position_embedding": "learned"}
"""Model fields newer than the first checkpoints, with the value those checkpoints were written with."""


def reshape_plan(path: Path, meta: dict, shape: dict, new: Layout, vocab_size: int) -> Reshape | None:
    """None when `new` is the checkpoint's layout; the Reshape when it differs and can be converted.

    Raises ReshapeError listing every cause that stops the conversion: another model (the padded
    vocabulary may differ when TP does; the real vocabulary may not), a checkpoint without ZeRO
    partitions (ZeRO-0 keeps Adam's moments inside the engine state, which the converter does not
    read), a new layout without ZeRO (DeepSpeed loads universal checkpoints through its ZeRO optimizer).
    """
    old = saved_layout(meta)
    # A field added to the model after the checkpoint was written holds its default there
    # (e.g. position_embedding: learned), so a bsops upgrade mid-run still resumes.
    saved_shape = {**SHAPE_DEFAULTS, **meta.get("model", {})}
    causes = []
    for key, value in shape.items():
        if key in IGNORED_SHAPE_KEYS or saved_shape.get(key) == value:
            continue
        if key == "padded_vocab_size" and old.tensor != new.tensor:
            continue  # padded per TP size; the real vocabulary is compared below
        causes.append(f"model.{key}: checkpoint {saved_shape.get(key)!r}, config {value!r}")
    saved_vocab = meta.get("experiment", {}).get("model", {}).get("vocab_size")
    if saved_vocab is not None and saved_vocab != vocab_size:
        causes.append(f"model.vocab_size: checkpoint {saved_vocab!r}, config {vocab_size!r}")
    if causes:  # another model: not a reshape at all
        layouts = f" ({old}; the config asks for {new})" if old != new else ""
        raise ReshapeError(f"{path} was written by a different model{layouts}:\n  - " + "\n  - ".join(causes)
                           + "\nResume with the model it was written with, or use a new checkpoints folder")
    if (old.tensor, old.pipeline, old.data) == (new.tensor, new.pipeline, new.data):
        return None
    if dp_only_without_zero(meta, old, new):
        return None
    if old.zero_stage == 0:
        causes.append(f"the checkpoint was written with parallel.zero_stage 0: Adam's moments are inside "
                      f"mp_rank_*_model_states.pt, not in the ZeRO partitions DeepSpeed's converter reads; resume it "
                      f"once with its own layout ({old}) and parallel.zero_stage 1, then change the layout")
    if new.zero_stage == 0:
        causes.append("parallel.zero_stage 0: DeepSpeed loads universal checkpoints through its ZeRO optimizer; "
                      "set parallel.zero_stage to 1 (or 2)")
    if causes:
        raise ReshapeError(f"cannot resume {path} ({old}) with {new}:\n  - " + "\n  - ".join(causes))
    return Reshape(old, new)


def dp_only_without_zero(meta: dict, old: Layout, new: Layout) -> bool:
    """Whether DeepSpeed loads the checkpoint as it is: only DP changes, and without ZeRO in fp32/fp16
    every DP rank holds the whole optimizer inside mp_rank_*_model_states.pt, which is written per
    TP/PP rank, not per DP rank. (bf16 at ZeRO-0 uses DeepSpeed's bf16 optimizer, which shards per DP rank.)
    A node-schedule phase change of a ZeRO-0 run is exactly this case."""
    precision = meta.get("experiment", {}).get("train", {}).get("precision", "fp32")
    return (old.zero_stage == new.zero_stage == 0 and precision != "bf16"
            and (old.tensor, old.pipeline) == (new.tensor, new.pipeline))


def universal_info(parameter_names: set[str], padded_vocab_rows: int) -> dict:
    """UNIVERSAL_CHECKPOINT_INFO for the bundled trainer's parameters (names as PipelineModule gives them).

    Only patterns that match some parameter are listed: DeepSpeed's converter checks that each is used.
    """
    from deepspeed.checkpoint import constants as c

    replicated = [
        r"\d+\.(input_layernorm|post_attention_layernorm)\.(weight|bias)$",  # LayerNorms of the blocks
        r"\d+\.(self_attention\.dense|mlp\.dense_4h_to_h)\.bias$",  # row-parallel biases, added after the reduce
        r"\d+\.(weight|bias)$",  # the final LayerNorm (a layer that is a LayerNorm)
        r"tied_modules\.word_embeddings\.(position_embeddings\.weight|embed_norm\.(weight|bias))$",
    ]
    row_parallel = [r"\d+\.(self_attention\.dense|mlp\.dense_4h_to_h)\.weight$"]
    vocabulary = [WORD_EMBEDDINGS.replace(".", r"\.") + "$"]

    def used(patterns: list[str]) -> list[str]:
        import re

        return [p for p in patterns if any(re.match(p, name) for name in parameter_names)]

    return {
        c.UNIVERSAL_CHECKPOINT_VERSION_KEY: c.UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        c.TP_REPLICATED_PARAMETER_PATTERNS: used(replicated),
        c.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: used(row_parallel),
        c.VOCABULARY_PARAMETER_PATTERNS: used(vocabulary),
        c.PIPELINE_REPLICATED_PARAMETER_PATTERNS: used(vocabulary),
        "original_vocab_size": padded_vocab_rows,  # keep every trained row; fit_vocabulary cuts surplus padding
    }


def universal_path(source: Path) -> Path:
    return source.with_name(source.name + SUFFIX)


def is_converted(source: Path) -> bool:
    """Whether `source` has a complete universal copy (its bsops.json is written last)."""
    return (universal_path(source) / META).is_file()


def _model_state_files(source: Path) -> list[Path]:
    return sorted(source.glob("mp_rank_*_model_states.pt"))


def _stage_input(source: Path, staging: Path, padded_vocab_rows: int) -> None:
    """`staging`: links to every file of `source`, with engine-state copies that carry universal_info."""
    import torch
    from deepspeed.checkpoint import constants as c

    model_files = _model_state_files(source)
    states = {f.name: torch.load(f, map_location="cpu", weights_only=False) for f in model_files}
    names = {name for state in states.values() for group in state.get(c.PARAM_SHAPES) or [] for name in group}
    info = universal_info(names, padded_vocab_rows)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for file in source.iterdir():
        if file.is_file() and file.name not in states:
            os.symlink(file.resolve(), staging / file.name)
    for name, state in states.items():
        state[c.UNIVERSAL_CHECKPOINT_INFO] = info
        torch.save(state, staging / name)


def convert(source: Path, padded_vocab_rows: int, workers: int = 1, timeout_s: float = CONVERT_TIMEOUT_S,
            log=print) -> bool:
    """Write `source`'s universal copy beside it (`global_stepN_universal`, named in `latest_universal`).

    Runs `python -m deepspeed.checkpoint.ds_to_universal` in its own process. Returns False without
    converting when the copy is already complete (a second resume does not convert again); an
    incomplete copy (an interrupted conversion) is removed and made again.
    """
    source = Path(source)
    out = universal_path(source)
    if is_converted(source):
        return False
    if not _model_state_files(source) or not list(source.glob("*optim_states.pt")):
        raise ReshapeError(f"{source}: no mp_rank_*_model_states.pt or ZeRO *optim_states.pt files; "
                           "DeepSpeed's converter needs a checkpoint written with parallel.zero_stage >= 1")
    staging = source.with_name(f".{out.name}.input")
    shutil.rmtree(out, ignore_errors=True)
    start = time.time()
    _stage_input(source, staging, padded_vocab_rows)
    argv = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(staging),
            "--output_folder", str(out), "--num_extract_workers", str(workers), "--num_merge_workers",
            str(max(1, workers // 2))]
    log(f"> converting {source} to DeepSpeed's universal checkpoint {out} ...")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired as exc:
        raise ConversionError(f"{' '.join(argv)}: no result after {timeout_s:.0f} s") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if proc.returncode != 0:
        tail = (proc.stdout[-2000:] + proc.stderr[-4000:]).strip()
        raise ConversionError(f"{' '.join(argv)} exited {proc.returncode}:\n{tail}")
    meta = json.loads((source / META).read_text(encoding="utf-8"))
    meta["universal"] = {"source": source.name, "vocabulary_rows": padded_vocab_rows}
    write_meta(out, meta)
    log(f"> converted {source.name} to {out.name} in {time.time() - start:.1f} s")
    return True


def fit_vocabulary(universal: Path, padded_vocab_rows: int) -> bool:
    """Cut the universal word embedding's padding rows beyond `padded_vocab_rows` (a smaller new padding).

    True when rows were cut. DeepSpeed pads a smaller universal vocabulary with zero rows itself.
    """
    import torch

    meta_file = Path(universal) / META
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    rows = meta["universal"]["vocabulary_rows"]
    if rows <= padded_vocab_rows:
        return False
    folder = Path(universal) / "zero" / WORD_EMBEDDINGS
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        file = folder / f"{state}.pt"
        data = torch.load(file, weights_only=False)
        data["param"] = data["param"][:padded_vocab_rows].clone()
        torch.save(data, file)
    meta["universal"]["vocabulary_rows"] = padded_vocab_rows
    write_meta(Path(universal), meta)
    return True


def ready(source: Path, padded_vocab_rows: int) -> bool:
    """Whether `source`'s universal copy is complete and fits a vocabulary padded to `padded_vocab_rows`."""
    meta_file = universal_path(Path(source)) / META
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return meta.get("universal", {}).get("vocabulary_rows", padded_vocab_rows + 1) <= padded_vocab_rows


def wait_ready(source: Path, padded_vocab_rows: int, timeout_s: float = CONVERT_TIMEOUT_S, poll_s: float = 0.5) -> None:
    """Wait (polling the shared filesystem, no collective to time out) until another rank has converted `source`."""
    deadline = time.monotonic() + timeout_s
    while not ready(source, padded_vocab_rows):
        if time.monotonic() > deadline:
            raise ConversionError(f"{universal_path(Path(source))}: not complete after {timeout_s:.0f} s of waiting "
                                  "for rank 0's conversion; see rank 0's error in the job output")
        time.sleep(poll_s)
