"""The experiment config: typed, frozen dataclasses loaded from trainings/<name>.yaml.

An experiment named on the command line is looked up in the local trainings folder (--trainings-dir,
$BSOPS_TRAININGS or ./trainings) first, then in bsops' bundled trainings/: a local file of the same
name wins, and the bundled experiments stay reachable from any folder. A `base:` is found the same
way, after the folder of the file that names it.

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
import os
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bigscience_ops import hub_remote, sizing
from bigscience_ops.errors import ConfigError
from bigscience_ops.resources import ResourceError, bundled, is_bundled
from bigscience_ops.rollbacks import with_recorded_skips
from bigscience_ops.schedules import parse_skip_ranges
from bigscience_ops.schema import MAX_STEPS, Experiment, NodePhase
from bigscience_ops.slurm import parse_time_limit
from bigscience_ops.typedyaml import build, read_with_bases


# ----------------------------------------------------------------------------- loading

def local_trainings_dir(trainings_dir: Path | None = None) -> Path:
    """The user's own experiments: --trainings-dir, else $BSOPS_TRAININGS, else ./trainings (which may not exist)."""
    if trainings_dir is not None:
        return Path(trainings_dir)
    env = os.environ.get("BSOPS_TRAININGS")
    return Path(env) if env else Path.cwd() / "trainings"


def trainings_dirs(trainings_dir: Path | None = None) -> list[Path]:
    """Where experiments are looked up by name, in order: the local folder (local_trainings_dir), then the
    bundled trainings/. A local file wins over a bundled one of the same name."""
    found = [local_trainings_dir(trainings_dir)]
    try:
        mine = bundled("trainings")
    except ResourceError:
        return found
    if not found[0].is_dir() or found[0].resolve() != mine.resolve():
        found.append(mine)
    return found


@dataclass(frozen=True)
class Found:
    """An experiment file found by name: where it is and whether it is one of bsops' own."""

    name: str
    path: Path
    bundled: bool
    shadowed_by: Path | None = None  # a bundled file hidden by a local one of the same name


def find_experiments(trainings_dir: Path | None = None) -> list[Found]:
    """Every experiment of trainings_dirs(), local ones first; a bundled one a local file hides is marked."""
    seen: dict[str, Path] = {}
    found = []
    for directory in trainings_dirs(trainings_dir):
        for path in sorted(directory.glob("*.yaml")):
            found.append(Found(path.stem, path, is_bundled(path), seen.get(path.stem)))
            seen.setdefault(path.stem, path)
    return found


def list_experiments(trainings_dir: Path | None = None) -> list[str]:
    """The names experiment_path() finds, sorted."""
    return sorted({f.name for f in find_experiments(trainings_dir)})


def experiment_path(name: str, trainings_dir: Path | None = None) -> Path:
    """The file of an experiment given by name (trainings_dirs(), in order) or by path."""
    if name.endswith((".yaml", ".yml", ".json")) or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(str(path), "", name, "no such experiment file")
        return path
    return _by_name(name, trainings_dirs(trainings_dir), "", name)


def _by_name(name: str, folders: list[Path], field: str, source: str, skip: Path | None = None) -> Path:
    """The first folder's NAME.yaml; `skip` is a file naming itself as its base (a local tiny.yaml that says
    `base: tiny` means the bundled one)."""
    for directory in folders:
        path = directory / f"{name}.yaml"
        if path.is_file() and (skip is None or path.resolve() != skip.resolve()):
            return path
    known = ", ".join(sorted({p.stem for d in folders for p in d.glob("*.yaml")})) or "none"
    where = " or ".join(str(d) for d in dict.fromkeys(folders))
    raise ConfigError(source or where, field, name, f"no such experiment in {where}; known: {known}")


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_ALLOWED = ("allowed: 1-100 letters, digits, '.', '_' and '-', starting with a letter or digit (a name "
                "becomes file names, Slurm job names and shell words)")


def check_name(name: str, source: str) -> None:
    """Refuse an experiment name that could not safely become a file, a job name and a shell word."""
    if not NAME.fullmatch(name):
        raise ConfigError(source, "name", name, NAME_ALLOWED)


def load_experiment(name: str, trainings_dir: Path | None = None) -> Experiment:
    """Load, merge `base:` chains, coerce, validate and derive one experiment (with the skips its run's
    rollbacks recorded)."""
    path = experiment_path(name, trainings_dir)
    check_name(path.stem, str(path))
    inputs_root, outputs_root = project_folder(path), outputs_folder(path)  # where its relative paths resolve
    raw, origins = read_with_bases(path, partial(_find_base, trainings_dir=trainings_dir), _one_node_plan)
    raw.pop("base", None)
    exp = _build(path.stem, raw, origins, str(path), inputs_root, outputs_root)
    # A rollback's skipped iterations are part of the run from then on (rollbacks.py).
    return with_recorded_skips(exp)


def project_folder(experiment_file: Path) -> Path:
    """The folder the experiment file's relative paths resolve against: the one holding its trainings/ folder."""
    return Path(experiment_file).resolve().parent.parent


def outputs_folder(experiment_file: Path) -> Path:
    """The folder its relative outputs resolve against: the project folder, or for one of bsops' own
    (bundled) experiments, whatever the install kind, the current folder."""
    return Path.cwd() if is_bundled(experiment_file) else project_folder(experiment_file)


def run_folder_note(experiment_file: Path, exp: Experiment) -> str:
    """`run folder: PATH (why)`: where exp's run is and which part of the rule (README "Where paths resolve")
    put it there; every command that reads or writes a run prints it."""
    out, name, experiment_file = Path(exp.paths.output), Path(experiment_file).name, Path(experiment_file).resolve()
    project = project_folder(experiment_file)
    if is_bundled(experiment_file):
        why = (f"{exp.name} is bundled with bsops: its runs go under the current folder"
               if out.resolve().is_relative_to(Path.cwd().resolve()) else f"paths.output of bsops' bundled {name}")
    else:
        why = (f"relative paths of {experiment_file} resolve against {project}"
               if out.resolve().is_relative_to(project.resolve()) else f"paths.output of {experiment_file}")
    return f"run folder: {out} ({why})"


def _find_base(base: object, path: Path, trainings_dir: Path | None) -> Path:
    """The file `base: BASE` in `path` means: the same rule as a name on the command line, after the file's own
    folder (the local folder, then bsops' own)."""
    if not isinstance(base, str):
        raise ConfigError(str(path), "base", base, "the name of another experiment (found like EXP on the command "
                          "line: this file's folder, the local trainings/, then bsops' own)")
    folders = list(dict.fromkeys([path.parent, *trainings_dirs(trainings_dir)]))
    return _by_name(base, folders, "base", str(path), skip=path)


def field_origins(name: str, trainings_dir: Path | None = None) -> dict[str, str]:
    """For each field path written in EXP's file or its bases, the file that set it (the last one wins)."""
    path = experiment_path(name, trainings_dir)
    return read_with_bases(path, partial(_find_base, trainings_dir=trainings_dir), _one_node_plan)[1]


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


# ----------------------------------------------------------------------------- validation and derivation

def _check(condition: bool, source: str, dotted: str, value: Any, allowed: str) -> None:
    if not condition:
        raise ConfigError(source, dotted, value, allowed)




def _validate(exp: Experiment, src: str) -> None:
    m, p, b, t = exp.model, exp.parallel, exp.batch, exp.train
    _validate_node_schedule(exp.slurm.node_schedule, src)
    _check(m.hidden_size % m.num_attention_heads == 0, src, "model.hidden_size", m.hidden_size,
           f"must be divisible by model.num_attention_heads ({m.num_attention_heads})")
    _check(m.num_layers >= p.pipeline, src, "model.num_layers", m.num_layers,
           f"must be at least parallel.pipeline ({p.pipeline}): every stage holds blocks")
    try:
        sizing.check_partition_method(p.partition_method)
    except ValueError as exc:
        raise ConfigError(src, "parallel.partition_method", p.partition_method, str(exc)) from None
    _check(m.num_attention_heads % p.tensor == 0, src, "parallel.tensor", p.tensor,
           f"must divide model.num_attention_heads ({m.num_attention_heads})")
    if m.ffn_hidden_size is not None:
        _check(m.ffn_hidden_size % p.tensor == 0, src, "model.ffn_hidden_size", m.ffn_hidden_size,
               f"must be divisible by parallel.tensor ({p.tensor})")
    if m.max_position_embeddings is not None:
        _check(m.max_position_embeddings >= m.seq_length, src, "model.max_position_embeddings",
               m.max_position_embeddings, f"must be at least model.seq_length ({m.seq_length})")

    _check((t.samples is None) != (t.iters is None), src, "train", {"samples": t.samples, "iters": t.iters},
           "set exactly one of train.samples and train.iters")
    # Every schedule is walked step by step (plan, trainer): a length no run has keeps `bsops plan` from ending.
    if t.samples is not None:
        _check(t.samples // b.global_batch_size <= MAX_STEPS, src, "train.samples", t.samples,
               f"gives more than {MAX_STEPS:,} steps at global batch size {b.global_batch_size}; no run is that long")
    if b.rampup is not None:
        _check(b.rampup.samples // b.rampup.start <= MAX_STEPS, src, "batch.rampup.samples", b.rampup.samples,
               f"ramps up over more than {MAX_STEPS:,} steps from batch size {b.rampup.start}")
    if b.rampup is not None:
        r = b.rampup
        _check(t.iters is None, src, "batch.rampup", dataclasses.asdict(r),
               "a batch-size rampup needs train.samples, not train.iters (Megatron rejects the pair)")
        _check(r.start < b.global_batch_size, src, "batch.rampup.start", r.start,
               f"must be below batch.global_batch_size ({b.global_batch_size})")
        _check((b.global_batch_size - r.start) % r.increment == 0, src, "batch.rampup.increment", r.increment,
               f"must divide global_batch_size - start = {b.global_batch_size} - {r.start} = {b.global_batch_size - r.start}")

    lr = exp.lr_schedule
    for kind in ("warmup", "decay"):
        given = [u for u in ("samples", "tokens", "iters") if getattr(lr, f"{kind}_{u}") is not None]
        _check(len(given) <= 1, src, f"lr_schedule.{kind}_{given[-1] if given else 'samples'}",
               {f"{kind}_{u}": getattr(lr, f"{kind}_{u}") for u in given},
               f"set at most one of {kind}_samples, {kind}_tokens, {kind}_iters")
    opt = exp.optimizer
    _check(0 <= opt.min_lr <= opt.lr, src, "optimizer.min_lr", opt.min_lr, f"must be in [0, optimizer.lr = {opt.lr}]")

    ck = exp.checkpoint
    last = 0
    for i, rng in enumerate(ck.save_schedule):
        _check(rng.until > last, src, f"checkpoint.save_schedule[{i}].until", rng.until,
               f"ranges must end in increasing order (previous ends at {last})")
        last = rng.until

    if exp.slurm.device == "cpu":
        _check(t.precision != "fp16", src, "train.precision", t.precision,
               "fp16 needs a GPU; with slurm.device: cpu use fp32 or bf16")
    split = exp.data.split.split(",")
    _check(len(split) == 3 and all(re.fullmatch(r"\d+(\.\d+)?", s.strip()) for s in split)
           and sum(float(s) for s in split) > 0, src, "data.split", exp.data.split,
           "three non-negative numbers such as '949,50,1' (train,valid,test)")
    tok = exp.data.tokenizer
    # The tokenizer's files are site values: both blank is on plan's to-do list (site_values.py); one of two is wrong.
    if tok.kind == "gpt2-bpe":
        _check((tok.vocab_file is None) == (tok.merges_file is None), src, "data.tokenizer", dataclasses.asdict(tok),
               "kind gpt2-bpe needs vocab_file and merges_file (both, or neither until you fill them in)")
    hub_remote.check_hub(exp.hub, src)
    _validate_curriculum(exp, src)


def _validate_curriculum(exp: Experiment, src: str) -> None:
    try:
        parse_skip_ranges(exp.train.skip_iterations)
    except ValueError as exc:
        raise ConfigError(src, "train.skip_iterations", exp.train.skip_iterations, str(exc)) from None
    c, seq = exp.curriculum, exp.model.seq_length
    if c is None:
        return
    _check(c.min_difficulty % c.difficulty_step == 0, src, "curriculum.min_difficulty", c.min_difficulty,
           f"must be a multiple of curriculum.difficulty_step ({c.difficulty_step})")
    _check(c.min_difficulty <= seq, src, "curriculum.min_difficulty", c.min_difficulty,
           f"must not exceed model.seq_length ({seq}), the curriculum's end")
    _check(seq % c.difficulty_step == 0, src, "model.seq_length", seq,
           f"must be a multiple of curriculum.difficulty_step ({c.difficulty_step}), or the curriculum never reaches it")


def _validate_node_schedule(schedule: list[NodePhase], src: str) -> None:
    """Each phase's shape; whether the phases start in order (through the rampup) is the plan's check."""
    for i, phase in enumerate(schedule):
        where = f"slurm.node_schedule[{i}]"
        starts = {k: v for k in ("from_samples", "from_iteration") if (v := getattr(phase, k)) is not None}
        if i == 0:
            _check(not starts, src, where, starts,
                   "the first phase starts the run: leave out from_samples and from_iteration")
            continue
        _check(len(starts) == 1, src, where, dataclasses.asdict(phase), "set exactly one of from_samples and from_iteration")
        _check(phase.nodes != schedule[i - 1].nodes, src, f"{where}.nodes", phase.nodes,
               f"must differ from the previous phase's {schedule[i - 1].nodes} nodes (or remove the phase)")


SIGNAL_SECONDS_MAX = 65535


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
    exp: Experiment = build(Experiment, raw, "", origins, source)
    _validate(exp, source)
    return derive(exp, root, source, output_root)


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
    try:
        limit = parse_time_limit(slurm.time)
    except ValueError as exc:
        raise ConfigError(source, "slurm.time", slurm.time, str(exc)) from None
    backup = exp.backup
    if backup.dest is not None:
        backup = dataclasses.replace(backup, dest=_resolve_path(backup.dest, out_root))
    exp = dataclasses.replace(exp, model=m, paths=paths, data=data, slurm=slurm, backup=backup)
    params = sizing.count_parameters(exp.model, exp.parallel.tensor).total
    ck = fill(exp.checkpoint, "checkpoint", exit_margin_mins=exit_margin_minutes(params),
              kill_switch_path=f"{output}/kill-switch")
    if ck.exit_duration_in_mins is None:
        _check(limit > ck.exit_margin_mins, source, "slurm.time", slurm.time,
               f"must be longer than the exit margin of {ck.exit_margin_mins} minutes")
        ck = fill(ck, "checkpoint", exit_duration_in_mins=limit - ck.exit_margin_mins)
    ck = dataclasses.replace(ck, kill_switch_path=_resolve_path(ck.kill_switch_path, out_root))
    slurm = fill(exp.slurm, "slurm", signal_seconds=min(SIGNAL_SECONDS_MAX, ck.exit_margin_mins * 60))
    _check(1 <= slurm.signal_seconds <= SIGNAL_SECONDS_MAX, source, "slurm.signal_seconds", slurm.signal_seconds,
           f"must be 1 to {SIGNAL_SECONDS_MAX} seconds (Slurm's limit for --signal)")
    return dataclasses.replace(exp, checkpoint=ck, slurm=slurm, derived=tuple(exp.derived) + tuple(derived))


def to_dict(exp: Experiment) -> dict:
    """The resolved experiment as plain data (what `bsops show` prints and run records keep)."""
    data = dataclasses.asdict(exp)
    data.pop("derived")
    return data


def from_dict(data: dict, source: str = "<resolved config>") -> Experiment:
    """Rebuild an experiment from `to_dict` output (a run record) without re-deriving anything."""
    exp: Experiment = build(Experiment, data, "", {}, source)
    _validate(exp, source)
    return exp
