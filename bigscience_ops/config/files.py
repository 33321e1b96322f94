"""Where experiments are: files found by name, their names, and the folders their paths resolve against.

An experiment named on the command line is looked up in the local trainings folder (--trainings-dir,
$BSOPS_TRAININGS or ./trainings) first, then in bsops' bundled trainings/: a local file of the same
name wins, and the bundled experiments stay reachable from any folder. A `base:` is found the same
way, after the folder of the file that names it.

Where relative paths resolve, for every command and every install kind: against the experiment
file's project folder, the folder that holds its trainings/ folder, wherever the command runs from.
bsops' own experiments, in a bundled trainings/ folder (source checkout, editable or wheel install,
$BSOPS_DATA_DIR), write their outputs under the current folder (runs/NAME): bsops' folder is no
place for runs. config/loading.py loads what is found here.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.errors import ConfigError
from bigscience_ops.resources import ResourceError, bundled, is_bundled
from bigscience_ops.schema import Experiment
from bigscience_ops.slurm.names import reserved_problem
from bigscience_ops.typedyaml import PLAIN_FILE_ALLOWED
from bigscience_ops.untrusted import kind_of


def local_trainings_dir(trainings_dir: Path | None = None) -> Path:
    """The user's own experiments: --trainings-dir, else $BSOPS_TRAININGS, else ./trainings (which may not exist)."""
    if trainings_dir is not None:
        return Path(trainings_dir)
    env = os.environ.get("BSOPS_TRAININGS")
    return Path(env) if env else Path.cwd() / "trainings"


def trainings_dirs(trainings_dir: Path | None = None) -> list[Path]:
    """Where experiments are looked up by name, in order: the local folder (local_trainings_dir), then the
    bundled trainings/. A local file wins over a bundled one of the same name. (The commands refuse a --trainings-dir
    or $BSOPS_TRAININGS that is not there before they look: cli/base.trainings_option. `bsops new` writes into its
    folder and makes it.)"""
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
        if not os.path.lexists(path):
            raise ConfigError(str(path), "", name, "no such experiment file")
        return path  # a link, a FIFO or a folder there is refused by the reading (typedyaml.read_yaml), by name
    return _by_name(name, trainings_dirs(trainings_dir), "", name)


def _by_name(name: str, folders: list[Path], field: str, source: str, skip: Path | None = None) -> Path:
    """The first folder's NAME.yaml; `skip` is a file naming itself as its base (a local tiny.yaml that says
    `base: tiny` means the bundled one)."""
    for directory in folders:
        path = directory / f"{name}.yaml"  # whatever is there: a link or a FIFO is refused when read, not passed over
        if os.path.lexists(path) and (skip is None or os.path.realpath(path) != os.path.realpath(skip)):
            return path
    known = ", ".join(sorted({p.stem for d in folders for p in d.glob("*.yaml")})) or "none"
    where = " or ".join(str(d) for d in dict.fromkeys(folders))
    raise ConfigError(source or where, field, name, f"no such experiment in {where}; known: {known}")


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_ALLOWED = ("allowed: 1-100 letters, digits, '.', '_' and '-', starting with a letter or digit (a name "
                "becomes file names, Slurm job names and shell words)")


def check_name(name: str, source: str) -> None:
    """Refuse an experiment name that could not safely become a file, a job name and a shell word, or that has
    the form bsops reserves for its hourly jobs' names (`bsops.`..., slurm.names). Checks the text alone: no
    path is built from it before."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(source, "name", name, NAME_ALLOWED)
    reserved = reserved_problem(name)
    if reserved is not None:
        raise ConfigError(source, "name", name, f"{reserved}; {NAME_ALLOWED}")


@dataclass(frozen=True)
class Located:
    """An experiment file found, its name checked, and the folders its relative paths resolve against."""

    path: Path
    inputs_root: Path
    outputs_root: Path


def locate(name: str, trainings_dir: Path | None = None) -> Located:
    """The experiment NAME's file (experiment_path), its name checked (check_name), and where its relative inputs
    (project_folder) and outputs (outputs_folder) resolve."""
    path = experiment_path(name, trainings_dir)
    check_name(path.stem, str(path))
    check_plain(path)  # before its folders are worked out through it
    return Located(path, project_folder(path), outputs_folder(path))


def check_plain(path: Path) -> None:
    """Refuse an experiment file that is not a plain file (a symbolic link, a FIFO, a folder), by what it is and
    never by what it holds (read_yaml refuses the same, for a base)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # gone: the reading says so
    if not stat.S_ISREG(mode):
        raise ConfigError(str(path), "", kind_of(path), PLAIN_FILE_ALLOWED)


def project_folder(experiment_file: Path) -> Path:
    """The folder the experiment file's relative paths resolve against: the one holding its trainings/ folder."""
    return Path(experiment_file).resolve().parent.parent


def outputs_folder(experiment_file: Path) -> Path:
    """The folder its relative outputs resolve against: the project folder, or for one of bsops' own
    (bundled) experiments, whatever the install kind, the current folder."""
    return Path.cwd() if is_bundled(experiment_file) else project_folder(experiment_file)


def run_folder_note(experiment_file: Path, exp: Experiment) -> str:
    """`run folder: PATH (why)`: where exp's run is and which part of the rule (docs/OPERATOR.md, "Where paths resolve")
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


def find_base(base: object, path: Path, trainings_dir: Path | None) -> Path:
    """The file `base: BASE` in `path` means: the same rule as a name on the command line, after the file's own
    folder (the local folder, then bsops' own)."""
    if not isinstance(base, str):
        raise ConfigError(str(path), "base", base, "the name of another experiment (found like EXP on the command "
                          "line: this file's folder, the local trainings/, then bsops' own)")
    folders = list(dict.fromkeys([path.parent, *trainings_dirs(trainings_dir)]))
    return _by_name(base, folders, "base", str(path), skip=path)
