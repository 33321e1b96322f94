"""A run's live branch after its rollbacks: the iteration it has trained, read from its folder (no torch).

`bsops rollback --step S` moves `latest` back to global_step S and sets the later checkpoints aside
(checkpoints/rollback.py, recorded in rollbacks.jsonl): what the run trained after S before the rollback is
an abandoned branch, and the relaunch trains those iterations again from S. The views show the live branch:

- main_log.txt read in order: a task's start (the job script's "task ID begins at iteration S", the trainer's
  "> training ...: starting at S", trainer/sampling.TaskLayout) drops the iteration lines after S logged before
  it (a relaunch after a rollback starts at S);
- until the log shows a task that started at S since the last rollback (a ledger `begin` after it, or without a
  ledger the log written after it, and the log's last task start at S) or a checkpoint after S was saved, the
  log's lines after S are the abandoned branch's too: dropped;
- the live iteration is the last live iteration line's, the last task's start or the latest checkpoint,
  whichever is later (the rollback set the later checkpoints aside, so `latest` is always the live branch's).
  A trainer logs every log_interval iterations, so a run's last iteration is often not logged: its save says
  it was trained.

TensorBoard points carry their wall time: `abandoned` says which a rollback left behind (views/plot.py).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bigscience_ops.run.iterations import IterationStats, parse_iteration_line
from bigscience_ops.run.rollbacks import Rollback
from bigscience_ops.trainer.sampling import LayoutLineError, parse_layout_line

START_MARK = "> training "
"""In every task's start line (trainer/sampling.TaskLayout.line)."""
LOG_FILTER = b"iteration"
"""In every iteration line and task start line ("... iterations, starting at S"): runlog.lines' `containing`."""
TASK_BEGINS = re.compile(r"^task \S+ begins at iteration ([0-9]{1,30})$")
"""The line `bsops task begin` (cli/task.py) writes into main_log.txt when a task of the job script will train."""


@dataclass(frozen=True)
class LiveBranch:
    trained: int
    """The last iteration the live branch trained, by its log and checkpoints (0: none)."""
    lines: list[IterationStats] = field(default_factory=list)
    """The last live iteration lines, oldest first (at most the `keep` asked for)."""
    rollback: Rollback | None = None
    """The run's last rollback."""
    relaunched: bool = True
    """A task has begun since the last rollback (True when there was none)."""

    @property
    def pending(self) -> Rollback | None:
        """The last rollback while no task has run since: its skip happens at the relaunch."""
        return None if self.relaunched else self.rollback


def _task_start(line: str) -> int | None:
    """The iteration a task starts at, from its job script's begin line or its trainer's start line; None for any
    other line (and a start line no task can have, trainer/sampling.LayoutLineError: samples.read_layouts names it)."""
    if START_MARK in line:
        try:
            task = parse_layout_line(line)
        except LayoutLineError:
            return None
        return None if task is None else task.start
    begins = TASK_BEGINS.match(line.strip()) if "begins at iteration" in line else None
    return int(begins.group(1)) if begins else None


def walk(lines: Iterable[str], keep: int = 1) -> tuple[deque[IterationStats], int, int | None]:
    """The last `keep` iteration lines of the live branch of a log read in order, the iteration it reached (the
    last live line's, or the last task's start when it logged none since) and the last task's start."""
    live: deque[IterationStats] = deque(maxlen=max(1, keep))
    reached, last_start = 0, None
    for line in lines:
        start = _task_start(line)
        if start is not None:
            while live and live[-1].iteration > start:
                live.pop()
            reached = last_start = start
            continue
        stats = parse_iteration_line(line) if "|" in line else None
        if stats is not None:
            live.append(stats)
            reached = stats.iteration
    return live, reached, last_start


def relaunched(rollback: Rollback, latest: int | None, begins: Sequence[float], log_mtime: float | None) -> bool:
    """Whether a task has begun since `rollback`: the ledger has a task begin after it, a checkpoint after its target
    was saved, or (a run without a ledger: its trainer launched by hand) the log was written after it."""
    return (any(when > rollback.time for when in begins) or (latest is not None and latest > rollback.to_step)
            or (not begins and log_mtime is not None and log_mtime > rollback.time))


def live_branch(lines: Iterable[str], *, latest: int | None, rollbacks: Sequence[Rollback] = (),
                begins: Sequence[float] = (), log_mtime: float | None = None, keep: int = 1) -> LiveBranch:
    """The live branch of a run from its log's lines (in order; a tail will do), its latest checkpoint's step, its
    rollbacks, the times its tasks began (ledger) and when its log was last written."""
    live, reached, last_start = walk(lines, keep)
    last = rollbacks[-1] if rollbacks else None
    again = last is None or relaunched(last, latest, begins, log_mtime)
    # The log's lines after the target are the relaunch's once a checkpoint after it is saved, or once the task
    # that began since the rollback has logged its start (at the target): before, they are the abandoned branch's.
    trusted = last is None or (latest is not None and latest > last.to_step) or (again and last_start == last.to_step)
    if not trusted:
        live = deque((s for s in live if s.iteration <= last.to_step), maxlen=live.maxlen)
        reached = min(reached, last.to_step)
    return LiveBranch(max(reached, latest or 0), list(live), last, again)


def abandoned(samples: int, when: float, cutoffs: Sequence[tuple[float, int]]) -> bool:
    """Whether a point logged at `when` (epoch seconds) after `samples` consumed samples is an abandoned branch's:
    a rollback (time, consumed samples of its target) came after it and went back before it."""
    return any(when < at and samples > kept for at, kept in cutoffs)
