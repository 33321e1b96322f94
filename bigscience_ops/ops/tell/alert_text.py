"""What the alert emails say: each subject leads with what to do, then what is wrong; the body holds the details.

The watchdog's alerts carry their own headline and next step where the queue or the log make them exact
(`release held array 720000 (scontrol release 720000)`, a health finding's rollback command); otherwise
a condition's fixed headline and advice below are used. Subjects are fixed words, ids and numbers:
never a job name from the queue or a log line (those go in the body), and message.compose caps
them at SUBJECT_MAX characters. The channels (channels.py) send these texts; notify.py keeps the cooldown state.

A value from a run's files is never a link here: the watchdog quotes each one where it enters an alert
(quoting.quote_untrusted), a failing job's error and a message read back from the alert state go through it
line by line (untrusted_text), and message.compose lays quoting.defang_block over every subject and body.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import datetime, timedelta

from bigscience_ops.ops.tell.quoting import LINE_MAX, quote_untrusted
from bigscience_ops.ops.watch.status import Alert, StatusReport

ERROR_LINES = 40
"""Lines of a failing job's error text (or of a message read back from the alert state) shown at most."""

HEADLINES = {
    "not-scheduled": "launch it again: nothing running or queued",
    "never-starts": "release or cancel the queued job: it will never start",
    "stalled": "read the log, scancel a hung task: no progress",
    "overlap": "cancel the newer job: two trainings running at once",
    "cron-chain": "re-install the cron chain (bsops cron install): gone or late",
    "slurm-error": "check the Slurm controller: cannot query Slurm",
    "health-nan": "roll back: NaN loss",
    "health-skipped": "look for a spike, roll back if it goes on: iterations skipped",
    "health-loss-scale": "roll back or train in bf16: fp16 loss scale collapsed",
    "health-loss-spike": "read the samples, roll back if it stays: loss spike",
    "health-grad-norm": "watch the loss: grad norm explosion",
    "health-slow": "find and exclude the slow node: throughput fell",
    "health-unreadable": "check the log file: training health unreadable",
    "eval-drop": "read the samples, roll back if it stays: an eval metric fell",
    "eval-result-file": "look at the eval results: a result file cannot be read",
}
"""A condition's subject words when its alert brings none: what to do, then what is wrong."""

ADVICE = {
    "not-scheduled": "Nothing is running or queued: launch the training again (`bsops launch EXP`; add "
                     "--after-current if a job of it is still queued).",
    "never-starts": "A queued job will never start on its own: release it (`scontrol release ID`) if it is "
                    "held, otherwise cancel it (`scancel ID`) and launch again.",
    "stalled": "The job runs but the training makes no progress: read the end of the log; if it hangs, "
               "`scancel` the running task (the next array task resumes from the last checkpoint) and, if "
               "one node is to blame, exclude it.",
    "overlap": "Two trainings run at once and write the same checkpoints: cancel the newer one now.",
    "cron-chain": "A cron runner chain is gone or late, so the hourly jobs (this watchdog among them) may "
                  "not run: `bsops cron status` shows the chains, `bsops cron install` re-submits a missing one.",
    "slurm-error": "The watchdog could not ask Slurm: check the controller (`sinfo`, `squeue`) from a login "
                   "node; the training's state is unknown until it answers.",
    "health-nan": "Roll back to the last good checkpoint and skip the data since (`bsops rollback EXP --to STEP "
                  "--skip A-B`).",
    "health-skipped": "Overflowing steps train nothing: look for a loss or grad-norm spike, and roll back if it "
                      "goes on.",
    "health-loss-scale": "The gradients overflow again and again: roll back to a checkpoint before the collapse, "
                         "or train in bf16.",
    "health-loss-spike": "Look at the samples of the iteration (`bsops samples EXP --iteration N`); if the loss "
                         "does not come back, roll back and skip them (`bsops rollback EXP --to STEP --skip A-B`).",
    "health-grad-norm": "A loss spike usually follows: watch the next lines, roll back if the loss jumps.",
    "health-slow": "A slow or bad node: find the outlier in the job's per-node timings, exclude it "
                   "(slurm.exclude) and requeue.",
    "health-unreadable": "The watchdog cannot read the run's log: check the file and its permissions.",
    "eval-drop": "An evaluation metric fell below the run's best so far by more than its eval.alert_drop margin: "
                 "read the samples trained on since the best checkpoint (`bsops samples EXP --iteration N`); if the "
                 "next evaluation does not come back, roll back to it (`bsops rollback EXP --to STEP --skip A-B`).",
    "eval-result-file": "A result file of `bsops eval` cannot be read: evaluate that checkpoint again (`bsops eval EXP "
                        "--step N`) or move the file away.",
}
"""A condition's next step when its alert brings none; EXP becomes the experiment's name. A condition with a
subject after a colon (`eval-drop:lambada_openai/acc`) takes its kind's."""


def _kind(condition: str) -> str:
    return condition.split(":", 1)[0]


def headline(alert: Alert) -> str:
    return alert.headline or HEADLINES.get(alert.condition) or HEADLINES.get(_kind(alert.condition), alert.condition)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def alert_email(experiment: str, report: StatusReport, due: Sequence[Alert], cooldown: float,
                log_path: str | None) -> tuple[str, str]:
    """(subject, body) of the watchdog's alert about `due` (the first one's headline leads the subject)."""
    more = f" (+{len(due) - 1} more)" if len(due) > 1 else ""
    subject = f"[ALERT] {experiment}: {headline(due[0])}{more}"
    advice = "\n".join(f"- {_sentence(a.advice or ADVICE.get(_kind(a.condition), 'Look at the status lines above.'))}"
                       for a in due)
    body = "\n".join([
        f"Experiment: {experiment}",
        f"Slurm job name: {report.job_name}",
        f"Checked at: {report.checked_at:%Y-%m-%d %H:%M:%S} on {socket.gethostname()}",
        *([f"Log: {log_path}"] if log_path else []),
        "",
        *(a.message for a in due),
        "",
        "What the watchdog saw:",
        *report.lines,
        "",
        "What to do:",
        advice.replace("EXP", experiment),
        f"- Check again with: bsops status --job-name {report.job_name}",
        "",
        f"This alert repeats at most every {cooldown:g} minutes while the condition lasts; a recovery",
        "email follows when it clears.",
    ])
    return subject, body + "\n"


def recovery_email(experiment: str, report: StatusReport, entries: Sequence[dict], conditions: Sequence[str],
                   now: datetime) -> tuple[str, str]:
    subject = f"[RECOVERED] {experiment}: {', '.join(conditions)} cleared"
    lasted = [f"- {untrusted_text(str(e.get('message', c)))} (since {e.get('since', '?')})"
              for c, e in zip(conditions, entries)]  # the state file beside the log is the run's: its words quoted
    body = "\n".join([
        f"Experiment: {experiment}",
        f"Slurm job name: {report.job_name}",
        f"Checked at: {now:%Y-%m-%d %H:%M:%S} on {socket.gethostname()}",
        "",
        "These alerts have cleared; nothing more to do for them:",
        *lasted,
        "",
        "What the watchdog sees now:",
        *report.lines,
    ])
    return subject, body + "\n"


def finished_email(experiment: str, report: StatusReport) -> tuple[str, str]:
    subject = f"[FINISHED] {experiment}: training finished at iteration {report.finished_at}"
    body = "\n".join([f"Experiment: {experiment}", f"Slurm job name: {report.job_name}", "",
                      *report.lines, "", "Nothing is queued and none needs to be: remove its watchdog "
                      "from cron.hourly/ when the checkpoints are safe."])
    return subject, body + "\n"


def job_alert_email(experiment: str, job: str, error: str, command: str, since: datetime, cooldown: float,
                    now: datetime) -> tuple[str, str]:
    """(subject, body) of an hourly job's failure (`job`: hub-sync, backup)."""
    failing = f"\n\nIt has been failing since {since:%Y-%m-%d %H:%M} ({lasted(now - since)})." if since < now else ""
    body = (f"{job} of {experiment} failed:\n\n{untrusted_text(error)}{failing}\n\n"
            f"The next hourly run tries again; run `{command}` by hand to see it now.\n\n"
            f"This alert repeats at most every {cooldown:g} minutes while it keeps failing; a recovery email\n"
            f"follows when {job} works again.\n")
    return f"[bsops] {experiment}: {job} failed", body


def job_recovery_email(experiment: str, job: str, entry: dict, now: datetime) -> tuple[str, str]:
    since = datetime.fromisoformat(entry["since"])
    body = (f"{job} of {experiment} works again (checked at {now:%Y-%m-%d %H:%M:%S} on {socket.gethostname()}).\n\n"
            f"It failed from {since:%Y-%m-%d %H:%M} for {lasted(now - since)}. The last error was:\n\n"
            f"{untrusted_text(str(entry.get('message', '(not recorded)')))}\n\nNothing more to do for it.\n")
    return f"[RECOVERED] {experiment}: {job} works again", body


def untrusted_text(text: str) -> str:
    """A text that mixes bsops' words with a run's file's (an error naming a jobs.jsonl line, git's output, a message
    read back from the alert state): each of its first ERROR_LINES lines through quoting.quote_untrusted (printable,
    bounded, no link), the line breaks kept."""
    lines = text.split("\n")
    more = [f"(+{len(lines) - ERROR_LINES} more lines)"] if len(lines) > ERROR_LINES else []
    return "\n".join([*(quote_untrusted(line, LINE_MAX, mark=False) for line in lines[:ERROR_LINES]), *more])


def lasted(span: timedelta) -> str:
    minutes = max(0, round(span.total_seconds() / 60))
    days, rest = divmod(minutes, 24 * 60)
    return (f"{days} d " if days else "") + f"{rest // 60} h {rest % 60:02d} min"
