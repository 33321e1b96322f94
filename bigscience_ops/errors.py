"""The error types library functions raise; only cli.py turns them into messages and exit codes."""

from __future__ import annotations


class BsopsError(Exception):
    """Base of every error a user can cause or fix; cli.py prints it without a traceback."""


class ConfigError(BsopsError):
    """An experiment file is invalid: names the file, the field path, the value and what is allowed."""

    def __init__(self, source: str, field: str, value: object, allowed: str) -> None:
        self.source, self.field, self.value, self.allowed = source, field, value, allowed
        where = f"{source}: {field}" if field else source
        shown = repr(value)
        if len(shown) > 200:  # a 100 kB value (or one built from aliases) is named, not printed
            shown = f"{shown[:120]}... ({len(shown)} characters)"
        super().__init__(f"{where}: got {shown}; {allowed}")


class PlanError(BsopsError):
    """A resolved experiment breaks a rule that would fail or mislead a training run."""

    def __init__(self, problems: list) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) must be fixed before launching:\n{lines}")


class LaunchError(BsopsError):
    """A launch cannot go ahead or did not finish: it would overlap a training, cannot be recorded, or (a local one)
    could not start or a task failed, naming the task, its exit code and its log."""
