"""Checkpoints set aside: a save that never committed, or one whose files no longer match its manifest, moved out
of the way by the trainer's resume (checkpoints/resume.py). Nothing is deleted.

The folder moves, whole and as it was, to <checkpoints>/set-aside-<time>/global_stepN (one rename: the same file
system), where no command lists, resumes from, backs up or deletes it: they only ever look at the global_stepN
folders at the top, as with the folders a rollback sets aside (`rolled-back-<time>/`). Each move is one line of
<checkpoints>/set-aside.jsonl (time, tag, where it went, why: the first file that failed and how), which the
watchdog reads (as untrusted input, like every run file) to alert once per move.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bigscience_ops.untrusted import Checked, append_line, build, check_str, check_time, checked_jsonl

RECORD = "set-aside.jsonl"
"""One JSON line per checkpoint set aside, in <checkpoints>/."""
FOLDER_PREFIX = "set-aside-"
"""<checkpoints>/set-aside-<YYYYmmdd-HHMMSS>/ holds the folders set aside at that time."""
REASON_LIMIT = 1000
"""Characters of a reason kept in the record (a path and what was wrong with it)."""


@dataclass(frozen=True)
class SetAside:
    """One checkpoint folder moved out of the way, and why."""

    time: float
    """Epoch seconds of the move."""
    tag: str
    """global_stepN, as the folder was named."""
    folder: str
    """Where it is now: <checkpoints>/set-aside-<time>/global_stepN."""
    reason: str
    """Why it could not be resumed from: the first file that failed and how (or: no manifest, the save did not
    commit)."""


_RULES = {
    "time": check_time,
    "tag": lambda v: check_str(v, 64),
    "folder": lambda v: check_str(v, 4096),
    "reason": lambda v: check_str(v, REASON_LIMIT),
}


def set_aside(checkpoints: Path, folder: Path, reason: str, now: float | None = None) -> SetAside:
    """Move the checkpoint folder `folder` (a global_stepN of `checkpoints`) to set-aside-<time>/ and record why.

    The move is a rename within `checkpoints`: atomic, nothing copied, nothing deleted. A second folder of the
    same tag set aside within the same second goes to set-aside-<time>.2/ (and so on)."""
    checkpoints, folder = Path(checkpoints), Path(folder)
    when = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    target, n = checkpoints / f"{FOLDER_PREFIX}{stamp}" / folder.name, 1
    while target.exists() or target.is_symlink():
        n += 1
        target = checkpoints / f"{FOLDER_PREFIX}{stamp}.{n}" / folder.name
    target.parent.mkdir(exist_ok=True)
    os.replace(folder, target)
    record = SetAside(when, folder.name, str(target), " ".join(reason.split())[:REASON_LIMIT])
    append_line(checkpoints / RECORD, _json(record))
    return record


def read_checked(checkpoints: Path) -> Checked[SetAside]:
    """Every checkpoint set aside in `checkpoints`, oldest first, and a problem for each line (or the file) that
    is not one: the watchdog reports both and goes on."""
    return checked_jsonl(Path(checkpoints) / RECORD, lambda data: build(SetAside, data, _RULES))


def _json(record: SetAside) -> str:
    return json.dumps(asdict(record), ensure_ascii=True)
