"""A run named on the command line, read as the run recorded itself: the experiment its launch wrote down.

The one way in for every command that reads a run (`bigscience_ops.run.open` is `open_run`). A run is named
by its experiment (a name or a YAML path: the run folder is the experiment's paths.output) or by its folder (a
folder holding experiment.json, which a local launch writes, or launches/<time>/experiment.json, which each Slurm
launch writes), or both. `open_run` loads and checks the experiment file once (today's YAML, with the command
line's `section.key=value` overrides) and returns the run as the newest of those records holds it, with the skips
of the run's later rollbacks added (as records.as_recorded adds them), the run folder, and the fields where
today's YAML differs from the record in a way that changes the data order or the model (`ORDER_FIELDS`): the run
is shown as it trained, and the caller says in one line that the file moved on. A run never launched has no
record: its experiment is today's YAML, as the launch would run it.

What is configuration is never taken from a run's own files: the `alerts`, `hub`, `backup` and `eval` sections of
the opened run are its experiment file's as it is today (`SETTINGS`). Who is told, which host an SMTP password or a
Hub token goes to, where checkpoints are copied before scratch copies are deleted, what a checkpoint is evaluated
on: a record rewritten to name another SMTP host would otherwise get the password, and a run launched before its
`eval:` section was written is evaluated by it. With no experiment file of the recorded name here, those sections
are empty (nothing sent, pushed, deleted or referenced) and `settings_problem` says why; `configured()` refuses
then, for the commands that must not go on without them.

The record is untrusted input (runfiles.py): it is read only when it is a plain file of at most
RECORD_LIMIT bytes, and anything else (a link, a folder, torn JSON, a field of the wrong type, another
experiment's record under --run) is a RunRecordError naming the file and what was expected.
Reading the YAML never reads the run folder (config/loading.py); this module does, on purpose, for a run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.config import loading as config
from bigscience_ops.run import rollbacks
from bigscience_ops.errors import BsopsError, ConfigError
from bigscience_ops.config.files import check_name
from bigscience_ops.config.loading import Overrides, apply_overrides
from bigscience_ops.run.records import EXPERIMENT_JSON
from bigscience_ops.untrusted import Problem, RecordFileError, excerpt, kind_of, read_small
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


SETTINGS = ("alerts", "hub", "backup", "eval")
"""The sections an opened run takes from its experiment file today, never from its record."""


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
    """The run as recorded (`recorded`) with the SETTINGS sections of its experiment file today (empty ones when no
    experiment file of its name loads here: `settings_problem`)."""
    recorded: Experiment
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
    origins: dict[str, str] = dataclasses.field(default_factory=dict)
    """For each field path the experiment file today (or its bases, or the command line) sets, who set it
    (config.field_origins), from the same reading of the YAML; empty when no experiment file was read."""
    record_problem: Problem | None = None
    """The newest record, when it could not be read and the run, named by its experiment, was opened as the
    experiment file says today instead (`open_run(..., fallback=True)`: the watchdog and the hourly jobs, which
    must not go blind because a run file is torn). None when the record was read, or there is none."""
    settings_problem: str | None = None
    """Why the SETTINGS sections are empty: no experiment file of the run's name loads here. None when they are the
    experiment file's."""

    @property
    def named(self) -> str:
        """The experiment file the run was named by, else the experiment's recorded name (what errors and hints say)."""
        return str(self.yaml) if self.yaml is not None else self.experiment.name

    def configured(self) -> Experiment:
        """`experiment`, for a command that sends, pushes, deletes or evaluates: RunRecordError when its settings
        could not be taken from an experiment file (the command then does none of it)."""
        if self.settings_problem is not None:
            raise RunRecordError(self.settings_problem)
        return self.experiment

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


def open_run(exp: str | None = None, trainings_dir: Path | None = None, folder: Path | None = None,
             overrides: Sequence[str] = (), settings: bool = True, fallback: bool = False) -> OpenedRun:
    """The run EXP names (an experiment name, its YAML file or a run folder), or the run folder `folder` (`--run`).

    With both, EXP is the experiment the folder's record must be (compared by name) and the YAML the record is
    compared against. The experiment file is loaded once, with `overrides` (`section.key=value`, the command
    line's). A run named by its folder alone takes its settings from the experiment file of the recorded name,
    unless `settings` is False (a list of many runs: no experiment file read, the sections empty). With `fallback`, a
    run named by its experiment whose record cannot be read is opened as today's YAML, the problem in
    `record_problem` (for the watchdog to alert on). Raises RunRecordError (a folder with no record, a record unreadable or of another experiment) or
    config's ConfigError (the YAML named).
    """
    if exp is not None and folder is None and is_run_folder_name(exp):
        exp, folder = None, Path(exp)
    by_folder = folder is not None
    if folder is None and exp is None:
        raise RunRecordError("name a run: an experiment (EXP), or its run folder (a path to it, or --run PATH)")
    yaml, today, origins = (None, None, {}) if exp is None else _load(exp, trainings_dir, overrides)
    if folder is None:
        assert today is not None
        folder = Path(today.paths.output)
        found = newest_record(folder)
        if found is None:
            return _opened(_with_skips(today), (today, origins), folder, None, yaml)
    else:
        folder = Path(folder)
        found = _folder_record(folder)
    try:
        recorded = read_record(found)
    except RunRecordError as exc:
        if not fallback or by_folder or today is None:
            raise
        opened = _opened(_with_skips(today), (today, origins), folder, found, yaml)  # watched as the file says
        return dataclasses.replace(opened, record_problem=Problem(str(found), 0, _reason(exc, found)))
    if today is not None:
        _same_experiment(found, recorded, today)
        source: tuple[Experiment, dict] | str = (today, origins)
        found_differences = differences(recorded, today)
    else:  # named by its folder alone: the settings are the experiment file of the recorded name's
        source = _settings_source(recorded.name, trainings_dir, overrides) if settings else "not asked for"
        found_differences = ()
    return _opened(_with_skips(_located(recorded, folder)), source, folder, found, yaml, found_differences, by_folder,
                   _moved_from(recorded, folder))


def _load(exp: str, trainings_dir: Path | None, overrides: Sequence[str]) -> tuple[Path, Experiment, dict]:
    """The experiment file EXP names, the experiment it holds and who set each field: the one load of the YAML a
    command makes."""
    from bigscience_ops.config.files import experiment_path

    return (experiment_path(exp, trainings_dir), *config.load_with_origins(exp, trainings_dir, overrides))


def _settings_source(name: str, trainings_dir: Path | None, overrides: Sequence[str]) -> tuple[Experiment, dict] | str:
    """The experiment file of the recorded name (and its origins), or why none loads here (the run is then opened
    without settings). An override of the command line that is refused is the command's error, said as it is."""
    try:
        return config.load_with_origins(name, trainings_dir, overrides)
    except ConfigError as exc:
        if exc.source == config.COMMAND_LINE:
            raise
        return (f"alert channels, Hub, backup and eval settings come from the experiment file, never from a run's "
                f"record, and no experiment file of {name!r} loads here (`bsops show {name}` says why)")


def _opened(run: Experiment, today: tuple[Experiment, dict] | str, folder: Path, record: Path | None,
            yaml: Path | None, found: tuple[Difference, ...] = (), by_folder: bool = False,
            moved_from: str | None = None) -> OpenedRun:
    """The opened run: `run` with the SETTINGS of `today` (the experiment file's experiment and origins), or with
    empty ones and the problem when `today` is one."""
    if isinstance(today, str):
        return OpenedRun(_without_settings(run), run, folder, record, yaml, found, by_folder, moved_from,
                         settings_problem=today)
    configured = dataclasses.replace(run, **{name: getattr(today[0], name) for name in SETTINGS})
    return OpenedRun(configured, run, folder, record, yaml, found, by_folder, moved_from, origins=today[1])


def _without_settings(run: Experiment) -> Experiment:
    """`run` with no channel, Hub, backup store or evaluation: a record's own are never used. Its limits (stall,
    cooldown, health) are kept: they tell what the record's log means, they reach no one."""
    from bigscience_ops.schema import AlertsConfig, BackupConfig, EvalConfig, HubConfig

    kept = run.alerts
    alerts = dataclasses.replace(AlertsConfig(), stall_minutes=kept.stall_minutes,
                                 cooldown_minutes=kept.cooldown_minutes, health=kept.health)
    return dataclasses.replace(run, alerts=alerts, hub=HubConfig(), backup=BackupConfig(), eval=EvalConfig())


def _reason(exc: RunRecordError, found: Path) -> str:
    """What a RunRecordError says of the record, without the file's name it starts with (the Problem names it)."""
    text = str(exc)
    return text[len(f"{found}: "):] if text.startswith(f"{found}: ") else text


def _folder_record(folder: Path) -> Path:
    if not folder.is_dir():
        raise RunRecordError(f"run folder {folder}: is {kind_of(folder)}; expected a run folder (one holding "
                             f"{EXPERIMENT_JSON} or {LAUNCHES}/<time>/{EXPERIMENT_JSON})")
    found = newest_record(folder)
    if found is None:
        raise RunRecordError(f"run folder {folder}: no {EXPERIMENT_JSON} in it or in {LAUNCHES}/*/: not a run bsops "
                             "launched (a run never launched is named by its experiment)")
    return found


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
