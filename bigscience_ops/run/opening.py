"""A run named on the command line, read as the run recorded itself: the experiment its launch wrote down.

A run is named by its experiment (a name or a YAML path: the run folder is the experiment's
paths.output) or by its folder (a folder holding experiment.json, which a local launch writes, or
launches/<time>/experiment.json, which each Slurm launch writes). `open_run` returns the experiment
the newest of those records holds, with the skips of the run's later rollbacks added
(as launch_plan.as_recorded adds them), the run folder, and the fields where today's YAML differs from the record
in a way that changes the data order or the model (`ORDER_FIELDS`): the run is shown as it trained,
and the caller says in one line that the file moved on. A run never launched has no record: its
experiment is today's YAML, as the launch would run it.

The record is untrusted input (runfiles.py): it is read only when it is a plain file of at most
RECORD_LIMIT bytes, and anything else (a link, a folder, torn JSON, a field of the wrong type, another
experiment's record under --run) is a RunRecordError naming the file and what was expected.
Reading the YAML never reads the run folder (config.py); this module does, on purpose, for a run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops import config
from bigscience_ops.run import rollbacks
from bigscience_ops.errors import BsopsError, ConfigError
from bigscience_ops.experiment_files import check_name
from bigscience_ops.run.records import EXPERIMENT_JSON, Overrides, apply_overrides
from bigscience_ops.untrusted import RecordFileError, excerpt, kind_of, read_small
from bigscience_ops.schema import Experiment

LAUNCHES = "launches"
"""<run>/launches/<time>/: one Slurm launch's record (submit.record_dir)."""
RECORD_LIMIT = 1 << 20
"""The largest experiment.json read: bsops writes a few kB."""
MAX_LAUNCHES = 10_000
"""Launch records looked at in one run folder (one per launch: years of hourly relaunches fit)."""
ORDER_FIELDS = ("train.seed", "train.samples", "train.iters", "data.blend", "data.split", "data.tokenizer",
                "model", "batch", "curriculum")
"""Where a change to the YAML changes which data a run reads in which order, or what the model is. Not
train.skip_iterations: a rollback adds skips to the run, not to the file. Not model.kernels: the same
arithmetic by another implementation."""
SAME_MATH = ("model.kernels",)


class RunRecordError(BsopsError):
    """A run's recorded experiment cannot be read or is not one bsops writes; or the folder named holds no record."""


@dataclass(frozen=True)
class Difference:
    """One field where the experiment file now says another thing than the run's record."""

    field: str
    recorded: object
    now: object

    def __str__(self) -> str:
        return f"{self.field} ({_short(self.recorded)} -> {_short(self.now)})"


@dataclass(frozen=True)
class OpenedRun:
    experiment: Experiment
    """As the run recorded it (its newest record, its rollbacks' skips added); today's YAML when never launched."""
    folder: Path
    """The run folder."""
    record: Path | None
    """The experiment.json the experiment was read from; None: no launch recorded yet (today's YAML)."""
    yaml: Path | None
    """The experiment file named, when the run was named by its experiment."""
    differences: tuple[Difference, ...] = ()
    """Where `yaml` now differs from the record in a field of ORDER_FIELDS."""
    by_folder: bool = False
    """The run was named by its folder (EXP a folder, or --run), not found from its experiment's paths.output."""
    moved_from: str | None = None
    """The record's paths.output where it is another folder (the run folder was moved or copied): the record's
    paths were taken under the folder named."""

    def differs_note(self) -> str | None:
        """One line saying that the experiment file moved on since the launch, or None."""
        if not self.differences:
            return None
        shown = ", ".join(map(str, self.differences[:4]))
        more = f" and {len(self.differences) - 4} more" if len(self.differences) > 4 else ""
        return (f"note: {self.yaml} now differs from the run's record in {shown}{more}; showing the run as "
                f"recorded ({self.record})")


def is_run_folder_name(text: str) -> bool:
    """Whether EXP names a run folder: an existing folder given as a path (`runs/tiny`, `.`), or a bare name that is
    a folder holding a run's record here; a bare name that is any other folder stays an experiment's name."""
    if not os.path.isdir(text):
        return False
    return os.sep in text or text in (".", "..") or newest_record(Path(text)) is not None


def open_run(exp: str | None, trainings_dir: Path | None = None, run: Path | None = None) -> OpenedRun:
    """The run EXP names (an experiment name, its YAML file or a run folder), or the run folder `run` (`--run`).

    With both, EXP is the experiment the folder's record must be (compared by name) and the YAML the
    record is compared against. Raises RunRecordError (a folder with no record, a record unreadable or of
    another experiment) or config's ConfigError (the YAML).
    """
    if exp is not None and run is None and is_run_folder_name(exp):
        exp, run = None, Path(exp)
    if run is not None:
        return _by_folder(Path(run), exp, trainings_dir)
    if exp is None:
        raise RunRecordError("name a run: an experiment (EXP), or its run folder (a path to it, or --run PATH)")
    from bigscience_ops.experiment_files import experiment_path

    yaml = experiment_path(exp, trainings_dir)
    today = config.load_experiment(exp, trainings_dir)
    folder = Path(today.paths.output)
    found = newest_record(folder)
    if found is None:
        return OpenedRun(_with_skips(today), folder, None, yaml)
    recorded = read_record(found)
    _same_experiment(found, recorded, today)
    return OpenedRun(_with_skips(_located(recorded, folder)), folder, found, yaml, differences(recorded, today),
                     False, _moved_from(recorded, folder))


def _by_folder(folder: Path, exp: str | None, trainings_dir: Path | None) -> OpenedRun:
    if not folder.is_dir():
        raise RunRecordError(f"run folder {folder}: is {kind_of(folder)}; expected a run folder (one holding "
                             f"{EXPERIMENT_JSON} or {LAUNCHES}/<time>/{EXPERIMENT_JSON})")
    found = newest_record(folder)
    if found is None:
        raise RunRecordError(f"run folder {folder}: no {EXPERIMENT_JSON} in it or in {LAUNCHES}/*/: not a run bsops "
                             "launched (a run never launched is named by its experiment)")
    recorded = read_record(found)
    yaml, today = None, None
    if exp is not None:
        from bigscience_ops.experiment_files import experiment_path

        yaml = experiment_path(exp, trainings_dir)
        today = config.load_experiment(exp, trainings_dir)
        _same_experiment(found, recorded, today)
    return OpenedRun(_with_skips(_located(recorded, folder)), folder, found, yaml,
                     differences(recorded, today) if today is not None else (), True, _moved_from(recorded, folder))


def _same_experiment(found: Path, recorded: Experiment, today: Experiment) -> None:
    if today.name != recorded.name:
        raise RunRecordError(f"{found}: records experiment {recorded.name!r}, not {today.name!r}; name the run by "
                             f"its folder alone, or with the experiment {recorded.name!r}")


def newest_record(folder: Path) -> Path | None:
    """The run folder's newest experiment record: <folder>/experiment.json (a local launch) or
    <folder>/launches/<time>/experiment.json (each Slurm launch), by modification time; None when none is there.
    A launch folder that is a link is passed over (a run's records are never read through a link)."""
    candidates = [folder / EXPERIMENT_JSON]
    launches = folder / LAUNCHES
    if launches.is_dir() and not launches.is_symlink():
        try:
            with os.scandir(launches) as entries:
                names = sorted(e.name for e, _ in zip(entries, range(MAX_LAUNCHES))
                               if e.is_dir(follow_symlinks=False))
        except OSError:
            names = []
        candidates += [launches / name / EXPERIMENT_JSON for name in names]
    found = []
    for path in candidates:
        try:
            found.append((os.lstat(path).st_mtime, path))
        except OSError:
            continue
    return max(found, key=lambda found: found[0])[1] if found else None


def read_record(path: Path) -> Experiment:
    """The experiment a run record holds (config.from_dict: typed and validated, nothing re-derived)."""
    expected = "the experiment.json a launch writes (the resolved experiment as a JSON object)"
    try:
        data = read_small(path, RECORD_LIMIT)
    except RecordFileError as exc:
        raise RunRecordError(f"{path}: {exc.what}; expected {expected}") from None
    if data is None:
        raise RunRecordError(f"{path}: missing; expected {expected}")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RunRecordError(f"{path}: not JSON (it holds {excerpt(data)}); expected {expected}") from None
    if not isinstance(raw, dict):
        raise RunRecordError(f"{path}: a JSON {type(raw).__name__}; expected {expected}")
    try:
        check_name(raw.get("name"), str(path))
        return config.from_dict(raw, str(path))
    except ConfigError as exc:
        raise RunRecordError(f"{exc}; expected {expected}") from None
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:  # a shape the typed reader did not expect
        raise RunRecordError(f"{path}: not an experiment record ({type(exc).__name__}); expected {expected}") from None


def differences(recorded: Experiment, today: Experiment) -> tuple[Difference, ...]:
    """The fields of ORDER_FIELDS (each leaf) where `today` says another thing than `recorded`."""
    before, after = _leaves(dataclasses.asdict(recorded)), _leaves(dataclasses.asdict(today))
    found = []
    for key in sorted(set(before) | set(after)):
        if any(key == f or key.startswith(f + ".") for f in ORDER_FIELDS) and key not in SAME_MATH:
            if before.get(key) != after.get(key):
                found.append(Difference(key, before.get(key), after.get(key)))
    return tuple(found)


def with_configured_settings(opened: OpenedRun, trainings_dir: Path | None = None) -> Experiment:
    """The run as recorded, with the `alerts`, `hub`, `backup` and `eval` sections of its experiment file as it is
    today.

    Who is told, which host an SMTP password or a Hub token goes to, the environment variables they are read
    from, and where checkpoints are copied before scratch copies are deleted are configuration: never taken from a
    run's own files, which are untrusted input (a record rewritten to name another SMTP host would otherwise get
    the password). What a checkpoint is evaluated on, the references and alert margins, and the eval job's resources
    are configuration too: a run launched before its `eval:` section was written is evaluated by it. Raises RunRecordError when no experiment file of the recorded name is found (or it does not
    load): the caller then sends, pushes and deletes nothing.
    """
    name = str(opened.yaml) if opened.yaml is not None else opened.experiment.name
    try:
        today = config.load_experiment(name, trainings_dir)
    except ConfigError:
        raise RunRecordError(f"alert channels, Hub and backup settings come from the experiment file, never from a "
                             f"run's record, and no experiment file of {opened.experiment.name!r} loads here "
                             f"(`bsops show {opened.experiment.name}` says why)") from None
    return dataclasses.replace(opened.experiment, alerts=today.alerts, hub=today.hub, backup=today.backup,
                               eval=today.eval)


def relaunch_differences(exp: Experiment, folder: Path) -> tuple[Path | None, tuple[Difference, ...]]:
    """Where `exp` (what a launch is about to train) differs from the last launch recorded in the run folder `folder`
    in a field of ORDER_FIELDS: (the record, the differences); (None, ()) for a run never launched. A relaunch with
    another seed, blend or model trains on from the checkpoint with them, which is sometimes meant and never silent.
    Raises RunRecordError for a record that cannot be read."""
    found = newest_record(folder)
    if found is None:
        return None, ()
    return found, differences(read_record(found), exp)


def _leaves(data: dict, prefix: str = "") -> dict[str, object]:
    """Dotted paths to the values of nested mappings (a list, such as data.blend, is one value)."""
    out: dict[str, object] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_leaves(value, path + "."))
        else:
            out[path] = value
    return out


def _short(value: object) -> str:
    """A recorded value as one short line: JSON (a control character in a record shows escaped), cut at 60."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _same_folder(recorded: Experiment, folder: Path) -> bool:
    try:
        return Path(recorded.paths.output).resolve() == folder.resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def _with_skips(exp: Experiment) -> Experiment:
    """`exp` with the skips its run's rollbacks recorded, as launch_plan.as_recorded adds them, read alone: a line of
    rollbacks.jsonl that is not a record is for the view to report (info, chronicle), and an unreadable `latest`
    (which as_recorded's records also read) is no reason not to show the rest of the run."""
    found = rollbacks.read_checked(exp.paths.output).records
    return apply_overrides(exp, Overrides(skips=tuple(dict.fromkeys(r.skip for r in found if r.skip))))


def _moved_from(recorded: Experiment, folder: Path) -> str | None:
    return None if _same_folder(recorded, folder) else str(recorded.paths.output)


def _located(recorded: Experiment, folder: Path) -> Experiment:
    """The record as it reads the run at `folder`: as it is where it names that folder; a moved or copied run folder
    takes its paths (checkpoints, logs, tensorboard, kill switch) under the folder it is now in."""
    return recorded if _same_folder(recorded, folder) else apply_overrides(recorded, Overrides(out=folder))
