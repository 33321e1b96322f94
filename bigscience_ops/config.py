"""The experiment config: typed, frozen dataclasses loaded from trainings/<name>.yaml.

Files are found by name as experiment_files.py says (the local trainings folder, then bsops' own).
An experiment may start with `base: <other>` and list only what differs. Values are coerced to
the declared types (`10e6` for an int, `6e-5` for a float), unknown keys are rejected with the
valid ones, and every error names the file, the field path, the value and what is allowed.
Values left out that follow from others (ffn size, paths, job name, exit duration) are derived
once here and recorded in `Experiment.derived`, so nothing derived is typed twice.

Where relative paths resolve, for every command and every install kind: against the experiment
file's project folder, the folder that holds its trainings/ folder, wherever the command runs from.
That holds for inputs (data.blend prefixes, tokenizer files) and outputs (paths.*, the kill switch,
backup.dest, data.cache_dir) alike, so a cron job or an on-call check finds the run the launch
made. An input under corpus/ that the project folder does not have is the bundled corpus's file (an
experiment copied from `tiny` trains on it and converts with its tokenizer). bsops' own experiments,
in a bundled trainings/ folder (source checkout, editable or wheel install, $BSOPS_DATA_DIR), read
their inputs there and write their outputs under the current folder (runs/NAME): bsops' folder is
no place for runs. Loading makes every path absolute, so job scripts and experiment.json never
depend on the folder a job runs in.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from pathlib import Path
from typing import Any

from bigscience_ops import sizing, validation
from bigscience_ops.errors import ConfigError
from bigscience_ops.experiment_files import check_name, experiment_path, find_base, outputs_folder, project_folder
from bigscience_ops.resources import ResourceError, bundled
from bigscience_ops.schema import Experiment
from bigscience_ops.slurm import parse_time_limit
from bigscience_ops.typedyaml import build, read_with_bases
from bigscience_ops.validation import SIGNAL_SECONDS_MAX


# ----------------------------------------------------------------------------- loading

def load_experiment(name: str, trainings_dir: Path | None = None) -> Experiment:
    """Load, merge `base:` chains, coerce, validate and derive one experiment. Nothing of its run folder is read:
    what a run recorded (a rollback's skips) is applied by the launch plan (launch_plan.apply_overrides)."""
    path = experiment_path(name, trainings_dir)
    check_name(path.stem, str(path))
    inputs_root, outputs_root = project_folder(path), outputs_folder(path)  # where its relative paths resolve
    raw, origins = read_with_bases(path, partial(find_base, trainings_dir=trainings_dir), _one_node_plan)
    raw.pop("base", None)
    return _build(path.stem, raw, origins, str(path), inputs_root, outputs_root)


def field_origins(name: str, trainings_dir: Path | None = None) -> dict[str, str]:
    """For each field path written in EXP's file or its bases, the file that set it (the last one wins)."""
    path = experiment_path(name, trainings_dir)
    return read_with_bases(path, partial(find_base, trainings_dir=trainings_dir), _one_node_plan)[1]


def _one_node_plan(data: dict, merged: dict, source: str) -> None:
    """slurm.nodes and slurm.node_schedule say one thing: a file sets one of them, and replaces an inherited other."""
    slurm = data.get("slurm")
    if not isinstance(slurm, dict):
        return
    if "nodes" in slurm and slurm.get("node_schedule"):
        raise ConfigError(source, "slurm.node_schedule", slurm["node_schedule"],
                          f"set slurm.nodes ({slurm['nodes']}) or slurm.node_schedule, not both: a schedule's "
                          "first phase is the starting node count")
    inherited = merged.get("slurm")
    if isinstance(inherited, dict):
        if "nodes" in slurm:
            inherited.pop("node_schedule", None)
        if "node_schedule" in slurm:
            inherited.pop("nodes", None)


# ----------------------------------------------------------------------------- derivation

def exit_margin_minutes(num_params: float) -> int:
    """Minutes kept free before the time limit to finish an iteration and write a checkpoint.

    The tr1-13B notes kept 10 minutes for 13B and warned that bigger models need more; the margin grows
    with the square root of the size (about 29 minutes at 104B) and is never below 5 minutes.
    """
    return max(5, math.ceil(10 * math.sqrt(num_params / 13e9)))


def _resolve_path(value: str, root: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else root / path)


def _resolve_input(value: str, root: Path, prefix: bool = False) -> str:
    """An input path: against `root`, unless it is under corpus/ and `root` lacks it, then the bundled corpus's.

    `prefix` is a dataset prefix, there when its .bin or .idx is (or, before a first build, nowhere).
    """
    path = Path(value).expanduser()
    here = Path(_resolve_path(value, root))
    if path.is_absolute() or path.parts[:1] != ("corpus",):
        return str(here)
    if here.exists() or prefix and any(Path(f"{here}{ext}").exists() for ext in (".bin", ".idx")):
        return str(here)
    try:
        corpus = bundled("corpus").resolve()
    except ResourceError:
        return str(here)
    return str(corpus.joinpath(*path.parts[1:]))


def _build(name: str, raw: dict, origins: dict, source: str, root: Path, output_root: Path | None = None) -> Experiment:
    if "name" in raw and raw["name"] != name:
        raise ConfigError(source, "name", raw["name"], f"the name is the file name ({name!r}); remove the key")
    raw = {**raw, "name": name}
    if "derived" in raw:
        raise ConfigError(source, "derived", raw["derived"], "computed by bsops; remove the key")
    return _checked(raw, origins, source, (root, output_root))


def _checked(raw: dict, origins: dict, source: str, roots: tuple[Path, Path | None] | None) -> Experiment:
    """Typed (typedyaml), its cross-field rules checked (validation.py: the one place they run) and, for an
    experiment file, derived (`roots`: where its inputs and outputs resolve); a run record is derived already."""
    exp: Experiment = build(Experiment, raw, "", origins, source)
    validation.validate(exp, source)
    if roots is not None:
        exp = derive(exp, roots[0], source, roots[1])
    validation.check_derived(exp, source)
    return exp


def derive(exp: Experiment, root: Path, source: str = "", output_root: Path | None = None) -> Experiment:
    """Fill every field left out that follows from others, and record which were filled.

    Relative inputs resolve against `root` (the project folder, holding trainings/; see the module's
    docstring for corpus/), those of outputs (paths.*, the kill switch, the backup and index cache
    folders) against `output_root` (`root` when not given).
    """
    out_root = output_root or root
    derived: list[str] = []

    def fill(obj: Any, section: str, **values: Any) -> Any:
        changes = {k: v for k, v in values.items() if getattr(obj, k) is None}
        derived.extend(f"{section}.{k}" for k in changes)
        return dataclasses.replace(obj, **changes) if changes else obj

    m = fill(exp.model, "model", ffn_hidden_size=4 * exp.model.hidden_size,
             max_position_embeddings=exp.model.seq_length)
    output = _resolve_path(exp.paths.output or f"runs/{exp.name}", out_root)
    if exp.paths.output is None:
        derived.append("paths.output")
    paths = dataclasses.replace(exp.paths, output=output)
    paths = fill(paths, "paths", checkpoints=f"{output}/checkpoints", tensorboard=f"{output}/tensorboard",
                 logs=f"{output}/logs", codecarbon=f"{output}/codecarbon")
    paths = dataclasses.replace(paths, **{k: _resolve_path(getattr(paths, k), out_root)
                                          for k in ("checkpoints", "tensorboard", "logs", "codecarbon")})
    data = dataclasses.replace(
        exp.data,
        blend=[dataclasses.replace(d, prefix=_resolve_input(d.prefix, root, prefix=True)) for d in exp.data.blend],
        tokenizer=dataclasses.replace(exp.data.tokenizer, **{
            k: _resolve_input(v, root) for k in ("vocab_file", "merges_file", "json_file")
            if (v := getattr(exp.data.tokenizer, k)) is not None}),
        cache_dir=None if exp.data.cache_dir is None else _resolve_path(exp.data.cache_dir, out_root),
    )
    slurm = fill(exp.slurm, "slurm", job_name=exp.name,
                 nodes=exp.slurm.node_schedule[0].nodes if exp.slurm.node_schedule else 1)
    limit = parse_time_limit(slurm.time)  # validation.check_time_limit has parsed it
    backup = exp.backup
    if backup.dest is not None:
        backup = dataclasses.replace(backup, dest=_resolve_path(backup.dest, out_root))
    exp = dataclasses.replace(exp, model=m, paths=paths, data=data, slurm=slurm, backup=backup)
    params = sizing.count_parameters(exp.model, exp.parallel.tensor).total
    ck = fill(exp.checkpoint, "checkpoint", exit_margin_mins=exit_margin_minutes(params),
              kill_switch_path=f"{output}/kill-switch")
    # Not positive when the time limit is shorter than the margin: validation.check_exit_duration refuses that.
    ck = fill(ck, "checkpoint", exit_duration_in_mins=limit - ck.exit_margin_mins)
    ck = dataclasses.replace(ck, kill_switch_path=_resolve_path(ck.kill_switch_path, out_root))
    slurm = fill(exp.slurm, "slurm", signal_seconds=min(SIGNAL_SECONDS_MAX, ck.exit_margin_mins * 60))
    return dataclasses.replace(exp, checkpoint=ck, slurm=slurm, derived=tuple(exp.derived) + tuple(derived))


def to_dict(exp: Experiment) -> dict:
    """The resolved experiment as plain data (what `bsops show` prints and run records keep)."""
    data = dataclasses.asdict(exp)
    data.pop("derived")
    return data


def from_dict(data: dict, source: str = "<resolved config>") -> Experiment:
    """Rebuild an experiment from `to_dict` output (a run record) without re-deriving anything."""
    return _checked(data, {}, source, None)
