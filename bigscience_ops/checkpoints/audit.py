"""`bsops verify`: every checkpoint of a run checked against its manifest, as a person asks before trusting it.

Each global_stepN folder is one Finding: verified (every file there, of its size and, unless sizes only, its
content: xxh3_128 as the manifest recorded it), damaged (the first file that is not, and how), not committed (a
save in progress or cut short: the trainer's next resume sets it aside), saved before manifests (with `adopt`:
its zip archives checked and its manifest written, as the trainer's resume would), or refused (a link, a manifest
that cannot be read). The checkpoints a resume set aside and why come from set-aside.jsonl. Nothing is moved or
deleted here; only `adopt` writes, and only manifests. Pure Python: nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.checkpoints import layout, manifest, resume, set_aside
from bigscience_ops.checkpoints.layout import CheckpointError

VERIFIED, DAMAGED, UNCOMMITTED, BEFORE_MANIFESTS, ADOPTED, REFUSED = (
    "verified", "damaged", "not committed", "saved before manifests", "adopted", "refused")
GOOD = (VERIFIED, ADOPTED)


@dataclass(frozen=True)
class Finding:
    tag: str
    step: int
    state: str
    detail: str = ""
    bytes_read: int = 0


@dataclass
class Audit:
    """What `audit` found in a checkpoints folder."""

    checkpoints: Path
    findings: list[Finding] = field(default_factory=list)
    set_aside: list[set_aside.SetAside] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Lines of set-aside.jsonl that cannot be read."""

    @property
    def ok(self) -> bool:
        """Every checkpoint is one a resume can take (an uncommitted save in progress aside)."""
        return all(f.state in (*GOOD, UNCOMMITTED) for f in self.findings)


def audit(checkpoints: Path, *, hashes: bool = True, adopt: bool = False, step: int | None = None,
          progress: Callable[[Finding], None] = lambda finding: None) -> Audit:
    """Check every checkpoint of `checkpoints` (or global_step`step` alone) against its manifest; `progress` is told
    each finding as it is made (the CLI prints a line each: a checkpoint of a large run takes minutes to read)."""
    checkpoints = Path(checkpoints)
    out = Audit(checkpoints)
    found = set_aside.read_checked(checkpoints)
    out.set_aside, out.problems = found.records, [str(p) for p in found.problems]
    for ckpt in layout.list_checkpoints(checkpoints):
        if step is not None and ckpt.step != step:
            continue
        finding = _check(checkpoints, ckpt, hashes, adopt)
        out.findings.append(finding)
        progress(finding)
    return out


def _check(checkpoints: Path, ckpt: layout.Checkpoint, hashes: bool, adopt: bool) -> Finding:
    def said(state: str, detail: str = "", read: int = 0) -> Finding:
        return Finding(ckpt.tag, ckpt.step, state, detail, read)

    try:
        committed = ckpt.manifest()
    except CheckpointError as exc:
        return said(REFUSED, str(exc))
    if committed is None:
        if not ckpt.saved_before_manifests():
            return said(UNCOMMITTED, resume.UNFINISHED)
        if not adopt:
            return said(BEFORE_MANIFESTS, "bsops.json but no manifest: `bsops verify --adopt` checks its zip archives "
                                          "and writes its manifest (a training task does it for the checkpoints it "
                                          "resumes from)")
        why = resume.adopt(checkpoints, ckpt)
        return said(DAMAGED, why) if why else said(ADOPTED, "its zip archives check out; manifest written",
                                                   ckpt.manifest().size)
    checked = manifest.verify(ckpt.path, committed, hashes=hashes)
    if checked.mismatches:
        more = f" (and {len(checked.mismatches) - 1} more)" if len(checked.mismatches) > 1 else ""
        return said(DAMAGED, f"{checked.mismatches[0]}{more}", checked.bytes_read)
    what = "every file's size and content" if hashes else "every file's size (content not read)"
    return said(VERIFIED, f"{len(committed.files)} files, {committed.size / 1e6:,.1f} MB: {what} as saved "
                          f"(iteration {committed.iteration}, {'with' if committed.optimizer else 'without'} "
                          "optimizer state)", checked.bytes_read)


def as_data(found: Audit) -> dict:
    """The audit as JSON-ready data (`bsops verify --json`)."""
    return {"checkpoints": str(found.checkpoints), "ok": found.ok,
            "findings": [{"tag": f.tag, "step": f.step, "state": f.state, "detail": f.detail,
                          "bytes_read": f.bytes_read} for f in found.findings],
            "set_aside": [{"time": r.time, "tag": r.tag, "folder": r.folder, "reason": r.reason}
                          for r in found.set_aside],
            "problems": found.problems}
