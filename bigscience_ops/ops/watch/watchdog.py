"""The status watchdog's run: check the queue and the run folder, watch the cron chains, email, log.

status.py decides over parsed jobs, lifecycle.py says where the run stands, schedule/cron.py knows the
chains, tell/ sends the alerts on each channel and keeps their state; `watch` puts one hourly run
together and appends every line to watchdog.log beside the run's main_log.txt.

The watchdog always runs and always tells: a run file it cannot read (the task ledger, `latest`,
rollbacks.jsonl, a backup manifest or journal: lifecycle.RunState.problems; the alert state itself:
notify.state_problem) is an alert of its own, naming the file and the line, sent through the same
channels and cooldown, while the rest of the check (the run's stopped or finished state, the queue,
health) is still done.

With the run's experiment known, its evaluation results are health too (`eval.alert_drop`): a metric of the
newest evaluated checkpoint worse than the run's best so far by more than its margin is an alert per metric
(kind `eval-drop`, one per `<task/metric>`: ops/health.eval_drop's advice), and a result file that cannot be read is an
alert naming it (`eval-result-file`), never left out in silence.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bigscience_ops import slurm
from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.run import log as runlog
from bigscience_ops.checkpoints import layout, set_aside
from bigscience_ops.checkpoints.set_aside import SetAside
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops import health
from bigscience_ops.ops.alerts import DEFAULT_CONTACT, EXIT_ERROR, Alert, StatusReport, condition, raise_alert
from bigscience_ops.ops.evaluate import results as eval_results
from bigscience_ops.ops.cron import runner as cron
from bigscience_ops.ops.tell.channels import Outbox
from bigscience_ops.ops.tell.message import NotifyError
from bigscience_ops.ops.tell import alert_state
from bigscience_ops.ops.tell.notify import (
    Notice, StateUnwritable, default_state_path, notify, state_problem, told_events,
)
from bigscience_ops.ops.tell.quoting import quote_untrusted
from bigscience_ops.ops.watch import local_run, status
from bigscience_ops.ops.watch.lifecycle import RunState
from bigscience_ops.run.records import EXPERIMENT_JSON
from bigscience_ops.untrusted import Problem
from bigscience_ops.schema import AlertsConfig, HealthConfig


@dataclass(frozen=True)
class WatchResult:
    report: StatusReport
    notices: tuple[Notice, ...] = ()
    email_error: str | None = None
    """Why a channel (email, webhook) could not send a message, or the alert state could not be used."""
    lines: tuple[str, ...] = ()
    """The report's lines followed by a line per message sent or failed: what was printed and logged."""

    @property
    def exit_code(self) -> int:
        """The report's code (0 healthy, 1 alert, 2 Slurm unreachable); 2 also when a message failed."""
        return max(self.report.exit_code, EXIT_ERROR if self.email_error else 0)


@dataclass(frozen=True)
class WatchSettings:
    """What one watchdog run watches and whom it tells. `bsops status` builds it from its options over the
    experiment's values; the hourly status job runs that command."""

    job_name: str
    """The Slurm job name to watch (compared whole, any length)."""
    users: tuple[str, ...] = ()
    """Watch these users' jobs (and, with `group`, every user of it); neither: every user's."""
    group: str | None = None
    log_path: str | os.PathLike[str] | None = None
    """The run's main_log.txt, read for progress and training health; watchdog.log goes beside it."""
    stall_minutes: float | None = None
    """Alert when a RUNNING job's log has had no new iteration line for this long; None: never."""
    contact: str = DEFAULT_CONTACT
    """Who the ALERT lines say to alert."""
    outbox: Outbox | None = None
    """The channels alerts, recoveries and the finish go out on; None: print and log only."""
    state_path: str | os.PathLike[str] | None = None
    """The cooldown state; None: `.bsops-alerts.json` next to the log (in ~/.cache/bsops/ without a log)."""
    cooldown_minutes: float = AlertsConfig.cooldown_minutes
    """Send the same alert at most once per this many minutes, on each channel."""
    experiment: str | None = None
    """The experiment's name, for the messages (default: the run's, else the job name)."""
    dry_run: bool = False
    """Decide only: send nothing, append nothing to watchdog.log, write and move no alert state (`status --dry-run`)."""
    timeout: float = 60.0
    """Seconds each Slurm query (squeue, sacct, the cron chains' squeue) may take."""
    cron_dir: str | os.PathLike[str] | None = None
    """Also check the cron runner chains of this folder (the watchers are watched too)."""
    health: HealthConfig | None = None
    """Training health checks over the log's recent iteration lines (ops/health.py); None: none."""

    def __post_init__(self) -> None:
        users = (self.users,) if isinstance(self.users, str) else tuple(self.users)
        object.__setattr__(self, "users", users)


def watch(settings: WatchSettings, *, run: RunState | None = None, now: datetime | None = None,
          env: Mapping[str, str] | None = None, query: Callable[..., list[slurm.Job]] | None = None) -> WatchResult:
    """One watchdog run: query Slurm (with `query`, default slurm.query_jobs), or for a run launched here its
    processes (local_run.py), decide (with `run`, the run folder's state), check the cron chains, send
    alerts/recoveries/the finish on the outbox's channels (secrets read from `env`, default os.environ), and append
    every line to watchdog.log beside the log, never to the main_log.txt whose progress it measures. Each
    training-health finding is an alert of its own kind, and each checkpoint set aside one alert, told once.

    Where the log's folder (or watchdog.log, or the alert state) cannot be written, the alert state and the lines
    are kept in the user's state folder instead (alert_state.place), and that is an alert of its own: the watchdog
    still tells, never dies of its own files.
    """
    s = settings
    if run is not None and run.local:  # no queue holds it: its processes do
        report = local_run.check(s.job_name, run, now=now, log_path=s.log_path, stall_minutes=s.stall_minutes,
                                 contact=s.contact)
    else:
        report = status.check(s.job_name, users=s.users, group=s.group, log_path=s.log_path,
                              stall_minutes=s.stall_minutes, now=now, contact=s.contact, timeout=s.timeout, run=run,
                              **({"query": query} if query is not None else {}))
    if run is not None and run.problems:
        report = _with_run_file_alerts(report, run.problems, s.contact)
    if s.cron_dir is not None:
        report = _with_chain_alerts(report, Path(s.cron_dir), s.contact, s.timeout)
    if s.health is not None and s.health.enabled and s.log_path is not None:
        known = run.experiment if run is not None else None
        checkpoints = Path(known.paths.checkpoints) if known is not None else None
        name = s.experiment or (known.name if known is not None else None)
        report = _with_health_alerts(report, Path(s.log_path), s.health, s.contact, name, checkpoints)
    if run is not None and run.experiment is not None:
        report = _with_eval_alerts(report, run.experiment, s.contact, s.experiment or run.experiment.name)
    outbox, log_path = s.outbox, s.log_path
    usual = default_state_path(log_path) if s.state_path is None else Path(s.state_path)
    if s.dry_run:  # what the run would say; the state is only read (what was told of checkpoints set aside)
        if run is not None and run.set_aside:
            told = told_events(usual, s.job_name, outbox.names if outbox is not None else None)
            report = _with_set_aside_alerts(report, run.set_aside, told, s.contact)
        return WatchResult(report, (), None, report.lines)
    where = alert_state.place(usual, status.watchdog_log(log_path) if log_path is not None else None, s.job_name, env)
    report = _with_moved_alert(report, where, s.contact)
    if run is not None and run.set_aside:
        told = told_events(where.state, s.job_name, outbox.names if outbox is not None else None)
        report = _with_set_aside_alerts(report, run.set_aside, told, s.contact)
    notices: list[Notice] = []
    errors, extra = [], []
    if outbox is not None:
        unreadable = state_problem(where.state)
        if unreadable is not None:  # told through the same channels: the state then starts afresh
            report = _with_run_file_alerts(report, (unreadable,), s.contact, kind="alert-state")
        try:
            notices = _notify(report, s, outbox, where, env)
        except StateUnwritable as exc:  # nothing was sent: again, from the user's state folder
            if where.moved is not None:
                errors.append(str(exc))
            else:
                where = alert_state.place(usual, where.log, s.job_name, env, why=f"{exc.path}: {exc.why}")
                report = _with_moved_alert(report, where, s.contact)
                try:
                    notices = _notify(report, s, outbox, where, env)
                except NotifyError as again:
                    errors.append(str(again))
        except NotifyError as exc:  # the alert state cannot be read or locked
            errors.append(str(exc))
    stamp = report.stamp
    extra += [f"{stamp} ***ALERT: the alert email could not be sent: {e}***" for e in errors]
    for n in notices:  # one line per message and the channels it went out on, one per channel that failed
        shown = outbox.destinations(n.channels) if outbox is not None else ""
        if n.error is None:
            extra.append(f"{stamp} {n.kind} email sent to {shown} {n.message_id}: {n.subject}")
        else:
            errors.append(n.error)
            extra.append(f"{stamp} ***ALERT: the {n.kind} email could not be sent to {shown} (the next run tries "
                         f"again): {n.error}***")
    error = "; ".join(errors) or None
    lines = (*report.lines, *extra)
    if where.log is not None:
        try:
            status.append_to_log(where.log, lines)
        except (runlog.LogError, OSError) as exc:  # said here, the check stands
            lines = (*lines, f"{stamp} ***ALERT: {where.log} cannot be written: {exc}***")
    return WatchResult(report, tuple(notices), error, lines)


def _notify(report: StatusReport, s: WatchSettings, outbox: Outbox, where: alert_state.Place,
            env: Mapping[str, str] | None) -> list[Notice]:
    return notify(report, outbox, where.state, experiment=s.experiment, cooldown_minutes=s.cooldown_minutes,
                  log_path=str(s.log_path) if s.log_path else None, env=env)


def _with_moved_alert(report: StatusReport, where: alert_state.Place, contact: str) -> StatusReport:
    """The report plus the alert that the watchdog's files are kept in the user's state folder, when they are
    (once: a report has it already after a first try)."""
    if where.moved is None or any(a.kind == "watch-files-moved" for a in report.alerts):
        return report
    what = ("beside the run's log" if where.usual is None
            else f"its alert state {where.usual} (or watchdog.log beside it)")
    return report.adding([raise_alert("watch-files-moved", contact=contact, job=report.job_name, what=what,
                                      why=quote_untrusted(where.moved, 600, mark=False),
                                      elsewhere=where.state.parent)])


def _with_set_aside_alerts(report: StatusReport, records: tuple[SetAside, ...], told: set[str],
                           contact: str) -> StatusReport:
    """The report plus one alert per checkpoint the trainer set aside (checkpoints/set_aside.py) that the alert
    state has not told yet: an event, told once (alerts.EVENT_KINDS), naming the tag, where it went and why."""
    alerts = []
    for record in records:
        subject = f"{re.sub(r'[^A-Za-z0-9_]', '?', record.tag)[:64]}@{int(record.time)}"
        if f"checkpoint-set-aside:{subject}" in told:
            continue
        step = re.fullmatch(r"global_step(\d{1,12})", record.tag)
        headline = (f"look at checkpoint {step.group(1)} set aside: it could not be resumed from" if step else "")
        alerts.append(raise_alert(
            "checkpoint-set-aside", subject=subject, contact=contact, headline=headline, job=report.job_name,
            tag=quote_untrusted(record.tag, 64, mark=False), folder=_path(record.folder),
            reason=quote_untrusted(record.reason, 600, mark=False),
            when=datetime.fromtimestamp(record.time).strftime("%Y-%m-%d %H:%M:%S")))
    return report.adding(alerts)


# The run's files by name: the kind of alert (ops/alerts.py) a file that cannot be read raises; any other is the
# backup store's (a manifest or journal).
RUN_FILES = {
    ledger.LEDGER_NAME: "run-file-ledger",
    layout.LATEST: "run-file-latest",
    rollbacks.RECORD: "run-file-rollbacks",
    EXPERIMENT_JSON: "run-file-record",
    set_aside.RECORD: "run-file-set-aside",
}
SHOWN_PROBLEMS = 5
"""Problems named per file in an alert; the rest are counted."""


def _with_run_file_alerts(report: StatusReport, problems: tuple[Problem, ...], contact: str,
                          kind: str | None = None) -> StatusReport:
    """The report plus one alert per kind of run file with problems (ledger, latest, rollbacks, backup store;
    `kind` forces one), each naming every file and its lines: through the same channels and cooldown."""
    grouped: dict[str, dict[str, list[Problem]]] = {}
    for problem in problems:
        found = kind or RUN_FILES.get(Path(problem.file).name, "run-file-backup")
        grouped.setdefault(found, {}).setdefault(problem.file, []).append(problem)
    return report.adding(
        raise_alert(found, contact=contact, job=report.job_name,
                    named="; ".join(f"{_path(file)}: {_problem_lines(lines)}" for file, lines in files.items()))
        for found, files in grouped.items())


def _path(file: str) -> str:
    """A run file's path for an alert: its name may come from a listing of the run's folders (quote_untrusted)."""
    return quote_untrusted(file, 1000, mark=False)


def _problem_lines(found: list[Problem]) -> str:
    """`line 3: cut short ...; line 9: ... (+N more)`: what each problem says, without its file. A problem quotes
    the file's own bytes (an excerpt, a name it refused): each goes through quote_untrusted, never a link."""
    shown = [(f"line {p.line}: " if p.line else "") + quote_untrusted(p.what, 400, mark=False)
             + (f" (held {quote_untrusted(p.held, 200, mark=False)})" if p.held else "")
             for p in found[:SHOWN_PROBLEMS]]
    more = f" (+{len(found) - SHOWN_PROBLEMS} more)" if len(found) > SHOWN_PROBLEMS else ""
    return " ".join("; ".join(shown).split()) + more


def _with_chain_alerts(report: StatusReport, cron_dir: Path, contact: str, timeout: float) -> StatusReport:
    """The report plus an alert per problem of an installed cron chain (or one if Slurm cannot say); the
    chains' squeue gets the status run's timeout too."""
    try:
        problems = [p for state in cron.chains(cron_dir, timeout=timeout) if state.installed for p in state.problems]
    except (slurm.SlurmError, BsopsError) as exc:
        problems = [f"the cron chains of {cron_dir} cannot be checked: {' '.join(str(exc).split())}"]
    # a chain's job name or log is the queue's: quoted
    return report.adding(raise_alert("cron-chain", contact=contact, problem=quote_untrusted(p, 1000, mark=False))
                         for p in problems)


def _with_health_alerts(report: StatusReport, log_path: Path, settings: HealthConfig, contact: str,
                        experiment: str | None, checkpoints: Path | None) -> StatusReport:
    """The report plus an alert per training-health finding among the log's recent iteration lines, each
    with the exact commands to look at the iteration's samples and to roll back (health.advise)."""
    if not log_path.is_file():
        return report
    try:
        lines, _ = runlog.tail(log_path, (settings.window + settings.recent) * 4)
    except (OSError, BsopsError) as exc:
        why = quote_untrusted(str(exc), 400, mark=False)
        return report.adding([raise_alert("health-unreadable", contact=contact, log=log_path, why=why)])
    findings = [health.advise(f, experiment, checkpoints)
                for f in health.check(health.entries(lines), settings, recent=settings.recent)]
    return report.adding(raise_alert(f"health-{f.kind}", contact=contact, headline=f.headline, advice=f.next_step,
                                     finding=f) for f in findings)


def _with_eval_alerts(report: StatusReport, exp, contact: str, experiment: str) -> StatusReport:
    """The report plus an alert per metric of eval.alert_drop whose newest result fell against the run's best so far
    (the live branch's results: ops/evaluate/results.py), and one naming the result files that cannot be read.
    Nothing when the experiment evaluates nothing and alerts on no drop."""
    if not (exp.eval.alert_drop or exp.eval.configured):
        return report
    output = Path(exp.paths.output)
    from bigscience_ops.ops.keep import evaluated  # as lifecycle reads the backup store: only where there are results

    found, problems = eval_results.read_live(output)
    found, _ = evaluated.counted(found, exp)  # a result of a step never saved drives no rollback advice (the views name it)
    checkpoints = Path(exp.paths.checkpoints)
    alerts: list[Alert] = []
    for d in eval_results.drops(found, exp.eval.alert_drop):
        f = health.eval_drop(d.step, d.iteration, d.metric, d.value, d.best, d.best_step, d.margin, experiment,
                             checkpoints)
        alerts.append(raise_alert("eval-drop", subject=d.metric, contact=contact, headline=f.headline,
                                  advice=f.next_step, finding=f))
    if problems:
        named = "; ".join(f"{_path(p.file)}: {_problem_lines([p])}" for p in problems[:SHOWN_PROBLEMS])
        more = f" (+{len(problems) - SHOWN_PROBLEMS} more files)" if len(problems) > SHOWN_PROBLEMS else ""
        advice = condition("eval-result-file").advice.replace("EXP", experiment)  # this run's name, as before
        alerts.append(raise_alert("eval-result-file", contact=contact, advice=advice, job=report.job_name,
                                  named=named + more))
    return report.adding(alerts)
