"""Checkpoint backup: weights-only copies (the final checkpoint whole), a verified manifest each, then scratch retention.

For each complete checkpoint not yet in the backup (checkpoints/layout.py says which are complete):
- weights-only unless it must keep its optimizer state (the final step of the training, and every
  step that is a multiple of backup.keep_optimizer_every): `*optim_states.pt` files are left out,
  and `mp_rank_*_model_states.pt`, which holds the optimizer under ZeRO-0, is rewritten without it;
- files are copied into <dest>/.partial/<tag>/ with a journal line each (size, sha256); a run
  killed half-way leaves that folder, and the next run keeps what the journal vouches for;
- every file is re-read and checked against the sha256 taken from the source, the folder (or one
  tar per checkpoint) moves into place, and <dest>/<tag>.manifest.json is written last: a
  checkpoint is in the backup exactly when its manifest is there.
Then retention (checkpoints/retention.py) deletes from scratch what the policy lets go.
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

from bigscience_ops.checkpoints import layout, retention
from bigscience_ops.checkpoints.layout import Checkpoint
from bigscience_ops.errors import BsopsError
from bigscience_ops.run_schedule import RunSchedule, run_schedule
from bigscience_ops.schema import Experiment

MANIFEST_SUFFIX = ".manifest.json"
PARTIAL = ".partial"
JOURNAL = ".journal.jsonl"
CHUNK = 8 * 1024 * 1024


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


@dataclass
class Report:
    dest: Path
    backed_up: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)  # tags whose interrupted copy was finished
    already: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)
    retention: retention.Decision | None = None
    deleted: list[str] = field(default_factory=list)


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


def keeps_optimizer(exp: Experiment, schedule: RunSchedule, step: int) -> bool:
    """Whether the backup keeps this step's optimizer states: the final step and every keep_optimizer_every-th."""
    every = exp.backup.keep_optimizer_every
    return step == schedule.train_iters or bool(every and step % every == 0)


def plan_checkpoint(ckpt: Checkpoint, whole: bool) -> Planned:
    files, left_out, rewritten = [], [], []
    for rel in ckpt.files():
        if not whole and layout.is_optimizer_file(rel):
            left_out.append(rel)
            continue
        files.append(rel)
        if not whole and layout.is_model_states_file(rel):
            rewritten.append(rel)
    size = sum((ckpt.path / rel).stat().st_size for rel in files)
    return Planned(ckpt, whole, files, left_out, rewritten, size)


# ----------------------------------------------------------------------------- manifests

def manifest_path(dest: Path, tag: str) -> Path:
    return Path(dest) / f"{tag}{MANIFEST_SUFFIX}"


def read_manifest(dest: Path, tag: str) -> dict | None:
    path = manifest_path(dest, tag)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


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


def _verify_folder(folder: Path, files: dict) -> list[str]:
    bad = []
    for rel, entry in files.items():
        path = folder / rel
        if not path.is_file():
            bad.append(f"{path}: missing")
            continue
        size, digest = _hash_file(path)
        if (size, digest) != (entry["size"], entry["sha256"]):
            bad.append(f"{path}: size {size} sha256 {digest[:12]}, manifest {entry['size']} {entry['sha256'][:12]}")
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
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _copy_file(src: Path, dst: Path, advance: Callable[[int], None]) -> tuple[int, str]:
    """Copy through a temporary name, fsync, rename; returns (size, sha256 of what was read)."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    digest, size = hashlib.sha256(), 0
    with open(src, "rb") as reader, open(tmp, "wb") as writer:
        while chunk := reader.read(CHUNK):
            writer.write(chunk)
            digest.update(chunk)
            size += len(chunk)
            advance(len(chunk))
        writer.flush()
        os.fsync(writer.fileno())
    os.replace(tmp, dst)
    return size, digest.hexdigest()


def _write_weights_only(src: Path, dst: Path, advance: Callable[[int], None]) -> tuple[int, str]:
    """DeepSpeed's mp_rank_*_model_states.pt without the optimizer state it holds under ZeRO-0."""
    import torch  # lazy: only this step of the backup needs it

    state = torch.load(src, map_location="cpu", weights_only=False)
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
    path = staging / JOURNAL
    done: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                done[entry["path"]] = {"size": entry["size"], "sha256": entry["sha256"]}
            except (json.JSONDecodeError, KeyError):
                break  # a line cut by the kill: what follows it is redone
    return done


def _copy_checkpoint(plan: Planned, dest: Path, tar: bool, progress: Progress) -> bool:
    """Copy, verify and commit one checkpoint; returns whether an interrupted copy was resumed."""
    tag = plan.ckpt.tag
    staging = dest / PARTIAL / tag
    final = dest / tag
    if final.is_dir() and not manifest_path(dest, tag).exists():
        staging.parent.mkdir(parents=True, exist_ok=True)
        if staging.exists():
            shutil.rmtree(staging)
        final.rename(staging)  # moved into place but not yet vouched for: finish it as an interrupted copy
    resumed = staging.is_dir()
    staging.mkdir(parents=True, exist_ok=True)
    done = _journal(staging)
    progress.begin(plan)
    files: dict[str, dict] = {}
    with open(staging / JOURNAL, "a", encoding="utf-8") as journal:
        for rel in plan.files:
            src, dst = plan.ckpt.path / rel, staging / rel
            entry = done.get(rel)
            if entry and dst.is_file() and dst.stat().st_size == entry["size"]:
                files[rel] = entry
                progress.advance(src.stat().st_size)
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            write = _write_weights_only if rel in plan.rewritten else _copy_file
            size, digest = write(src, dst, progress.advance)
            files[rel] = {"size": size, "sha256": digest}
            journal.write(json.dumps({"path": rel, **files[rel]}) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
    (staging / JOURNAL).unlink()
    for stray in [p for p in staging.rglob(".*.tmp") if p.is_file()]:
        stray.unlink()
    bad = _verify_folder(staging, files)
    if bad:
        shutil.rmtree(staging)
        raise BackupError(f"the copy of {plan.ckpt.path} does not match its source: {'; '.join(bad[:5])}; "
                          "the partial copy was removed and the next run copies it again")
    manifest = {"tag": tag, "step": plan.ckpt.step, "kind": "whole" if plan.whole else "weights-only",
                "source": str(plan.ckpt.path), "left_out": plan.left_out, "rewritten": plan.rewritten,
                "tar": tar, "files": files,
                "verified_at": dt.datetime.now().astimezone().isoformat(timespec="seconds")}
    if tar:
        target = dest / f"{tag}.tar"
        tmp = dest / PARTIAL / f"{tag}.tar.tmp"
        with tarfile.open(tmp, "w") as archive:
            for rel in sorted(files):
                archive.add(staging / rel, arcname=rel, recursive=False)
        os.replace(tmp, target)
        bad = _verify_tar(target, files)
        if bad:
            raise BackupError(f"{target} does not match the copied files: {'; '.join(bad[:5])}")
        manifest["tar_size"] = target.stat().st_size
    else:
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    tmp_manifest = dest / PARTIAL / f"{tag}{MANIFEST_SUFFIX}.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp_manifest, manifest_path(dest, tag))
    if tar:
        shutil.rmtree(staging)
    progress.end(plan, resumed)
    return resumed


def run_backup(exp: Experiment, to: Path | None = None, dry_run: bool = False,
               progress: Progress | None = None) -> Report:
    """Back up every complete checkpoint not yet in the backup, then apply scratch retention."""
    dest = destination(exp, to)
    scratch = Path(exp.paths.checkpoints)
    if not scratch.is_dir():
        raise BackupError(f"{scratch} (paths.checkpoints of {exp.name!r}) does not exist: nothing to back up")
    if dest.resolve() == scratch.resolve() or scratch.resolve() in dest.resolve().parents:
        raise BackupError(f"backup destination {dest} is inside the checkpoints folder {scratch}; choose another store")
    progress = progress or Progress()
    report = Report(dest)
    schedule = run_schedule(exp)
    for ckpt in layout.complete_checkpoints(scratch):
        if is_backed_up(dest, ckpt.tag):
            report.already.append(ckpt.tag)
            continue
        report.planned.append(plan_checkpoint(ckpt, keeps_optimizer(exp, schedule, ckpt.step)))
    if not dry_run:
        dest.mkdir(parents=True, exist_ok=True)
        for plan in report.planned:
            if _copy_checkpoint(plan, dest, exp.backup.tar, progress):
                report.resumed.append(plan.ckpt.tag)
            report.backed_up.append(plan.ckpt.tag)
    report.retention, report.deleted = _retention(exp, scratch, dest, dry_run)
    return report


def _retention(exp: Experiment, scratch: Path, dest: Path, dry_run: bool) -> tuple[retention.Decision, list[str]]:
    checkpoints = layout.list_checkpoints(scratch)
    latest = layout.latest_tag(scratch)
    verified = {c.step for c in checkpoints if is_backed_up(dest, c.tag)}
    decision = retention.decide([c.step for c in checkpoints], layout.step_of(latest) if latest else None, verified,
                                exp.backup.keep_last, exp.backup.keep_every)
    if dry_run or not decision.delete:
        return decision, []
    # `latest` is read again right before deleting: a save that finished meanwhile must not lose its base.
    def still_safe(ckpt: Checkpoint) -> bool:
        return layout.latest_tag(scratch) != ckpt.tag and is_backed_up(dest, ckpt.tag)

    return decision, retention.apply(checkpoints, decision, still_safe)
