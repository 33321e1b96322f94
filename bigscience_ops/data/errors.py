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


class DocumentTooLargeError(DataError):
    """A line of an input (one JSON document) is longer than the run allows; the run stops at it.

    Raised as soon as the line passes the limit, not after reading all of it: a line is held whole in
    memory by whoever tokenizes it, so the limit is what bounds a worker's memory, whatever the
    compression ratio of the file.
    """

    def __init__(self, path: str, line: int, limit: int) -> None:
        self.path, self.line, self.limit = path, line, limit
        super().__init__(f"{path}:{line}: a line longer than {limit} bytes (--max-document-bytes {limit}); nothing "
                         "was written. The file may be damaged or not jsonl; raise --max-document-bytes if the "
                         "document is real")

    def __reduce__(self):
        return type(self), (self.path, self.line, self.limit)


class InputConflictError(DataError):
    """Two inputs are the same file, or would write the same output; refused before anything is written."""

    def __init__(self, first: str, second: str, reason: str) -> None:
        self.first, self.second, self.reason = first, second, reason
        super().__init__(f"inputs {first} and {second} {reason}")

    def __reduce__(self):
        return type(self), (self.first, self.second, self.reason)


class IncompatibleDatasetsError(DataError):
    """Datasets to merge were made differently (tokenizer, special text or token dtype); nothing is merged."""

    def __init__(self, field: str, values: dict[str, object]) -> None:  # field: tokenizers, special texts, token dtypes
        self.field, self.values = field, values
        listing = "; ".join(f"{prefix}: {value}" for prefix, value in values.items())
        super().__init__(f"cannot merge datasets with different {field} ({listing}); nothing was merged. "
                         "Preprocess them again with one tokenizer")

    def __reduce__(self):
        return type(self), (self.field, self.values)


class DamagedInputError(DataError):
    """A compressed input is cut short, empty, damaged or not what its name says; nothing is written."""

    def __init__(self, path: str, kind: str, detail: str) -> None:
        self.path, self.kind, self.detail = path, kind, detail
        super().__init__(f"input {path}: not a complete {kind} file ({detail}); nothing was written. Check the "
                         "file (a download cut short?) or its name's extension")

    def __reduce__(self):
        return type(self), (self.path, self.kind, self.detail)


class NotCorpusError(DataError):
    """An input that is not a corpus file: one of bsops' own outputs, or not a regular file at all.

    `what` says which: run-record, problems-list, dataset, temporary (bsops' own files), or folder,
    fifo, character-device, block-device, socket, broken-link.
    """

    def __init__(self, path: str, what: str, detail: str) -> None:
        self.path, self.what, self.detail = path, what, detail
        super().__init__(f"input {path}: {detail}")

    def __reduce__(self):
        return type(self), (self.path, self.what, self.detail)
