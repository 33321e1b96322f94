"""Errors raised by the data package; each is a BsopsError so the CLI prints it without a traceback."""

from __future__ import annotations

from bigscience_ops.errors import BsopsError


class DataError(BsopsError):
    """A data file, option or dataset parameter is invalid."""


class DataFormatError(DataError):
    """An indexed dataset's .bin/.idx pair is missing, truncated or not in the expected format."""


class TokenizerError(DataError):
    """Tokenizer files are missing, unreadable or of an unsupported kind."""


class BadInputError(DataError):
    """A jsonl line is unusable and --strict asked to stop at the first one."""

    def __init__(self, path: str, line: int, kind: str, detail: str) -> None:
        self.path, self.line, self.kind, self.detail = path, line, kind, detail
        super().__init__(f"{path}:{line}: {kind}: {detail}")

    def __reduce__(self):  # raised in a worker process, re-raised in the main one
        return type(self), (self.path, self.line, self.kind, self.detail)
