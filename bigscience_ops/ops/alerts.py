"""The alerts' vocabulary: what one alert is, what a watchdog run reports, and every condition that needs a person.

Each condition is registered once here: its kind (the cooldown key: the alert state remembers `job::kind`, and
a parametrised kind adds its subject after a colon, `eval-drop:lambada_openai/acc`, so each metric keeps its own
cooldown), the words an email's subject leads with when the alert brings none (what to do, then what is wrong),
the next step for its "What to do" when the alert brings none (EXP becomes the experiment's name), and the
sentence of its `***ALERT: ...***` line. The watchdog, the training-health and eval-drop checks and the hourly
jobs' failures raise their alerts from here (`raise_alert`); tell/ words the messages from what an alert carries.

A new kind of alert is two edits: a `register(Condition(...))` here (or beside the check that raises it), and a
`raise_alert(kind, ...)` where it is detected, handed to `StatusReport.adding` (a watchdog check) or sent by
notify. Nothing else names a kind.

Values reach an alert already quoted: every fact from a run's files, the queue or a tool's output goes through
tell/quoting.quote_untrusted where the check reads it (no link, no control character), never here.

This module imports nothing else of ops/: watch/ and tell/ both stand on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

EXIT_HEALTHY = 0
EXIT_ALERT = 1
EXIT_ERROR = 2
"""Exit codes: healthy; at least one alert; Slurm could not be asked (the state is unknown)."""

STAMP_FORMAT = "%Y-%m-%d %H:%M:%S"
"""The `[YYYY-MM-DD HH:MM:SS]` prefix of every line a watchdog run prints and logs."""
DEFAULT_CONTACT = "the on-call person"
EVENT_KINDS = frozenset({"checkpoint-set-aside"})
"""Kinds that are events, not conditions: each is told once, never repeated after a cooldown nor recovered."""
"""Whom the ALERT lines say to alert when the caller names nobody: a role, never one site's team."""


@dataclass(frozen=True)
class Alert:
    """One condition that needs a person. `condition` is a stable key for the cooldowns (a kind, or
    `kind:subject` for a parametrised one)."""

    condition: str
    """A registered kind (CONDITIONS), with its subject after a colon for a parametrised one."""
    message: str
    """The `***ALERT: ...***` text, without the timestamp."""
    headline: str = ""
    """The subject's words: what to do first, then what is wrong (`release held array 720000 (scontrol release
    720000)`); only ids and numbers of the queue, never a job name. Empty: the condition's fixed headline."""
    advice: str = ""
    """The next step for the email's "What to do"; empty: the condition's advice."""

    @property
    def kind(self) -> str:
        """The condition's kind: `eval-drop` of `eval-drop:lambada_openai/acc`."""
        return self.condition.split(":", 1)[0]


@dataclass(frozen=True)
class StatusReport:
    """What one watchdog run found: a line per job and per alert, the alerts, the exit code."""

    job_name: str
    checked_at: datetime
    lines: tuple[str, ...]
    """Every line with its `[YYYY-MM-DD HH:MM:SS]` prefix: one per job, then one per alert."""
    alerts: tuple[Alert, ...] = ()
    exit_code: int = EXIT_HEALTHY
    finished_at: int | None = None
    """The final iteration when the training is done (nothing queued, the last checkpoint is the end)."""

    @property
    def healthy(self) -> bool:
        return self.exit_code == EXIT_HEALTHY

    @property
    def stamp(self) -> str:
        """`[YYYY-MM-DD HH:MM:SS]` of the check, the prefix of its lines."""
        return f"[{self.checked_at:{STAMP_FORMAT}}]"

    def adding(self, alerts: Iterable[Alert]) -> StatusReport:
        """This report with `alerts` after its own: a stamped line each, and at least EXIT_ALERT. The one way a
        watchdog check adds what it found; no alerts: the report as it is."""
        alerts = tuple(alerts)
        if not alerts:
            return self
        return replace(self, lines=(*self.lines, *(f"{self.stamp} {a.message}" for a in alerts)),
                       alerts=(*self.alerts, *alerts), exit_code=max(self.exit_code, EXIT_ALERT))


class UnknownCondition(KeyError):
    """An alert of a kind nobody registered (a typo in a check): names the kind and the registered ones."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Condition:
    """One kind of alert: its key, its words, registered once."""

    kind: str
    """The cooldown key (`stalled`, `health-nan`); lowercase words and dashes, no colon."""
    headline: str
    """An email subject's words when the alert brings none: what to do, then what is wrong. Fixed words, ids
    and numbers only (never a job name or a log's text)."""
    advice: str
    """The email's next step when the alert brings none; EXP becomes the experiment's name. `{fact}` fields
    are filled from the facts the alert is raised with."""
    says: str
    """The ALERT line's sentence, `{fact}` fields filled from the facts (`{job} is not RUNNING or SCHEDULED`)."""
    subject: str = ""
    """What a parametrised kind is per (`metric`: one cooldown per metric); empty: one alert of the kind."""

    def key(self, subject: str | None = None) -> str:
        """The alert's condition: the kind, with `:subject` for a parametrised one."""
        if bool(self.subject) != (subject is not None):
            need = f"one {self.subject} (the kind is per {self.subject})" if self.subject else "none"
            raise ValueError(f"alert {self.kind}: subject {subject!r}; allowed: {need}")
        return self.kind if subject is None else f"{self.kind}:{subject}"

    def alert(self, *, contact: str = DEFAULT_CONTACT, subject: str | None = None, headline: str = "",
              advice: str = "", **facts: object) -> Alert:
        """An Alert of this kind: its sentence with `facts` filled in, the headline and advice given (exact to the
        case: ids, the rollback command) or the condition's."""
        try:
            says = self.says.format(**facts)
            advice = advice or self.advice.format(**facts)
        except KeyError as exc:
            raise ValueError(f"alert {self.kind}: no fact {exc.args[0]!r} given; allowed: {sorted(facts)} must "
                             f"hold every field of {self.says!r} and {self.advice!r}") from None
        return Alert(self.key(subject), f"***ALERT: {says}! Alert someone at {contact}***",
                     headline or self.headline.format(**facts), advice)


CONDITIONS: dict[str, Condition] = {}
"""Every kind of alert by its kind: the one place its words are."""


def register(condition: Condition) -> Condition:
    """Add a kind of alert; a kind registered twice, or one that is no plain key, is refused."""
    kind = condition.kind
    if not kind or ":" in kind or kind != kind.strip().lower() or any(c.isspace() for c in kind):
        raise ValueError(f"alert kind {kind!r}: allowed: lowercase words joined by dashes, no colon or space")
    if kind in CONDITIONS:
        raise ValueError(f"alert kind {kind!r} is registered already (as {CONDITIONS[kind]!r}); a kind is "
                         "registered once")
    CONDITIONS[kind] = condition
    return condition


def condition(kind: str) -> Condition:
    """The registered condition of `kind` (an alert's `condition` may carry its subject: `eval-drop:t/acc`)."""
    found = CONDITIONS.get(kind.split(":", 1)[0])
    if found is None:
        raise UnknownCondition(f"alert kind {kind!r} is not registered; registered: {', '.join(sorted(CONDITIONS))}")
    return found


def raise_alert(kind: str, *, contact: str = DEFAULT_CONTACT, subject: str | None = None, headline: str = "",
                advice: str = "", **facts: object) -> Alert:
    """An Alert of the registered `kind` (Condition.alert): `raise_alert("stalled", job=name, what=..., ...)`."""
    return condition(kind).alert(contact=contact, subject=subject, headline=headline, advice=advice, **facts)


def headline_of(alert: Alert) -> str:
    """The alert's subject words: its own, else its condition's, else its condition's key."""
    found = CONDITIONS.get(alert.kind)
    return alert.headline or (found.headline if found is not None and "{" not in found.headline else alert.condition)


def advice_of(alert: Alert, default: str = "Look at the status lines above.") -> str:
    """The alert's next step: its own, else its condition's (with no facts to fill), else `default`."""
    found = CONDITIONS.get(alert.kind)
    return alert.advice or (found.advice if found is not None and "{" not in found.advice else default)


def _register_all(table: Mapping[str, tuple[str, str, str]], subject: str = "") -> None:
    for kind, (headline, advice, says) in table.items():
        register(Condition(kind, headline, advice, says, subject))


# --- the queue: status.evaluate and status.check -----------------------------------------------------------------
_register_all({
    "not-scheduled": ("launch it again: nothing running or queued",
                      "Nothing is running or queued: launch the training again (`bsops launch EXP`; add "
                      "--after-current if a job of it is still queued).",
                      "{job} is not RUNNING or SCHEDULED{stopped}"),
    "never-starts": ("release or cancel the queued job: it will never start",
                     "A queued job will never start on its own: release it (`scontrol release ID`) if it is "
                     "held, otherwise cancel it (`scancel ID`) and launch again.",
                     "{job} has job(s) that will never start on their own: {ids}"),
    "stalled": ("read the log, scancel a hung task: no progress",
                "The job runs but the training makes no progress: read the end of the log; if it hangs, "
                "`scancel` the running task (the next array task resumes from the last checkpoint) and, if "
                "one node is to blame, exclude it.",
                "{job} is RUNNING but {what} for {span} (limit {limit:g} min)"),
    "overlap": ("cancel the newer job: two trainings running at once",
                "Two trainings run at once and write the same checkpoints: cancel the newer one now.",
                "{job} has {count} jobs RUNNING at once ({ids}); two trainings must never overlap"),
    "slurm-error": ("check the Slurm controller (sinfo, squeue): cannot query Slurm",
                    "The watchdog could not ask Slurm: check the controller (`sinfo`, `squeue`) from a login "
                    "node; the training's state is unknown until it answers.",
                    "cannot query Slurm for {job}, its state is unknown ({detail})"),
    "cron-chain": ("re-install the cron chain (bsops cron install): gone or late",
                   "A cron runner chain is gone or late, so the hourly jobs (this watchdog among them) may "
                   "not run: `bsops cron status` shows the chains, `bsops cron install` re-submits a missing one.",
                   "{problem}"),
})

# --- the run's own files: the watchdog reads them and says which one it cannot ------------------------------------
_RUN_FILE = "{job} cannot read its run file {named}"
_register_all({
    "run-file-ledger": ("repair task-ledger.jsonl: a line cannot be read",
                        "A line of the task ledger cannot be read (a node died mid-write, or the file was damaged); "
                        "the watchdog skipped it and read the rest, and so do the array tasks (each says so in "
                        "main_log.txt). Remove or repair the line named above: `bsops rollback` refuses a ledger it "
                        "cannot read whole.", _RUN_FILE),
    "run-file-latest": ("look at the checkpoints folder: latest cannot be followed",
                        "`latest` cannot be read, or names no complete checkpoint: the next task resumes from the "
                        "newest checkpoint that verifies against its manifest and rewrites `latest` (what it set aside "
                        "is named in its log and alerted). Nothing to repair by hand; if it comes back, look at who "
                        "writes the folder (`bsops verify EXP` checks every checkpoint).", _RUN_FILE),
    "run-file-rollbacks": ("repair rollbacks.jsonl: a relaunch refuses it",
                           "rollbacks.jsonl holds a line that is not a rollback: a launch refuses to start until it is "
                           "repaired or removed (bsops rollback writes it, one JSON line per rollback).", _RUN_FILE),
    "run-file-record": ("repair the run's record: experiment.json cannot be read",
                        "The run's record (experiment.json, which each launch writes) cannot be read: the watchdog "
                        "and the hourly jobs read the run as its experiment file says today, and the commands that "
                        "show the run as recorded (info, chronicle, eval run) refuse it. Restore the file from "
                        "launches/<time>/ or from the backup, or relaunch (a launch writes it again).", _RUN_FILE),
    "run-file-backup": ("look at the backup store: a manifest or journal cannot be read",
                        "A manifest or journal of the backup store cannot be read: that copy counts as missing (the "
                        "next backup makes it again, and retention deletes nothing because of it). Look at the file "
                        "named above.", _RUN_FILE),
    "alert-state": ("look at the alert state: it cannot be read",
                    "The alert state (cooldowns and who was told) cannot be read: it was set aside and started "
                    "afresh, so alerts may repeat once. Look at the file named above, then delete it.", _RUN_FILE),
    "eval-result-file": ("look at the eval results: a result file cannot be read",
                         "A result file of `bsops eval` cannot be read (cut short, damaged or not one bsops wrote): it "
                         "is left out of the eval.alert_drop check, the tables and the plot. Evaluate that checkpoint "
                         "again (`bsops eval run EXP --step N`) to write it anew, or move the file away.",
                         "{job} cannot read its evaluation result file {named}"),
})

# --- training health (ops/health.py): a finding's own headline and next step are exact; these are its kind's -----
_HEALTH = "training health: {finding}"
_register_all({
    "health-nan": ("roll back: NaN loss",
                   "roll back to the last good checkpoint and skip the data since (`bsops rollback EXP --step STEP "
                   "--skip A-B`)", _HEALTH),
    "health-skipped": ("look for a spike, roll back if it goes on: steps skipped",
                       "overflowing steps train nothing: look for a loss or grad-norm spike, and roll back if it "
                       "goes on", _HEALTH),
    "health-loss-scale": ("roll back or train in bf16: fp16 loss scale collapsed",
                          "the gradients overflow again and again: roll back to a checkpoint before the collapse, "
                          "or train in bf16", _HEALTH),
    "health-loss-spike": ("read the samples, roll back if it stays: loss spike",
                          "look at the samples of the iteration (`bsops samples EXP --iteration N`); if the loss "
                          "does not come back, roll back and skip them (`bsops rollback EXP --step STEP --skip A-B`)",
                          _HEALTH),
    "health-grad-norm": ("watch the loss: grad norm explosion",
                         "a loss spike usually follows: watch the next lines, roll back if the loss jumps", _HEALTH),
    "health-slow": ("find and exclude the slow node: throughput fell",
                    "a slow or bad node: look for the outlier with the job's per-node timings, exclude it "
                    "(slurm.exclude) and requeue", _HEALTH),
    "health-unreadable": ("check the log file: training health unreadable",
                          "The watchdog cannot read the run's log: check the file and its permissions.",
                          "the training health of {log} cannot be read ({why})"),
})

# --- per subject: one cooldown per metric, per hourly job ---------------------------------------------------------
_register_all({
    "eval-drop": ("read the samples, roll back if it stays: an eval metric fell",
                  "An evaluation metric fell below the run's best so far by more than its eval.alert_drop margin: "
                  "read the samples trained on since the best checkpoint (`bsops samples EXP --iteration N`); if the "
                  "next evaluation does not come back, roll back to it (`bsops rollback EXP --step STEP --skip A-B`).",
                  "evaluation: {finding}"),
}, subject="metric")
_register_all({
    "job-failed": ("{job} failed",
                   "The next hourly run tries again; run `{command}` by hand to see it now.",
                   "{job} of {experiment} failed"),
}, subject="job")

# --- issue 47: a run launched here, nodes that never come back by themselves, the watchdog's own files, checkpoints
# set aside -------------------------------------------------------------------------------------------------------
_register_all({
    "local-stopped": ("launch it again: the local run stopped before its end",
                      "The run was launched on this machine (`bsops launch EXP --local`) and none of its processes is "
                      "left: its launcher and trainers ended before the training did (killed, the machine "
                      "restarted). Run the same `bsops launch EXP --local` again: it resumes from the last save.",
                      "{job} is not running here (launched with bsops launch --local){stopped}"),
    "pending-blocked": ("ask the cluster's admins to bring back the nodes: a task waits on down or drained nodes",
                        "A task of the training has waited past alerts.blocked_minutes on nodes that no waiting brings "
                        "back (down, drained, reserved for maintenance, not available): ask the cluster's "
                        "administrators (`sinfo -R` shows why each node is out), or move the training to other nodes "
                        "or another partition (slurm.partition, slurm.exclude) and launch again.",
                        "{job} has waited {span} (limit {limit:g} min) on nodes that only an administrator brings "
                        "back: {jobs}"),
    "watch-files-moved": ("make the run's log folder writable: the watchdog keeps its files elsewhere",
                          "The watchdog cannot write beside the run's log (a read-only or full file system, a "
                          "permission, something else in a file's place): its alert state (the cooldowns) and its "
                          "lines are kept in the folder named above until it can again, and then move back. Make the "
                          "folder writable, or look at what is in the file's place.",
                          "{job} cannot write {what} ({why}): its alert state and watchdog lines are kept in "
                          "{elsewhere} meanwhile"),
    "run-file-set-aside": ("repair set-aside.jsonl: a line cannot be read",
                           "A line of the checkpoints' set-aside.jsonl (one per checkpoint the trainer moved out of "
                           "the way) cannot be read: a checkpoint may have been set aside without the watchdog "
                           "telling which. Look at the set-aside-*/ folders of the checkpoints, then repair or remove "
                           "the line.", _RUN_FILE),
})
_register_all({
    "checkpoint-set-aside": ("look at the checkpoint set aside: it could not be resumed from",
                             "The trainer found the checkpoint `latest` named incomplete or corrupt, moved it aside "
                             "whole (nothing was deleted) and resumed from the newest one that verifies: the training "
                             "goes on from there and repeats the steps since. Look at the folder named above (which "
                             "file, and why: a full disk, a node that died mid-save), then delete it when you no "
                             "longer need it. Told once per checkpoint set aside.",
                             "{job}: checkpoint {tag} could not be resumed from ({reason}); it was set aside on "
                             "{when} as {folder}"),
}, subject="record")
