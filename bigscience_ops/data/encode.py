"""Lines of jsonl -> tokens per json key, with each unusable line named: the work every worker does.

A line that cannot be used (invalid UTF-8, malformed JSON, not an object, a missing key, a
non-string value) is dropped for every key; a key whose text gives no tokens has no document for
that key only, and the line's other keys still give theirs (as Megatron's tools/preprocess_data.py
does). A chunk's documents are tokenized in one batch call; with a `CrossCheck`, a sample of them is
re-encoded with the reference tokenizer and the first difference is returned as `mismatch`.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from bigscience_ops.data.tokenizer import CrossCheck, Tokenizer

PROBLEM_KINDS = ("invalid-utf8", "malformed-json", "not-an-object", "missing-key", "not-a-string", "empty")
LINE_PROBLEMS = PROBLEM_KINDS[:-1]  # these drop the whole line; "empty" drops one key's document


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    line: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.detail}"


@dataclasses.dataclass
class Encoded:
    """One chunk's result; `tokens[key]` is an array, or the path of a file holding it (spilled)."""

    tokens: dict[str, np.ndarray | str]
    sizes: dict[str, np.ndarray]
    problems: list[Problem]  # line numbers counted from the chunk's first line (0-based)
    lines: int
    checked: int = 0  # documents re-encoded by the cross-check
    mismatch: Problem | None = None  # the cross-check's finding: the run stops


def line_problem(line: bytes, keys: tuple[str, ...]) -> tuple[tuple[str, str] | None, dict | None]:
    """(kind, detail) of why a line gives no document at all, else the decoded object."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ("invalid-utf8", f"byte {exc.start} of the line is not valid UTF-8 ({exc.reason})"), None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return ("malformed-json", "blank line" if not text.strip() else str(exc)), None
    if not isinstance(obj, dict):
        return ("not-an-object", f"a JSON {type(obj).__name__}, expected an object"), None
    for key in keys:
        if key not in obj:
            present = ", ".join(sorted(obj)[:10]) or "none"
            return ("missing-key", f"no key {key!r}; keys present: {present}"), None
        value = obj[key]
        if not isinstance(value, str):
            return ("not-a-string", f"{key!r} is a JSON {type(value).__name__}, expected a string"), None
        if "\\ud" in text or "\\uD" in text:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return ("invalid-utf8", f"{key!r} has a lone surrogate escape at character {exc.start}"), None
    return None, obj


def split_lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the chunk ends with a newline
    return lines


@dataclasses.dataclass
class Encoder:
    """A process's tokenizer and settings; `encode` turns a chunk's lines into tokens."""

    tok: Tokenizer
    keys: tuple[str, ...]
    eod: int | None  # appended to every document, or None
    dtype: np.dtype
    check: CrossCheck | None

    def encode(self, lines: list[bytes], path: str) -> Encoded:
        problems: list[Problem] = []
        texts: dict[str, list[str]] = {k: [] for k in self.keys}
        line_of: list[int] = []  # the chunk line of each usable line
        for i, line in enumerate(lines):
            problem, obj = line_problem(line, self.keys)
            if problem is not None:
                problems.append(Problem(path, i, *problem))
                continue
            line_of.append(i)
            for key in self.keys:
                texts[key].append(obj[key])
        tokens: dict[str, np.ndarray | str] = {}
        sizes: dict[str, np.ndarray] = {}
        checked = 0
        for key in self.keys:
            ids, lengths = self.tok.encode_batch(texts[key])
            if self.check is not None:
                before = self.check.documents
                bad = self.check.first_mismatch(texts[key], ids, lengths)
                checked += self.check.documents - before
                if bad is not None:
                    mismatch = Problem(path, line_of[bad[0]], "tokenizer-mismatch", f"{key!r}: {bad[1]}")
                    return Encoded({}, {}, [mismatch], len(lines), checked, mismatch)
            # As Megatron's: a key whose text gives no tokens has no document; the others still do.
            kept = lengths > 0
            problems += [Problem(path, line_of[j], "empty", f"{key!r} is an empty document")
                         for j in np.flatnonzero(~kept).tolist()]
            lengths = lengths[kept]
            if self.eod is not None:
                ids = np.insert(ids, np.cumsum(lengths), self.eod)
                lengths = lengths + 1
            tokens[key] = ids.astype(self.dtype)
            sizes[key] = lengths.astype(np.int32)
        problems.sort(key=lambda p: p.line)  # stable: a line's keys stay in order
        return Encoded(tokens, sizes, problems, len(lines), checked)
