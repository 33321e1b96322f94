"""One precedence for every experiment field (docs/VOCABULARY.md, "Options and experiment fields"): an option that
names a field is an alias of its assignment (cli/base.py, field_alias_option), fed to the overrides layer; no other
option, and no command's code, sets a field another way. A new option named like a field, or one whose help says it
stands in for a field, fails here until it is an alias or said below to be no field."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.cli.base import FieldAlias
from bigscience_ops.schema import Experiment

CLI = Path(__file__).resolve().parents[2] / "bigscience_ops" / "cli"

NOT_A_FIELD = {
    ("status", "--job-name"): "a job watched by its name alone; refused with a run",
    ("status", "--log"): "with --job-name; refused with a run",
    ("status", "--user"): "users watched besides slurm.group's",
    ("hub-sync", "--remote"): "one URL for one kind, for this command; hub.remote_template is a template",
    ("samples", "--micro-batch-size"): "what to assume of a log that does not record it",
    ("samples", "--dp"): "what to assume of a log that does not record it",
    ("convert", "--dtype"): "the precision of the weights written (eval.dtype is the evaluation's)",
    ("runs", "--limit"): "rows of the runs index; no experiment is loaded",
    ("data verify", "--vocab-size"): "a bound to check token ids against, instead of --experiment's",
    ("preprocess", "--vocab-file"): "Megatron's option: the tokenizer files to encode with; no experiment",
    ("preprocess", "--merge-file"): "Megatron's option: the tokenizer files to encode with; no experiment",
    ("preprocess", "--log-interval"): "documents between two progress lines; no experiment",
    ("preprocess", "--make-vocab-size-divisible-by"): "Megatron's option, accepted and unused",
    ("preprocess", "--tokenizer"): "the tokenizer to encode with; no experiment",
    ("logs", "--interval"): "seconds between two looks at the log (checkpoint save intervals are steps)",
    ("eval", "--tensor"): "the evaluation's own layout of the checkpoint (bsops eval's)",
    ("eval", "--pipeline"): "the evaluation's own layout of the checkpoint (bsops eval's)",
}
"""(command, option): why an option that looks like an experiment field is none (it sets no field)."""


def _fields(cls: type = Experiment, prefix: str = "") -> dict[str, str]:
    """Every field path of the schema, nested sections followed: {path: its last name}."""
    found: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        found[prefix + f.name] = f.name
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if dataclasses.is_dataclass(args[0]):
            found.update(_fields(args[0], f"{prefix}{f.name}."))
    return found


FIELDS = _fields()
SECTIONS = "|".join(f.name for f in dataclasses.fields(Experiment))
STANDS_IN = re.compile(rf"(instead of|default:?|overrides?)[^.;]*\b(?:{SECTIONS})\.[a-z_]+")
"""A help text saying the option stands in for a field: `instead of paths.tensorboard`, `(default: backup.dest)`."""


def _commands(command: click.Command = main, path: tuple[str, ...] = ()):
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def _group(name: str) -> str:
    """`eval next` is eval's (another group's options are its own)."""
    return "eval" if name.split(" ")[0] == "eval" else name


def test_every_option_that_names_a_field_is_an_alias_of_it_or_said_to_be_none() -> None:
    leaves = set(FIELDS.values())
    looks_like: dict[tuple[str, str], str] = {}
    plain: set[tuple[str, str]] = set()
    for name, command in _commands():
        for param in command.params:
            if not isinstance(param, click.Option) or isinstance(param, FieldAlias):
                continue
            plain.add((_group(name), param.opts[0]))
            names = {o.lstrip("-").replace("-", "_") for o in (*param.opts, *param.secondary_opts)} | {param.name}
            if names & leaves or STANDS_IN.search(param.help or ""):
                looks_like[(_group(name), param.opts[0])] = param.help or ""
    unexplained = {key: help for key, help in looks_like.items() if key not in NOT_A_FIELD}
    assert unexplained == {}, "declare these with field_alias_option, or say in NOT_A_FIELD why they are no field"
    stale = {key for key in NOT_A_FIELD if key not in plain and key[0] != "eval"}
    assert stale == set(), "NOT_A_FIELD names options no command has (or that became aliases)"


def test_every_alias_names_a_field_a_command_line_sets_and_says_so_in_its_help() -> None:
    aliases = [(name, command, p) for name, command in _commands() for p in command.params if isinstance(p, FieldAlias)]
    assert {(name, p.opts[0]) for name, _, p in aliases} >= {("backup", "--to"), ("plan", "--nodes"),
                                                             ("launch", "--out"), ("launch", "--tasks")}
    for name, command, param in aliases:
        assert param.field in FIELDS and "." in param.field, (name, param.field)
        assert any(p.name == "overrides" for p in command.params), f"{name}: an alias needs the overrides argument"
        assert (param.help or "").startswith(f"Alias of {param.field}="), (name, param.help)
        assert not param.expose_value, f"{name} {param.opts[0]}: its value reaches the command as the assignment only"


def _experiment_writes(tree: ast.AST) -> list[str]:
    """What a module of cli/ does that sets a field outside the overrides layer: dataclasses.replace on anything but a
    watchdog state, the launch's apply_overrides or its Overrides, or an assignment to an attribute."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            first = node.args[0] if node.args else None
            if called == "replace" and getattr(getattr(func, "value", None), "id", "") == "dataclasses":
                if not (isinstance(first, ast.Name) and first.id == "state"):
                    found.append(f"line {node.lineno}: dataclasses.replace({ast.unparse(first) if first else ''}, ...)")
            if called in ("apply_overrides", "Overrides"):
                found.append(f"line {node.lineno}: {called}(...)")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                root = target
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if root is not target and isinstance(root, ast.Name) and _an_experiment(root.id):
                    found.append(f"line {node.lineno}: {ast.unparse(target)} = ...")
    return found


def _an_experiment(name: str) -> bool:
    """A name the commands give an experiment or an opened run."""
    return "exp" in name or name in ("opened", "run", "recorded", "launched", "configured")


@pytest.mark.parametrize("module", sorted(p.name for p in CLI.glob("*.py")))
def test_no_command_sets_an_experiment_field_in_its_code(module: str) -> None:
    assert _experiment_writes(ast.parse((CLI / module).read_text(encoding="utf-8"))) == []


def test_the_check_of_the_code_sees_the_ways_a_field_was_set_before() -> None:
    before = """
experiment = apply_overrides(experiment, Overrides(nodes_all_along=nodes))
exp = dataclasses.replace(exp, paths=paths)
experiment.paths.output = out
"""
    assert len(_experiment_writes(ast.parse(before))) == 4


def test_launch_out_and_tasks_are_recorded_as_their_assignments(tmp_path: Path, monkeypatch) -> None:
    """`launch --out DIR --tasks N` is `paths.output=DIR slurm.array=N`: what a dry run shows and would record."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["launch", "tiny", "--dry-run", "--out", "run #2", "--tasks", "3"])
    assert f"run folder: {tmp_path}/run #2 (paths.output, set on the command line)" in result.stdout, result.output
    assert "overrides (command line): 'paths.output=\"run #2\"' slurm.array=3" in result.stdout
    refused = CliRunner().invoke(main, ["launch", "tiny", "--local", "--out", "/"])
    assert refused.exit_code == 2 and "paths.output" in refused.stderr and "'--out' '/'" in refused.stderr
    assert not (tmp_path / "runs").exists()


def test_a_run_folder_the_experiment_sets_outside_launch_out_is_said(tmp_path: Path, monkeypatch) -> None:
    """--out moves paths.output; a folder the experiment sets itself (here paths.checkpoints) stays where the file
    says, and the launch says so in one warning naming the field and how to move it too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trainings").mkdir()
    (tmp_path / "trainings" / "fixed.yaml").write_text(f"base: tiny\npaths: {{checkpoints: {tmp_path / 'kept'}}}\n")
    result = CliRunner().invoke(main, ["launch", "fixed", "--trainings-dir", "trainings", "--local", "--dry-run",
                                       "--out", "elsewhere"])
    assert result.exit_code == 0, result.output
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning: paths.")]
    assert f"paths.checkpoints is {tmp_path / 'kept'}" in warning and "paths.checkpoints=..." in warning
    moved = CliRunner().invoke(main, ["launch", "fixed", "--trainings-dir", "trainings", "--local", "--dry-run",
                                      "--out", "elsewhere", f"paths.checkpoints={tmp_path / 'elsewhere' / 'c'}"])
    assert moved.exit_code == 0 and "warning: paths." not in moved.stderr
