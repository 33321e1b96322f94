"""What choosing a tokenizer backend would otherwise recompute on every run, kept in the user's cache.

Choosing a backend means building `tokenizers`' reference from the files, building fastokens and
tiktoken, and comparing their ids on a probe text: about 0.6 CPU s, more than tokenizing a small
shard. The outcome is stored once per tokenizer as three files under `cache_dir()/tokenizers/`:

    KEY.json            the verdict per fast backend ("ok" or why not), vocabulary size, EOD id,
                        special tokens and the sha256 of the two files below
    KEY.tokenizer.json  the tokenizer.json text `tokenizers` would run (what fastokens loads)
    KEY.ranks           tiktoken's ranks ({token bytes: rank} in Python's marshal format, read in
                        8 ms where a text format takes 35), when tiktoken reproduces the tokenizer

KEY hashes the tokenizer files' contents, `special_text`, and each library's installed files (their
size and mtime: a new version, or a reinstall, is another key), so a changed vocabulary or library
is probed again. An entry that does not parse, or whose files do not match their recorded sha256,
is ignored and rebuilt. Entries are written under temporary names and renamed into place, so
concurrent runs never read half an entry. The cache lives in `$XDG_CACHE_HOME/bsops` (default
`~/.cache/bsops`), never next to the tokenizer or the source tree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import marshal
import os
from pathlib import Path

FORMAT = 2
LIBRARIES = ("fastokens", "tiktoken", "tokenizers")


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/bsops, else ~/.cache/bsops."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bsops"


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _library_stamp(name: str) -> list:
    """The installed package's native libraries and __init__.py, by name, size and mtime (no import)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return [name, None]
    folder = Path(spec.origin).parent
    stamp = [name]
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name == "__init__.py" or entry.name.endswith((".so", ".pyd")):
            st = entry.stat()
            stamp.append([entry.name, st.st_size, st.st_mtime_ns])
    return stamp


def key_of(files: list[str], kind: str, special_text: str) -> str:
    """The cache key of a tokenizer: its files' contents, how special text is read, the libraries."""
    parts = [FORMAT, kind, special_text, [sha256_file(f) for f in files], [_library_stamp(n) for n in LIBRARIES]]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


@dataclasses.dataclass
class Entry:
    """A tokenizer's probe outcome; `verdicts[backend]` is "ok" or why that backend is not used."""

    verdicts: dict[str, str]
    vocab_size: int
    eod: int | None
    specials: dict[str, int]
    hf_json: str  # the tokenizer.json text
    ranks_file: Path | None  # tiktoken's ranks, when tiktoken reproduces the tokenizer


def _paths(key: str) -> tuple[Path, Path, Path]:
    folder = cache_dir() / "tokenizers"
    return folder / f"{key}.json", folder / f"{key}.tokenizer.json", folder / f"{key}.ranks"


def load(key: str) -> Entry | None:
    """The entry under `key`, or None when it is missing, unreadable or does not match its hashes."""
    record_path, json_path, ranks_path = _paths(key)
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if record.get("format") != FORMAT:
            return None
        hf_bytes = json_path.read_bytes()
        if hashlib.sha256(hf_bytes).hexdigest() != record["hf_json_sha256"]:
            return None
        ranks_file = None
        if record["ranks_sha256"] is not None:
            if sha256_file(str(ranks_path)) != record["ranks_sha256"]:
                return None
            ranks_file = ranks_path
        verdicts = {str(k): str(v) for k, v in record["verdicts"].items()}
        specials = {str(k): int(v) for k, v in record["specials"].items()}
        eod = None if record["eod"] is None else int(record["eod"])
        return Entry(verdicts, int(record["vocab_size"]), eod, specials, hf_bytes.decode("utf-8"), ranks_file)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def store(key: str, verdicts: dict[str, str], vocab_size: int, eod: int | None, specials: dict[str, int],
          hf_json: str, ranks: dict[bytes, int] | None) -> Entry | None:
    """Write an entry (files first, the record last); None when the cache folder is not writable."""
    record_path, json_path, ranks_path = _paths(key)
    hf_bytes = hf_json.encode("utf-8")
    ranks_bytes = None if ranks is None else marshal.dumps(ranks)
    record = {"format": FORMAT, "verdicts": verdicts, "vocab_size": vocab_size, "eod": eod, "specials": specials,
              "hf_json_sha256": hashlib.sha256(hf_bytes).hexdigest(),
              "ranks_sha256": None if ranks_bytes is None else hashlib.sha256(ranks_bytes).hexdigest()}
    try:
        record_path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(json_path, hf_bytes)
        if ranks_bytes is not None:
            _write_atomic(ranks_path, ranks_bytes)
        _write_atomic(record_path, json.dumps(record).encode())
    except OSError:  # a read-only home: the run goes on, probing again next time
        return None
    return Entry(verdicts, vocab_size, eod, specials, hf_json, ranks_path if ranks_bytes is not None else None)


def read_ranks(path: Path) -> dict[bytes, int]:
    """tiktoken's ranks from a KEY.ranks file (checked against its sha256 when the entry was loaded)."""
    ranks = marshal.loads(path.read_bytes())
    if not isinstance(ranks, dict):
        raise ValueError(f"{path} does not hold tiktoken's ranks")
    return ranks
