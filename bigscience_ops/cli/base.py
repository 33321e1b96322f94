"""What every command shares: the group, exit codes, error handling, the experiment options, the
option types that refuse hostile values, and the line that says which run folder a command uses."""

from __future__ import annotations

import functools
import inspect
import json
import re
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from bigscience_ops import __version__
from bigscience_ops.errors import BsopsError
from bigscience_ops.redact import scrub
from bigscience_ops.typedyaml import PLAIN, control_allowed, control_character

EXIT_PROBLEMS = 1  # the command ran and found problems (plan errors, alerts)
EXIT_ERROR = 2  # the command could not do its work (bad input, a tool failed)
VERBOSE = "bsops.verbose"  # ctx.meta key: print the raw command and stderr under a Slurm error


def verbose() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get(VERBOSE))


def echo_detail(exc: BaseException) -> None:
    """Under --verbose, the raw command, exit code and stderr of a Slurm failure (scrubbed)."""
    detail = getattr(exc, "detail", None)
    if verbose() and callable(detail):
        click.echo(scrub(detail()), err=True)


_FIELD_PATH = r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)+"
"""A dotted field path as the command line names one (SECTION.KEY, at least one dot)."""
_DASHED_FIELD = re.compile(rf"--({_FIELD_PATH})(=.*)?", re.DOTALL)
"""`--train.seed=7` or `--train.seed 7`: a field path with at least one dot (no option of bsops has one)."""


def dashed_overrides(args: list[str]) -> list[str]:
    """`--SECTION.KEY=VALUE` and `--SECTION.KEY VALUE` (torchtitan's and tyro's spelling) as `SECTION.KEY=VALUE`, the
    one overrides layer's; nothing after `--` is touched. A dashed field path with no value is left for click to
    refuse."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        dashed = _DASHED_FIELD.fullmatch(arg)
        if dashed and dashed.group(2) is not None:
            out.append(dashed.group(1) + dashed.group(2))
        elif dashed and i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.append(f"{dashed.group(1)}={args[i + 1]}")
            i += 1
        else:
            out.append(arg)
        i += 1
    return out


RENAMED = {
    "rollback": {"--to": "--step"},  # a checkpoint is chosen by --step everywhere
    "eval": {"--from": "--mirror"},  # --from names a run to start from (warm-start); this is a dataset mirror
    "samples": {"--micro-batch": "--micro-batch-index"},  # beside --micro-batch-size, which is a size
    "plot": {"--tensorboard-dir": "--from-clone"},  # where to read, as logs --from-clone: not paths.tensorboard
}
"""Option names of the last release, per command, and their new names (docs/VOCABULARY.md): each is still accepted
this release, and says its new name on stderr. Gone in the next release."""


def renamed_options(args: list[str]) -> list[str]:
    """`args` with the old option names of RENAMED (as `--old VALUE` or `--old=VALUE`) spelled the new way, each
    old name used said in one line on stderr; nothing after `--` is touched."""
    command = next((a for a in args if not a.startswith("-")), None)
    renamed = RENAMED.get(command or "", {})
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        old, equals, value = arg.partition("=")
        if old in renamed:
            click.echo(f"note: bsops {command} {old} is now {renamed[old]}; {old} goes in the next release", err=True)
            arg = renamed[old] + equals + value
        out.append(arg)
    return out


class _Group(click.Group):
    """Turns library errors and a command's bad arguments into one clear line and exit code 2, with no traceback."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, renamed_options(dashed_overrides(args)))

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BsopsError as exc:
            click.echo(f"error: {scrub(_alias_said(exc, ctx))}", err=True)
            echo_detail(exc)
            ctx.exit(EXIT_ERROR)
        except click.UsageError as exc:  # the arguments of a command: one line, naming the command's help
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            click.echo(f"error: {scrub(exc.format_message())} (see {where} --help)", err=True)
            ctx.exit(EXIT_ERROR)


def _set_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[VERBOSE] = True


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bsops")
@click.option("-v", "--verbose", is_flag=True, expose_value=False, is_eager=True, callback=_set_verbose,
              help="Under an error from Slurm, also print the command that failed, its exit code and its stderr.")
def main() -> None:
    """Run GPT pretraining on Slurm: plan, render, launch and watch experiments.

    An experiment is a YAML file NAME.yaml, looked up in the local trainings folder (--trainings-dir,
    $BSOPS_TRAININGS or ./trainings) first, then among bsops' bundled experiments; EXP is its NAME
    or a path to the file. A command that reads a run also takes the run folder as EXP (or --run
    PATH) and reads the experiment the run recorded; `bsops runs` lists the runs you launched.

    \b
    First steps:
      bsops list                 the experiments
      bsops plan tiny            sizes, memory, batch rampup, steps, days; every rule checked
      bsops render tiny          the Slurm job script and DeepSpeed JSON
      bsops launch tiny --local  train it on this machine
    """


def json_option(func):
    """--json: the command's result as one JSON document on stdout, holding what its text shows (docs/VOCABULARY.md)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as one JSON document instead of text.")(func)


def dry_run_option(func):
    """--dry-run: say what the command would do; write, send, submit and delete nothing (docs/VOCABULARY.md)."""
    return click.option("--dry-run", is_flag=True,
                        help="Say what would be done; write, send, submit and delete nothing.")(func)


def echo_json(document: object) -> None:
    """One JSON document on stdout (paths and other objects as their text)."""
    click.echo(json.dumps(document, indent=2, default=str))


verbose_option = click.option(
    "-v", "--verbose", is_flag=True, expose_value=False, callback=_set_verbose,
    help="Under an error from Slurm, also print the command that failed, its exit code and its stderr.")


# ----------------------------------------------------------------------------- option types

class FiniteFloat(click.ParamType):
    """A finite number within bounds: click's FloatRange lets nan and inf through (and 1e300 seconds overflows
    a sleep); every float option of bsops uses this instead."""

    name = "number"

    def __init__(self, low: float | None = None, high: float = 1e6, *, low_open: bool = False, unit: str = "") -> None:
        self.low, self.high, self.low_open, self.unit = low, high, low_open, unit

    def allowed(self) -> str:
        low = "" if self.low is None else f"{'above' if self.low_open else 'at least'} {self.low:g} and "
        return f"allowed: a finite number {low}at most {self.high:g}{' ' + self.unit if self.unit else ''}"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float) and math.isfinite(value) and self._within(value):
            return value
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"got {_shown(value)}; {self.allowed()}", param, ctx)
        if not math.isfinite(number) or not self._within(number):
            self.fail(f"got {_shown(value)}; {self.allowed()}", param, ctx)
        return number

    def _within(self, number: float) -> bool:
        if self.low is not None and (number < self.low or self.low_open and number == self.low):
            return False
        return number <= self.high


def _shown(value: object) -> str:
    """A value as an error line may show it: repr, so a line break reads as `\\n`, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse_control(value: str, kind: click.ParamType, param: click.Parameter | None, ctx: click.Context | None) -> None:
    bad = control_character(value, PLAIN)
    if bad is not None:
        kind.fail(f"got {_shown(value)}: {bad}; {control_allowed(PLAIN)}", param, ctx)


class Text(click.ParamType):
    """One line of text: a control character or a Unicode line break (U+2028 ...) is refused, since option
    values reach job names, Slurm's argv, log lines and email headers."""

    name = "text"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = value if isinstance(value, str) else str(value)
        _refuse_control(text, self, param, ctx)
        return text


class SafePath(click.Path):
    """click.Path that refuses a control character or line break in the path, as Text does."""

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, str):
            _refuse_control(value, self, param, ctx)
        return super().convert(value, param, ctx)


TEXT = Text()


# ----------------------------------------------------------------------------- experiments and run folders

TRAININGS_DIR_ALLOWED = ("allowed: an existing folder of experiment YAML files (one that is not there would leave "
                         "only bsops' bundled experiments to look in, and EXP would silently mean one of them)")


def _existing_folder(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """--trainings-dir (else $BSOPS_TRAININGS, when set) names a folder that is there: every command that looks
    experiments up refuses one that is not, cron jobs included (their job scripts pass the folder the experiment was
    found in, which may since have gone). ./trainings, the default, may be missing."""
    import os

    named = value if value is not None else Path(os.environ["BSOPS_TRAININGS"]) if os.environ.get(
        "BSOPS_TRAININGS") else None
    if named is not None and not named.is_dir():
        what = "not a folder" if named.exists() else "no such folder"
        where = "" if value is not None else " ($BSOPS_TRAININGS, with no --trainings-dir given)"
        shown = repr(str(named)) if len(str(named)) <= 400 else _shown(str(named))  # a path: shown whole
        raise click.BadParameter(f"got {shown}{where}: {what}; {TRAININGS_DIR_ALLOWED}", ctx, param)
    return value


def trainings_option(func):
    return click.option(
        "--trainings-dir", type=SafePath(file_okay=False, path_type=Path), default=None, callback=_existing_folder,
        help="Folder of your experiment YAML files, looked in before the bundled ones "
             "(default: $BSOPS_TRAININGS, else ./trainings); it must exist.",
    )(func)


OVERRIDES_HELP = """SECTION.KEY=VALUE (also spelled --SECTION.KEY=VALUE) sets any field of the experiment for one command:
VALUE is one YAML flow value, typed, bounded and checked exactly as in the file. One precedence for every field:
the command line, then the experiment file, then its bases, then bsops' defaults. A run's record (experiment.json)
keeps the values and the assignments; `bsops plan` shows them; `bsops fields` lists every field. For example:

\b
  bsops plan tiny train.seed=7 optimizer.lr=3e-4 'eval.tasks=[arc_easy, piqa]'"""
OVERRIDES_LINE = ("SECTION.KEY=VALUE (or --SECTION.KEY=VALUE) after EXP sets that field of the experiment for this "
                  "command, as a file would; `bsops fields` lists the fields, `bsops --help` says the rule.")
main.help = f"{inspect.cleandoc(main.help or '')}\n\n{OVERRIDES_HELP}"


def overrides_argument(func):
    """The trailing `[SECTION.KEY=VALUE]...` of a command that loads an experiment (config.load_experiment's
    `overrides`), with OVERRIDES_LINE added to the command's help (the rule itself is said once, in `bsops --help`).
    The command receives the assignments of its field aliases (field_alias_option) after those written out, so a
    field given both ways is refused as given twice. Place it below @main.command()."""
    func.__doc__ = f"{inspect.cleandoc(func.__doc__ or '')}\n\n{OVERRIDES_LINE}"

    @functools.wraps(func)
    def with_aliases(*args, **kwargs):
        given = click.get_current_context().meta.get(ALIASED, [])
        kwargs["overrides"] = (*kwargs.get("overrides", ()), *(alias.assignment for alias in given))
        return func(*args, **kwargs)

    return click.argument("overrides", nargs=-1, type=TEXT, metavar="[SECTION.KEY=VALUE]...")(with_aliases)


ALIASED = "bsops.aliased"
"""ctx.meta key: the field aliases given on this command line (Aliased), in order."""


@dataclass(frozen=True)
class Aliased:
    """One field alias as given: `--to /x` is the assignment `backup.dest="/x"`."""

    flag: str
    field: str
    value: str
    assignment: str


class FieldAlias(click.Option):
    """An option that is another spelling of one experiment field (`field`): its value becomes the assignment
    `field=VALUE` of the command's overrides, typed, bounded, refused and recorded exactly as that assignment
    (docs/OVERRIDES.md). A string field takes the value whole (quoted for YAML: `#`, `: ` or `[` stay text); any
    other field reads it as one YAML flow value, as after `field=`."""

    def __init__(self, *args, field: str, **kwargs) -> None:
        self.field = field
        super().__init__(*args, **kwargs)


def field_alias_option(field: str, *decls: str, metavar: str = "VALUE", help: str = "", hidden: bool = False):
    """`--flag VALUE` as the assignment `field=VALUE` of the command's overrides (overrides_argument), said in
    --help as "Alias of FIELD=METAVAR"; the one way an option sets an experiment field (tests/cli/test_one_precedence.py
    checks that every option that names a field is one)."""

    def given(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is None:
            return
        text = json.dumps(value, ensure_ascii=False) if _is_text_field(field) else value
        ctx.meta.setdefault(ALIASED, []).append(Aliased(param.opts[0], field, value, f"{field}={text}"))

    said = f"Alias of {field}={metavar}" + (f": {help}" if help else ".")
    return click.option(*decls, cls=FieldAlias, field=field, type=TEXT, default=None, expose_value=False,
                        callback=given, metavar=metavar, help=said, hidden=hidden)


def _is_text_field(field: str) -> bool:
    """Whether the experiment field at the dotted path `field` holds a string (str, or str | None)."""
    import typing

    from bigscience_ops.schema import Experiment

    tp: object = Experiment
    for name in field.split("."):
        tp = typing.get_type_hints(tp)[name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 and typing.get_origin(tp) is not list else tp
    return tp is str


def _alias_said(exc: BsopsError, ctx: click.Context) -> str:
    """`exc`'s line, naming the option it came from when it refuses the assignment of a field alias."""
    text = str(exc)
    for alias in ctx.meta.get(ALIASED, []):
        if "command line" in str(getattr(exc, "source", "")) and getattr(exc, "field", None) == alias.field:
            return f"{text} (given as '{alias.flag}' {_shown(alias.value)})"
    return text


def load_experiment(name: str, trainings_dir: Path | None, overrides: tuple[str, ...] = ()):
    """The experiment NAME (or path) with the command line's SECTION.KEY=VALUE `overrides`, loaded without importing
    anything heavy at CLI start."""
    from bigscience_ops.config import loading as config

    return config.load_experiment(name, trainings_dir, overrides)


def echo_run_folder(name: str, trainings_dir: Path | None, experiment, err: bool = False) -> None:
    """Say which run folder the command reads or writes, and the rule that put it there: the first line of the
    command's report, or on stderr (`err`) where stdout is the data itself (a log, Markdown, JSON)."""
    from bigscience_ops.config.files import experiment_path, run_folder_note

    if any(assignment.startswith("paths.output=") for assignment in experiment.overrides):
        click.echo(f"run folder: {experiment.paths.output} (paths.output, set on the command line)", err=err)
        _say_folders_kept(experiment)
        return
    experiment_file = experiment_path(name, trainings_dir)
    click.echo(run_folder_note(experiment_file, experiment), err=err)


RUN_FOLDERS = ("paths.checkpoints", "paths.tensorboard", "paths.logs", "paths.codecarbon",
               "checkpoint.kill_switch_path")
"""Where a run writes besides its folder: derived under paths.output unless the experiment sets them."""


def _say_folders_kept(experiment) -> None:
    """One warning per run folder the experiment sets outside a paths.output the command line moved (`launch --out`):
    it stays where the file says, and the run writes there."""
    output = Path(experiment.paths.output)
    for dotted in RUN_FOLDERS:
        section, name = dotted.split(".")
        value = getattr(getattr(experiment, section), name)
        if value and dotted not in experiment.derived and not Path(value).is_relative_to(output):
            click.echo(f"warning: {dotted} is {value}, as the experiment sets it, outside the run folder given on the "
                       f"command line: the run writes there (give {dotted}=... too to move it)", err=True)


run_option = click.option(
    "--run", "run", type=SafePath(file_okay=False, path_type=Path), default=None,
    help="The run folder to read (one holding experiment.json or launches/*/experiment.json, e.g. made by "
         "launch --local --out); EXP may then be left out, or names the experiment it must have recorded. A folder "
         "given as EXP is read the same way.")


_ASSIGNMENT = re.compile(rf"{_FIELD_PATH}=", re.DOTALL)


def open_run_saying(exp: str | None, run: Path | None, trainings_dir: Path | None, err: bool = False,
                    say_folder: bool = True, overrides: tuple[str, ...] | None = None, fallback: bool = False):
    """The run EXP (a name, a YAML file or a run folder) or --run names, as the run recorded itself with its
    experiment file's settings today (run.open, which is opening.open_run: the one way a command reads a run), and
    what a command says of it: which run folder it is (on
    stderr with `err`: where stdout is the data; not at all without `say_folder`) and, in one line on stderr, where
    the experiment file now differs from the run's record in a field that changes the data order or the model: the
    run is shown as recorded. With `fallback` (the watchdog, the hourly jobs), a record that cannot be read is said in
    one line and the run is read as its experiment file says today. `overrides`: those of a command that takes them
    (None: it takes none); with --run, an EXP that is a SECTION.KEY=VALUE is the first of them, not a name."""
    from bigscience_ops import run as runs

    if overrides is not None and run is not None and exp is not None and _ASSIGNMENT.match(exp):
        exp, overrides = None, (exp, *overrides)
    opened = runs.open(exp, trainings_dir, run, overrides or (), fallback=fallback)
    if opened.record_problem is not None:
        click.echo(f"note: {opened.record_problem}; the run is read as {opened.yaml} says today", err=True)
    if say_folder:
        _say_folder(opened, trainings_dir, err)
    note = opened.differs_note()
    if note is not None:
        click.echo(note, err=True)
    return opened


def configured_run(exp: str | None, run: Path | None, trainings_dir: Path | None, overrides: tuple[str, ...] = (),
                   fallback: bool = False):
    """The run EXP (or --run) names as it recorded itself, with the alerts, hub, backup and eval settings of its
    experiment file today (run.open; refused when no experiment file of its name loads: never a record's), and the
    experiment file's name. With `fallback` (an hourly job), a record that cannot be read is said and the run read as
    its experiment file says today."""
    opened = open_run_saying(exp, run, trainings_dir, overrides=overrides, fallback=fallback)
    return opened.configured(), opened.named


alert_option = click.option(
    "--alert", is_flag=True,
    help="On failure, email the experiment's alerts recipients at once, then at most once per "
         "alerts.cooldown_minutes while it keeps failing, and once more when it works again (as the status "
         "watchdog does); the cron jobs pass it.")


def run_alerting(exp, alert: bool, job: str, command: str, work: Callable[[], None]) -> None:
    """Run `work` through the library's job_alerts.run_alerting (with --alert, the failure or the recovery told as
    the watchdog tells its alerts, on the channels of exp's alerts section); print what it says on stderr and exit 2
    when the work or a message failed."""
    from bigscience_ops.ops.tell import job_alerts

    teller = job_alerts.Teller(exp.name, exp.alerts, exp.paths.logs, (exp.hub.token_env, exp.alerts.smtp_password_env))
    outcome = job_alerts.run_alerting(teller, alert, job, command, work)
    for line in outcome.lines:
        click.echo(line, err=True)
    if outcome.failed:
        sys.exit(EXIT_ERROR)


def _say_folder(opened, trainings_dir: Path | None, err: bool) -> None:
    if opened.by_folder:
        moved = f"; moved from {opened.moved_from}, its paths taken under it" if opened.moved_from else ""
        click.echo(f"run folder: {opened.folder} (named on the command line; recorded in {opened.record}{moved})",
                   err=err)
        return
    echo_run_folder(str(opened.yaml), trainings_dir, opened.experiment, err=err)
    if opened.record is None and not opened.folder.exists():
        _elsewhere(opened.experiment.name)


def _elsewhere(name: str) -> None:
    """Where the runs index knows runs of `name` when there is none where the experiment puts it (a bundled
    experiment's run goes under the folder it was launched from)."""
    from bigscience_ops.run import index as runs_index

    folders = [launch.folder for launch, _ in runs_index.latest_by_folder(runs_index.read_index().records)
               if launch.experiment == name and Path(launch.folder).is_dir()]
    if folders:
        click.echo(f"note: no run of {name} here; your runs index (bsops runs) has {len(folders)}, the newest in "
                   f"{folders[0]}: name a run by its folder (bsops info FOLDER)", err=True)


def default_cron_dir() -> Path:
    from bigscience_ops.ops.cron.runner import default_cron_dir as default

    return default()


cron_dir_option = click.option(
    "--cron-dir", type=SafePath(file_okay=False, path_type=Path), default=None,
    help="Folder with cron.hourly/, cron.daily/ and cron.yaml (default: $BSOPS_CRON_DIR, else "
         "$XDG_DATA_HOME/bsops/cron, else ~/.local/share/bsops/cron).")
