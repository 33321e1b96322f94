"""Warm start by depth scaling: the first checkpoint of a deeper model, built from a trained shallower one.

Gopher's appendix G.3.3 (seed 004): scale a trained model depth-wise by duplicating a subset of its
layers. For L source blocks and L' > L target blocks, target block i (0-based) starts as source block
floor(i * L / L'); the embedding (word and position tables) and the final LayerNorm are copied.

DeepSpeed's pipeline checkpoints number their layer files over the whole model, whatever the PP:
`layer_00` is the embedding, `layer_01` .. `layer_L` the blocks, `layer_{L+1}` the final LayerNorm
(the tied head has no file of its own). So a new layer file is a byte copy of a source layer file under
another number, one per TP rank (`layer_XX-model_YY-model_states.pt`), and any PP of the target loads
it. Beside them go minimal `mp_rank_XX_model_states.pt` (no optimizer state) and a bsops.json saying
`"weights_only": true` with step 0, zero consumed samples and the new experiment's shape: the trainer
loads the weights only (`load_module_only`) and starts the schedules, the optimizer and the data from
the beginning.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.config import loading as config
from bigscience_ops.checkpoints import manifest
from bigscience_ops.checkpoints.layout import (
    COMMIT_KEY, LATEST, META, complete_checkpoints, list_checkpoints, resume_step, run_id, write_latest, write_meta,
)
from bigscience_ops.errors import BsopsError

LAYER_FILE = re.compile(r"layer_(\d+)-(.*model_states\.pt)")
# Fields that must agree: they decide the shape of a tensor that is copied.
SAME_SHAPE = ("hidden_size", "num_attention_heads", "ffn_hidden_size", "padded_vocab_size", "position_embedding",
              "embed_layernorm")


class WarmStartError(BsopsError):
    """A warm start that cannot be built: names the field or path, its value, and what is allowed."""


@dataclass(frozen=True)
class Source:
    """One complete checkpoint of the shallower run."""

    checkpoints: Path
    tag: str
    meta: dict

    @property
    def path(self) -> Path:
        return self.checkpoints / self.tag


@dataclass(frozen=True)
class WarmStart:
    source: Source
    target: Path  # the new global_step0 folder
    mapping: list[int]  # target block i <- source block mapping[i] (0-based)


def layer_mapping(source_layers: int, target_layers: int) -> list[int]:
    """Gopher G.3.3: new block i starts as source block floor(i * L / L')."""
    return [i * source_layers // target_layers for i in range(target_layers)]


def parse_from(spec: str) -> tuple[str, str | None]:
    """RUN[:STEP] -> (RUN, STEP or None for `latest`). A STEP is digits or 'latest'."""
    run, sep, step = spec.rpartition(":")
    if sep and (step.isdigit() or step == "latest") and run:
        return run, None if step == "latest" else step
    return spec, None


def source_checkpoints(run: str, trainings_dir: Path | None = None) -> Path:
    """The checkpoints folder of RUN: a checkpoints folder, a run folder holding one (or its experiment.json),
    or an experiment name whose paths.checkpoints holds the run."""
    folder = Path(run)
    if folder.is_dir():
        if (folder / LATEST).exists() or list_checkpoints(folder):
            return folder
        if (folder / "experiment.json").is_file():
            try:
                rendered = json.loads((folder / "experiment.json").read_text(encoding="utf-8"))
                return Path(rendered["paths"]["checkpoints"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise WarmStartError(f"--from {run}: {folder / 'experiment.json'} has no paths.checkpoints ({exc}); "
                                     "expected the experiment.json bsops render writes") from None
        if (folder / "checkpoints").is_dir():
            return folder / "checkpoints"
        raise WarmStartError(f"--from {run}: the folder holds no checkpoints (no 'latest', no global_stepN, no "
                             "checkpoints/ or experiment.json); give a run folder, its checkpoints folder or an "
                             "experiment name")
    try:
        exp = config.load_experiment(run, trainings_dir)
    except BsopsError as exc:
        raise WarmStartError(f"--from {run}: neither a folder nor a loadable experiment ({exc})") from None
    return Path(exp.paths.checkpoints)


def find_source(checkpoints: Path, step: str | None, run: str) -> Source:
    complete = complete_checkpoints(checkpoints)
    if not complete:
        raise WarmStartError(f"--from {run}: {checkpoints} holds no complete checkpoint (one with a committed "
                             f"{manifest.MANIFEST})")
    if step is None:
        step_now = resume_step(checkpoints)  # `latest` when it names a complete checkpoint, else the newest
        chosen = next((c for c in complete if c.step == step_now), None)
        if chosen is None:
            raise WarmStartError(f"--from {run}: no complete checkpoint to start from in {checkpoints}; give a "
                                 f"complete step: {', '.join(str(c.step) for c in complete)}")
    else:
        chosen = next((c for c in complete if c.step == int(step)), None)
        if chosen is None:
            raise WarmStartError(f"--from {run}:{step}: no complete checkpoint at step {step} in {checkpoints}; "
                                 f"complete steps: {', '.join(str(c.step) for c in complete)}")
    found = chosen.manifest()
    bad = manifest.verify(chosen.path, found).mismatches
    if bad:
        raise WarmStartError(f"--from {run}: {chosen.path} does not match its manifest ({bad[0]}"
                             f"{f', and {len(bad) - 1} more' if len(bad) > 1 else ''}); give another step")
    return Source(checkpoints, chosen.tag, chosen.meta())


def check(source: Source, target_shape: dict, target_tensor: int) -> None:
    """Refuse what a copy of layers cannot make: another width, heads, FFN, vocabulary, position
    embedding or TP, or a target that is not deeper."""
    src = source.meta.get("model", {})
    problems = [f"model.{k}: source {src.get(k)!r}, target {target_shape[k]!r} (must be equal)"
                for k in SAME_SHAPE if src.get(k, "learned" if k == "position_embedding" else None) != target_shape[k]]
    if target_shape["position_embedding"] == "learned" and src.get("max_position_embeddings") != \
            target_shape["max_position_embeddings"]:
        problems.append(f"model.max_position_embeddings: source {src.get('max_position_embeddings')!r}, target "
                        f"{target_shape['max_position_embeddings']!r} (the learned position table is copied: "
                        "must be equal)")
    src_tp = source.meta.get("parallel", {}).get("tensor")
    if src_tp != target_tensor:
        problems.append(f"parallel.tensor: source {src_tp!r}, target {target_tensor!r} (each TP rank's layer files "
                        "are copied: must be equal)")
    if not isinstance(src.get("num_layers"), int) or target_shape["num_layers"] <= src["num_layers"]:
        problems.append(f"model.num_layers: source {src.get('num_layers')!r}, target {target_shape['num_layers']!r} "
                        "(warm start scales depth: the target must have more layers)")
    if problems:
        raise WarmStartError(f"cannot warm-start from {source.path}: " + "; ".join(problems))


def _layer_files(path: Path) -> dict[int, list[tuple[str, Path]]]:
    """layer number -> [(file name after 'layer_NN-', path)] of one checkpoint folder."""
    found: dict[int, list[tuple[str, Path]]] = {}
    for file in sorted(path.iterdir()):
        match = LAYER_FILE.fullmatch(file.name)
        if match:
            found.setdefault(int(match.group(1)), []).append((match.group(2), file))
    return found


def build(exp, source: Source, log=lambda line: None, dry_run: bool = False) -> WarmStart:
    """Write global_step0 of EXP's checkpoints folder from `source`, then `latest` (`dry_run`: everything checked,
    the checkpoint it would write returned, nothing written)."""
    from bigscience_ops.sizing import GPTShape

    shape = dataclasses.asdict(GPTShape.from_experiment(exp))
    p = exp.parallel
    check(source, shape, p.tensor)
    out = Path(exp.paths.checkpoints)
    existing = list_checkpoints(out)
    if existing or (out / LATEST).exists():
        raise WarmStartError(f"paths.checkpoints: {out} already holds checkpoints "
                             f"({', '.join(c.tag for c in existing[-3:]) or LATEST}); a warm start writes the first "
                             "checkpoint of a new run: give the experiment an empty checkpoints folder")
    src_layers, tgt_layers = source.meta["model"]["num_layers"], shape["num_layers"]
    files = _layer_files(source.path)
    needed = range(src_layers + 2)
    missing = [n for n in needed if n not in files]
    if missing:
        raise WarmStartError(f"{source.path}: no layer file for layer(s) {missing}; a checkpoint of {src_layers} "
                             f"blocks has layer_00 .. layer_{src_layers + 1:02d}")
    mapping = layer_mapping(src_layers, tgt_layers)
    origin = {0: 0, tgt_layers + 1: src_layers + 1} | {i + 1: m + 1 for i, m in enumerate(mapping)}
    tag = "global_step0"
    target = out / tag
    if dry_run:
        return WarmStart(source, target, mapping)
    import torch

    tmp = out / f".{tag}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for new, old in sorted(origin.items()):
        for suffix, file in files[old]:
            shutil.copyfile(file, tmp / f"layer_{new:02d}-{suffix}")
        log(f"layer_{new:02d} <- {source.tag}/layer_{old:02d}")
    mp_world = p.tensor * p.pipeline
    for rank in range(mp_world):  # the engine state without an optimizer: DeepSpeed reads the sizes only
        torch.save({"module": None, "buffer_names": [], "optimizer": None, "lr_scheduler": None,
                    "skipped_steps": 0, "global_steps": 0, "global_samples": 0, "dp_world_size": 1,
                    "mp_world_size": mp_world, "iteration": 0}, tmp / f"mp_rank_{rank:02d}_model_states.pt")
    write_meta(tmp, {
        "iteration": 0,
        "consumed_train_samples": 0,
        "consumed_tokens": 0,
        "weights_only": True,
        "warm_start": {"source": str(source.path), "source_iteration": source.meta.get("iteration"),
                       "source_layers": src_layers, "block_from": mapping},
        "model": shape,
        "parallel": {"tensor": p.tensor, "pipeline": p.pipeline, "data": None},
        "experiment": config.to_dict(exp),
        COMMIT_KEY: manifest.MANIFEST,
    })
    files = {rel: manifest.record_file(tmp / rel) for rel in manifest.files_on_disk(tmp)}
    layout = {"tensor": p.tensor, "pipeline": p.pipeline, "data": 1, "zero_stage": p.zero_stage,
              "precision": exp.train.precision}
    manifest.commit(tmp, manifest.Manifest(tag, 0, run_id(out) or "", exp.name, layout, False, files, time.time()))
    tmp.rename(target)
    write_latest(out, tag)
    return WarmStart(source, target, mapping)
