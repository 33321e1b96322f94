"""Which checkpoint a run resumes from: the one `latest` names when it is what its manifest says, else the newest
one that is. Never a checkpoint that is not, never "finished" because of a `latest` that names nothing, never
hand repair.

`survey` lists the global_stepN folders in the order a resume tries them: the one `latest` names first, then the
others from the newest. `decide` walks them with a check the caller supplies (the trainer checks a committed one
against its manifest, sizes and hashes, each rank a share of the files: `shares`; it adopts one saved before
manifests after its zip archives check out) and returns the first that passes, what to set aside (moved whole by
checkpoints/set_aside.py, never deleted) and the lines to print:
- a folder without a committed manifest is a save that did not finish (its task was killed, or the disk filled):
  set aside, wherever it is; a save from before manifests at or before `latest` is tried (adopted) instead;
- a committed checkpoint whose files do not match its manifest (truncated, flipped, missing) is set aside once a
  verified one is found, naming the first file and how it differs;
- when none passes and one of them was committed (or saved before manifests), nothing is set aside and the resume
  is refused: a run that had a checkpoint never silently starts over. When none ever committed (the first save
  was cut short), the run starts from scratch, as it would have without them.
Pure Python: the caller does the reading, the moving and the collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.checkpoints import layout
from bigscience_ops.checkpoints import manifest as manifests
from bigscience_ops.checkpoints.layout import Checkpoint, CheckpointError
from bigscience_ops.checkpoints.manifest import Manifest, ManifestError

COMMITTED, LEGACY, UNCOMMITTED, UNREADABLE = "committed", "saved before manifests", "uncommitted", "unreadable"
UNFINISHED = ("no manifest: the save did not finish (its task was killed or stopped, or the disk filled, before "
              "every rank's files were written)")


@dataclass(frozen=True)
class Candidate:
    """One global_stepN folder as the survey found it."""

    ckpt: Checkpoint
    state: str
    """COMMITTED (its manifest read), LEGACY (saved before manifests: bsops.json, no manifest, at or before
    `latest`), UNCOMMITTED or UNREADABLE (a manifest that cannot be read)."""
    manifest: Manifest | None = None
    why: str = ""
    """For UNCOMMITTED and UNREADABLE: why it cannot be resumed from."""

    @property
    def tag(self) -> str:
        return self.ckpt.tag


@dataclass(frozen=True)
class Survey:
    """The run's checkpoints in the order a resume tries them, and what `latest` said."""

    candidates: tuple[Candidate, ...]
    latest: str | None
    """The tag `latest` names (None: no `latest`, or one that cannot be read)."""
    latest_problem: str = ""
    """Why `latest` cannot be followed: unreadable, or naming a folder that is not there (empty: it can)."""
    links: tuple[str, ...] = ()
    """global_stepN entries that are links: never read, never moved."""


@dataclass
class Outcome:
    """What a resume does: the checkpoint it takes, what it sets aside (with why), or what it refuses on."""

    chosen: Candidate | None = None
    set_aside: list[tuple[Candidate, str]] = field(default_factory=list)
    refused: list[tuple[Candidate, str]] = field(default_factory=list)
    """Set when nothing can be resumed from but something had committed: nothing is moved, the resume fails."""
    notes: list[str] = field(default_factory=list)


def survey(checkpoints: Path) -> Survey:
    """Every global_stepN folder of `checkpoints` in the order a resume tries them."""
    checkpoints = Path(checkpoints)
    named, problem = None, ""
    try:
        named = layout.latest_tag(checkpoints)
    except CheckpointError as exc:
        problem = str(exc)
    listed = layout.list_checkpoints(checkpoints)
    links = tuple(c.tag for c in listed if c.is_link)
    folders = [c for c in listed if not c.is_link and c.path.is_dir()]
    named_step = layout.step_of(named) if named else None
    if named is not None and named not in {c.tag for c in folders}:
        problem = f"{checkpoints / layout.LATEST} names {named}, which is not a checkpoint folder there"
    first = [c for c in folders if c.tag == named]
    rest = sorted((c for c in folders if c.tag != named), key=lambda c: c.step, reverse=True)
    return Survey(tuple(_candidate(c, named_step) for c in first + rest), named, problem, links)


def _candidate(ckpt: Checkpoint, latest_step: int | None) -> Candidate:
    try:
        found = ckpt.manifest()
    except CheckpointError as exc:
        return Candidate(ckpt, UNREADABLE, why=str(exc))
    if found is not None:
        return Candidate(ckpt, COMMITTED, found)
    if ckpt.saved_before_manifests() and (latest_step is None or ckpt.step <= latest_step):
        return Candidate(ckpt, LEGACY)
    return Candidate(ckpt, UNCOMMITTED, why=UNFINISHED)


def decide(found: Survey, check: Callable[[Candidate], str | None]) -> Outcome:
    """Walk the candidates in order; `check` says why one cannot be resumed from (None: it can). Every rank of a
    training calls this with the same survey and a collective `check`, so every rank decides the same."""
    out = Outcome()
    failed: list[tuple[Candidate, str]] = []
    for cand in found.candidates:
        if cand.state in (UNCOMMITTED, UNREADABLE):
            failed.append((cand, cand.why))
            continue
        why = check(cand)
        if why is None:
            out.chosen = cand
            break
        failed.append((cand, why))
    untried = [c for c in found.candidates if out.chosen is not None and c.ckpt.step != out.chosen.ckpt.step
               and c.state == UNCOMMITTED and all(c is not f for f, _ in failed)]
    lost = [(c, why) for c, why in failed if c.state != UNCOMMITTED]
    if out.chosen is None and lost:
        out.refused = failed
        return out
    out.set_aside = failed + [(c, c.why) for c in untried]
    if found.latest_problem or (found.latest is None and found.candidates):
        why = found.latest_problem or "there is no `latest`"
        target = f"resuming from {out.chosen.tag}, the newest verified checkpoint" if out.chosen else \
            "no checkpoint to resume from: starting from scratch"
        out.notes.append(f"{why}: {target}")
    for tag in found.links:
        out.notes.append(f"{tag} is a symbolic link: never resumed from (nor moved); move the folder itself there")
    return out


def adopt(checkpoints: Path, ckpt: Checkpoint) -> str | None:
    """Write the manifest of a checkpoint saved before manifests (its zip archives checked first); why it cannot be,
    or None. What the manifest says of the run comes from the checkpoint's bsops.json and the folder's run id."""
    try:
        meta = ckpt.meta()
        exp = meta.get("experiment") or {}
        parallel = meta.get("parallel") or {}
        manifests.adopt(ckpt.path, iteration=int(meta["iteration"]), run_id=layout.run_id(checkpoints) or "",
                        experiment=str(exp.get("name", "")),
                        layout={"tensor": parallel.get("tensor", 1), "pipeline": parallel.get("pipeline", 1),
                                "data": parallel.get("data") or 1,
                                "zero_stage": (exp.get("parallel") or {}).get("zero_stage", 0),
                                "precision": (exp.get("train") or {}).get("precision", "")},
                        optimizer=not meta.get("weights_only", False))
    except (CheckpointError, ManifestError) as exc:
        return str(exc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"{ckpt.path / layout.META}: lacks the iteration or layout ({type(exc).__name__}: {exc})"
    return None


def relaunch_refusal(checkpoints: Path, shape: dict, tensor: int, pipeline: int, data: int, zero_stage: int,
                     vocab_size: int) -> str | None:
    """Why a launch with this model and layout cannot load the checkpoint the run resumes from, naming each field
    that differs (checkpoints/universal.reshape_plan's rules: another layout is fine where DeepSpeed's universal
    checkpoint converts it); None when it can, or when the run has no checkpoint yet. Read before anything starts,
    so a relaunch that cannot work is refused before the queue wait, not after."""
    from bigscience_ops.checkpoints import universal

    step = layout.resume_step(checkpoints)
    if step is None:
        return None
    ckpt = Checkpoint(f"global_step{step}", step, Path(checkpoints) / f"global_step{step}")
    try:
        meta = ckpt.meta()
    except CheckpointError as exc:
        return str(exc)
    if not isinstance(meta.get("model"), dict):  # no shape recorded to compare: the trainer's resume says what is wrong
        return None
    if meta.get("weights_only"):  # a warm start: any PP/DP, the model and TP as written
        saved = {**universal.SHAPE_DEFAULTS, **(meta.get("model") or {})}
        diffs = [f"model.{k}: checkpoint {saved.get(k)!r}, config {v!r}" for k, v in shape.items()
                 if k not in universal.IGNORED_SHAPE_KEYS and saved.get(k) != v]
        saved_tp = (meta.get("parallel") or {}).get("tensor")
        if saved_tp != tensor:
            diffs.append(f"parallel.tensor: checkpoint {saved_tp!r}, config {tensor!r}")
        return f"{ckpt.path} was written by a different model: " + "; ".join(diffs) if diffs else None
    try:
        universal.reshape_plan(ckpt.path, meta, shape, universal.Layout(tensor, pipeline, data, zero_stage), vocab_size)
    except CheckpointError as exc:
        return " ".join(str(exc).split())
    return None


def shares(manifest: Manifest, world: int) -> list[list[str]]:
    """The manifest's files split over `world` ranks for verification, about equal bytes each: the largest files
    first, each to the rank with the fewest bytes so far (the same split on every rank)."""
    loads = [0] * world
    out: list[list[str]] = [[] for _ in range(world)]
    for rel, rec in sorted(manifest.files.items(), key=lambda item: (-item[1].size, item[0])):
        rank = loads.index(min(loads))
        out[rank].append(rel)
        loads[rank] += rec.size
    return out


def refusal(outcome: Outcome, checkpoints: Path) -> str:
    """The error of a resume that found nothing to resume from while something had committed."""
    listed = "; ".join(f"{c.tag}: {why}" for c, why in outcome.refused)
    return (f"no checkpoint of {checkpoints} can be resumed from, and one of them was a committed save: {listed}. "
            "Nothing was moved. Restore the newest from the backup store (its copy is verified against the same "
            "manifest), or move the folder away to start the run over")
