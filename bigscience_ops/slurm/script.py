"""sbatch's #SBATCH reader: how bsops writes a value so that sbatch reads back exactly it, and how it
reads a job script's options back the way sbatch does."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

#
# sbatch reads the `#SBATCH` lines of a script with its own parser (src/sbatch/opt.c), not bash's:
# words split on whitespace, '...' and "..." group, a backslash escapes the next character even
# inside quotes, an unquoted `#` ends the line, and a quote left open is a fatal error. bsops
# writes every #SBATCH value with `sbatch_quote` and reads job names back with the same rules;
# tests/cluster/test_cluster_sbatch_parser.py holds both against `sbatch -vv`.

_SBATCH_PLAIN = re.compile(r"[A-Za-z0-9._@+,:/%=&|*\[\]()-]+")
SBATCH_PREFIX = "#SBATCH"


def sbatch_quote(value: object) -> str:
    """`value` written for an `#SBATCH --opt=VALUE` line so that sbatch's parser reads back exactly it:
    bare when it holds nothing the parser treats specially, else in single quotes with `\\` and `'`
    escaped by a backslash. Raises ValueError for a value the line cannot hold (empty, or a line break
    or other control character)."""
    text = str(value)
    bad = re.search(r"[\x00-\x1f\x7f\x85\u2028\u2029]", text)
    if not text or bad:
        what = "it is empty" if not text else f"U+{ord(bad.group()):04X} at position {bad.start()}"
        raise ValueError(f"{text!r} cannot be an #SBATCH value: {what}; allowed: one line of printable text")
    if _SBATCH_PLAIN.fullmatch(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sbatch_words(text: str) -> list[str]:
    """The words sbatch's parser makes of what follows `#SBATCH` on one line; ValueError on an open quote."""
    words: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos >= end:
            return words
        word: list[str] = []
        quote, escaped = "", False
        while pos < end and (quote or not text[pos].isspace()):
            char = text[pos]
            pos += 1
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                continue
            elif quote:
                if char == quote:
                    quote = ""
                    continue
            elif char in "'\"":
                quote = char
                continue
            elif char == "#":  # the rest of the line is a comment
                return words + ["".join(word)] if word else words
            word.append(char)
        if quote:
            raise ValueError(f"unmatched {quote} in {text.strip()!r} (sbatch refuses the script)")
        words.append("".join(word))


SCRIPT_BYTES = 4 << 20
"""The most of a job script read: Slurm's default max_script_size (slurm.conf SchedulerParameters), beyond which
slurmctld refuses the job anyway."""


def _script_text(script: Path) -> str:
    """The script's text, if it is a regular file (a link to one is followed) of at most SCRIPT_BYTES: a FIFO
    in a cron folder must not hang the runner, nor a huge file fill its memory. ValueError names what it is."""
    fd = os.open(script, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{script} is not a regular file (mode {stat.filemode(st.st_mode)}); allowed: a job "
                             "script file")
        data = os.pread(fd, SCRIPT_BYTES + 1, 0)
    finally:
        os.close(fd)
    if len(data) > SCRIPT_BYTES:
        raise ValueError(f"{script} is larger than {SCRIPT_BYTES >> 20} MiB, Slurm's default max_script_size; "
                         "allowed: a job script sbatch accepts")
    return data.decode("utf-8", errors="replace")


def script_options(script: Path) -> list[str]:
    """The words of a job script's #SBATCH lines, read up to its first command as sbatch does.
    Raises ValueError where sbatch would refuse a line (an open quote) or the file (not a regular file, larger
    than SCRIPT_BYTES), OSError where the file cannot be read."""
    words = []
    for line in _script_text(script).split("\n"):
        if line.startswith(SBATCH_PREFIX):
            words += sbatch_words(line[len(SBATCH_PREFIX):])
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return words


def script_job_name(script: Path) -> str:
    """The --job-name (or -J) of a job script's #SBATCH lines as sbatch reads it (the last one wins);
    the file's stem without one. Raises ValueError where sbatch would refuse the script's options."""
    words, name = script_options(script), None
    for i, word in enumerate(words):
        if word.startswith("--job-name="):
            name = word.removeprefix("--job-name=")
        elif word in ("--job-name", "-J") and i + 1 < len(words):
            name = words[i + 1]
        elif word.startswith("-J") and word != "-J":
            name = word[2:]
    return name if name else script.stem


def output_path(folder: str | os.PathLike[str], pattern: str) -> str:
    """`folder/pattern` for --output: a `%` of the folder doubled, so Slurm's %-patterns expand only in
    `pattern`. Raises ValueError for a backslash, which turns the patterns off and is dropped by Slurm."""
    text = os.fspath(folder)
    if "\\" in text:
        raise ValueError(f"--output folder {text!r} holds a backslash: Slurm drops it and stops expanding "
                         f"{pattern!r}; allowed: a folder path without backslash")
    return text.replace("%", "%%") + "/" + pattern
