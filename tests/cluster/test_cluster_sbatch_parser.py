"""What reaches an #SBATCH line is what Slurm's own parser reads back, or it is refused at load.

sbatch reads `#SBATCH` lines with a parser of its own (a backslash escapes even inside quotes, an
unquoted `#` ends the line): bash quoting let a value add options (`export : ALL,BASH_ENV=...`).
Each hostile value below, in each field that reaches an #SBATCH line, is either refused when the
experiment (or cron.yaml) loads, with one `error:` line naming the field and exit code 2 and nothing
written, or rendered so that `sbatch -vv` (tests/fixtures_sbatch.py) parses exactly one option equal
to it and no other option. This is also this part's share of the hostile-input table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bigscience_ops import slurm
from bigscience_ops.cli import EXIT_ERROR, main
from bigscience_ops.config.loading import load_experiment
from tests.fixtures_sbatch import sbatch_options  # noqa: F401  (the fixture)

HOSTILE = {
    "backslash": "a\\b",
    "trailing backslash": "six\\",
    "single quote": "a'b",
    "double quote": 'a"b',
    "escaped quote": "a\\'b",
    "space": "a b",
    "hash": "a#b",
    "percent": "a%b",
    "equals": "a=b",
    "comma": "a,b",
    "leading dash": "-x",
    "U+2028": "a\u2028b",
    "U+2029": "a\u2029b",
    "U+0085": "a\x85b",
    "U+000B vertical tab": "a\x0bb",
    "U+000C form feed": "a\x0cb",
    "U+001C file separator": "a\x1cb",
    "U+001D group separator": "a\x1db",
    "U+001E record separator": "a\x1eb",
    "export injection": "p' --export=ALL,BASH_ENV=/tmp/evil '",
    "backslash injection": "p\\' --export=ALL,BASH_ENV=/tmp/evil #",
}

# experiment field -> the option sbatch reports for it
FIELDS = {"slurm.partition": "partition", "slurm.account": "account", "slurm.qos": "qos",
          "slurm.job_name": "job-name", "slurm.constraint": "constraint", "paths.output": "output"}
# What each field carries; the rest of HOSTILE is refused. Slurm takes lists of partitions and features.
CARRIES = {"slurm.partition": {"comma"}, "slurm.constraint": {"comma"},
           "paths.output": {"single quote", "double quote", "space", "hash", "percent", "equals", "comma",
                            "leading dash", "export injection"}}
BASE_OPTIONS = ["array", "cpus-per-task", "job-name", "nodes", "ntasks-per-node", "output", "signal", "time"]


def _value(dotted: str, kind: str, tmp_path: Path) -> str:
    # A run folder is made absolute by the loader: put the value in its last part.
    return str(tmp_path / f"runs{HOSTILE[kind]}") if dotted == "paths.output" else HOSTILE[kind]


def _write(trainings: Path, dotted: str, value: str) -> None:
    section, key = dotted.split(".")
    (trainings / "hostile.yaml").write_text(yaml.safe_dump({"base": "tiny", section: {key: value}}), encoding="utf-8")


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("dotted", list(FIELDS))
def test_sbatch_reads_back_the_value_or_it_is_refused_at_load(dotted: str, kind: str, trainings: Path,
                                                              tmp_path: Path, sbatch_options) -> None:
    value = _value(dotted, kind, tmp_path)
    _write(trainings, dotted, value)
    out = tmp_path / "rendered"
    result = CliRunner().invoke(main, ["render", "hostile", "--out", str(out), "--trainings-dir", str(trainings)])
    if kind not in CARRIES.get(dotted, ()):
        assert result.exit_code == EXIT_ERROR, result.output
        [line] = result.output.strip().split("\n")
        assert line.startswith("error: ") and f"hostile.yaml: {dotted}: got {value!r}" in line
        assert "allowed" in line and "Traceback" not in result.output
        assert not out.exists() and not (tmp_path / f"runs{HOSTILE[kind]}").exists()
        return
    assert result.exit_code == 0, result.output
    script = out / "hostile.slurm"
    parsed = sbatch_options(script)
    option = FIELDS[dotted]
    if dotted == "paths.output":
        logs = load_experiment("hostile", trainings).paths.logs
        assert logs == f"{value}/logs"
        value = slurm.output_path(logs, "%x-%A_%a.out")  # a % of the folder doubled: Slurm writes it as one %
    assert [v for n, v in parsed if n == option] == [value]
    assert sorted(n for n, _ in parsed) == sorted({*BASE_OPTIONS, option}), parsed
    assert [w for w in slurm.script_options(script) if w.startswith(f"--{option}=")] == [f"--{option}={value}"]


@pytest.mark.parametrize("dotted", list(FIELDS))
def test_a_safe_value_reaches_its_option(dotted: str, trainings: Path, tmp_path: Path, sbatch_options) -> None:
    """The table's fields really reach their #SBATCH line (else the refusals above prove nothing)."""
    value = str(tmp_path / "runs-ok") if dotted == "paths.output" else "gpu_p13,v100" if dotted == "slurm.partition" \
        else "v100-32g&ib" if dotted == "slurm.constraint" else "six@gpu"
    _write(trainings, dotted, value)
    out = tmp_path / "rendered"
    result = CliRunner().invoke(main, ["render", "hostile", "--out", str(out), "--trainings-dir", str(trainings)])
    assert result.exit_code == 0, result.output
    parsed = dict(sbatch_options(out / "hostile.slurm"))
    expected = f"{value}/logs/%x-%A_%a.out" if dotted == "paths.output" else value
    assert parsed[FIELDS[dotted]] == expected


def test_a_bare_trailing_backslash_in_the_account_is_refused_by_plan(trainings: Path) -> None:
    """It used to pass `plan` and make sbatch fail with "Unmatched `'`" at launch."""
    _write(trainings, "slurm.account", "six\\")
    result = CliRunner().invoke(main, ["plan", "hostile", "--trainings-dir", str(trainings)])
    assert result.exit_code == EXIT_ERROR and "slurm.account: got 'six\\\\'" in result.output


CRON_FIELDS = ["partition", "account", "qos", "name_prefix", "time"]


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("field", CRON_FIELDS)
def test_cron_yaml_values_are_refused_at_load(field: str, kind: str, tmp_path: Path) -> None:
    cron_dir = tmp_path / "cron"
    cron_dir.mkdir()
    (cron_dir / "cron.yaml").write_text(yaml.safe_dump({field: HOSTILE[kind]}), encoding="utf-8")
    result = CliRunner().invoke(main, ["cron", "add", "tiny", "--cron-dir", str(cron_dir)])
    if (field, kind) == ("partition", "comma"):  # a list of partitions: carried as it is
        assert result.exit_code == 0 and "#SBATCH --partition=a,b\n" in next((cron_dir / "cron.hourly").iterdir()).read_text()
        return
    assert result.exit_code == EXIT_ERROR, result.output
    [line] = result.output.strip().split("\n")
    assert line.startswith("error: ") and f"cron.yaml: {field}: got {HOSTILE[kind]!r}" in line
    assert sorted(p.name for p in cron_dir.iterdir()) == ["cron.yaml"]


def test_cron_scripts_carry_a_cron_folder_with_quotes_and_spaces(tmp_path: Path, sbatch_options) -> None:
    """The cron folder comes from the command line: its runner and hourly jobs' --output reach sbatch intact."""
    cron_dir = tmp_path / "it's a \"cron\" # 100%"
    result = CliRunner().invoke(main, ["cron", "add", "tiny", "--cron-dir", str(cron_dir)])
    assert result.exit_code == 0, result.output
    [job] = (cron_dir / "cron.hourly").iterdir()
    parsed = dict(sbatch_options(job))
    assert parsed["output"] == slurm.output_path(cron_dir.resolve() / "logs", "%x-%j.out")
    assert parsed["job-name"] == "bsops.tiny.slurm-status"
    refused = CliRunner().invoke(main, ["cron", "add", "tiny", "--cron-dir", str(tmp_path / "back\\slash")])
    assert refused.exit_code == EXIT_ERROR and "backslash" in refused.output
    assert json.dumps(str(cron_dir))  # the folder name is valid text


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_the_python_reader_agrees_with_sbatch(kind: str, tmp_path: Path, sbatch_options) -> None:
    """slurm.sbatch_quote then sbatch's parser give back the value; slurm.script_job_name reads it the same."""
    value = HOSTILE[kind]
    script = tmp_path / "job.slurm"
    try:
        quoted = slurm.sbatch_quote(value)
    except ValueError:
        assert kind.startswith("U+"), kind  # line breaks are never written
        return
    script.write_text(f"#!/bin/bash\n#SBATCH --job-name={quoted}\n#SBATCH --partition=p\necho\n", encoding="utf-8")
    assert sbatch_options(script) == [("job-name", value), ("partition", "p")]
    assert slurm.script_job_name(script) == value
