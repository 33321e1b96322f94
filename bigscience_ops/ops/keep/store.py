"""The backup store: what a bsops store is, what a copy in it is, and whether a copy is whole.

A store (backup.dest, or --to) is a folder marked as a bsops store (`.bsops-store`); anything else that holds
files is refused, so the backup never writes into, or deletes because of, a folder it did not make. Each run has
its own part of it, <store>/<experiment>/<run id>/. There, a checkpoint's copy is the entry <tag> (or <tag>.N for
a later checkpoint saved under the same tag): a folder or <entry>.tar, and <entry>.manifest.json, written last. A
copy is in the store exactly when that manifest is there and is one the backup wrote (every field checked here:
the store's files are untrusted input like the run's). `is_backed_up` is the cheap check (every file there with
its size); `verify` re-reads every byte against the manifest's sha256. An interrupted copy lives in
<run store>/.partial/<entry>/ with a journal line per file copied (ops/keep/backup.py writes it; read here).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import tarfile
from pathlib import Path

from bigscience_ops.checkpoints import layout, manifest
from bigscience_ops.checkpoints.layout import Checkpoint
from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import (
    MAX_STEP, Checked, Problem, RecordFileError, check_int, check_time, excerpt, jsonl_lines, read_small,
)

MANIFEST_SUFFIX = ".manifest.json"
PARTIAL = ".partial"
JOURNAL = ".journal.jsonl"
SOURCE = ".source.json"  # in a partial copy: the fingerprint of the checkpoint it is a copy of
STORE_MARKER = ".bsops-store"
CHUNK = 8 * 1024 * 1024
MANIFEST_LIMIT = 64 << 20
"""The largest manifest read: one of a checkpoint of ten thousand files is a few MB."""
KINDS = ("whole", "weights-only")
_SHA256 = frozenset("0123456789abcdef")


class BackupError(BsopsError):
    """A backup cannot run or a copy does not match its source."""


def open_store(dest: Path, create: bool = True) -> Path:
    """`dest` as a bsops store: made (with its marker) when missing or empty; refused when it holds anything else."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise BackupError(f"backup destination {dest} is a file; give a folder (an empty one, or a bsops store)")
    if (dest / STORE_MARKER).is_file():
        return dest
    if dest.is_dir() and any(dest.iterdir()):
        raise BackupError(f"backup destination {dest} holds files but is not a bsops backup store (it has no "
                          f"{STORE_MARKER}): nothing is written there, and nothing is deleted because of it; give an "
                          "empty or new folder, or a store an earlier backup made")
    if create:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / STORE_MARKER).write_text(json.dumps({"bsops": "backup store", "version": 2}) + "\n", encoding="utf-8")
    return dest


def run_store(dest: Path, experiment: str, run_id: str) -> Path:
    """This run's part of the store."""
    if experiment in ("", ".", "..") or "/" in experiment or "\0" in experiment:
        raise BackupError(f"experiment name {experiment!r} cannot name a folder of the backup store")
    return Path(dest) / experiment / run_id


def manifest_path(store: Path, entry: str) -> Path:
    return Path(store) / f"{entry}{MANIFEST_SUFFIX}"


def entries(store: Path) -> list[str]:
    """The copies in a run's store, by entry name (a tag, or tag.N for a later checkpoint of the same tag)."""
    store = Path(store)
    if not store.is_dir():
        return []
    return sorted(p.name[:-len(MANIFEST_SUFFIX)] for p in store.iterdir() if p.name.endswith(MANIFEST_SUFFIX))


def find_copy(store: Path, ckpt: Checkpoint, source: dict[str, list[int]]) -> str | None:
    """The entry holding a copy of this very checkpoint (its tag, and its files as they are now), or None."""
    for entry in entries(store):
        if entry != ckpt.tag and not entry.startswith(f"{ckpt.tag}."):
            continue
        manifest = read_manifest(store, entry)
        if manifest and manifest.get("tag") == ckpt.tag and manifest.get("source_files") == source \
                and is_backed_up(store, entry):
            return entry
    return None


def read_manifest(dest: Path, tag: str) -> dict | None:
    """The manifest of entry `tag` when it is one this backup wrote (every field checked), else None: a copy
    whose manifest is missing, unreadable or not such a manifest is not in the backup."""
    return manifest_checked(dest, tag)[0]


def manifest_checked(dest: Path, entry: str) -> tuple[dict | None, Problem | None]:
    """(the manifest of `entry`, None), (None, None) when it has none, or (None, what is wrong with it): a link,
    a FIFO, a huge file, no JSON object, a field of the wrong type or out of range."""
    path = manifest_path(dest, entry)
    try:
        data = read_small(path, MANIFEST_LIMIT)
    except RecordFileError as exc:
        return None, Problem(str(path), 0, exc.what)
    if data is None:
        return None, None
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None, Problem(str(path), 0, "not a JSON manifest", excerpt(data))
    why = _manifest_problem(manifest)
    return (None, Problem(str(path), 0, why)) if why else (manifest, None)


def _manifest_problem(manifest: object) -> str | None:
    """What makes `manifest` not one this backup writes, or None."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not a manifest (a JSON object)"
    tag = manifest.get("tag")
    if not isinstance(tag, str) or layout.step_of(tag) is None:
        return f"field tag: got {excerpt(str(tag))}; expected global_stepN"
    why = check_int(manifest.get("step"), 0, MAX_STEP)
    if why:
        return f"field step: {why}"
    if manifest.get("kind") not in KINDS:
        return f"field kind: got {excerpt(str(manifest.get('kind')))}; expected one of {', '.join(KINDS)}"
    try:  # a time the chronicle and `info` can show: from 1970 to the year 9999
        verified = dt.datetime.fromisoformat(manifest.get("verified_at")).timestamp()  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        verified = None
    if verified is None or check_time(verified):
        return f"field verified_at: got {excerpt(str(manifest.get('verified_at')))}; expected an ISO date and time"
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(rel, str) and _file_entry(e) for rel, e in files.items()):
        return "field files: expected {path: {size: bytes, sha256: 64 hex digits}} for every file"
    source = manifest.get("source_files")
    if not isinstance(source, dict) or not all(
            isinstance(rel, str) and isinstance(v, list) and len(v) == 2 and not any(check_int(n, 0, 2**63) for n in v)
            for rel, v in source.items()):
        return "field source_files: expected {path: [size, mtime_ns]} for every file of the checkpoint"
    if not isinstance(manifest.get("tar", False), bool):
        return "field tar: expected true or false"
    if manifest.get("tar") and check_int(manifest.get("tar_size"), 0, 2**63):
        return "field tar_size: expected the tar's size in bytes"
    return None


def _file_entry(entry: object) -> bool:
    return (isinstance(entry, dict) and check_int(entry.get("size"), 0, 2**63) is None
            and isinstance(entry.get("sha256"), str) and len(entry["sha256"]) == 64
            and set(entry["sha256"]) <= _SHA256)


def manifests(store: Path) -> Checked[tuple[str, dict]]:
    """Every (entry, manifest) of a run's store, and a problem for each manifest that is not one this backup wrote."""
    out: Checked[tuple[str, dict]] = Checked()
    for entry in entries(store):
        manifest, problem = manifest_checked(store, entry)
        if problem is not None:
            out.problems.append(problem)
        elif manifest is not None:
            out.records.append((entry, manifest))
    return out


def store_problems(store: Path) -> list[Problem]:
    """What in a run's store cannot be read: manifests that are not this backup's, and journals of interrupted
    copies with a bad line before their last (a last line cut short is what a killed copy leaves: it is redone)."""
    problems = manifests(store).problems
    partial = Path(store) / PARTIAL
    if partial.is_dir() and not partial.is_symlink():
        for staged in sorted(partial.iterdir()):
            if staged.is_dir() and not staged.is_symlink():
                problems += journal_checked(staged)[1]
    return problems


def is_backed_up(dest: Path, tag: str) -> bool:
    """A manifest is there and every file it lists is present with its size (the cheap check retention uses)."""
    manifest = read_manifest(dest, tag)
    if manifest is None:
        return False
    if manifest.get("tar"):
        path = Path(dest) / f"{tag}.tar"
        return path.is_file() and path.stat().st_size == manifest["tar_size"]
    folder = Path(dest) / tag
    return all((folder / rel).is_file() and (folder / rel).stat().st_size == entry["size"]
               for rel, entry in manifest["files"].items())


def verify(dest: Path, tag: str) -> list[str]:
    """Re-read every backed-up file of `tag` and compare with its manifest; returns the mismatches (empty: verified)."""
    manifest = read_manifest(dest, tag)
    if manifest is None:
        return [f"{manifest_path(dest, tag)}: missing or unreadable"]
    if manifest.get("tar"):
        return verify_tar(Path(dest) / f"{tag}.tar", manifest["files"])
    return verify_folder(Path(dest) / tag, manifest["files"])


def verify_folder(folder: Path, files: dict, saved: dict[str, manifest.FileRecord] | None = None) -> list[str]:
    """Re-read every copied file: its size and sha256 against what was read from the source, and its xxh3_128
    against the checkpoint's own manifest (`saved`, for the files copied byte for byte)."""
    bad = []
    for rel, entry in files.items():
        path = folder / rel
        if not path.is_file():
            bad.append(f"{path}: missing")
            continue
        size, digest, xxh3 = hashes(path)
        if (size, digest) != (entry["size"], entry["sha256"]):
            bad.append(f"{path}: size {size} sha256 {digest[:12]}, manifest {entry['size']} {entry['sha256'][:12]}")
        elif saved is not None and rel in saved and (size, xxh3) != (saved[rel].size, saved[rel].xxh3):
            bad.append(f"{path}: does not match the checkpoint's manifest (size {size}, xxh3_128 {xxh3[:12]}; "
                       f"saved {saved[rel].size}, {saved[rel].xxh3[:12]})")
    extra = sorted({p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - set(files))
    return bad + [f"{folder / rel}: not in the manifest" for rel in extra]


def verify_tar(path: Path, files: dict) -> list[str]:
    seen, bad = set(), []
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                handle = tar.extractfile(member)
                digest, size = hashlib.sha256(), 0
                while chunk := handle.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                entry = files.get(member.name)
                seen.add(member.name)
                if entry is None or (size, digest.hexdigest()) != (entry["size"], entry["sha256"]):
                    bad.append(f"{path}:{member.name}: does not match the manifest")
    except (OSError, tarfile.TarError) as exc:
        return [f"{path}: unreadable ({exc})"]
    return bad + [f"{path}:{rel}: missing" for rel in sorted(set(files) - seen)]


def hash_file(path: Path) -> tuple[int, str]:
    size, digest, _ = hashes(path)
    return size, digest


def hashes(path: Path) -> tuple[int, str, str]:
    """(size, sha256, xxh3_128) of a file, in one read."""
    import xxhash

    digest, fast, size = hashlib.sha256(), xxhash.xxh3_128(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            fast.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest(), fast.hexdigest()


def journal_vouched(staging: Path) -> dict[str, dict]:
    return journal_checked(staging)[0]


def journal_checked(staging: Path) -> tuple[dict[str, dict], list[Problem]]:
    """What an interrupted copy's journal vouches for, up to its first bad line (what follows is redone), and a
    problem for a bad line that is not a last line cut short by the kill."""
    done: dict[str, dict] = {}
    lines = list(jsonl_lines(staging / JOURNAL))
    for i, (number, entry, problem) in enumerate(lines):
        if problem is None and isinstance(entry, dict) and isinstance(entry.get("path"), str) and _file_entry(entry):
            done[entry["path"]] = {"size": entry["size"], "sha256": entry["sha256"]}
            continue
        last_cut = i == len(lines) - 1 and problem is not None and problem.what.startswith("cut short")
        if last_cut:
            return done, []
        return done, [problem or Problem(str(staging / JOURNAL), number, "not a journal line (path, size, sha256)")]
    return done, []
