"""A checkpoint's manifest: the record that commits a save, and the one thing every reader trusts.

A save is a commit (trainer/checkpointing.py): every rank writes its files, fsyncs each and records its size and
content hash (`record_file`); when all ranks are done, rank 0 writes `manifest.json` into the global_stepN folder
in one atomic step (`commit`: written beside it, fsynced, renamed), and only then points `latest` at the folder.
A folder without a committed manifest is a save that did not finish: resume, `info`, `runs`, `rollback`, eval,
backup, retention and hub-sync all treat it as incomplete (checkpoints/layout.py asks this module).

The manifest lists every file of the checkpoint (relative path, size in bytes, xxh3_128 of its content), the
iteration, the run id (layout.RUN_ID), the experiment's name, the layout it was written with (TP, PP, DP, ZeRO
stage, precision) and whether the optimizer state is in it. `verify` compares a folder with it: sizes alone (a
stat per file: what listing commands do) or sizes and hashes (resume, backup, adoption).

The hash is xxh3_128 (the xxhash package): about 28 GB/s on one core here against 1.5 GB/s for sha256 and 4.7
GB/s for blake3, so hashing what a rank just wrote costs about what reading it back from the page cache costs
(benchmarks/checkpoint_save.py measures it against the save itself). It guards against damage (a truncated,
flipped or missing file), not against a person who can rewrite the manifest too.

Checkpoints saved before manifests existed are adopted (`adopt`): each torch file must be a whole zip archive
whose every member matches its CRC-32 (zipfile reads them; nothing is unpickled), then a manifest marked
`adopted` is written. The trainer adopts the checkpoints up to `latest` when it resumes a run that has them,
`bsops verify EXP --adopt` does it for a run that is not training. Pure Python: no torch here.
"""

from __future__ import annotations

import io
import json
import os
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import (
    MAX_STEP, RecordFileError, check_int, check_str, check_time, excerpt, kind_of, read_small, write_atomically,
)

MANIFEST = "manifest.json"
"""The commit record inside each global_stepN folder, written last."""
FORMAT = 1
HASH = "xxh3_128"
CHUNK = 8 << 20
WINDOW = 64 << 20
"""Bytes of a file hashed per memory-map window."""
MANIFEST_LIMIT = 64 << 20
"""The largest manifest read: one line of about 100 bytes per file, so a checkpoint of 100,000 files fits."""
_HEX = frozenset("0123456789abcdef")


class ManifestError(BsopsError):
    """A manifest that cannot be read or written, or a folder that cannot be adopted: names the file and why."""


@dataclass(frozen=True)
class FileRecord:
    """What a writer says of one file of a checkpoint."""

    size: int
    xxh3: str
    """xxh3_128 of the file's bytes, 32 hex digits."""


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint: what it holds and what it is."""

    tag: str
    iteration: int
    run_id: str
    """The run the checkpoint belongs to (<checkpoints>/bsops-run-id at the save); "" when the folder had none."""
    experiment: str
    layout: dict
    """{"tensor", "pipeline", "data", "zero_stage", "precision"} it was written with."""
    optimizer: bool
    """Whether the optimizer state is in it: a resume continues exactly (False: weights only, a warm start)."""
    files: dict[str, FileRecord]
    committed_at: float
    adopted: bool = False
    """Written for a checkpoint saved before manifests: its zip archives were checked, then hashed as found."""
    format: int = FORMAT
    hash: str = HASH

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        files = {rel: {"size": f.size, "xxh3": f.xxh3} for rel, f in sorted(self.files.items())}
        data = {"format": self.format, "hash": self.hash, "tag": self.tag, "iteration": self.iteration,
                "run_id": self.run_id, "experiment": self.experiment, "layout": self.layout,
                "optimizer": self.optimizer, "adopted": self.adopted, "committed_at": self.committed_at,
                "files": files}
        return json.dumps(data, indent=1) + "\n"


@dataclass(frozen=True)
class Mismatch:
    """One file of a checkpoint that is not what its manifest says."""

    path: str
    """The file, relative to the checkpoint folder."""
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


@dataclass
class Verified:
    """What `verify` found: the mismatches (empty: the folder is what its manifest says) and the bytes read."""

    mismatches: list[Mismatch] = field(default_factory=list)
    bytes_read: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatches


# ----------------------------------------------------------------------------- writing

def hash_file(path: Path) -> FileRecord:
    """The size and xxh3_128 of a file as it is now (never through a link), read through a memory map in 64 MiB
    windows: no copy into Python objects, so hashing runs at the speed of memory (about 28 GB/s here, against 1.3
    GB/s through read() into 8 MiB buffers)."""
    import mmap

    import xxhash

    digest = xxhash.xxh3_128()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        for start in range(0, size, WINDOW):
            length = min(WINDOW, size - start)
            with mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=start) as window:
                digest.update(window)
    finally:
        os.close(fd)
    return FileRecord(size, digest.hexdigest())


class HashingWriter(io.RawIOBase):
    """A file being written that hashes (xxh3_128) and counts every byte as it goes by: a writer records what it
    wrote without reading it back (torch.save writes through it: trainer/deepspeed_state.py)."""

    def __init__(self, handle) -> None:
        import xxhash

        self.handle, self.digest, self.size = handle, xxhash.xxh3_128(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        written = self.handle.write(data)
        self.digest.update(memoryview(data)[:written])
        self.size += written
        return written

    def record(self) -> FileRecord:
        return FileRecord(self.size, self.digest.hexdigest())


def record_file(path: Path) -> FileRecord:
    """What the writer of `path` says of it: its data flushed to the disk (fsync), then its size and hash (read
    back: for small files, and those a writer did not hash as it wrote them)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return hash_file(path)


def commit(folder: Path, manifest: Manifest) -> None:
    """Write `manifest` into the checkpoint folder in one atomic step: from then on the checkpoint exists."""
    write_atomically(Path(folder) / MANIFEST, manifest.to_json().encode("utf-8"))


# ----------------------------------------------------------------------------- reading

def read(folder: Path) -> Manifest | None:
    """The folder's committed manifest; None when it has none (a save that did not finish, or one written before
    manifests). A manifest that is a link, a FIFO, too large, not JSON, or a field of the wrong type, is a
    ManifestError naming the file and the field."""
    file = Path(folder) / MANIFEST
    try:
        data = read_small(file, MANIFEST_LIMIT)
    except RecordFileError as exc:
        raise ManifestError(str(exc)) from None
    if data is None:
        if file.is_symlink():
            raise ManifestError(f"{file}: is {kind_of(file)}, not a plain file; a manifest is never read through "
                                "a link")
        return None
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        raise ManifestError(f"{file}: not a JSON manifest ({excerpt(data)}); the trainer writes it whole, so it was "
                            "damaged afterwards") from None
    manifest, why = _parse(raw)
    if manifest is None:
        raise ManifestError(f"{file}: {why}; expected the manifest the trainer commits")
    if manifest.tag != Path(folder).name:
        raise ManifestError(f"{file}: names {excerpt(manifest.tag)}, but the folder is {Path(folder).name}: a "
                            "checkpoint folder renamed or copied under another tag is not the checkpoint it says")
    return manifest


def _parse(raw: object) -> tuple[Manifest | None, str]:
    if not isinstance(raw, dict):
        return None, f"a JSON {type(raw).__name__}, not an object"
    if raw.get("format") != FORMAT or raw.get("hash") != HASH:
        return None, (f"format {excerpt(str(raw.get('format')))} hash {excerpt(str(raw.get('hash')))}; this bsops "
                      f"reads format {FORMAT} with {HASH}")
    checks = {
        "tag": check_str(raw.get("tag"), 64),
        "iteration": check_int(raw.get("iteration"), 0, MAX_STEP),
        "run_id": check_str(raw.get("run_id"), 64),
        "experiment": check_str(raw.get("experiment"), 256),
        "committed_at": check_time(raw.get("committed_at")),
    }
    for name, why in checks.items():
        if why:
            return None, f"field {name}: {why}"
    for name in ("optimizer", "adopted"):
        if not isinstance(raw.get(name), bool):
            return None, f"field {name}: expected true or false"
    layout = raw.get("layout")
    if not isinstance(layout, dict) or any(check_int(layout.get(k), 0, 1 << 20) for k in
                                           ("tensor", "pipeline", "data", "zero_stage")):
        return None, "field layout: expected {tensor, pipeline, data, zero_stage: counts, precision: text}"
    files = raw.get("files")
    if not isinstance(files, dict) or not files:
        return None, "field files: expected {path: {size, xxh3}} for at least one file"
    parsed = {}
    for rel, entry in files.items():
        why = _file_problem(rel, entry)
        if why:
            return None, f"field files: {excerpt(str(rel))}: {why}"
        parsed[rel] = FileRecord(entry["size"], entry["xxh3"])
    return Manifest(raw["tag"], raw["iteration"], raw["run_id"], raw["experiment"], dict(layout), raw["optimizer"],
                    parsed, raw["committed_at"], raw["adopted"]), ""


def _file_problem(rel: object, entry: object) -> str | None:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel.split("/") or "\\" in rel \
            or any(not c.isprintable() for c in rel) or rel == MANIFEST:
        return "not a relative path inside the checkpoint"
    if not isinstance(entry, dict) or set(entry) != {"size", "xxh3"}:
        return "expected {size, xxh3}"
    if check_int(entry["size"], 0, 1 << 62):
        return "size: expected a byte count"
    digest = entry["xxh3"]
    if not isinstance(digest, str) or len(digest) != 32 or not set(digest) <= _HEX:
        return "xxh3: expected 32 hex digits"
    return None


def verify(folder: Path, manifest: Manifest, *, hashes: bool = True, only: Iterable[str] | None = None,
           extras: bool | None = None) -> Verified:
    """Compare the folder's files with `manifest`: each is a plain file (never a link) of the recorded size and,
    with `hashes`, content. `only`: the files to check (a rank's share at resume); default all. `extras` (default:
    when checking all): a file the manifest does not list is a mismatch too, as DeepSpeed would load a file put
    there after the save by its name alone."""
    folder = Path(folder)
    out = Verified()
    if extras if extras is not None else only is None:
        try:
            found = files_on_disk(folder)
        except OSError as exc:
            found = []
            out.mismatches.append(Mismatch(".", f"cannot be listed ({exc.strerror or exc})"))
        out.mismatches += [Mismatch(rel, "is not in its manifest: put there after the save")
                           for rel in found if rel not in manifest.files]
        out.mismatches += [Mismatch(p.relative_to(folder).as_posix(), f"is {kind_of(p)}: a checkpoint holds plain "
                                    "files only") for p in sorted(folder.rglob("*"))
                           if p.is_symlink() and p.relative_to(folder).as_posix() not in manifest.files]
    for rel in sorted(manifest.files if only is None else only):
        want = manifest.files[rel]
        path = folder / rel
        if path.is_symlink() or (path.exists() and not path.is_file()):
            out.mismatches.append(Mismatch(rel, f"is {kind_of(path)}, not a plain file"))
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            out.mismatches.append(Mismatch(rel, "missing"))
            continue
        if size != want.size:
            out.mismatches.append(Mismatch(rel, f"is {size} bytes, its manifest says {want.size}"))
            continue
        if hashes:
            got = hash_file(path)
            out.bytes_read += got.size
            if got.xxh3 != want.xxh3:
                out.mismatches.append(Mismatch(rel, f"content differs from its manifest ({HASH} {got.xxh3[:12]}, "
                                                    f"recorded {want.xxh3[:12]})"))
    return out


def files_on_disk(folder: Path) -> list[str]:
    """Every plain file below the folder but the manifest, as sorted relative POSIX paths."""
    folder = Path(folder)
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not p.is_symlink() and p.name != MANIFEST
                  and not p.name.startswith(f".{MANIFEST}."))


# ----------------------------------------------------------------------------- checkpoints saved before manifests

def zip_problem(path: Path) -> str | None:
    """Why a torch file is not a whole zip archive (truncated, a member whose bytes fail its CRC-32), or None.
    Reads every member's bytes through zipfile; nothing is unpickled."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"not a whole zip archive ({type(exc).__name__}: {excerpt(str(exc))}): cut short or damaged"
    return None if bad is None else f"member {excerpt(bad)} fails its CRC-32: the file was damaged after the save"


def adopt(folder: Path, *, iteration: int, run_id: str, experiment: str, layout: dict, optimizer: bool,
          now: float | None = None) -> Manifest:
    """Write the manifest of a checkpoint saved before manifests, after checking that every `.pt` file is a whole
    zip archive; a ManifestError names the first file that is not (and nothing is written)."""
    folder = Path(folder)
    files = files_on_disk(folder)
    for rel in files:
        path = folder / rel
        if path.suffix == ".pt":
            why = zip_problem(path)
            if why:
                raise ManifestError(f"{path}: {why}; {folder.name} was saved before manifests and cannot be adopted")
    manifest = Manifest(folder.name, iteration, run_id, experiment, layout, optimizer,
                        {rel: record_file(folder / rel) for rel in files},
                        time.time() if now is None else now, adopted=True)
    commit(folder, manifest)
    return manifest
