"""`bsops data verify PREFIX`: a dataset read whole, every token and every entry of its index, nothing sampled.

The pre-flight (preflight.py) is fast because it trusts what it can: a .bin over 64 MiB is bound by sampled blocks
and its scan kept per file (binding.py). This is the check that trusts nothing, for a dataset that came from
elsewhere, a copy, or a run that stopped on a bad token (the trainer names it: trainer/data.py). It reads:

  - the .idx against the .bin: the header (magic, version, dtype), its size for its counts, every size at least 0,
    every pointer where the sizes before it put it (Megatron's writer lays documents back to back), the document
    index from 0 to the item count, never decreasing, and the .bin's size exactly what the sizes add up to;
  - every token of the .bin, in chunks of binding.SCAN_CHUNK ids (bounded memory, disk speed): its smallest and
    largest id, and with a vocabulary (`limit`: ids must be below it) every id outside [0, limit), counted, the
    first MAX_LISTED named by document and offset;
  - the dataset's record PREFIX.dataset.json, when there is one: its counts, its binding and its largest id checked
    against what was read (dataset_record.inspect, given this scan).

`verify` returns a Verified (what was read, and every problem found); it raises DataError only when there is no
dataset to read (a .bin or .idx missing). `progress(done_bytes, total_bytes)` is called after each chunk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from bigscience_ops.data import binding
from bigscience_ops.data import dataset_record as own_record
from bigscience_ops.data.errors import DataError, DataFormatError
from bigscience_ops.data.indexed import IndexedDataset, bin_path, idx_path

MAX_LISTED = 20  # bad tokens named one by one; the rest are counted


@dataclass(frozen=True)
class BadToken:
    """A token id outside [0, limit): the document (its item index in the .idx), the offset in it, the id."""

    document: int
    offset: int
    token: int


@dataclass(frozen=True)
class Verified:
    prefix: str
    dtype: str | None = None
    documents: int = 0
    tokens: int = 0
    bin_bytes: int = 0
    min_id: int | None = None  # None: no token (or the .bin was not read)
    max_id: int | None = None
    limit: int | None = None  # ids must be below it; None: no vocabulary given, ids not checked
    bad_tokens: int = 0  # ids outside [0, limit)
    first_bad: list[BadToken] = field(default_factory=list)  # the first MAX_LISTED of them
    problems: list[str] = field(default_factory=list)  # the .idx against the .bin, the record
    record: str = "none"  # "none", "used" (its claims hold), or why it is not used

    @property
    def ok(self) -> bool:
        return not self.problems and self.bad_tokens == 0

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def _index_problems(indexed: IndexedDataset) -> list[str]:
    """What the .idx says that the .bin (or the .idx itself) contradicts, beyond what IndexedDataset checked."""
    problems = []
    sizes, pointers, docs = indexed.sizes, indexed.pointers, indexed.doc_idx
    idx = idx_path(indexed.prefix)
    if len(sizes) and int(sizes.min()) < 0:
        first = int(np.flatnonzero(sizes < 0)[0])
        problems.append(f"{idx}: document {first} has size {int(sizes[first])}; sizes are counts of tokens, at least 0")
        return problems  # the pointers below are computed from the sizes
    expected = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1], dtype=np.int64, out=expected[1:])
        expected *= indexed.dtype.itemsize
    wrong = np.flatnonzero(pointers != expected)
    if len(wrong):
        first = int(wrong[0])
        problems.append(f"{idx}: document {first} starts at byte {int(pointers[first])} of the .bin, where the sizes "
                        f"before it put it at {int(expected[first])} ({len(wrong)} pointers differ): documents "
                        "overlap or leave gaps, as no writer of the format lays them")
    if len(docs) == 0 or int(docs[0]) != 0 or int(docs[-1]) != len(sizes) or (np.diff(docs) < 0).any():
        shown = [int(d) for d in docs[:3]] + (["..."] if len(docs) > 4 else []) + [int(d) for d in docs[3:][-1:]]
        problems.append(f"{idx}: the document index {shown} must run from 0 to the item count {len(sizes)}, never "
                        "decreasing")
    return problems


def _scan(indexed: IndexedDataset, limit: int | None,
          progress: Callable[[int, int], None] | None) -> tuple[int | None, int | None, int, list[BadToken]]:
    """(smallest id, largest id, ids outside [0, limit), the first MAX_LISTED of them) over the whole .bin."""
    tokens = indexed.tokens
    total, itemsize = len(tokens), indexed.dtype.itemsize
    starts = indexed.pointers // itemsize
    low = high = None
    bad, listed = 0, []
    for start in range(0, total, binding.SCAN_CHUNK):
        chunk = tokens[start:start + binding.SCAN_CHUNK]
        lo, hi = int(chunk.min()), int(chunk.max())
        low, high = (lo, hi) if low is None else (min(low, lo), max(high, hi))
        if limit is not None and (lo < 0 or hi >= limit):
            outside = np.flatnonzero((chunk < 0) | (chunk >= limit))
            bad += len(outside)
            for position in outside[:MAX_LISTED - len(listed)] + start:
                document = int(np.searchsorted(starts, position, side="right")) - 1
                listed.append(BadToken(document, int(position - starts[document]), int(tokens[position])))
        if progress is not None:
            progress(min(start + binding.SCAN_CHUNK, total) * itemsize, total * itemsize)
    return low, high, bad, listed


def verify(prefix: str | os.PathLike, limit: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> Verified:
    """Dataset PREFIX read whole (the module docstring); `limit`: token ids must be below it."""
    prefix = os.fspath(prefix)
    missing = [str(p) for p in (bin_path(prefix), idx_path(prefix)) if not p.is_file()]
    if missing:
        what = "no such file" if not any(os.path.exists(p) for p in missing) else "not a regular file"
        raise DataError(f"{' and '.join(missing)}: {what}; a dataset is PREFIX.bin and PREFIX.idx, two regular files "
                        "(bsops preprocess writes them): give the prefix without .bin/.idx")
    bin_bytes = Path(bin_path(prefix)).stat().st_size
    try:
        indexed = IndexedDataset(prefix)
    except (DataFormatError, OSError, ValueError) as exc:
        return Verified(prefix, bin_bytes=bin_bytes, limit=limit, problems=[f"not a dataset that can be read: {exc}"])
    found = Verified(prefix, indexed.dtype.name, len(indexed), indexed.num_tokens, bin_bytes, limit=limit,
                     problems=_index_problems(indexed))
    if found.problems:
        return found  # the tokens' documents cannot be named through a broken index
    low, high, bad, listed = _scan(indexed, limit, progress)
    found = replace(found, min_id=low, max_id=high, bad_tokens=bad, first_bad=listed)
    reading = own_record.inspect(prefix, indexed, scanned=(high, "verify"))
    if reading.link or reading.why is not None:
        record = reading.why or f"{own_record.record_path(prefix)} is a symbolic link (a record is never read so)"
        return replace(found, record=record, problems=[*found.problems, record])
    return replace(found, record="used" if reading.record is not None else "none")
