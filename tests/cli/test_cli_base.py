"""What every command shares (cli/base.py): hostile option values refused in one line, Slurm errors in one
line with the raw command only under --verbose, a missing SLURM_CONF reported at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import EXIT_ERROR, main

# (argv, the option as the error names it, the value as it shows it)
HOSTILE_ARGUMENTS = [
    (["status", "tiny", "--timeout", "nan"], "'--timeout'", "'nan'"),
    (["status", "tiny", "--timeout", "inf"], "'--timeout'", "'inf'"),
    (["status", "tiny", "--timeout", "1e300"], "'--timeout'", "'1e300'"),
    (["status", "tiny", "--timeout", "-1"], "'--timeout'", "'-1'"),
    (["status", "tiny", "--timeout", "soon"], "'--timeout'", "'soon'"),
    (["status", "--job-name", "a\nb"], "'--job-name'", "'a\\nb'"),
    (["status", "--job-name", "a\u2028b"], "'--job-name'", "'a\\u2028b'"),
    (["status", "--job-name", "a\x1b[31mb"], "'--job-name'", "'a\\x1b[31mb'"),
    (["status", "tiny", "--contact", "me\rBcc: you"], "'--contact'", "'me\\rBcc: you'"),
    (["status", "tiny", "--log", "x\u0085y"], "'--log'", "'x\\x85y'"),
    (["logs", "tiny", "-f", "--interval", "nan"], "'--interval'", "'nan'"),
    (["logs", "tiny", "-f", "--interval", "1e300"], "'--interval'", "'1e300'"),
    (["hub-sync", "tiny", "--wait", "inf"], "'--wait'", "'inf'"),
    (["preprocess", "--input", "x.jsonl", "--output-prefix", "o", "--cross-check", "nan"], "'--cross-check'", "'nan'"),
    (["plan", "ti\nny"], "'EXP'", "'ti\\nny'"),
    (["new", "a\u2029b"], "'NAME'", "'a\\u2029b'"),
    (["render", "tiny", "--out", "r\nm"], "'--out'", "'r\\nm'"),
    (["cron", "add", "tiny", "--jobs", "status\n"], "'--jobs'", "'status\\n'"),
    (["launch", "tiny", "--local", "--tasks", "10000000"], "'--tasks'", "10000000"),
]


@pytest.mark.parametrize("argv, option, shown", HOSTILE_ARGUMENTS, ids=[" ".join(a[0:3]) + " " + a[-1][:8]
                                                                        for a, _, _ in HOSTILE_ARGUMENTS])
def test_hostile_arguments_are_refused_in_one_line(argv: list[str], option: str, shown: str) -> None:
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == EXIT_ERROR, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    [line] = result.stderr.splitlines()  # one line, naming the option, the value and what is allowed
    assert line.startswith("error: ") and option in line and shown in line and ("allowed" in line or "range" in line or "must be" in line)


def test_preprocess_names_the_files_gpt2bpe_needs(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["preprocess", "--input", str(tmp_path / "x.jsonl"), "--output-prefix", "o",
                                       "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json"])
    assert result.exit_code == EXIT_ERROR and "needs --vocab-file and --merge-file" in result.stderr
    assert "got --vocab-file" in result.stderr and len(result.stderr.splitlines()) == 1


def test_a_bad_combination_is_one_line_naming_the_help() -> None:
    result = CliRunner().invoke(main, ["launch", "tiny", "--local", "--after-current"], prog_name="bsops")
    assert result.exit_code == EXIT_ERROR
    assert result.stderr.splitlines()[-1] == ("error: --after-current applies to Slurm launches, not --local (see "
                                              "bsops launch --help)")
    assert "run folder" not in result.output  # refused before anything is read


def test_a_missing_slurm_conf_is_one_line_at_once_and_verbose_adds_the_command(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "gone" / "slurm.conf"))
    started = time.monotonic()
    result = CliRunner().invoke(main, ["status", "tiny", "--no-email"])
    # A hang detector, not a speed test: the answer takes a fraction of a second; squeue run on the missing file
    # would retry it for 60 s, past this deadline of 30.
    assert result.exit_code == EXIT_ERROR and time.monotonic() - started < 30
    expected = f"Slurm's configuration SLURM_CONF={tmp_path}/gone/slurm.conf does not exist (squeue not run)"
    assert "--format" not in result.output and "\\x1f" not in result.output and result.stderr == ""
    assert result.stdout.splitlines()[0] == (f"run folder: {tmp_path}/runs/tiny (tiny is bundled with bsops: its "
                                             "runs go under the current folder)")
    [alert] = result.stdout.splitlines()[1:]  # the watchdog's one line
    assert expected in alert
    verbose = CliRunner().invoke(main, ["--verbose", "status", "tiny", "--no-email"])
    assert verbose.exit_code == EXIT_ERROR and "  command:   squeue --noheader" in verbose.stderr
    for argv in (["cron", "status", "--cron-dir", str(tmp_path / "c")], ["cron", "install", "--cron-dir",
                                                                         str(tmp_path / "c"), "--verbose"]):
        cron = CliRunner().invoke(main, argv)
        assert cron.exit_code == EXIT_ERROR and cron.stderr.startswith(f"error: {expected}: point SLURM_CONF")
        assert ("  command:   squeue" in cron.stderr) == ("--verbose" in argv)


def test_a_field_alias_is_its_assignment_one_precedence_for_both() -> None:
    """`plan --nodes 4` is `plan slurm.nodes=4`: the same plan, the same recorded assignment; given both ways it is
    refused as a field given twice, and a value the field refuses is refused as the assignment is, naming the flag."""
    import json

    by_flag = CliRunner().invoke(main, ["plan", "tiny", "--json", "--nodes", "2"])
    by_field = CliRunner().invoke(main, ["plan", "tiny", "--json", "slurm.nodes=2"])
    assert by_flag.exit_code == by_field.exit_code and by_flag.stdout == by_field.stdout
    assert json.loads(by_flag.stdout)["overrides"] == ["slurm.nodes=2"]
    twice = CliRunner().invoke(main, ["plan", "tiny", "--nodes", "2", "slurm.nodes=3"])
    assert twice.exit_code == EXIT_ERROR and "given twice" in twice.stderr and "(given as '--nodes' '2')" in twice.stderr
    for value in ("0", "two", "nan", "2\n"):
        refused = CliRunner().invoke(main, ["plan", "tiny", "--nodes", value])
        [line] = refused.stderr.splitlines()
        assert refused.exit_code == EXIT_ERROR and refused.stdout == "" and "--nodes" in line, line
    # a string field takes the value whole: a `#` or `: ` is part of the folder, not YAML's
    shown = CliRunner().invoke(main, ["show", "tiny", "--json", "backup.dest=/x #2"])
    assert shown.exit_code == EXIT_ERROR  # the assignment itself: a comment would cut the folder
    store = CliRunner().invoke(main, ["backup", "tiny", "--dry-run", "--to", "/nowhere/x #2: y", "backup.dest=/z"])
    assert store.exit_code == EXIT_ERROR and "backup.dest=\"/nowhere/x #2: y\"" in store.stderr
