"""Checkpoint backup: weights-only copies (the final checkpoint whole), a verified manifest each, then scratch retention.

The store (backup.dest, or --to) and what a copy in it is are ops/keep/store.py's: a folder marked as a bsops
store, with each run's part under <store>/<experiment>/<run id>/, the run id being the one the trainer wrote when
the run started from scratch (checkpoints/layout.py).

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
from bigscience_ops.ops.keep.store import (
    CHUNK, MANIFEST_LIMIT, PARTIAL, SOURCE, JOURNAL, BackupError, entries, find_copy, hash_file, journal_vouched,
    manifest_path, open_store, read_manifest, run_store, verify, verify_folder, verify_tar,
)
from bigscience_ops.errors import BsopsError
from bigscience_ops.untrusted import read_small, write_atomically
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schema import BackupConfig, Experiment


@dataclass(frozen=True)
class BackupSettings:
    """What the backup takes of the experiment, taken out once by `settings` (the command, the hourly job)."""

    name: str
    """The experiment's name: its part of the store, <store>/<name>/<run id>/, and the messages."""
    checkpoints: Path
    """paths.checkpoints: the scratch folder copied from, and that retention deletes from."""
    backup: BackupConfig
    """The backup section: the store (dest), tar, retention (keep_last, keep_every), keep_optimizer_every."""
    final_step: int
    """The run schedule's train_iters: the final step's checkpoint is copied whole."""


def settings(exp: Experiment) -> BackupSettings:
    """The backup's settings from the experiment (the backup section as the experiment file says today)."""
    return BackupSettings(exp.name, Path(exp.paths.checkpoints), exp.backup, run_schedule(exp).train_iters)


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


class BackupProgress:
    """Told about the work as it goes (the CLI shows a bar or lines); the default says nothing."""

    def begin(self, plan: Planned) -> None: ...
    def advance(self, nbytes: int) -> None: ...
    def end(self, plan: Planned, resumed: bool) -> None: ...


def destination(run: BackupSettings) -> Path:
    """The store: backup.dest (`bsops backup --to DEST` sets it on the command line)."""
    if run.backup.dest:
        return Path(run.backup.dest)
    raise BackupError(f"no backup destination for {run.name!r}: set backup.dest in the experiment or pass --to DEST")


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


def keeps_optimizer(run: BackupSettings, step: int) -> bool:
    """Whether the backup keeps this step's optimizer states: the final step and every keep_optimizer_every-th."""
    every = run.backup.keep_optimizer_every
    return step == run.final_step or bool(every and step % every == 0)


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


# ----------------------------------------------------------------------------- copying

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
    return hash_file(dst)


def _copy_checkpoint(plan: Planned, dest: Path, tar: bool, progress: BackupProgress, about: dict) -> bool:
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
    done = journal_vouched(staging)
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
    bad = verify_folder(staging, files, {rel: rec for rel, rec in saved.files.items() if rel not in plan.rewritten})
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
        bad = verify_tar(target, files)
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


def run_backup(run: BackupSettings, dry_run: bool = False,
               progress: BackupProgress | None = None) -> Report:
    """Back up every complete checkpoint without a copy in the store, then apply scratch retention.

    A checkpoint that cannot be copied is in `Report.failed` (the others go on), a folder retention had to
    leave in place in `Report.left_on_scratch`; the CLI reports both as one error.
    """
    dest = destination(run)
    scratch = run.checkpoints
    if not scratch.is_dir():
        raise BackupError(f"{scratch} (paths.checkpoints of {run.name!r}) does not exist: nothing to back up")
    if dest.resolve() == scratch.resolve() or scratch.resolve() in dest.resolve().parents:
        raise BackupError(f"backup destination {dest} is inside the checkpoints folder {scratch}; choose another store")
    if dest.resolve() in scratch.resolve().parents:
        raise BackupError(f"backup destination {dest} holds the checkpoints folder {scratch}; choose another store")
    open_store(dest, create=not dry_run)
    run_id = layout.run_id(scratch) if dry_run else layout.ensure_run_id(scratch)
    store = run_store(dest, run.name, run_id or "new-run")
    progress = progress or BackupProgress()
    report = Report(dest, store=store)
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
        report.planned.append(plan_checkpoint(ckpt, keeps_optimizer(run, ckpt.step), source))
    if not dry_run:
        store.mkdir(parents=True, exist_ok=True)
        about = {"run_id": run_id, "experiment": run.name}
        for plan in report.planned:
            try:
                if _copy_checkpoint(plan, store, run.backup.tar, progress, about):
                    report.resumed.append(plan.ckpt.tag)
                report.backed_up.append(plan.ckpt.tag)
            except (BackupError, OSError) as exc:
                report.failed[plan.ckpt.tag] = str(exc)
    report.retention, applied = _retention(run.backup, scratch, store, dry_run)
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


def _copy_kind(store: Path, ckpt: Checkpoint) -> str | None:
    """The kind ("whole", "weights-only") of the store's copy of this very checkpoint, None when it has none."""
    try:
        entry = find_copy(store, ckpt, fingerprint(ckpt))
    except (BackupError, OSError):
        return None
    found = read_manifest(store, entry) if entry is not None else None
    return found.get("kind") if found is not None else None


def _retention(kept: BackupConfig, scratch: Path, store: Path, dry_run: bool
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
    args = ([c.step for c in checkpoints], layout.resume_step(scratch), verified, kept.keep_last, kept.keep_every)
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
