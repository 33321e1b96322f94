"""`bsops fields`: every field of the schema with its type, default, bounds and doc; docs/FIELDS.md in sync; the
`--SECTION.KEY=VALUE` spelling of an override; the overrides rule said once in the help."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import fields
from bigscience_ops.cli import main
from bigscience_ops.cli.base import OVERRIDES_HELP, OVERRIDES_LINE, dashed_overrides
from bigscience_ops.config.loading import load_experiment, to_dict
from bigscience_ops.schema import AlertsConfig

DOCS = Path(__file__).resolve().parents[2] / "docs" / "FIELDS.md"


def _leaves(value: object, prefix: str = "") -> set[str]:
    if isinstance(value, dict) and value:
        return {leaf for key, item in value.items() for leaf in _leaves(item, f"{prefix}{key}.")}
    return {prefix.rstrip(".")}


def test_every_field_of_a_loaded_experiment_is_listed_and_nothing_else() -> None:
    # the leaves of a real experiment as its record writes them, against the rows read off the schema
    listed = {row.path for row in fields.field_rows()}
    record = to_dict(load_experiment("tiny"))
    mapping_fields = {"eval.sources", "eval.references"}  # one value each (a mapping of names), set whole
    leaves = {leaf for leaf in _leaves(record) if not any(leaf.startswith(f"{m}.") for m in mapping_fields)}
    leaves -= {"derived", "recorded"}  # bsops' own, never a file's
    assert leaves - listed == set()
    assert {p for p in listed if not p.startswith("curriculum") and not p.startswith("batch.rampup")} - leaves \
        - mapping_fields == set()


def test_a_row_carries_the_schemas_default_bounds_and_doc() -> None:
    [row] = [r for r in fields.field_rows("alerts") if r.path == "alerts.cooldown_minutes"]
    assert row.default == str(AlertsConfig.cooldown_minutes) and row.type == "int"
    assert row.bounds == ">= 1, <= 525600" and "between two emails" in row.doc and row.settable
    [name] = [r for r in fields.field_rows() if r.path == "name"]
    assert not name.settable
    assert {r.default for r in fields.field_rows("model") if r.path == "model.num_layers"} == {"required"}


def test_a_section_inside_a_section_and_an_unknown_one() -> None:
    assert {r.path.rpartition(".")[0] for r in fields.field_rows("alerts.health")} == {"alerts.health"}
    with pytest.raises(fields.FieldsError, match=r"no section 'alert' .*allowed: .*alerts"):
        fields.field_rows("alert")
    result = CliRunner().invoke(main, ["fields", "train.seed"])
    assert result.exit_code == 2 and "no section 'train.seed'" in result.output


def test_the_command_prints_text_json_and_the_docs_table() -> None:
    runner = CliRunner()
    text = runner.invoke(main, ["fields", "train"])
    assert text.exit_code == 0 and "train.seed: int = 42  [>= 0, < 4294967296]\n" in text.output
    rows = json.loads(runner.invoke(main, ["fields", "--json"]).output)
    assert [r["path"] for r in rows] == [r.path for r in fields.field_rows()]
    both = runner.invoke(main, ["fields", "--json", "--markdown"])
    assert both.exit_code == 2 and "allowed: one of them" in both.output


def test_docs_fields_is_the_schema_as_it_is() -> None:
    assert DOCS.read_text(encoding="utf-8") == fields.markdown_table(fields.field_rows()), \
        "docs/FIELDS.md is out of date: bsops fields --markdown > docs/FIELDS.md"


@pytest.mark.parametrize(("given", "seen"), [
    (["plan", "tiny", "--train.seed=7"], ["plan", "tiny", "train.seed=7"]),
    (["plan", "tiny", "--train.seed", "7", "--json"], ["plan", "tiny", "train.seed=7", "--json"]),
    (["plan", "--json", "tiny", "--eval.tasks=[a, b]"], ["plan", "--json", "tiny", "eval.tasks=[a, b]"]),
    (["plan", "tiny", "--", "--train.seed=7"], ["plan", "tiny", "--", "--train.seed=7"]),
    (["plan", "tiny", "--train.seed"], ["plan", "tiny", "--train.seed"]),
    (["plan", "tiny", "--trainings-dir", "x"], ["plan", "tiny", "--trainings-dir", "x"]),
])
def test_a_dashed_field_path_is_an_override(given: list[str], seen: list[str]) -> None:
    assert dashed_overrides(given) == seen


def test_a_dashed_override_reaches_the_overrides_layer() -> None:
    result = CliRunner().invoke(main, ["plan", "tiny", "--train.seed=7", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["overrides"] == ["train.seed=7"]
    wrong = CliRunner().invoke(main, ["plan", "tiny", "--train.sed=7"])
    assert wrong.exit_code == 2 and "unknown key" in wrong.output and "seed" in wrong.output


def test_the_overrides_rule_is_said_once_in_the_help() -> None:
    runner = CliRunner()
    top = runner.invoke(main, ["--help"]).output
    assert "One precedence for every field" in top
    for command in ("plan", "show", "render", "launch", "status"):
        text = runner.invoke(main, [command, "--help"]).output
        assert "One precedence" not in text and "bsops fields" in text, command
    assert OVERRIDES_LINE and "bsops fields" in OVERRIDES_HELP
