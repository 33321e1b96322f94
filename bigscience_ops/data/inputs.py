"""Finding preprocessing inputs (files, folders, globs) and reading them decompressed, whole lines at a time.

An input is a `.jsonl`/`.json` file, optionally `.gz`, `.xz` or `.zst` compressed. A folder stands
for its `*.jsonl`, `*.json`, `*.jsonl.gz`, `*.jsonl.xz` and `*.jsonl.zst` files, sorted by name; a
glob (`shards/*.jsonl.gz`, `**` included) for its matches, sorted. Every form gives the same bytes
as decompressing first.

Decoders, measured here on a 346 MB jsonl (one core each, MB/s of decompressed text):

    gzip   isal 1250 (igzip, ISA-L)   rapidgzip 600 (1 thread; 545 with 2)   stdlib gzip 400
           indexed_gzip 205   `gzip -dc` 187
    zstd   zstandard 1230   `zstd -dc` 1050 (more CPU: a pipe)
    xz     lzma 144   `xz -T1 -dc` 137   `xz -T2 -dc` 249 (multi-block files; see xz.py)

isal is used for gzip: three times Python's gzip on one core, twice rapidgzip's single thread, and
it leaves the other cores to the tokenizing workers. rapidgzip decodes one file on many threads,
which pays only when one gzip file must feed more workers than isal's 1.25 GB/s can (about 40 of
them here; the benchmark's model shows where); shards, each read by its own worker, scale further
and need no parallel decoder. indexed_gzip is zlib with an index for random access: slower for a
sequential read. isal and zstandard are the `corpus` extra (pip install 'bigscience-ops[corpus]');
without isal, Python's gzip reads .gz; without zstandard, the `zstd` command reads .zst.
"""

from __future__ import annotations

import importlib.util
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bigscience_ops.data.errors import DataError

FOLDER_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".jsonl.xz", ".jsonl.zst")
COMPRESSIONS = {".gz": "gzip", ".xz": "xz", ".zst": "zstd"}
DATA_SUFFIXES = (".jsonl", ".json")
ZSTD_TIMEOUT_S = 7 * 24 * 3600  # the zstd command reads one shard: a generous bound, never forever


def compression(path: str | os.PathLike) -> str | None:
    """gzip, xz or zstd from the file name's last suffix; None for a plain file."""
    return COMPRESSIONS.get(Path(path).suffix.lower())


def shard_stem(path: str | os.PathLike) -> str:
    """The file name without its compression and .jsonl/.json suffixes: `en_00.jsonl.gz` -> `en_00`."""
    name = Path(path).name
    low = name.lower()
    for suffix in COMPRESSIONS:
        if low.endswith(suffix):
            name, low = name[:-len(suffix)], low[:-len(suffix)]
            break
    for suffix in DATA_SUFFIXES:
        if low.endswith(suffix):
            return name[:-len(suffix)]
    return name


def _is_glob(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def expand_inputs(specs: list[str | os.PathLike]) -> list[Path]:
    """Files, folders and globs -> the input files, in order (folders and globs sorted by name).

    A folder or glob that holds no input file is an error naming it; a file that does not exist is
    left for the caller to report with the others.
    """
    out: list[Path] = []
    for spec in specs:
        text = os.fspath(spec)
        path = Path(text)
        if path.is_dir():
            found = sorted((p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(FOLDER_SUFFIXES)),
                           key=lambda p: p.name)
            if not found:
                raise DataError(f"input folder {path} holds no input file; allowed: "
                                f"{', '.join('*' + s for s in FOLDER_SUFFIXES)}")
            out += found
        elif _is_glob(text) and not path.exists():
            import glob

            found = sorted(Path(p) for p in glob.glob(text, recursive=True) if os.path.isfile(p))
            if not found:
                raise DataError(f"input glob {text!r} matches no file")
            out += found
        else:
            out.append(path)
    return out


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def decoder_notes(paths: list[Path]) -> list[str]:
    """One line per missing optional decoder that these inputs would use, saying what is used instead."""
    kinds = {compression(p) for p in paths}
    notes = []
    if "gzip" in kinds and not _have("isal"):
        notes.append("isal is not installed: .gz inputs are read with Python's gzip, about 3x slower "
                     "(pip install 'bigscience-ops[corpus]')")
    if "zstd" in kinds and not _have("zstandard"):
        notes.append("zstandard is not installed: .zst inputs are read through the zstd command "
                     "(pip install 'bigscience-ops[corpus]')")
    return notes


class _CommandReader(io.RawIOBase):
    """The stdout of a decompressing command as a file; its exit status is checked at the end."""

    def __init__(self, argv: list[str]) -> None:
        import subprocess

        self._argv = argv
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._proc.returncode is not None:  # ended, and its status checked
            return 0
        n = self._proc.stdout.readinto(buffer)
        if n == 0:
            _, err = self._proc.communicate(timeout=ZSTD_TIMEOUT_S)
            if self._proc.returncode != 0:
                raise OSError(f"{' '.join(self._argv)} exited {self._proc.returncode}: "
                              f"{err.decode(errors='replace').strip()}")
        return n

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.communicate(timeout=60)
        super().close()


def open_decoded(path: Path, raw: BinaryIO) -> BinaryIO | None:
    """A reader of `path`'s decompressed bytes over the open file `raw`; None for a plain file."""
    kind = compression(path)
    if kind == "gzip":
        if _have("isal"):
            from isal import igzip

            return igzip.IGzipFile(fileobj=raw, mode="rb")
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind == "xz":
        import lzma

        return lzma.LZMAFile(raw, mode="rb")
    if kind == "zstd":
        if _have("zstandard"):
            import zstandard

            # read_across_frames: files made of several frames (pzstd, concatenated shards) read whole.
            return zstandard.ZstdDecompressor().stream_reader(raw, read_size=1 << 20, read_across_frames=True)
        import shutil

        if shutil.which("zstd"):
            return io.BufferedReader(_CommandReader(["zstd", "-dcq", "--", str(path)]), 1 << 20)
        raise DataError(f"input {path}: reading .zst needs the zstandard package or the zstd command; "
                        "pip install 'bigscience-ops[corpus]' or apt-get install zstd")
    return None


def decode_errors() -> tuple[type[BaseException], ...]:
    """What the decoders raise on a damaged or mislabelled file (each is reported as one clear error)."""
    import lzma
    import zlib

    errors: list[type[BaseException]] = [OSError, EOFError, lzma.LZMAError, zlib.error]
    if _have("zstandard"):
        import zstandard

        errors.append(zstandard.ZstdError)
    if _have("isal"):
        from isal import isal_zlib

        errors.append(isal_zlib.error)
    return tuple(errors)


def line_chunks(reader: BinaryIO, size: int) -> Iterator[bytes]:
    """The decompressed stream in pieces of about `size` bytes, each ending at a line end (the last may not)."""
    rest = b""
    while True:
        data = reader.read(size)
        if not data:
            break
        if rest:
            data = rest + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # a line longer than size: read on
            rest = data
            continue
        rest = data[cut:]
        yield data[:cut] if cut < len(data) else data
    if rest:
        yield rest


def plain_cuts(raw: BinaryIO, size: int, total: int) -> Iterator[tuple[int, int]]:
    """(offset, length) pieces of about `size` bytes of a plain file, each ending at a line end.

    Only the bytes around each cut are read here: whoever encodes a piece reads it.
    """
    offset = 0
    while offset < total:
        end = offset + size
        if end < total:
            raw.seek(end)
            end += len(raw.readline())
        end = min(end, total)
        yield offset, end - offset
        offset = end
