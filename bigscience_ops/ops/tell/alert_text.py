"""What the alert emails say: each subject leads with what to do, then what is wrong; the body holds the details.

The watchdog's alerts carry their own headline and next step where the queue or the log make them exact
(`release held array 720000 (scontrol release 720000)`, a health finding's rollback command); otherwise
their condition's, registered with its kind in ops/alerts.py, the one place those words are. Subjects are
fixed words, ids and numbers: never a job name from the queue or a log line (those go in the body), and
message.compose caps them at SUBJECT_MAX characters. The channels (channels.py) send these texts; notify.py keeps the cooldown state.

A value from a run's files is never a link here: the watchdog quotes each one where it enters an alert
(quoting.quote_untrusted), a failing job's error and a message read back from the alert state go through it
line by line (untrusted_text), the names a subject or a body is built from (the experiment's, which a run's
record may give, the Slurm job name, a condition read back from the alert state) through its link rules
(`named`: `tr1-13B` stays as it is, `paypal.bank` is `paypal[.]bank`), and message.compose lays
quoting.defang_block over every subject and body.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import datetime, timedelta

from bigscience_ops.ops.alerts import EVENT_KINDS, Alert, StatusReport, advice_of, headline_of
from bigscience_ops.ops.tell.quoting import LINE_MAX, defang_names, quote_untrusted

ERROR_LINES = 40
"""Lines of a failing job's error text (or of a message read back from the alert state) shown at most."""


def named(name: object) -> str:
    """An experiment's, a Slurm job's or a condition's name as a subject or a body shows it: a name that looks like
    a host or an address is no link (quoting.defang_names: `paypal.bank` is `paypal[.]bank`); the usual names stay
    as they are, and the subject's and body's own rules make a control character in one harmless."""
    return defang_names(str(name))


def headline(alert: Alert) -> str:
    """The alert's subject words (ops/alerts.py: its own, else its condition's)."""
    return headline_of(alert)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def alert_email(experiment: str, report: StatusReport, due: Sequence[Alert], cooldown: float,
                log_path: str | None) -> tuple[str, str]:
    """(subject, body) of the watchdog's alert about `due` (the first one's headline leads the subject)."""
    experiment, job_name = named(experiment), named(report.job_name)
    more = f" (+{len(due) - 1} more)" if len(due) > 1 else ""
    subject = f"[ALERT] {experiment}: {headline(due[0])}{more}"
    advice = "\n".join(f"- {_sentence(advice_of(a))}" for a in due)
    body = "\n".join([
        f"Experiment: {experiment}",
        f"Slurm job name: {job_name}",
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
        f"- Check again with: bsops status --job-name {job_name}",
        "",
        *_repeats(due, cooldown),
    ])
    return subject, body + "\n"


def _repeats(due: Sequence[Alert], cooldown: float) -> list[str]:
    """The footer: how often the conditions are told again; an event (a checkpoint set aside) is told once."""
    events = [a for a in due if a.kind in EVENT_KINDS]
    if len(events) == len(due):
        return ["This alert is told once: what it tells has happened and cannot clear."]
    lines = [f"This alert repeats at most every {cooldown:g} minutes while the condition lasts; a recovery",
             "email follows when it clears."]
    return lines + (["What has happened (a checkpoint set aside) is told once."] if events else [])


def recovery_email(experiment: str, report: StatusReport, entries: Sequence[dict], conditions: Sequence[str],
                   now: datetime) -> tuple[str, str]:
    experiment, conditions = named(experiment), [named(c) for c in conditions]  # the state's keys: the run's words
    subject = f"[RECOVERED] {experiment}: {', '.join(conditions)} cleared"
    lasted = [f"- {untrusted_text(str(e.get('message', c)))} (since {e.get('since', '?')})"
              for c, e in zip(conditions, entries)]  # the state file beside the log is the run's: its words quoted
    body = "\n".join([
        f"Experiment: {experiment}",
        f"Slurm job name: {named(report.job_name)}",
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
    experiment = named(experiment)
    subject = f"[FINISHED] {experiment}: training finished at iteration {report.finished_at}"
    body = "\n".join([f"Experiment: {experiment}", f"Slurm job name: {named(report.job_name)}", "",
                      *report.lines, "", "Nothing is queued and none needs to be: remove its watchdog "
                      "from cron.hourly/ when the checkpoints are safe."])
    return subject, body + "\n"


def job_alert_email(experiment: str, job: str, alert: Alert, error: str, since: datetime, cooldown: float,
                    now: datetime) -> tuple[str, str]:
    """(subject, body) of an hourly job's failure (`job`: hub-sync, backup, eval), raised as `alert` (job-failed)."""
    raw, experiment = experiment, named(experiment)
    failing = f"\n\nIt has been failing since {since:%Y-%m-%d %H:%M} ({lasted(now - since)})." if since < now else ""
    body = (f"{job} of {experiment} failed:\n\n{untrusted_text(error)}{failing}\n\n"
            f"{advice_of(alert).replace(raw, experiment)}\n\n"
            f"This alert repeats at most every {cooldown:g} minutes while it keeps failing; a recovery email\n"
            f"follows when {job} works again.\n")
    return f"[bsops] {experiment}: {headline_of(alert)}", body


def job_recovery_email(experiment: str, job: str, entry: dict, now: datetime) -> tuple[str, str]:
    experiment = named(experiment)
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
