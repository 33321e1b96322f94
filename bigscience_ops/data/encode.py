"""Lines of jsonl -> tokens per json key, with each unusable line named: the work every worker does.

A line that cannot be used (invalid UTF-8, malformed JSON, not an object, a missing key, a
non-string value) is dropped for every key; a key whose text gives no tokens has no document for
that key only, and the line's other keys still give theirs (as Megatron's tools/preprocess_data.py
does). A chunk's documents are tokenized in one batch call; with a `CrossCheck`, a sample of them is
re-encoded with the reference tokenizer and the first difference is returned as `mismatch`.

Hostile lines cost bounded memory: a line longer than the run's maximum is `too_large` (the run stops
there), and a chunk lists at most LISTED_PER_CHUNK problems, the first by line, and counts the rest
by kind (a chunk of 2 MiB of blank lines is two million problems, each ~200 bytes as objects).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
from collections.abc import Iterator

import numpy as np

from bigscience_ops.data.tokenizer import CrossCheck, Tokenizer

PROBLEM_KINDS = ("invalid-utf8", "malformed-json", "not-an-object", "missing-key", "not-a-string", "empty")
LINE_PROBLEMS = PROBLEM_KINDS[:-1]  # these drop the whole line; "empty" drops one key's document
LISTED_PER_CHUNK = 20_000  # problems a chunk lists; more are counted (a chunk that bad is not a corpus)
SHOWN_KEY_CHARS = 200  # of each key named in a missing-key problem (a key may be megabytes long)


@dataclasses.dataclass(frozen=True)
class LineProblem:
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
    problems: list[LineProblem]  # the first LISTED_PER_CHUNK, by line; lines counted from the chunk's first (0-based)
    lines: int
    checked: int = 0  # documents re-encoded by the cross-check
    mismatch: LineProblem | None = None  # the cross-check's finding: the run stops
    counts: dict[str, int] = dataclasses.field(default_factory=dict)  # problems per kind, listed or not
    too_large: tuple[int, int] | None = None  # (chunk line, the maximum): a line over it; the run stops
    max_id: dict[str, int] = dataclasses.field(default_factory=dict)  # per key, the largest token id (none: no token)

    @property
    def stops(self) -> bool:
        return self.mismatch is not None or self.too_large is not None

    def extend(self, other: Encoded) -> None:
        """Append the result of the chunk's next piece (its lines follow this one's); tokens and sizes are
        the caller's to gather."""
        offset = self.lines
        if sum(self.counts.values()) == len(self.problems):  # listed so far: a prefix, and more may follow
            room = LISTED_PER_CHUNK - len(self.problems)
            self.problems += [dataclasses.replace(p, line=p.line + offset) for p in other.problems[:room]]
        for kind, n in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        self.lines += other.lines
        self.checked += other.checked
        for key, high in other.max_id.items():
            self.max_id[key] = max(high, self.max_id.get(key, high))
        if other.mismatch is not None:
            self.mismatch = dataclasses.replace(other.mismatch, line=other.mismatch.line + offset)
        if other.too_large is not None:
            self.too_large = (other.too_large[0] + offset, other.too_large[1])


def _shown_key(key: str) -> str:
    return key if len(key) <= SHOWN_KEY_CHARS else f"{key[:SHOWN_KEY_CHARS]}... ({len(key)} characters)"


def line_problem(line: bytes, keys: tuple[str, ...]) -> tuple[tuple[str, str] | None, dict | None]:
    """(kind, detail) of why a line gives no document at all, else the decoded object."""
    if not line or line.isspace():  # what json.loads would refuse, told at once (a file may hold millions)
        return ("malformed-json", "blank line"), None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ("invalid-utf8", f"byte {exc.start} of the line is not valid UTF-8 ({exc.reason})"), None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return ("malformed-json", "blank line" if not text.strip() else str(exc)), None
    except RecursionError:  # arrays or objects nested thousands deep
        return ("malformed-json", "nested deeper than the JSON parser goes"), None
    if not isinstance(obj, dict):
        return ("not-an-object", f"a JSON {type(obj).__name__}, expected an object"), None
    for key in keys:
        if key not in obj:
            present = ", ".join(_shown_key(k) for k in sorted(obj)[:10]) or "none"
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


def _empty_problems(path: str, key: str, lines: list[int], limit: int) -> Iterator[LineProblem]:
    for line in lines:
        if line >= limit:
            return
        yield LineProblem(path, line, "empty", f"{key!r} is an empty document")


@dataclasses.dataclass
class Encoder:
    """A process's tokenizer and settings; `encode` turns a chunk's lines into tokens."""

    tok: Tokenizer
    keys: tuple[str, ...]
    eod: int | None  # appended to every document, or None
    dtype: np.dtype
    check: CrossCheck | None
    max_bytes: int | None = None  # the longest line taken (newline not counted); None: no limit

    def encode(self, lines: list[bytes], path: str) -> Encoded:
        listed: list[LineProblem] = []  # line problems, the first LISTED_PER_CHUNK
        counts: dict[str, int] = {}
        unlisted_from: int | None = None  # the first line whose line problem was only counted
        texts: dict[str, list[str]] = {k: [] for k in self.keys}
        line_of: list[int] = []  # the chunk line of each usable line
        for i, line in enumerate(lines):
            if self.max_bytes is not None and len(line) > self.max_bytes:
                return Encoded({}, {}, [], len(lines), 0, None, {}, (i, self.max_bytes))
            problem, obj = line_problem(line, self.keys)
            if problem is not None:
                counts[problem[0]] = counts.get(problem[0], 0) + 1
                if unlisted_from is None and len(listed) < LISTED_PER_CHUNK:
                    listed.append(LineProblem(path, i, *problem))
                elif unlisted_from is None:
                    unlisted_from = i
                continue
            line_of.append(i)
            for key in self.keys:
                texts[key].append(obj[key])
        tokens: dict[str, np.ndarray | str] = {}
        sizes: dict[str, np.ndarray] = {}
        empties: list[tuple[str, list[int]]] = []  # (key, the chunk lines of its empty documents)
        checked = 0
        max_id: dict[str, int] = {}
        for key in self.keys:
            ids, lengths = self.tok.encode_batch(texts[key])
            if self.check is not None:
                before = self.check.documents
                bad = self.check.first_mismatch(texts[key], ids, lengths)
                checked += self.check.documents - before
                if bad is not None:
                    mismatch = LineProblem(path, line_of[bad[0]], "tokenizer-mismatch", f"{key!r}: {bad[1]}")
                    return Encoded({}, {}, [mismatch], len(lines), checked, mismatch)
            # As Megatron's: a key whose text gives no tokens has no document; the others still do.
            kept = lengths > 0
            empty = [line_of[j] for j in np.flatnonzero(~kept).tolist()]
            if empty:
                counts["empty"] = counts.get("empty", 0) + len(empty)
                empties.append((key, empty))
            lengths = lengths[kept]
            if self.eod is not None:
                ids = np.insert(ids, np.cumsum(lengths), self.eod)
                lengths = lengths + 1
            if ids.size:  # recorded with the part: the launch's pre-flight check reads it instead of a scan
                max_id[key] = int(ids.max())
            tokens[key] = ids.astype(self.dtype)
            sizes[key] = lengths.astype(np.int32)
        problems = listed
        if empties:  # merged by line (stable: a line's keys stay in order), up to where listing stopped
            limit = len(lines) if unlisted_from is None else unlisted_from
            streams = [listed] + [_empty_problems(path, key, empty, limit) for key, empty in empties]
            problems = list(itertools.islice(heapq.merge(*streams, key=lambda p: p.line), LISTED_PER_CHUNK))
        return Encoded(tokens, sizes, problems, len(lines), checked, None, counts, max_id=max_id)
