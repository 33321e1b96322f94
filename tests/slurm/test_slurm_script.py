"""slurm/script.py: sbatch's own #SBATCH reader in Python. `sbatch_quote` writes a value that sbatch's parser
reads back exactly, `sbatch_words` and `script_options` read a job script's options as sbatch does,
`script_job_name` finds its name, `output_path` builds --output. tests/cluster/test_cluster_sbatch_parser.py holds the
same rules against `sbatch -vv` itself; the reading cases below were each checked against it (Slurm 22.05)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigscience_ops import slurm
from bigscience_ops.slurm.script import SCRIPT_BYTES

PLAIN = ["gpu_p13", "six@gpu", "v100-32g&ib", "gpu_p13,v100", "%x-%A_%a.out", "/scratch/run/logs/%x-%j.out",
         "1-5%1", "r7i4n[1-7]", "a=b", "a|b", "x:y", "a+b", "(x)", "*", "20:00:00", "tr8-104B", "-x"]
"""Values sbatch's parser reads as they are: written bare."""
QUOTED = ["a b", "a'b", 'a"b', "a\\b", "six\\", "a#b", "#", "a\\'b", "'", "\\", "$(rm -rf ~)", "`id`", "a;b",
          "~/x", "caf\u00e9 \u6587\u5b57", "a\u00a0b", " leading", "trailing ", "p' --export=ALL,BASH_ENV=/tmp/evil '",
          "p\\' --export=ALL,BASH_ENV=/tmp/evil #", "--x=1 --y=2"]
"""Values that hold what the parser treats specially (space, quotes, backslash, `#`) or that are not ASCII."""
UNWRITABLE = ["", "a\nb", "a\rb", "\t", "a\tb", "a\x00b", "a\x1bb", "a\x1fb", "a\x7fb", "a\x85b", "a\u2028b",
              "a\u2029b", "\n--export=ALL"]
"""Empty, or holding a line break or another control character: no #SBATCH line can carry them."""


def script(folder: Path, *lines: str, name: str = "job.slurm") -> Path:
    path = folder / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- sbatch_quote ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", PLAIN)
def test_plain_values_are_written_bare(value: str) -> None:
    assert slurm.sbatch_quote(value) == value
    assert slurm.sbatch_words(f" --opt={value}") == [f"--opt={value}"]


@pytest.mark.parametrize("value", QUOTED)
def test_other_values_are_quoted_and_read_back_exactly(value: str) -> None:
    quoted = slurm.sbatch_quote(value)
    assert quoted.startswith("'") and quoted.endswith("'") and quoted != value
    assert slurm.sbatch_words(f" --opt={quoted}") == [f"--opt={value}"]
    # one word however it is surrounded, and the next option and a comment do not change it
    assert slurm.sbatch_words(f"  --opt={quoted}   --next=1 # a comment --evil") == [f"--opt={value}", "--next=1"]


def test_values_that_are_not_text_are_written_as_text(tmp_path: Path) -> None:
    assert slurm.sbatch_quote(5) == "5"
    assert slurm.sbatch_quote(tmp_path / "logs") == str(tmp_path / "logs")
    assert slurm.sbatch_quote(Path("/a b")) == "'/a b'"


@pytest.mark.parametrize("value", UNWRITABLE)
def test_values_a_line_cannot_hold_are_refused(value: str) -> None:
    with pytest.raises(ValueError):
        slurm.sbatch_quote(value)


# --- sbatch_words ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "words"), [
    ("", []),
    ("   ", []),
    ("\t--job-name=tabbed", ["--job-name=tabbed"]),
    (" --nodes=2   --job-name=two", ["--nodes=2", "--job-name=two"]),
    (" --job-name='a b' --partition=\"c d\"", ["--job-name=a b", "--partition=c d"]),
    (" --job-name=a'b c'd", ["--job-name=ab cd"]),            # quotes group in the middle of a word
    (" --job-name=\"it's\"", ["--job-name=it's"]),             # one kind of quote inside the other
    (" --job-name='a\\'b'", ["--job-name=a'b"]),               # a backslash escapes even inside quotes
    (" --job-name=a\\#b", ["--job-name=a#b"]),                 # an escaped # is text
    (" --job-name='a#b'", ["--job-name=a#b"]),                 # so is a quoted one
    (" --job-name=a#b --partition=q", ["--job-name=a"]),       # an unquoted # ends the line
    (" --nodes=2 # --partition=z", ["--nodes=2"]),
    (" # --partition=z", []),
    (" -J short", ["-J", "short"]),
])
def test_words_as_sbatch_reads_them(text: str, words: list[str]) -> None:
    assert slurm.sbatch_words(text) == words


@pytest.mark.parametrize("text", [" --job-name='a", ' --job-name="a', " --job-name='a\\'", " --x=1 --y=\"b c"])
def test_an_open_quote_is_refused_as_sbatch_refuses_the_script(text: str) -> None:
    with pytest.raises(ValueError):
        slurm.sbatch_words(text)


# --- script_options, script_job_name ----------------------------------------------------------------------

def test_options_are_read_up_to_the_first_command(tmp_path: Path) -> None:
    path = script(tmp_path,
                  "#!/bin/bash",
                  "# a comment, then an empty line and one of spaces",
                  "",
                  "   ",
                  "#SBATCH --job-name=tr8-104B",
                  "#SBATCH --nodes=2   --ntasks-per-node=1   # two options, then a comment",
                  "  #SBATCH --indented   (a comment to sbatch: not at the start of the line)",
                  f"#SBATCH --output={slurm.sbatch_quote('/scratch/it is/%x.out')}",
                  "#SBATCH\t--time=20:00:00",
                  "#SBATCH--partition=glued",
                  "set -e",
                  "#SBATCH --job-name=after-a-command")
    assert slurm.script_options(path) == ["--job-name=tr8-104B", "--nodes=2", "--ntasks-per-node=1",
                                          "--output=/scratch/it is/%x.out", "--time=20:00:00", "--partition=glued"]
    assert slurm.script_job_name(path) == "tr8-104B"


def test_what_sbatch_quote_writes_script_options_reads_back(tmp_path: Path) -> None:
    values = {"job-name": "p' --export=ALL,BASH_ENV=/tmp/evil '", "partition": "gpu_p13,v100", "account": "six\\",
              "output": "/scratch/100% sure #1/logs/%x-%A_%a.out", "comment": "caf\u00e9 \"quoted\" 'too'"}
    lines = [f"{slurm.SBATCH_PREFIX} --{option}={slurm.sbatch_quote(value)}" for option, value in values.items()]
    path = script(tmp_path, "#!/bin/bash", *lines, "srun true")
    assert slurm.script_options(path) == [f"--{option}={value}" for option, value in values.items()]
    assert slurm.script_job_name(path) == values["job-name"]


def test_a_script_sbatch_refuses_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        slurm.script_options(script(tmp_path, "#!/bin/bash", "#SBATCH --job-name='open", "true"))
    with pytest.raises(ValueError):
        slurm.script_job_name(script(tmp_path, "#!/bin/bash", "#SBATCH --job-name=\"open", "true", name="b.slurm"))
    with pytest.raises(OSError):
        slurm.script_options(tmp_path / "missing.slurm")


def test_bytes_that_are_not_utf8_are_read_as_replacement_characters(tmp_path: Path) -> None:
    path = tmp_path / "latin1.slurm"
    path.write_bytes(b"#!/bin/bash\n#SBATCH --job-name=caf\xe9\ntrue\n")
    assert slurm.script_options(path) == ["--job-name=caf\ufffd"]


@pytest.mark.parametrize(("lines", "name"), [
    (["#SBATCH --job-name=long-form"], "long-form"),
    (["#SBATCH --job-name spaced"], "spaced"),
    (["#SBATCH -J short"], "short"),
    (["#SBATCH -Jglued"], "glued"),
    (["#SBATCH --job-name='with space'"], "with space"),
    (["#SBATCH --job-name=first", "#SBATCH -J second"], "second"),  # the last one wins, as in sbatch
    (["#SBATCH -J spaced --job-name word"], "word"),
    (["#SBATCH --job-name=early", "true", "#SBATCH --job-name=late"], "early"),
    (["#SBATCH --job-name=early", "  #SBATCH --job-name=indented"], "early"),
])
def test_the_job_name_as_sbatch_reads_it(tmp_path: Path, lines: list[str], name: str) -> None:
    assert slurm.script_job_name(script(tmp_path, "#!/bin/bash", *lines, "true", name="job.slurm")) == name


# --- output_path -------------------------------------------------------------------------------------------

def test_output_path_doubles_the_folders_percent_signs_only(tmp_path: Path) -> None:
    assert slurm.output_path("/scratch/logs", "%x-%A_%a.out") == "/scratch/logs/%x-%A_%a.out"
    assert slurm.output_path("/scratch/100%/logs", "%x-%j.out") == "/scratch/100%%/logs/%x-%j.out"
    assert slurm.output_path(tmp_path / "a b", "%x.out") == f"{tmp_path}/a b/%x.out"
    written = slurm.sbatch_quote(slurm.output_path("/scratch/it's 100%", "%x.out"))
    assert slurm.sbatch_words(f" --output={written}") == ["--output=/scratch/it's 100%%/%x.out"]


@pytest.mark.parametrize("folder", ["/scratch\\logs", "\\", "/scratch/logs\\"])
def test_output_path_refuses_a_backslash(folder: str) -> None:
    with pytest.raises(ValueError):
        slurm.output_path(folder, "%x.out")


def test_a_script_that_is_no_file_or_too_large_is_refused_not_read(tmp_path: Path) -> None:
    """A cron folder is shared scratch: a FIFO named *.slurm must not hang `cron run`, nor a huge file fill its
    memory; both are a ValueError `cron run` reports and skips, as sbatch would refuse them."""
    import os

    fifo = tmp_path / "fifo.slurm"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        slurm.script_job_name(fifo)
    (tmp_path / "folder.slurm").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        slurm.script_job_name(tmp_path / "folder.slurm")
    big = tmp_path / "big.slurm"
    with open(big, "wb") as f:
        f.write(b"#!/bin/bash\n#SBATCH --job-name=big\n")
        f.truncate(SCRIPT_BYTES + 1)
    with pytest.raises(ValueError, match="max_script_size"):
        slurm.script_job_name(big)
    with open(big, "r+b") as f:
        f.truncate(SCRIPT_BYTES)
    assert slurm.script_job_name(big) == "big"
