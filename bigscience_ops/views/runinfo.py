"""`bsops info`: a run's state at a glance, read from its folder alone (no Slurm, no torch).

What the run already records answers it: the last iteration lines of main_log.txt (parsed by the
trainer's own reader, iteration_log.parse_iteration_line) on the run's live branch (views/branch.py: after a
rollback, the abandoned iterations are not the run's progress), `latest` and the complete checkpoints
(checkpoints/layout.py), the last backup (the manifests ops/keep/store.py reads in the run's part of
the store, read as JSON: no checkpoint file is opened), the task ledger (ledger.py: array tasks with
their nodes, iterations, times and exits), the evaluation results of its checkpoints (eval/global_stepN.json,
ops/evaluate/results.py: a table of metrics by step, the experiment's eval.references beside; the results of a
branch a rollback abandoned left out, and those of a step the run has no checkpoint of or of another run (its id):
ops/keep/evaluated.py; a limited result, eval.limit examples per task, marked as such),
the open alerts of the watchdog and hourly jobs (ops/tell/notify.py's
state file), and the disk the run folder takes. Each part that cannot be read is reported in the result and
the rest is still shown: a ledger or rollbacks line, a manifest that is not one (each field is checked by its
reader), a `latest` or global_stepN that is a link (refused, as by every command).

The backup store and the references are the experiment file's (`bsops info` passes the run with its file's
backup and eval sections: cli/views.configured), never what the launch record says: a backup configured after
the launch is shown, and a record rewritten to name another store is not read.

The run's iteration is the live branch's: its last iteration line, or its latest checkpoint where that is later
(a trainer logs every log_interval iterations, so the last iteration is often not logged). A run whose latest
checkpoint is its last iteration (iterations are 1-based: step train_iters) is finished.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.run import log as runlog
from bigscience_ops.checkpoints import layout, set_aside
from bigscience_ops.errors import BsopsError
from bigscience_ops.run.iterations import IterationStats
from bigscience_ops.ops.evaluate import results as eval_results
from bigscience_ops.ops.keep import store as backup_store
from bigscience_ops.ops.keep import evaluated as evaluated_steps
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schema import Experiment
from bigscience_ops.views import branch

TAIL_LINES = 400  # lines read from the end of main_log.txt: enough for the recent iteration lines
THROUGHPUT_WINDOW = 20  # iteration lines the median throughput is taken over
EVAL_STEPS = 6  # evaluated steps shown in the evaluation table, the newest (a terminal's width)


@dataclass(frozen=True)
class BackupInfo:
    """The run's copies in the backup store, from their manifests; `note` says why there are none."""

    store: Path | None = None  # <backup.dest>/<experiment>/<run id>
    copies: int = 0
    last: str | None = None  # the entry of the highest step (global_stepN, or global_stepN.2 after a rollback)
    step: int | None = None
    kind: str | None = None  # whole or weights-only
    verified_at: float | None = None  # epoch seconds
    note: str | None = None


@dataclass(frozen=True)
class RunInfo:
    name: str
    run_folder: Path
    log: Path | None  # main_log.txt, None when the run has not logged yet
    last: IterationStats | None  # the last iteration line
    logged_at: float | None  # when the log was last written (epoch seconds)
    median_samples_per_second: float | None  # over the last THROUGHPUT_WINDOW iteration lines
    latest: int | None  # the step `latest` names
    checkpoints: list[int]  # steps of the complete checkpoints, oldest first
    saved_at: float | None  # when the newest complete checkpoint was written
    launches: int
    tasks: list[ledger.Attempt]  # since the last launch
    stopped: bool  # the failure budget stopped the array
    alerts: list[dict[str, Any]]  # open alerts: condition, since, message
    disk: dict[str, int]  # bytes: "run folder", "checkpoints"
    problems: list[str] = field(default_factory=list)  # what could not be read, one line each
    backup: BackupInfo = field(default_factory=BackupInfo)
    iteration: int | None = None  # the live branch's: its last iteration line or latest checkpoint, the later
    train_iters: int | None = None  # the trainer's (its log line), else the experiment's
    finished: bool = False  # the latest checkpoint is step train_iters: the last iteration trained and saved
    rollback: rollbacks.Rollback | None = None  # the last rollback
    relaunched: bool = True  # a task has run since the last rollback (True without one)
    evaluation: eval_results.Table | None = None  # metrics by evaluated step, references beside; None: none yet


def run_info(exp: Experiment) -> RunInfo:
    """The state of `exp`'s run from its folder."""
    out, checkpoints = Path(exp.paths.output), Path(exp.paths.checkpoints)
    problems: list[str] = []
    log = Path(exp.paths.logs) / runlog.LOG_NAME
    lines: list[str] = []
    if log.is_file():
        try:
            found = runlog.read_tail(log, TAIL_LINES)
            lines = found.lines
            note = runlog.unread_note(found, TAIL_LINES)  # one huge last line, NULs: said, not "nothing logged"
            if note is not None:
                problems.append(f"log {log}: {note}")
        except (OSError, BsopsError) as exc:
            problems.append(f"log {log}: {exc}")
    latest, complete, saved_at = None, [], None
    try:
        latest = layout.latest_step(checkpoints)
        done = layout.complete_checkpoints(checkpoints)
        layout.latest_checkpoint(checkpoints)  # names a plain checkpoint folder: else a problem, the rest shown
        complete = [c.step for c in done]
        saved_at = max((c.path.stat().st_mtime for c in done), default=None)
    except (OSError, BsopsError) as exc:
        problems.append(f"checkpoints {checkpoints}: {exc}")
    problems += [f"checkpoints: {p}" for p in layout.linked_checkpoints(checkpoints)]
    problems += _not_resumable(checkpoints)
    read = ledger.read_checked(out / ledger.LEDGER_NAME)
    records = read.records
    problems += [f"task ledger: {p}" for p in read.problems]
    done = rollbacks.read_checked(out)
    problems += [f"rollbacks: {p}" for p in done.problems]
    live = branch.live_branch(lines, latest=latest, rollbacks=done.records, log_mtime=_mtime(log),
                              begins=[r.time for r in records if r.event == "begin"], keep=THROUGHPUT_WINDOW)
    iterations = live.lines
    recent = [s.samples_per_second for s in iterations[-THROUGHPUT_WINDOW:] if s.samples_per_second > 0]
    train_iters = iterations[-1].train_iters if iterations else _train_iters(exp)
    iteration = live.trained if iterations or latest is not None else None
    unreadable: list[str] = []
    try:
        copies = backup_info(exp, unreadable)
    except (OSError, BsopsError) as exc:
        copies = BackupInfo(note="could not be read")
        problems.append(f"backup: {exc}")
    problems += [f"backup: {p}" for p in unreadable]
    evaluated, eval_problems = eval_results.read_all(out, checkpoints, limited=True)  # limited ones marked
    evaluated, uncounted = evaluated_steps.counted(eval_results.live(evaluated, done.records), exp)
    problems += [f"evaluation: {p}" for p in [*eval_problems, *uncounted]]
    evaluation = eval_results.table(evaluated, exp.eval.references, EVAL_STEPS) if evaluated else None
    return RunInfo(exp.name, out, log if log.is_file() else None, iterations[-1] if iterations else None,
                   _mtime(log), statistics.median(recent) if recent else None, latest, complete, saved_at,
                   sum(1 for r in records if r.event == "launch"), ledger.attempts(records), ledger.stopped(records),
                   [], {"run folder": _bytes(out), "checkpoints": _bytes(checkpoints)}, problems, copies,
                   iteration, train_iters, latest is not None and train_iters is not None and latest >= train_iters,
                   live.rollback, live.relaunched, evaluation)


def _train_iters(exp: Experiment) -> int | None:
    try:
        return run_schedule(exp).train_iters
    except (BsopsError, ValueError):
        return None


def backup_info(exp: Experiment, problems: list[str] | None = None) -> BackupInfo:
    """The run's last backup, read from the manifests in its part of the store (never a checkpoint file); each
    manifest that is not one this backup wrote is left out and named in `problems`."""
    if not exp.backup.dest:
        return BackupInfo(note="backup.dest is not set")
    run_id = layout.run_id(Path(exp.paths.checkpoints))
    if run_id is None:
        return BackupInfo(note="the run has no run id yet (no checkpoint saved): nothing backed up")
    store = backup_store.run_store(Path(exp.backup.dest), exp.name, run_id)
    found = backup_store.manifests(store)  # every field checked: step a whole number, verified_at an ISO time, kind known
    if problems is not None:
        problems += [str(p) for p in found.problems]
    if not found.records:
        return BackupInfo(store, note=f"no copy in {store} yet")
    entry, last = max(found.records, key=lambda em: (em[1]["step"], em[1]["verified_at"]))
    verified = dt.datetime.fromisoformat(last["verified_at"]).timestamp()
    return BackupInfo(store, len(found.records), entry, last["step"], last["kind"], verified)


def _not_resumable(checkpoints: Path) -> list[str]:
    """A line for each checkpoint folder no command counts (no committed manifest, or files not as saved) and for
    each one a resume set aside (set-aside.jsonl, read as untrusted input), with why."""
    lines = []
    try:
        for ckpt in layout.incomplete_checkpoints(checkpoints):
            lines.append(f"checkpoints: {ckpt.tag} is not complete (no committed manifest, or a file not as saved): "
                         "a save in progress or cut short; the next resume sets it aside (`bsops verify` says which "
                         "file)")
    except OSError as exc:
        lines.append(f"checkpoints {checkpoints}: {exc.strerror or exc}")
    found = set_aside.read_checked(checkpoints)
    lines += [f"checkpoints: {r.tag} was set aside by a resume on {time.strftime('%Y-%m-%d %H:%M', time.localtime(r.time))} "
              f"(moved to {r.folder}): {r.reason}" for r in found.records]
    return lines + [f"checkpoints: {p}" for p in found.problems]


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _bytes(folder: Path) -> int:
    """Bytes of the regular files under `folder`, links not followed."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size if not os.path.islink(os.path.join(root, name)) else 0
    return total


# ----------------------------------------------------------------------------- showing it

def _when(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "never"
    ago = max(0.0, now - epoch)
    span = (f"{ago:.0f} s" if ago < 120 else f"{ago / 60:.0f} min" if ago < 7200
            else f"{ago / 3600:.1f} h" if ago < 172800 else f"{ago / 86400:.1f} days")
    return f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(epoch))} ({span} ago)"


def _size(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def info_text(info: RunInfo, now: float | None = None) -> str:
    now = time.time() if now is None else now
    lines = [f"run {info.name}: {info.run_folder}"]
    if not info.run_folder.is_dir():
        lines[0] += " (no such folder: this run was not launched from here; paths resolve as docs/OPERATOR.md's"
        lines[0] += " 'Where paths resolve' says)"
    last = info.last
    if info.iteration is None:
        lines.append(f"  progress:    no iteration logged yet ({info.log or 'no main_log.txt'})")
    else:
        total = info.train_iters
        share = f" ({100 * info.iteration / max(1, total):.1f}%)" if total else ""
        done = f": finished, the last checkpoint is the final step {info.latest}" if info.finished else ""
        lines.append(f"  progress:    iteration {info.iteration}/{total or '?'}{share}{done}")
    r = info.rollback
    if r is not None:
        skip = f", skipping {r.skip}" if r.skip else ""
        lines.append(f"  rollback:    from global_step{r.from_step} to global_step{r.to_step}{skip}, "
                     f"{_when(r.time, now)}; " + ("the live branch trained on from it" if info.relaunched else
                                                 "not relaunched yet: the iterations after it are set aside"))
    if last is not None:
        loss = "loss not logged" if last.lm_loss is None else f"lm loss {last.lm_loss:.4f}"
        median = (f" (median of the last {THROUGHPUT_WINDOW} lines: {info.median_samples_per_second:.2f})"
                  if info.median_samples_per_second is not None else "")
        lines.append(f"  last line:   iteration {last.iteration}, {loss}, {last.samples_per_second:.2f} samples/s"
                     f"{median}; logged {_when(info.logged_at, now)}")
    if info.latest is None:
        lines.append("  checkpoint:  none yet")
    else:
        lines.append(f"  checkpoint:  latest global_step{info.latest}; {len(info.checkpoints)} complete, newest saved "
                     f"{_when(info.saved_at, now)}")
    stop = "; stopped by the failure budget" if info.stopped else ""
    since = f"since the last of {info.launches} launches" if info.launches > 1 else (
        "since the launch" if info.launches else "recorded")
    lines.append(f"  tasks:       {len(info.tasks)} {since}{stop}")
    for task in info.tasks:
        end = "running or killed" if task.ended is None else f"exit {task.exit_code}"
        through = "?" if task.end_iteration is None else task.end_iteration
        took = "" if task.ended is None or task.started is None else f", {(task.ended - task.started) / 60:.1f} min"
        lines.append(f"    {task.job_id}  nodes {task.nodes or '?'}  iterations {task.start_iteration} -> {through}  "
                     f"{end}  started {_when(task.started, now)}{took}")
    b = info.backup
    if b.last is None:
        lines.append(f"  backup:      none ({b.note})")
    else:
        lines.append(f"  backup:      {b.last} ({b.kind}), verified {_when(b.verified_at, now)}; {b.copies} cop"
                     f"{'y' if b.copies == 1 else 'ies'} in {b.store}")
    table = info.evaluation
    if table is not None:
        evaluated = len(table.steps) + table.left_out
        limited = sum(n is not None for n in table.limits)
        marked = f" ({limited} shown with a limited result: eval.limit)" if limited else ""
        lines.append(f"  evaluation:  {evaluated} checkpoint(s) evaluated, the newest global_step{table.steps[-1]}"
                     f"{marked}")
        lines.extend(f"    {line}" for line in table.text().splitlines())
    if info.alerts:
        lines.append(f"  alerts:      {len(info.alerts)} open")
        lines.extend(f"    {a['condition']} since {a['since']}: {a['message']}" for a in info.alerts)
    else:
        lines.append("  alerts:      none open")
    lines.append("  disk:        " + ", ".join(f"{name} {_size(n)}" for name, n in info.disk.items()))
    lines.extend(f"  could not read: {problem}" for problem in info.problems)
    return "\n".join(lines)


def info_data(info: RunInfo) -> dict[str, Any]:
    """`info` for --json: paths as strings, times as epoch seconds."""
    data = asdict(info)
    data["run_folder"] = str(info.run_folder)
    data["log"] = str(info.log) if info.log else None
    data["backup"]["store"] = str(info.backup.store) if info.backup.store else None
    return data
