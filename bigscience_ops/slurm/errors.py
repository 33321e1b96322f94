"""Slurm's errors: a command that failed, timed out or could not start, and output that does not parse.

A SlurmCommandError reads as one human line (what failed and the next step: "cannot reach the Slurm
controller (SLURM_CONF=...): is slurmctld running?"); the raw argv, exit code and stderr stay on the
error (`argv`, `returncode`, `stderr`, and `detail()` for `bsops --verbose`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence

from bigscience_ops.errors import BsopsError

# What Slurm's clients print when they find no configuration, or cannot reach the controller.
_UNCONFIGURED = ("could not establish a configuration source", "unable to process configuration file",
                 "cannot stat file", "clustername needs to be specified")
_UNREACHABLE = ("unable to contact slurm controller", "connection refused", "connect failure",
                "socket timed out", "zero bytes were transmitted")


class SlurmError(BsopsError):
    """A Slurm command failed or answered something unparseable."""


class SlurmOutputError(SlurmError):
    """A Slurm command exited 0 but its output is not what that command prints (a site wrapper, a cut answer):
    the state is unknown, never "no job". Carries the tool, what did not parse and an excerpt of the output."""

    def __init__(self, tool: str, problem: str, output: str) -> None:
        self.tool, self.problem, self.output = tool, problem, output
        excerpt = output if len(output) <= 200 else f"{output[:200]}... ({len(output)} characters)"
        super().__init__(f"cannot query Slurm: {tool}'s output does not parse ({problem}): {excerpt!r}; is "
                         f"`{tool}` on PATH Slurm's own client (`command -v {tool}`), or a site wrapper that "
                         "changes what it prints?")


def conf_note(env: Mapping[str, str] | None = None) -> str:
    """Which configuration Slurm's clients read: `SLURM_CONF=PATH`, or that it is unset."""
    conf = (os.environ if env is None else env).get("SLURM_CONF")
    return f"SLURM_CONF={conf}" if conf else "SLURM_CONF is unset"


def missing_conf(env: Mapping[str, str] | None = None) -> str | None:
    """SLURM_CONF when it is set to a file that does not exist (a Slurm client would retry it for a minute)."""
    conf = (os.environ if env is None else env).get("SLURM_CONF")
    return conf if conf and not os.path.isfile(conf) else None


def said(exc: BaseException) -> str:
    """An error in one line for a log or an email: a Slurm command's message with what the command said."""
    text = exc.with_reason() if isinstance(exc, SlurmCommandError) else str(exc)
    return " ".join(text.split())


def check_conf(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Raise SlurmCommandError at once when SLURM_CONF names a missing file, instead of running `argv`."""
    conf = missing_conf(env)
    if conf is not None:
        raise SlurmCommandError(argv, None, "", f"not run: SLURM_CONF={conf} does not exist")


class SlurmCommandError(SlurmError):
    """A Slurm command exited non-zero, timed out, or could not be started: carries argv, code, stderr.

    Its message is one line: what failed and the next step; `detail()` holds the raw command and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, problem: str) -> None:
        self.argv, self.returncode, self.stderr, self.problem = list(argv), returncode, stderr, problem
        super().__init__(self._human())

    @property
    def tool(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else "slurm"

    def _human(self) -> str:
        said = self.stderr.lower()
        where = conf_note()
        if self.problem.startswith("not run: SLURM_CONF="):
            return (f"Slurm's configuration {self.problem.removeprefix('not run: ')} ({self.tool} not run): "
                    "point SLURM_CONF at your cluster's slurm.conf, or unset it")
        if self.returncode is None and "did not answer" in self.problem:
            return f"{self.tool} {self.problem.split(' (')[0]} ({where}): is slurmctld running and reachable?"
        if any(marker in said for marker in _UNCONFIGURED):
            return (f"Slurm is not configured on this machine ({where}): no cluster configuration found; set "
                    "SLURM_CONF to your cluster's slurm.conf, or run on a login node")
        if any(marker in said for marker in _UNREACHABLE):
            return f"cannot reach the Slurm controller ({where}): is slurmctld running?"
        if self.returncode is None:
            return f"{self.tool} {self.problem}" + (f": {self.reason()}" if self.problem == "could not run" else "")
        return f"{self.tool} failed ({self.problem}): {self.reason()}"

    def reason(self) -> str:
        """What the command said, in one line: its last `error:` or `fatal:` line without the tool's prefix."""
        lines = [line.strip() for line in self.stderr.split("\n") if line.strip()]
        for marker in ("fatal:", "error:"):
            said = [line for line in lines if marker in line]
            if said:
                return said[-1].split(marker, 1)[1].strip() or said[-1]
        return lines[-1] if lines else "(no output on stderr)"

    def with_reason(self) -> str:
        """The message and what the command said, for logs and alert emails the on-call person reads later."""
        said = self.reason() if self.stderr.strip() else ""
        return f"{self}" + (f" ({self.tool} said: {said})" if said and said not in str(self) else "")

    def command(self) -> str:
        """The argv as a shell line; unprintable characters (the squeue delimiter) shown escaped."""
        return " ".join(shlex.quote(a) if a.isprintable() else repr(a) for a in self.argv)

    def detail(self) -> str:
        """The raw command, its exit code and its stderr (what `--verbose` prints under the message)."""
        code = "none (it did not finish)" if self.returncode is None else str(self.returncode)
        stderr = self.stderr.strip() or "(nothing)"
        return "\n".join([f"  command:   {self.command()}", f"  problem:   {self.problem}", f"  exit code: {code}",
                          "  stderr:    " + stderr.replace("\n", "\n             ")])
