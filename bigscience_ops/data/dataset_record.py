"""The record of a dataset bsops wrote: `PREFIX.dataset.json` beside `PREFIX.bin/.idx`.

Every dataset bsops writes gets one, once its .bin and .idx are final: each output of `preprocess` (one
output, one per input, or the merge of several inputs) and the output of `merge-datasets`. It says

  - `tokenizer`: the tokenizer identity exactly as the run's part records hold it in their settings (kind, the
    sha256 of its files, special text: the fields `shards.merge_checked` compares); null for a merge of datasets
    some of which had no record, since their tokenizer is not known;
  - `dtype`, `documents`, `tokens`: what the .idx describes (a record whose counts differ from the .idx it sits
    beside is not this dataset's record: an interrupted rewrite, or a dataset copied over another's);
  - `max_id`: the largest token id (null: no token), so the pre-flight checks need no scan;
  - `bsops`: the version that wrote it.

A record is untrusted input when read (`read`): bounded size, and anything torn, of the wrong types or not
matching the .idx is ignored with the reason, never an exception.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bigscience_ops.runfiles import write_atomically

FORMAT = "bsops-dataset"  # the first key of the file: inputs.side_file tells the record by it
VERSION = 1
SUFFIX = ".dataset.json"
MAX_BYTES = 1 << 16  # a larger file named like a record is not one of ours
IDENTITY = ("kind", "tokenizer", "special_text")  # the settings that name the tokenizer (shards.merge_checked)
SCAN_CHUNK = 1 << 24  # token ids read at once by a scan (32-128 MiB of memory by dtype)


def record_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}{SUFFIX}")


def identity(settings: dict) -> dict:
    """The tokenizer identity of a preprocess run's settings (or of a record's), as a record holds it."""
    return {k: settings.get(k) for k in IDENTITY}


def remove(prefix: str | os.PathLike) -> None:
    """Drop the record before the dataset is rewritten (it no longer describes the files being written)."""
    record_path(prefix).unlink(missing_ok=True)


def write(prefix: str | os.PathLike, tokenizer: dict | None, max_id: int | None) -> Path:
    """Write PREFIX's record (atomically: a temporary, fsync, rename) from its final .idx; returns its path."""
    from bigscience_ops import __version__
    from bigscience_ops.data.indexed import IndexedDataset

    indexed = IndexedDataset(prefix)
    record = {"format": FORMAT, "version": VERSION, "tokenizer": tokenizer, "dtype": indexed.dtype.str,
              "documents": len(indexed), "tokens": indexed.num_tokens, "max_id": max_id, "bsops": __version__}
    del indexed
    path = record_path(prefix)
    write_atomically(path, json.dumps(record).encode("utf-8"), tmp=f"{path}.tmp-{os.getpid()}")
    return path


def scan_max_id(bin_file: Path, dtype) -> int | None:
    """The largest token id in a .bin of `dtype` tokens, read in chunks of SCAN_CHUNK ids; None when empty."""
    import numpy as np

    size = bin_file.stat().st_size
    count = size // np.dtype(dtype).itemsize
    if count == 0:
        return None
    tokens = np.memmap(bin_file, mode="r", dtype=dtype, shape=(count,))
    try:
        best = None
        for start in range(0, count, SCAN_CHUNK):
            high = int(tokens[start:start + SCAN_CHUNK].max())
            best = high if best is None else max(best, high)
        return best
    finally:
        del tokens


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def valid_settings(settings: object) -> bool:
    """Whether a part record's `settings` (preprocess._settings) have the shape merge and the pre-flight read: the
    tokenizer identity, the token dtype and the keys, each of its type."""
    return (isinstance(settings, dict) and _valid_tokenizer({k: settings.get(k) for k in IDENTITY})
            and isinstance(settings.get("dtype"), str) and isinstance(settings.get("keys"), list))


def _valid_tokenizer(value: object) -> bool:
    if value is None:
        return True
    return (isinstance(value, dict) and set(value) == set(IDENTITY) and isinstance(value["kind"], str)
            and isinstance(value["tokenizer"], list) and all(isinstance(h, str) for h in value["tokenizer"])
            and (value["special_text"] is None or isinstance(value["special_text"], str)))


def read(prefix: str | os.PathLike, indexed=None) -> tuple[dict | None, str | None]:
    """(record, None) when PREFIX.dataset.json is a record of this very dataset; (None, why it was ignored) when a
    file is there but is not; (None, None) when there is none. `indexed`: the dataset's IndexedDataset, if open."""
    path = record_path(prefix)
    try:
        if not path.exists():
            return None, None
        if not path.is_file():
            return None, f"{path} is not a regular file"
        size = path.stat().st_size
        if size > MAX_BYTES:
            return None, f"{path} holds {size} bytes; a record of bsops' holds at most {MAX_BYTES}"
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc})"
    try:
        data = json.loads(text)
    except ValueError:
        return None, f"{path} is not JSON (cut short or damaged)"
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        return None, f"{path} is not a dataset record of this bsops (format {FORMAT!r} version {VERSION})"
    high = data.get("max_id")
    if (not isinstance(data.get("dtype"), str) or not _count(data.get("documents")) or not _count(data.get("tokens"))
            or not (high is None or _count(high)) or not _valid_tokenizer(data.get("tokenizer"))):
        return None, f"{path} has fields of the wrong types"
    if indexed is None:
        from bigscience_ops.data.errors import DataFormatError
        from bigscience_ops.data.indexed import IndexedDataset

        try:
            indexed = IndexedDataset(prefix)
        except (DataFormatError, OSError, ValueError) as exc:
            return None, f"{path} sits beside a dataset that cannot be read ({exc})"
    actual = {"dtype": indexed.dtype.str, "documents": len(indexed), "tokens": indexed.num_tokens}
    differ = [f"{k} {data[k]!r:.24} (the .idx: {v!r})" for k, v in actual.items() if data[k] != v]
    if differ:
        return None, f"{path} describes another dataset: {', '.join(differ)}"
    if (high is None) != (data["tokens"] == 0):
        return None, f"{path} has max_id {high} for {data['tokens']} tokens"
    return data, None
