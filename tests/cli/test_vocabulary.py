"""docs/VOCABULARY.md is what the command line is: every option of every command is in its table with the commands
that take it, each option name in one row (one meaning), and the renamed options are the ones bsops still reads."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.cli.base import RENAMED, renamed_options

DOC = Path(__file__).resolve().parents[2] / "docs" / "VOCABULARY.md"


def _table(heading: str) -> list[list[str]]:
    """The rows of the Markdown table under `## heading`, as lists of cells."""
    text = DOC.read_text(encoding="utf-8").split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ")][2:]  # past the head and its rule
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def _options_in_code() -> dict[str, set[str]]:
    """Every visible option name (long and short) of every visible command: the commands that take it."""
    found: dict[str, set[str]] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                if not sub.hidden:
                    walk(sub, [*path, name])
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for name in (*param.opts, *param.secondary_opts):
                    found.setdefault(name, set()).add(" ".join(path) or "bsops")

    walk(main, [])
    return found


def _options_in_doc() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for names, meaning, commands in _table("Options"):
        assert meaning, f"{names}: no meaning"
        for name in re.findall(r"`([^`]+)`", names):
            assert name not in found, f"{name} is in two rows: one name, one meaning"
            found[name] = {c.strip() for c in commands.split(",")}
    return found


def test_every_command_takes_the_options_the_vocabulary_says_and_no_other() -> None:
    code, doc = _options_in_code(), _options_in_doc()
    assert set(code) - set(doc) == set(), "options missing from docs/VOCABULARY.md"
    assert set(doc) - set(code) == set(), "options in docs/VOCABULARY.md that no command has"
    wrong = {name: (sorted(doc[name]), sorted(code[name])) for name in code if doc[name] != code[name]}
    assert wrong == {}, "option: (commands the vocabulary says, commands that take it)"


def test_the_renamed_options_are_the_ones_still_read_and_each_says_its_new_name() -> None:
    table = {(command, old.strip("`")): new.strip("`") for command, old, new in _table("Renamed this release")
             if not command.endswith("(a command)")}
    assert table == {(command, old): new for command, names in RENAMED.items() for old, new in names.items()}
    code = _options_in_code()

    def takes(name: str, command: str) -> bool:  # the command, or a subcommand of it (eval: eval prefetch)
        return any(c == command or c.startswith(command + " ") for c in code.get(name, set()))

    for (command, old), new in table.items():
        assert takes(new, command) and not takes(old, command), (command, old)


@pytest.mark.parametrize(("args", "expected"), [
    (["rollback", "run", "--to", "5"], ["rollback", "run", "--step", "5"]),
    (["rollback", "run", "--to=5"], ["rollback", "run", "--step=5"]),
    (["eval", "prefetch", "x", "--from", "m"], ["eval", "prefetch", "x", "--mirror", "m"]),
    (["eval", "x", "--prefetch", "--from", "m"], ["eval", "x", "--prefetch", "--mirror", "m"]),  # the old spelling
    (["warm-start", "--from", "r:5", "x"], ["warm-start", "--from", "r:5", "x"]),  # its own --from: not renamed
    (["rollback", "run", "--", "--to"], ["rollback", "run", "--", "--to"]),
])
def test_an_old_name_is_read_as_the_new_one_for_its_command_only(args: list[str], expected: list[str]) -> None:
    assert renamed_options(args) == expected


def test_an_old_name_on_the_command_line_says_its_new_one() -> None:
    result = CliRunner().invoke(main, ["samples", "tiny", "--iteration", "1", "--micro-batch", "99", "--no-text"])
    assert "note: bsops samples --micro-batch is now --micro-batch-index" in result.stderr
    assert "no such option" not in result.output.lower()
