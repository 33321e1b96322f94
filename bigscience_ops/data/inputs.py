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

Hostile inputs. Every read is bounded: decoders are asked for at most a chunk at a time, and a line
(one document) longer than the run's maximum stops the run as soon as it passes it (`LineTooLong`),
so a small file that decompresses to gigabytes without a newline never fills memory. A .zst file's
frames are walked before it is read (zst.py), since the zstandard reader ends quietly where a cut-short
file ends; .gz and .xz decoders refuse a cut-short file themselves, and an empty compressed file is
not one. Folders and globs give each regular file once (by device and inode: a link and its target, or
a symlink loop, count once; a glob enters each real folder once), refuse names that match but are not
regular files (a FIFO would block the run, /dev/zero never ends), and skip bsops' own side files
(`side_file`), so an output prefix inside the input folder does not feed a rerun its own outputs.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
import io
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bigscience_ops.data.errors import DamagedInputError, DataError, InputConflictError, NotCorpusError

FOLDER_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".jsonl.xz", ".jsonl.zst")
COMPRESSIONS = {".gz": "gzip", ".xz": "xz", ".zst": "zstd"}
DATA_SUFFIXES = (".jsonl", ".json")
ZSTD_TIMEOUT_S = 7 * 24 * 3600  # the zstd command reads one shard: a generous bound, never forever
MAX_DOCUMENT_BYTES = 64 << 20  # the longest line a run takes by default (--max-document-bytes)
SNIFF_BYTES = 1 << 16  # read from a file named like a side file to tell whether bsops wrote it
PROBLEM_KEYS = {"path", "line", "kind", "detail"}  # a problems list's lines (shards.py writes them)
_TEMPORARY = re.compile(r"\.(bin|idx|jsonl|json)\.tmp-\d+$")  # a writer's file before it is published


class LineTooLong(Exception):
    """A line passed the maximum; `index` is its 0-based number in the stream read (callers name the file)."""

    def __init__(self, index: int) -> None:
        self.index = index
        super().__init__(f"line index {index} is longer than the maximum")


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


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _entries(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder or "."))
    except OSError:
        return []


def _real_dirs(top: str) -> Iterator[str]:
    """`top` and every folder below it (links to folders followed), each real folder once, depth first."""
    seen: set[tuple[int, int]] = set()
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder or ".")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen or not stat.S_ISDIR(st.st_mode):
            continue
        seen.add((st.st_dev, st.st_ino))
        yield folder
        stack += [os.path.join(folder, n) for n in reversed(_entries(folder)) if not _hidden(n)]


def _glob(pattern: str) -> list[str]:
    """What glob.glob(pattern, recursive=True) matches, but a `**` enters each real folder once.

    glob.glob follows a symlink loop until the path is too long (40 times) and walks a folder once per
    link to it; here a loop is entered once, so every file is found once per path that does not repeat
    a folder. Names starting with a dot match only a part that starts with one, as in glob.
    """
    absolute = pattern.startswith(os.sep)
    parts = [p for p in pattern.split(os.sep) if p]
    found: list[str] = []

    def walk(base: str, i: int) -> None:
        part, last = parts[i], i == len(parts) - 1
        if part == "**":
            for folder in _real_dirs(base):
                if last:
                    found.extend(os.path.join(folder, n) for n in _entries(folder) if not _hidden(n))
                else:
                    walk(folder, i + 1)
            return
        if not _is_glob(part):
            path = os.path.join(base, part)
            if last:
                if os.path.lexists(path):
                    found.append(path)
            elif os.path.isdir(path):
                walk(path, i + 1)
            return
        for name in _entries(base):
            if (_hidden(name) and not part.startswith(".")) or not fnmatch.fnmatchcase(name, part):
                continue
            path = os.path.join(base, name)
            if last:
                found.append(path)
            elif os.path.isdir(path):
                walk(path, i + 1)

    if parts:
        walk(os.sep if absolute else "", 0)
    return found


_KINDS = ((stat.S_ISDIR, "folder", "a folder"), (stat.S_ISFIFO, "fifo", "a FIFO (reading it would wait forever)"),
          (stat.S_ISCHR, "character-device", "a character device"), (stat.S_ISBLK, "block-device", "a block device"),
          (stat.S_ISSOCK, "socket", "a socket"))


def not_a_file(path: Path) -> tuple[str, str] | None:
    """(what, description) when `path` (links followed) is not a regular file, else None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return "broken-link", f"a link to {os.readlink(path)}, which does not exist"
        return "missing", "does not exist"
    except OSError as exc:  # a symlink loop (ELOOP), a name too long, no permission
        return "unreadable", f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    for test, what, text in _KINDS:
        if test(mode):
            return what, text
    return "special", "not a regular file"


def _first_line(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.readline(SNIFF_BYTES)
    except OSError:
        return b""


def side_file(path: Path) -> tuple[str, str] | None:
    """(what, description) when `path` is a file bsops writes next to its outputs, else None.

    By name and, for names a corpus could also have, by content: a run record `PART.preprocess.json`
    (it starts `{"format": `), a dataset's record `PREFIX.dataset.json` (it starts `{"format": "bsops-dataset"`), a
    scan's result `PREFIX.maxid` (it starts `{"format": `),
    a problems list `*_problems.jsonl` (lines of path, line, kind, detail), an
    indexed dataset's `.idx` (Megatron's magic) or `.bin` (with its `.idx`), a writer's temporary
    (`*.bin.tmp-PID`, ...) and a worker's token spill (in a `bsops-preprocess-*` folder). The caller
    has checked that `path` is a regular file.
    """
    name = path.name
    low = name.lower()
    if _TEMPORARY.search(low):
        return "temporary", "a file bsops writes before publishing it under its final name (a run was stopped)"
    if path.parent.name.startswith("bsops-preprocess-"):
        return "temporary", "a worker's token spill file"
    if low.endswith(".preprocess.json") and _first_line(path).startswith(b'{"format": '):
        return "run-record", "a run record bsops writes next to a finished part (PART.preprocess.json)"
    if low.endswith(".dataset.json") and _first_line(path).startswith(b'{"format": "bsops-dataset"'):
        return "dataset-record", "a dataset's record bsops writes beside its .bin/.idx (PREFIX.dataset.json)"
    if low.endswith(".maxid") and _first_line(path).startswith(b'{"format": '):
        return "scan-cache", "the largest token id of a dataset's .bin as a scan found it (PREFIX.maxid)"
    if low.endswith("_problems.jsonl"):
        try:
            first = json.loads(_first_line(path))
        except ValueError:
            first = None
        if isinstance(first, dict) and set(first) == PROBLEM_KEYS:
            return "problems-list", "a list of unusable lines bsops wrote (PREFIX_problems.jsonl)"
    if low.endswith(".idx"):
        with open(path, "rb") as f:
            if f.read(9) == b"MMIDIDX\x00\x00":
                return "dataset", "an indexed dataset's .idx (preprocess output, not jsonl)"
    if low.endswith(".bin") and os.path.isfile(str(path)[:-4] + ".idx"):
        return "dataset", "an indexed dataset's .bin (preprocess output, not jsonl)"
    return None


@dataclasses.dataclass
class FoundInputs:
    """The input files of some specs, in order, and what the folders and globs held besides."""

    files: list[Path] = dataclasses.field(default_factory=list)
    links: list[tuple[Path, Path]] = dataclasses.field(default_factory=list)  # (left out, the same file kept)
    side_files: list[Path] = dataclasses.field(default_factory=list)  # bsops' own outputs, never read


def _walk(spec: str, path: Path) -> list[Path]:
    """The candidate paths a folder or glob spec stands for, sorted (folders by name, globs by path)."""
    if path.is_dir():
        return sorted((path / n for n in _entries(str(path)) if n.lower().endswith(FOLDER_SUFFIXES)),
                      key=lambda p: p.name)
    return sorted(Path(p) for p in _glob(spec))


def find_inputs(specs: list[str | os.PathLike]) -> FoundInputs:
    """Files, folders and globs -> the input files, in order (folders and globs sorted by name).

    A folder or glob gives each regular file once (a link to a file it also holds, a hard link or a
    symlink loop counts once: the first name is kept, the others listed in `links`), skips bsops' own
    side files (listed in `side_files`) and folders a glob matches, and refuses a matching name that is
    not a regular file (NotCorpusError: a FIFO, a device, a socket, a broken link). A file named
    explicitly that is a side file is refused; one that does not exist is left for the caller to
    report with the others. The same file given twice (by two specs) is an InputConflictError.
    """
    out = FoundInputs()
    seen: dict[tuple[int, int], Path] = {}

    def add(path: Path, spec: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            out.files.append(path)  # the caller reports it
            return
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise InputConflictError(str(seen[key]), str(path), f"are the same file (given twice, or through "
                                     f"a link; {spec!r} holds the second): each file is read once")
        seen[key] = path
        out.files.append(path)

    for spec in specs:
        text = os.fspath(spec)
        path = Path(text)
        walked = path.is_dir() or (_is_glob(text) and not path.exists())
        if not walked:
            if path.is_file() and (side := side_file(path)) is not None:
                raise NotCorpusError(text, side[0], f"is {side[1]}; it is never read as a corpus file")
            add(path, text)
            continue
        in_spec: dict[tuple[int, int], Path] = {}
        found = 0
        for candidate in _walk(text, path):
            odd = not_a_file(candidate)
            if odd is not None:
                if odd[0] == "folder" and not path.is_dir():
                    continue  # a glob's folders: the files are what it stands for
                raise NotCorpusError(str(candidate), odd[0],
                                     f"is {odd[1]}, not a file; {text!r} holds it. Remove it or give the files")
            if side_file(candidate) is not None:
                out.side_files.append(candidate)
                continue
            st = os.stat(candidate)
            key = (st.st_dev, st.st_ino)
            if key in in_spec:
                out.links.append((candidate, in_spec[key]))
                continue
            in_spec[key] = candidate
            found += 1
            add(candidate, text)
        if not found:
            if path.is_dir():
                raise DataError(f"input folder {path} holds no input file; allowed: "
                                f"{', '.join('*' + s for s in FOLDER_SUFFIXES)}")
            raise DataError(f"input glob {text!r} matches no file")
    return out


def expand_inputs(specs: list[str | os.PathLike]) -> list[Path]:
    """The input files of `specs` (see find_inputs)."""
    return find_inputs(specs).files


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


def _size(raw: BinaryIO) -> int | None:
    try:
        return os.fstat(raw.fileno()).st_size
    except (OSError, AttributeError, io.UnsupportedOperation):
        return None


def open_decoded(path: Path, raw: BinaryIO) -> BinaryIO | None:
    """A reader of `path`'s decompressed bytes over the open file `raw`; None for a plain file.

    DamagedInputError when a compressed file is empty (every compressor writes a header) or, for
    .zst, when its frames do not reach the end of the file (zst.py); other damage is raised by the
    reader as one of `decode_errors()`.
    """
    kind = compression(path)
    if kind is not None and _size(raw) == 0:
        raise DamagedInputError(str(path), kind, "the file is empty: 0 bytes, where a compressed empty text "
                                "still has a header")
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
        from bigscience_ops.data import zst

        zst.check_frames(raw, str(path))  # the zstandard reader stops quietly where a cut-short file ends
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


def line_chunks(reader: BinaryIO, size: int, max_line: int | None = None) -> Iterator[bytes]:
    """The decompressed stream in pieces of about `size` bytes, each ending at a line end (the last may not).

    A line longer than `max_line` bytes (newline not counted) raises LineTooLong as soon as the part
    read of it passes `max_line`, so at most `max_line + size` bytes of it are ever held; each byte of
    a long line is copied once, not once per read.
    """
    pending = bytearray()  # the start of a line whose end is not read yet
    lines = 0  # whole lines yielded so far
    while True:
        data = reader.read(size)
        if not data:
            break
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # a line longer than size: read on
            pending += data
            if max_line is not None and len(pending) > max_line:
                raise LineTooLong(lines)
            continue
        if pending:
            if max_line is not None and len(pending) + data.find(b"\n") > max_line:
                raise LineTooLong(lines)
            chunk = bytes(pending) + data[:cut]
            pending = bytearray()
        else:
            chunk = data[:cut] if cut < len(data) else data
        if cut < len(data):
            pending += data[cut:]
        lines += chunk.count(b"\n")
        yield chunk
    if pending:
        if max_line is not None and len(pending) > max_line:
            raise LineTooLong(lines)
        yield bytes(pending)


def _line_index(raw: BinaryIO, offset: int) -> int:
    """The 0-based number of the line holding byte `offset` of a plain file (its newlines before it)."""
    raw.seek(0)
    count = 0
    left = offset
    while left > 0:
        data = raw.read(min(left, 1 << 20))
        if not data:
            break
        count += data.count(b"\n")
        left -= len(data)
    return count


def plain_cuts(raw: BinaryIO, size: int, total: int, max_line: int | None = None) -> Iterator[tuple[int, int]]:
    """(offset, length) pieces of about `size` bytes of a plain file, each ending at a line end.

    Only the bytes around each cut are read here: whoever encodes a piece reads it (and checks its
    lines' lengths). The line a cut falls in is read to its end, at most `max_line + 1` bytes of it:
    longer, it raises LineTooLong.
    """
    offset = 0
    while offset < total:
        end = offset + size
        if end < total:
            raw.seek(end)
            rest = raw.readline(-1 if max_line is None else max_line + 1)
            if max_line is not None and len(rest) > max_line and not rest.endswith(b"\n"):
                raise LineTooLong(_line_index(raw, end))
            end += len(rest)
        end = min(end, total)
        yield offset, end - offset
        offset = end
