"""The record of a dataset bsops wrote: `PREFIX.dataset.json` beside `PREFIX.bin/.idx`.

Every dataset bsops writes gets one, once its .bin and .idx are final: each output of `preprocess` (one
output, one per input, or the merge of several inputs) and the output of `merge-datasets`. It says

  - `tokenizer`: the tokenizer identity exactly as the run's part records hold it in their settings (kind, the
    sha256 of its files, special text: the fields `shards.merge_checked` compares); null for a merge of datasets
    some of which had no record, since their tokenizer is not known;
  - `dtype`, `documents`, `tokens`: what the .idx describes (a record whose counts differ from the .idx it sits
    beside is not this dataset's record: an interrupted rewrite, or a dataset copied over another's);
  - `max_id`: the largest token id (null: no token);
  - `binding`: what ties it to its data's content (binding.py: the .idx's sha256, the .bin's size and its
    sha256, or sampled blocks' for a .bin over 64 MiB); absent in records written before bsops bound them;
  - `bsops`: the version that wrote it.

A record is a claim, checked when read (`inspect`): only a regular file is read, never through a link (a link is
`link`, which the pre-flight refuses); bounded size; anything torn, of the wrong types, not matching the .idx or
bound to other data is not used, with the reason, never an exception. The largest id it claims is checked by a
scan of the .bin: each time for a .bin hashed whole (as cheap as the hash), once per file for a larger one
(binding.checked_max_id, cached by binding and file): a record that claims another id is not used. A record
without a binding whose claim the scan bears out gets its binding then, where the folder is writable.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.data import binding as bind
from bigscience_ops.data.binding import scan_max_id  # noqa: F401  (merge and preprocess scan through here)
from bigscience_ops.untrusted import write_atomically

FORMAT = "bsops-dataset"  # the first key of the file: inputs.side_file tells the record by it
VERSION = 1
SUFFIX = ".dataset.json"
MAX_BYTES = 1 << 16  # a larger file named like a record is not one of ours
IDENTITY = ("kind", "tokenizer", "special_text")  # the settings that name the tokenizer (shards.merge_checked)


def record_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}{SUFFIX}")


def identity(settings: dict) -> dict:
    """The tokenizer identity of a preprocess run's settings (or of a record's), as a record holds it."""
    return {k: settings.get(k) for k in IDENTITY}


def remove(prefix: str | os.PathLike) -> None:
    """Drop the record before the dataset is rewritten (it no longer describes the files being written)."""
    record_path(prefix).unlink(missing_ok=True)


def write(prefix: str | os.PathLike, tokenizer: dict | None, max_id: int | None) -> Path:
    """Write PREFIX's record (atomically: a temporary, fsync, rename) from its final .idx, bound to its .bin and .idx
    as they are now; returns its path. `max_id`, the writer's count, is checked by a scan of the .bin:
    where they differ (a part record of an earlier run that lied), the scan's is written."""
    from bigscience_ops import __version__
    from bigscience_ops.data.indexed import IndexedDataset

    indexed = IndexedDataset(prefix)
    bound = bind.compute(prefix)
    scanned = bind.checked_max_id(prefix, indexed.dtype, bound)[0]
    record = {"format": FORMAT, "version": VERSION, "tokenizer": tokenizer, "dtype": indexed.dtype.str,
              "documents": len(indexed), "tokens": indexed.num_tokens,
              "max_id": scanned, "binding": bound, "bsops": __version__}
    del indexed
    return _put(prefix, record)


def _put(prefix: str | os.PathLike, record: dict) -> Path:
    path = record_path(prefix)
    write_atomically(path, json.dumps(record).encode("utf-8"), tmp=f"{path}.tmp-{os.getpid()}")
    return path


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




@dataclass(frozen=True)
class Reading:
    """What `inspect` made of PREFIX.dataset.json."""

    record: dict | None = None  # the record, when it is this dataset's and its largest id was borne out
    why: str | None = None  # why a file there was not used (None with no record: there is none)
    link: bool = False  # the record's path is a symbolic link (never read through)
    max_id: tuple[int | None, str] | None = None  # the record's largest id, checked, and where the check came from
    binding: dict | None = None  # the data's binding, when it was computed


def inspect(prefix: str | os.PathLike, indexed=None, scanned: tuple[int | None, str] | None = None) -> Reading:
    """PREFIX.dataset.json checked against its data (the module docstring). `indexed`: the dataset's
    IndexedDataset, if open; `scanned`: the .bin's largest id and where it came from, when the caller has just read
    the whole .bin (`bsops data verify`), else binding.checked_max_id's."""
    path = record_path(prefix)
    found = bind.read_regular(path, MAX_BYTES)
    if found.data is None:
        return Reading(why=found.why, link=found.link)
    try:
        data = json.loads(found.data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return Reading(why=f"{path} is not JSON (cut short or damaged)")
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        return Reading(why=f"{path} is not a dataset record of this bsops (format {FORMAT!r} version {VERSION})")
    high = data.get("max_id")
    if (not isinstance(data.get("dtype"), str) or not _count(data.get("documents")) or not _count(data.get("tokens"))
            or not (high is None or _count(high)) or not _valid_tokenizer(data.get("tokenizer"))
            or not ("binding" not in data or bind.valid(data["binding"]))):
        return Reading(why=f"{path} has fields of the wrong types")
    if indexed is None:
        from bigscience_ops.data.errors import DataFormatError
        from bigscience_ops.data.indexed import IndexedDataset

        try:
            indexed = IndexedDataset(prefix)
        except (DataFormatError, OSError, ValueError) as exc:
            return Reading(why=f"{path} sits beside a dataset that cannot be read ({exc})")
    actual = {"dtype": indexed.dtype.str, "documents": len(indexed), "tokens": indexed.num_tokens}
    differ = [f"{k} {data[k]!r:.24} (the .idx: {v!r})" for k, v in actual.items() if data[k] != v]
    if differ:
        return Reading(why=f"{path} describes another dataset: {', '.join(differ)}")
    if (high is None) != (data["tokens"] == 0):
        return Reading(why=f"{path} has max_id {high} for {data['tokens']} tokens")
    try:
        bound = bind.compute(prefix)
        if "binding" in data and data["binding"] != bound:
            return Reading(why=f"{path} was written for other data: its binding differs from what "
                               f"{os.fspath(prefix)}.bin/.idx hold now, as a record copied beside changed data's "
                               "would", binding=bound)
        value = (scanned or bind.checked_max_id(prefix, indexed.dtype, bound))[0]
    except OSError as exc:
        return Reading(why=f"{path} sits beside a dataset that cannot be read ({exc.strerror or exc})")
    if value != high:
        return Reading(why=f"{path} claims max_id {high}, a scan of {os.fspath(prefix)}.bin finds {value}",
                       binding=bound)
    if "binding" not in data:  # written before records were bound: bound now, where the folder allows
        data = {**data, "binding": bound}
        try:
            _put(prefix, data)
        except OSError:
            pass
    return Reading(data, max_id=(value, f"record {path}"), binding=bound)


def read(prefix: str | os.PathLike, indexed=None) -> tuple[dict | None, str | None]:
    """(record, None) when PREFIX.dataset.json is a record of this very dataset whose claims hold; (None, why it was
    not used) when a file is there but is not; (None, None) when there is none (`inspect`)."""
    reading = inspect(prefix, indexed)
    return reading.record, reading.why
