"""Slurm's errors: a command that failed, timed out or could not start, and output that does not parse."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from bigscience_ops.errors import BsopsError


class SlurmError(BsopsError):
    """A Slurm command failed or answered something unparseable."""


class SlurmCommandError(SlurmError):
    """A Slurm command exited non-zero, timed out, or could not be started: carries argv, code, stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, problem: str) -> None:
        self.argv, self.returncode, self.stderr = list(argv), returncode, stderr
        # Unprintable characters (the squeue delimiter) are shown escaped, the rest shell-quoted.
        command = " ".join(shlex.quote(a) if a.isprintable() else repr(a) for a in self.argv)
        detail = stderr.strip() or "(no output on stderr)"
        super().__init__(f"`{command}` {problem}: {detail}")
