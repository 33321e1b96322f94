"""Checkpoint backup: weights-only copies (the final checkpoint whole), a verified manifest each, then scratch retention.

The store (backup.dest, or --to) is a folder marked as a bsops store (`.bsops-store`); anything else
that holds files is refused, so the backup never writes into, or deletes because of, a folder it did
not make. Each run has its own part of it, <store>/<experiment>/<run id>/, the run id being the one the
trainer wrote when the run started from scratch (checkpoints/layout.py): two experiments sharing a
store, or a run restarted from scratch, never mistake each other's copies for their own.

For each committed checkpoint (its manifest, checkpoints/manifest.py, is the one thing trusted: a folder without
one is a save in progress or cut short, and is left alone) whose copy is not in the store:
- its files are checked against the manifest before a byte is copied (sizes), and every byte read is hashed and
  compared with it as it is copied (xxh3_128 beside the store's sha256): a checkpoint that does not match is not
  copied, and is reported with the file named (the command exits non-zero, the alert names it);
- weights-only unless it must keep its optimizer state (the final step of the training, and every
  step that is a multiple of backup.keep_optimizer_every): `*optim_states.pt` files are left out,
  and `mp_rank_*_model_states.pt`, which holds the optimizer under ZeRO-0, is rewritten without it,
  read with torch's restricted loader (weights_only=True): nothing in a checkpoint file is ever run,
  and a file that loader refuses (corrupt or crafted) is reported and its checkpoint left uncopied;
- files are copied into <run store>/.partial/<entry>/ with a journal line each (size, sha256); a run
  killed half-way leaves that folder, and the next run keeps what the journal vouches for;
- every file is re-read and checked against the sha256 taken from the source and, unless rewritten, against the
  checkpoint's own manifest; the folder (or one tar per checkpoint) moves into place, with the checkpoint's
  manifest.json in a whole copy (so a restored copy is a committed checkpoint), and <entry>.manifest.json is
  written last: a checkpoint is in
  the backup exactly when its manifest is there. The manifest records the source: the run id, the
  experiment, the tag, and each source file's size and modification time, so a copy is of "that very
  checkpoint" only while the files on scratch are the ones copied (a checkpoint saved again under the
  same tag after a rollback is a new checkpoint, stored as <tag>.2).
Then retention (checkpoints/retention.py) deletes from scratch only complete checkpoints with such a copy, and
never the newest resumable one without a verified whole copy; every deletion is listed in the report (and, when
the backup fails, in its alert).
One checkpoint that cannot be copied is reported and skipped; the others are still backed up.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.checkpoints import layout, manifest, retention
from bigscience_ops.checkpoints.layout import Checkpoint, CheckpointError
from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import (
    MAX_STEP, Checked, Problem, RecordFileError, check_int, check_time, excerpt, jsonl_lines, read_small, write_atomically,
)
from bigscience_ops.run_schedule import RunSchedule, run_schedule
from bigscience_ops.schema import Experiment

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


@dataclass
class Planned:
    """What backing up one checkpoint means."""

    ckpt: Checkpoint
    whole: bool
    files: list[str]  # relative paths to write
    left_out: list[str]  # optimizer partitions not copied
    rewritten: list[str]  # model-states files written without their optimizer state
    size: int  # bytes read from scratch
    source: dict[str, list[int]] = field(default_factory=dict)  # every file of the checkpoint: [size, mtime_ns]


@dataclass
class Report:
    dest: Path
    backed_up: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)  # tags whose interrupted copy was finished
    already: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)
    retention: retention.Decision | None = None
    deleted: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # tag -> why it was not backed up
    incomplete: list[str] = field(default_factory=list)  # folders without a committed manifest: not copied
    left_on_scratch: dict[str, str] = field(default_factory=dict)  # folder -> why retention could not delete
    # it where it is (a symbolic link, not a folder)
    store: Path | None = None  # this run's part of the store: <dest>/<experiment>/<run id>


class Progress:
    """Told about the work as it goes (the CLI shows a bar or lines); the default says nothing."""

    def begin(self, plan: Planned) -> None: ...
    def advance(self, nbytes: int) -> None: ...
    def end(self, plan: Planned, resumed: bool) -> None: ...


def destination(exp: Experiment, to: Path | None) -> Path:
    if to is not None:
        return Path(to)
    if exp.backup.dest:
        return Path(exp.backup.dest)
    raise BackupError(f"no backup destination for {exp.name!r}: set backup.dest in the experiment or pass --to DEST")


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


def fingerprint(ckpt: Checkpoint) -> dict[str, list[int]]:
    """Every file of the checkpoint with [size, mtime_ns]; a symbolic link (the folder or anything in it) is a
    BackupError (never followed)."""
    if ckpt.path.is_symlink():
        raise BackupError(f"{ckpt.path} is a symbolic link (to {os.readlink(ckpt.path)!r}), not the checkpoint's own "
                          f"folder: {ckpt.tag} is not backed up (nor deleted); move the folder itself there")
    out: dict[str, list[int]] = {}
    for root, dirs, files in os.walk(ckpt.path, followlinks=False):
        for name in dirs + files:
            path = Path(root) / name
            if path.is_symlink():
                raise BackupError(f"{path} is a symbolic link (to {os.readlink(path)!r}): a checkpoint holds plain "
                                  f"files only, so {ckpt.tag} is not backed up (nor deleted); remove the link")
        for name in files:
            path = Path(root) / name
            st = path.stat()
            out[path.relative_to(ckpt.path).as_posix()] = [st.st_size, st.st_mtime_ns]
    return dict(sorted(out.items()))


def keeps_optimizer(exp: Experiment, schedule: RunSchedule, step: int) -> bool:
    """Whether the backup keeps this step's optimizer states: the final step and every keep_optimizer_every-th."""
    every = exp.backup.keep_optimizer_every
    return step == schedule.train_iters or bool(every and step % every == 0)


def plan_checkpoint(ckpt: Checkpoint, whole: bool, source: dict[str, list[int]] | None = None) -> Planned:
    """What copying `ckpt` means: the files its manifest lists (and the manifest itself in a whole copy); in a
    weights-only copy the optimizer partitions are left out and the model-states files rewritten without it."""
    source = fingerprint(ckpt) if source is None else source
    listed = ckpt.committed()
    files, left_out, rewritten = [], [], []
    for rel in source:
        if listed is None or (rel not in listed.files and not (whole and rel == manifest.MANIFEST)):
            left_out.append(rel)  # not part of the committed checkpoint (or, weights-only, its manifest)
            continue
        if not whole and layout.is_optimizer_file(rel):
            left_out.append(rel)
            continue
        files.append(rel)
        if not whole and layout.is_model_states_file(rel):
            rewritten.append(rel)
    size = sum(source[rel][0] for rel in files)
    return Planned(ckpt, whole, files, left_out, rewritten, size, source)


# ----------------------------------------------------------------------------- manifests

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


def _entry_for(store: Path, ckpt: Checkpoint, source: dict[str, list[int]]) -> str:
    """Where a new copy of `ckpt` goes: its interrupted copy's entry, else its tag, else the first free tag.N."""
    partial = Path(store) / PARTIAL
    if partial.is_dir():
        for staged in sorted(partial.iterdir()):
            try:
                if staged.is_dir() and not staged.is_symlink() and json.loads(
                        read_small(staged / SOURCE, MANIFEST_LIMIT) or b"null") == {"tag": ckpt.tag,
                                                                                    "source_files": source}:
                    return staged.name
            except (BsopsError, OSError, ValueError, RecursionError):
                continue
    # A folder without a manifest is a copy moved into place but never vouched for: it is finished (or redone).
    taken = set(entries(store)) | ({p.name for p in partial.iterdir()} if partial.is_dir() else set())
    entry, n = ckpt.tag, 1
    while entry in taken:
        n += 1
        entry = f"{ckpt.tag}.{n}"
    return entry


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
                problems += _journal_checked(staged)[1]
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
        return _verify_tar(Path(dest) / f"{tag}.tar", manifest["files"])
    return _verify_folder(Path(dest) / tag, manifest["files"])


def _verify_folder(folder: Path, files: dict, saved: dict[str, manifest.FileRecord] | None = None) -> list[str]:
    """Re-read every copied file: its size and sha256 against what was read from the source, and its xxh3_128
    against the checkpoint's own manifest (`saved`, for the files copied byte for byte)."""
    bad = []
    for rel, entry in files.items():
        path = folder / rel
        if not path.is_file():
            bad.append(f"{path}: missing")
            continue
        size, digest, xxh3 = _hashes(path)
        if (size, digest) != (entry["size"], entry["sha256"]):
            bad.append(f"{path}: size {size} sha256 {digest[:12]}, manifest {entry['size']} {entry['sha256'][:12]}")
        elif saved is not None and rel in saved and (size, xxh3) != (saved[rel].size, saved[rel].xxh3):
            bad.append(f"{path}: does not match the checkpoint's manifest (size {size}, xxh3_128 {xxh3[:12]}; "
                       f"saved {saved[rel].size}, {saved[rel].xxh3[:12]})")
    extra = sorted({p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - set(files))
    return bad + [f"{folder / rel}: not in the manifest" for rel in extra]


def _verify_tar(path: Path, files: dict) -> list[str]:
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


# ----------------------------------------------------------------------------- copying

def _hash_file(path: Path) -> tuple[int, str]:
    size, digest, _ = _hashes(path)
    return size, digest


def _hashes(path: Path) -> tuple[int, str, str]:
    """(size, sha256, xxh3_128) of a file, in one read."""
    import xxhash

    digest, fast, size = hashlib.sha256(), xxhash.xxh3_128(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            fast.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest(), fast.hexdigest()


def _copy_file(src: Path, dst: Path, advance: Callable[[int], None],
               saved: manifest.FileRecord | None = None) -> tuple[int, str]:
    """Copy through a temporary name, fsync, rename; returns (size, sha256 of what was read). With `saved` (the
    checkpoint manifest's record of the file), what was read must match it, or nothing is put in place."""
    import xxhash

    tmp = dst.with_name(f".{dst.name}.tmp")
    digest, fast, size = hashlib.sha256(), xxhash.xxh3_128(), 0
    with open(src, "rb") as reader, open(tmp, "wb") as writer:
        while chunk := reader.read(CHUNK):
            writer.write(chunk)
            digest.update(chunk)
            fast.update(chunk)
            size += len(chunk)
            advance(len(chunk))
        writer.flush()
        os.fsync(writer.fileno())
    if saved is not None and (size, fast.hexdigest()) != (saved.size, saved.xxh3):
        tmp.unlink()
        raise BackupError(_not_as_saved(src, size, fast.hexdigest(), saved))
    os.replace(tmp, dst)
    return size, digest.hexdigest()


def _not_as_saved(src: Path, size: int, xxh3: str, saved: manifest.FileRecord) -> str:
    return (f"{src} does not match its checkpoint's manifest (read {size} bytes, xxh3_128 {xxh3[:12]}; saved "
            f"{saved.size} bytes, {saved.xxh3[:12]}): it changed or was damaged after the save, so its checkpoint is "
            "not backed up (nor deleted); the next resume sets it aside and falls back to the newest checkpoint "
            "that matches")


def _write_weights_only(src: Path, dst: Path, advance: Callable[[int], None],
                        saved: manifest.FileRecord | None = None) -> tuple[int, str]:
    """DeepSpeed's mp_rank_*_model_states.pt without the optimizer state it holds under ZeRO-0; the source is
    checked against its checkpoint's manifest (`saved`) before it is read."""
    import torch  # lazy: only this step of the backup needs it

    if saved is not None:
        now = manifest.hash_file(src)
        if now != saved:
            raise BackupError(_not_as_saved(src, now.size, now.xxh3, saved))
    try:  # the restricted loader: tensors and plain values only; no object in the file is built or run
        state = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - an unpickling refusal, a corrupt or truncated file: all one answer
        why = " ".join(str(exc).split())[:300]
        raise BackupError(f"{src} cannot be read with torch's restricted loader ({type(exc).__name__}: {why}): a "
                          "model-states file holds tensors and plain values, so this one is corrupt or was not "
                          "written by the trainer; its checkpoint is not backed up (nor deleted). Inspect the file, "
                          "or let backup.keep_optimizer_every copy that step whole, byte for byte") from None
    advance(src.stat().st_size)
    if isinstance(state, dict) and state.get("optimizer") is not None:
        state["optimizer"] = None
    tmp = dst.with_name(f".{dst.name}.tmp")
    with open(tmp, "wb") as writer:
        torch.save(state, writer)
        writer.flush()
        os.fsync(writer.fileno())
    os.replace(tmp, dst)
    return _hash_file(dst)


def _journal(staging: Path) -> dict[str, dict]:
    return _journal_checked(staging)[0]


def _journal_checked(staging: Path) -> tuple[dict[str, dict], list[Problem]]:
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


def _copy_checkpoint(plan: Planned, dest: Path, tar: bool, progress: Progress, about: dict) -> bool:
    """Copy, verify and commit one checkpoint into the run store `dest`; returns whether an interrupted copy
    was resumed. `about` (run id, experiment) goes into the manifest."""
    tag = plan.ckpt.tag
    saved = plan.ckpt.committed()
    if saved is None:
        raise BackupError(f"{plan.ckpt.path} has no committed manifest whose files are all there: not a complete "
                          "checkpoint, so not copied")
    entry = _entry_for(dest, plan.ckpt, plan.source)
    staging = dest / PARTIAL / entry
    final = dest / entry
    if final.is_dir() and not manifest_path(dest, entry).exists():
        staging.parent.mkdir(parents=True, exist_ok=True)
        if staging.exists():
            shutil.rmtree(staging)
        final.rename(staging)  # moved into place but not yet vouched for: finish it as an interrupted copy
    resumed = staging.is_dir()
    staging.mkdir(parents=True, exist_ok=True)
    (staging / SOURCE).write_text(json.dumps({"tag": tag, "source_files": plan.source}), encoding="utf-8")
    done = _journal(staging)
    progress.begin(plan)
    files: dict[str, dict] = {}
    with open(staging / JOURNAL, "a", encoding="utf-8") as journal:
        for rel in plan.files:
            src, dst = plan.ckpt.path / rel, staging / rel
            journaled = done.get(rel)
            if journaled and dst.is_file() and dst.stat().st_size == journaled["size"]:
                files[rel] = journaled
                progress.advance(src.stat().st_size)
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            write = _write_weights_only if rel in plan.rewritten else _copy_file
            try:
                size, digest = write(src, dst, progress.advance, saved.files.get(rel))
            except BackupError:
                shutil.rmtree(staging, ignore_errors=True)  # nothing of a checkpoint that is not as saved is kept
                raise
            files[rel] = {"size": size, "sha256": digest}
            journal.write(json.dumps({"path": rel, **files[rel]}) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
    (staging / JOURNAL).unlink()
    (staging / SOURCE).unlink()
    for stray in [p for p in staging.rglob(".*.tmp") if p.is_file()]:
        stray.unlink()
    bad = _verify_folder(staging, files, {rel: rec for rel, rec in saved.files.items() if rel not in plan.rewritten})
    if bad:
        shutil.rmtree(staging)
        raise BackupError(f"the copy of {plan.ckpt.path} does not match its source: {'; '.join(bad[:5])}; "
                          "the partial copy was removed and the next run copies it again")
    manifest = {"tag": tag, "entry": entry, "step": plan.ckpt.step, **about,
                "kind": "whole" if plan.whole else "weights-only", "source": str(plan.ckpt.path),
                "source_files": plan.source, "left_out": plan.left_out, "rewritten": plan.rewritten,
                "tar": tar, "files": files,
                "verified_at": dt.datetime.now().astimezone().isoformat(timespec="seconds")}
    if tar:
        target = dest / f"{entry}.tar"
        tmp = dest / PARTIAL / f"{entry}.tar.tmp"
        with tarfile.open(tmp, "w") as archive:
            for rel in sorted(files):
                archive.add(staging / rel, arcname=rel, recursive=False)
        os.replace(tmp, target)
        bad = _verify_tar(target, files)
        if bad:  # neither the tar nor the staged files are kept: the next run copies the checkpoint again
            target.unlink()
            shutil.rmtree(staging)
            raise BackupError(f"{target} does not match the copied files: {'; '.join(bad[:5])}")
        manifest["tar_size"] = target.stat().st_size
    else:
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    write_atomically(manifest_path(dest, entry), (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
    if tar:
        shutil.rmtree(staging)
    progress.end(plan, resumed)
    return resumed


def run_backup(exp: Experiment, to: Path | None = None, dry_run: bool = False,
               progress: Progress | None = None) -> Report:
    """Back up every complete checkpoint without a copy in the store, then apply scratch retention.

    A checkpoint that cannot be copied is in `Report.failed` (the others go on), a folder retention had to
    leave in place in `Report.left_on_scratch`; the CLI reports both as one error.
    """
    dest = destination(exp, to)
    scratch = Path(exp.paths.checkpoints)
    if not scratch.is_dir():
        raise BackupError(f"{scratch} (paths.checkpoints of {exp.name!r}) does not exist: nothing to back up")
    if dest.resolve() == scratch.resolve() or scratch.resolve() in dest.resolve().parents:
        raise BackupError(f"backup destination {dest} is inside the checkpoints folder {scratch}; choose another store")
    if dest.resolve() in scratch.resolve().parents:
        raise BackupError(f"backup destination {dest} holds the checkpoints folder {scratch}; choose another store")
    open_store(dest, create=not dry_run)
    run_id = layout.run_id(scratch) if dry_run else layout.ensure_run_id(scratch)
    store = run_store(dest, exp.name, run_id or "new-run")
    progress = progress or Progress()
    report = Report(dest, store=store)
    schedule = run_schedule(exp)
    for ckpt in _candidates(scratch, report):
        refusal = ckpt.refusal()
        if refusal is not None:  # a global_stepN that is a link: neither copied nor deleted
            report.failed[ckpt.tag] = refusal
            continue
        why = _not_as_committed(ckpt)
        if why is not None:
            report.failed[ckpt.tag] = why
            continue
        try:
            source = fingerprint(ckpt)
        except (BackupError, OSError) as exc:
            report.failed[ckpt.tag] = str(exc)
            continue
        if find_copy(store, ckpt, source):
            report.already.append(ckpt.tag)
            continue
        report.planned.append(plan_checkpoint(ckpt, keeps_optimizer(exp, schedule, ckpt.step), source))
    if not dry_run:
        store.mkdir(parents=True, exist_ok=True)
        about = {"run_id": run_id, "experiment": exp.name}
        for plan in report.planned:
            try:
                if _copy_checkpoint(plan, store, exp.backup.tar, progress, about):
                    report.resumed.append(plan.ckpt.tag)
                report.backed_up.append(plan.ckpt.tag)
            except (BackupError, OSError) as exc:
                report.failed[plan.ckpt.tag] = str(exc)
    report.retention, applied = _retention(exp, scratch, store, dry_run)
    report.deleted = applied.deleted
    report.left_on_scratch = dict(applied.refused)
    return report


def _candidates(scratch: Path, report: Report) -> list[Checkpoint]:
    """The checkpoints with a manifest (readable or not: one that is not is reported), and every global_stepN that
    is a link (to be refused by name); the folders without one go into `report.incomplete` (saves in progress or
    cut short: the trainer's resume sets those aside). A `latest` that cannot be read is reported too (retention
    then deletes nothing); the copies go on."""
    try:
        layout.latest_tag(scratch)
    except CheckpointError as exc:
        report.failed[layout.LATEST] = f"{exc}; nothing is deleted until the next training task repairs it"
    out = []
    for ckpt in layout.list_checkpoints(scratch):
        if ckpt.is_link or (ckpt.path / manifest.MANIFEST).exists() or (ckpt.path / manifest.MANIFEST).is_symlink():
            out.append(ckpt)
        else:
            report.incomplete.append(ckpt.tag)
    return out


def _not_as_committed(ckpt: Checkpoint) -> str | None:
    """Why a checkpoint with a manifest is not what the manifest says (unreadable; a file missing, of another size),
    or None: such a checkpoint is not copied, and its failure names the file."""
    try:
        found = ckpt.manifest()
    except CheckpointError as exc:
        return f"{exc}: not copied (nor deleted)"
    bad = manifest.verify(ckpt.path, found, hashes=False).mismatches
    if not bad:
        return None
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return (f"{ckpt.path / bad[0].path} {bad[0].what}{more}: the checkpoint was damaged after its save, so it is not "
            "copied (nor deleted); the next resume sets it aside and falls back to the newest checkpoint that matches")


def _copied(store: Path, ckpt: Checkpoint) -> bool:
    """Whether the store holds a verified copy of this very checkpoint as its files are now."""
    return _copy_kind(store, ckpt) is not None


def _copy_kind(store: Path, ckpt: Checkpoint) -> str | None:
    """The kind ("whole", "weights-only") of the store's copy of this very checkpoint, None when it has none."""
    try:
        entry = find_copy(store, ckpt, fingerprint(ckpt))
    except (BackupError, OSError):
        return None
    found = read_manifest(store, entry) if entry is not None else None
    return found.get("kind") if found is not None else None


def _retention(exp: Experiment, scratch: Path, store: Path, dry_run: bool
               ) -> tuple[retention.Decision, retention.Applied]:
    """Retention over the complete checkpoints (committed manifests): the decision, then what was deleted. The
    newest resumable checkpoint is protected (retention.protect_resumable) whenever anything would go."""
    checkpoints = layout.complete_checkpoints(scratch)
    try:
        layout.latest_tag(scratch)
    except CheckpointError:  # reported by the copy's candidates; the trainer's resume repairs it
        return retention.Decision({c.step: "`latest` cannot be read: nothing is deleted" for c in checkpoints}), \
            retention.Applied()
    kinds = {c.step: _copy_kind(store, c) for c in checkpoints}
    verified = {step for step, kind in kinds.items() if kind is not None}
    args = ([c.step for c in checkpoints], layout.resume_step(scratch), verified, exp.backup.keep_last,
            exp.backup.keep_every)
    decision = retention.decide(*args)
    if decision.delete:
        def mismatch(ckpt: Checkpoint, found: manifest.Manifest) -> str | None:
            bad = manifest.verify(ckpt.path, found).mismatches
            return str(bad[0]) if bad else None

        protected = retention.protect_resumable(
            checkpoints, lambda c: kinds.get(c.step) == "whole" and verify(store, find_copy(
                store, c, fingerprint(c)) or "") == [], mismatch)
        decision = retention.decide(*args, protected=protected)
    if dry_run or not decision.delete:
        return decision, retention.Applied()
    # Where the run resumes from is read again right before deleting: a save that finished meanwhile must not lose
    # its base, and a rollback that moved it back keeps everything after it.
    # Its copy is re-read and checked against the manifest's sha256 right before: a copy damaged since
    # it was made never stands in for a checkpoint that is deleted.
    def still_safe(ckpt: Checkpoint) -> bool:
        now = layout.resume_step(scratch)
        if now is None or ckpt.step >= now:
            return False
        try:
            entry = find_copy(store, ckpt, fingerprint(ckpt))
        except (BackupError, OSError):
            return False
        return entry is not None and verify(store, entry) == []

    return decision, retention.apply(checkpoints, decision, still_safe)
