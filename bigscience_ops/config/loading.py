"""The experiment config: typed, frozen dataclasses loaded from trainings/<name>.yaml.

Files are found by name as config/files.py says (the local trainings folder, then bsops' own).
An experiment may start with `base: <other>` and list only what differs, and a command line may set
any field with `SECTION.KEY=VALUE` (`overrides`), merged over the file as the file is over its base:
one precedence, command line > file > bases > defaults, typed and checked alike, the assignments kept
in the experiment (its `overrides` field, so a run's record says what the command line changed).
Values are coerced to
the declared types (`10e6` for an int, `6e-5` for a float), unknown keys are rejected with the
valid ones, and every error names the file, the field path, the value and what is allowed. The
rules across fields are config/validation.py's, the values left out are filled by config/derivation.py (which also
says where relative paths resolve); both run from `_checked`, for an experiment file and a run
record (experiment.json) alike. Nothing here reads a run folder.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bigscience_ops.config import validation
from bigscience_ops.config.derivation import derive
from bigscience_ops.errors import ConfigError
from bigscience_ops.config.files import Located, experiment_path, find_base, locate
from bigscience_ops.schema import Experiment
from bigscience_ops.typedyaml import build, parse_assignments, read_layers


# ----------------------------------------------------------------------------- loading

def load_experiment(name: str, trainings_dir: Path | None = None, overrides: Sequence[str] = ()) -> Experiment:
    """Load, merge `base:` chains and the command line's `overrides` (`SECTION.KEY=VALUE` texts, the last word:
    command line > the file > its bases > defaults), coerce, validate and derive one experiment. Nothing of its run
    folder is read: what a run recorded (a rollback's skips) is applied by the launch plan (run.records)."""
    return load_with_origins(name, trainings_dir, overrides)[0]


def load_with_origins(name: str, trainings_dir: Path | None = None,
                      overrides: Sequence[str] = ()) -> tuple[Experiment, dict[str, str]]:
    """`load_experiment` and, from the same reading of the files, `field_origins`: a command that needs both (which
    site values a base sets) reads the YAML once."""
    found = locate(name, trainings_dir)  # the file, its name checked, where its relative paths resolve
    raw, origins = read_layers(found.path, partial(find_base, trainings_dir=trainings_dir), _before_merge,
                               (_command_line(overrides), COMMAND_LINE))  # the command line: one more layer
    return _build(found, raw, origins, overrides), origins


def field_origins(name: str, trainings_dir: Path | None = None, overrides: Sequence[str] = ()) -> dict[str, str]:
    """For each field path written in EXP's file, its bases or `overrides`, the file that set it (the last one wins),
    or COMMAND_LINE."""
    return read_layers(experiment_path(name, trainings_dir), partial(find_base, trainings_dir=trainings_dir),
                       _before_merge, (_command_line(overrides), COMMAND_LINE))[1]


def _command_line(overrides: Sequence[str]) -> dict:
    """The assignments as one mapping (typedyaml.parse_assignments), refusing the fields a command line does not set
    and a path into a mapping field: that is one value, as in a file (`eval.sources.x=...` would drop the others)."""
    given = parse_assignments(overrides, COMMAND_LINE)
    for key, value in given.items():
        if key in NOT_OVERRIDDEN:
            raise ConfigError(COMMAND_LINE, key, value, f"{NOT_OVERRIDDEN[key]}; not set from the command line")
    for text in overrides:
        keys = tuple(text.partition("=")[0].split("."))
        inside = next((m for m in MAPPING_FIELDS if len(keys) > len(m) and keys[:len(m)] == m), None)
        if inside is not None:
            whole = ".".join(inside)
            raise ConfigError(COMMAND_LINE, ".".join(keys), text, f"{whole} is one value (a mapping of names), set "
                              f"whole as in a file: {whole}={{NAME: VALUE, ...}}")
    return given


COMMAND_LINE = "command line"
OVERRIDES_ALLOWED = ("kept by bsops: the SECTION.KEY=VALUE assignments of the command line that loaded the "
                     "experiment; remove the key")
NOT_OVERRIDDEN = {
    "name": "the experiment's name is its file name", "base": "a file's base is the file's to say",
    "record": "whether an experiment is a record of another team's run is its file's statement",
    "derived": "computed by bsops", "recorded": "kept by bsops", "overrides": OVERRIDES_ALLOWED.removesuffix(
        "; remove the key")}


def _before_merge(data: dict, merged: dict, source: str) -> None:
    """What a file (or the command line) says replaces some of what it inherits before it is merged: `record` is
    each file's own (an experiment based on a seed's record is not a record), and what _replaced says. `overrides`
    is bsops' to keep, never a file's."""
    if "overrides" in data and source != COMMAND_LINE:
        raise ConfigError(source, "overrides", data["overrides"], OVERRIDES_ALLOWED)
    if source != COMMAND_LINE:
        merged.pop("record", None)
    _replaced(data, merged, source)


def _replaced(data: dict, merged: dict, source: str) -> None:
    """What a file or the command line sets that replaces, not merges with, what it is merged over: the node plan
    (_one_node_plan), and a mapping field (eval.sources, eval.references, ...), as a list is: a whole value, not
    merged name by name (an experiment based on tiny that names its own held-out sources is not also evaluated on
    tiny's)."""
    _one_node_plan(data, merged, source)
    for path in MAPPING_FIELDS:
        own, inherited = data, merged
        for key in path[:-1]:
            own, inherited = own.get(key), inherited.get(key)
            if not isinstance(own, dict) or not isinstance(inherited, dict):
                break
        else:
            if path[-1] in own:
                inherited.pop(path[-1], None)


def _mapping_fields(cls: type, prefix: tuple[str, ...] = ()) -> tuple[tuple[str, ...], ...]:
    """The field paths of `cls` whose values are mappings of names (dict fields), nested sections followed."""
    hints = typing.get_type_hints(cls)
    found: list[tuple[str, ...]] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
            typing.Union, types.UnionType) else [tp]
        tp = args[0] if args else tp
        if typing.get_origin(tp) is dict:
            found.append(prefix + (f.name,))
        elif dataclasses.is_dataclass(tp):
            found.extend(_mapping_fields(tp, prefix + (f.name,)))
    return tuple(found)


MAPPING_FIELDS = _mapping_fields(Experiment)


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


# ----------------------------------------------------------------------------- building

def _build(found: Located, raw: dict, origins: dict, overrides: Sequence[str]) -> Experiment:
    """The merged layers as the experiment: its name (the file's), the assignments kept, typed, checked, derived."""
    name, path = found.path.stem, found.path
    source = f"{path} with the command line's {' '.join(overrides)}" if overrides else str(path)  # for the rules
    raw.pop("base", None)
    if overrides:
        raw["overrides"] = list(overrides)
    if "name" in raw and raw["name"] != name:
        raise ConfigError(source, "name", raw["name"], f"the name is the file name ({name!r}); remove the key")
    raw = {**raw, "name": name}
    if "derived" in raw:
        raise ConfigError(source, "derived", raw["derived"], "computed by bsops; remove the key")
    return _checked(raw, origins, source, (found.inputs_root, found.outputs_root))


def _checked(raw: dict, origins: dict, source: str, roots: tuple[Path, Path | None] | None) -> Experiment:
    """Typed (typedyaml), its cross-field rules checked (config/validation.py: the one place they run) and, for an
    experiment file, derived (`roots`: where its inputs and outputs resolve); a run record is derived already."""
    exp: Experiment = build(Experiment, raw, "", origins, source)
    validation.validate(exp, source)
    if roots is not None:
        exp = derive(exp, roots[0], roots[1])
    validation.check_derived(exp, source)
    return exp


def to_dict(exp: Experiment) -> dict:
    """The resolved experiment as plain data (what `bsops show` prints and run records keep)."""
    data = dataclasses.asdict(exp)
    data.pop("derived")
    data.pop("recorded")
    return data


def from_dict(data: dict, source: str = "<resolved config>") -> Experiment:
    """Rebuild an experiment from `to_dict` output (a run record) without re-deriving anything."""
    return _checked(data, {}, source, None)


# ----------------------------------------------------------------------------- what a launch changes

@dataclass(frozen=True)
class Overrides:
    """What a launch changes in the experiment; None (or no skips) leaves the field as the config says."""

    out: Path | None = None
    """The run folder (`launch --local --out`): paths.* and the kill switch move under it."""
    skips: tuple[str, ...] = ()
    """Skip ranges the run's rollbacks recorded, added to train.skip_iterations."""
    nodes: int | None = None
    """slurm.nodes: the node count of the phase the run is in (a node schedule)."""
    array: int | None = None
    """slurm.array: the tasks left to a node schedule's resubmitted array."""
    master_port: int | None = None
    """slurm.master_port: a local launch's free rendezvous port."""
    nodes_all_along: int | None = None
    """`plan --nodes N`: N nodes for the whole run, slurm.node_schedule set aside."""
    command_line: tuple[str, ...] | None = None
    """The command line's SECTION.KEY=VALUE assignments a command records (`bsops eval`'s, in its results)."""


def apply_overrides(exp: Experiment, overrides: Overrides) -> Experiment:
    """`exp` as a launch (or a view of the run as launched) runs it; the only place a launch changes an experiment."""
    o = overrides
    if o.out is not None:
        out = Path(o.out).resolve()
        paths = dataclasses.replace(exp.paths, output=str(out), checkpoints=str(out / "checkpoints"),
                                    tensorboard=str(out / "tensorboard"), logs=str(out / "logs"),
                                    codecarbon=str(out / "codecarbon"))
        checkpoint = dataclasses.replace(exp.checkpoint, kill_switch_path=str(out / "kill-switch"))
        exp = dataclasses.replace(exp, paths=paths, checkpoint=checkpoint)
    added = [skip for skip in o.skips if skip not in exp.train.skip_iterations]
    if added:
        exp = dataclasses.replace(exp, train=dataclasses.replace(
            exp.train, skip_iterations=[*exp.train.skip_iterations, *dict.fromkeys(added)]))
    slurm: dict = {k: v for k, v in (("nodes", o.nodes), ("array", o.array), ("master_port", o.master_port))
                   if v is not None}
    if o.nodes_all_along is not None:
        slurm.update(nodes=o.nodes_all_along, node_schedule=[])
    if o.command_line is not None:
        exp = dataclasses.replace(exp, overrides=list(o.command_line))
    return dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, **slurm)) if slurm else exp
