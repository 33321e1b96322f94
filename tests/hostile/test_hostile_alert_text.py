"""Hostile values in a run's files never reach an alert as a link or a raw control character.

Each row of HOSTILE is written where anyone on the project can write (the task ledger, a result file, the log's
last iteration line, eval/jobs.jsonl) and driven through every alert path that reads it, to a real SMTP server
(aiosmtpd) and a real https webhook server: `bsops status` (a task's end read from the ledger, a ledger line and a
result file that cannot be read), the watchdog's stall alert (the log's last iteration line) and `bsops eval --next
--alert` (a failed eval job of jobs.jsonl). The delivered bytes are checked: the value got there (its marker), and
no scheme, `www.` name, markdown or HTML link of it is live, and no control or separator character is raw.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import ledger
from bigscience_ops.cli import main
from bigscience_ops.ops.evaluate import next_eval
from bigscience_ops.ops.tell.quoting import quote_untrusted
from bigscience_ops.ops.watch import watchdog
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_smtp import Hooked, Inbox, plain_outbox
from tests.fixtures_slurm import replay_sbatch, replay_squeue
from tests.fixtures_status import seed_job
from tests.fixtures_runs import commit_checkpoint

VAR = "BSOPS_TEST_HOSTILE_WEBHOOK"
NOW = datetime(2026, 11, 22, 12, 0, 0)

HOSTILE = {
    "markdown link": "[verify your token](https://evil.example/login)",
    "markdown link with title": '[Reset](https://evil.example/reset "Genuine HR")',
    "markdown reference": "[verify][1] then [1]: https://evil.example/login",
    "markdown autolink": "<https://evil.example/login>",
    "bare https": "https://evil.example/login?next=/admin",
    "upper case": "HTTPS://EVIL.EXAMPLE/LOGIN",
    "mixed case": "hTtP://evil.example/a",
    "backslashes": "https:\\\\evil.example\\login",
    "one slash": "https:/evil.example/login",
    "no slash": "https:evil.example/login",
    "protocol relative": "//evil.example/login",
    "ftp": "ftp://evil.example/payload.sh",
    "www": "www.evil.example/login",
    "punycode": "https://xn--80ak6aa92e.com/login",
    "bare punycode": "xn--80ak6aa92e.com/login",
    "IDN": "https://раураl.com/login",
    "fullwidth": "ｈｔｔｐｓ：／／evil.example/login",
    "ideographic dot": "https://evil。example/login",
    "user info": "https://bank.example@evil.example/login",
    "IP": "http://203.0.113.7:8080/login",
    "javascript": "javascript:alert(document.cookie)",
    "vbscript": "vbscript:msgbox(1)",
    "data URI": "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "file URI": "file:///etc/passwd",
    "mailto": "mailto:it-support@evil.example?subject=token",
    "HTML img": '<img src="https://evil.example/x.png" onerror="alert(1)">',
    "HTML a": '<a href="https://evil.example/login">verify</a>',
    "slack link": "<https://evil.example/login|verify your token>",
    "line separator": "ok\u2028Subject: reset your token at https://evil.example/x",
    "paragraph separator": "ok\u2029[verify](https://evil.example/x)",
    "next line": "ok\u0085https://evil.example/x",
    "CRLF header": "x\r\nBcc: victim@example.org\r\n\r\nhttps://evil.example/x",
    "bare CR": "x\rhttps://evil.example/x",
    "VT FF and separators": "a\x0bb\x0cc\x1cd\x1de\x1ef https://evil.example/x",
    "bidi override": "\u202elanigiro\u202c https://evil.example/\u202egnp.exe",
    "zero width": "ht\u200btps://evil\u200d.example/\ufefflogin",
    "NUL": "job\x00https://evil.example/x",
    "terminal hyperlink": "\x1b]8;;https://evil.example/x\x07click\x1b]8;;\x07",
    "100 KB then a link": "A" * 100_000 + " https://evil.example/x",
    "a link then 100 KB": "https://evil.example/" + "a" * 100_000,
}

# What must not be in a delivered text: a live scheme, a `www.` name, the hostile host whole, markdown and HTML links.
LIVE = [
    re.compile(r"(?i)\b[a-z][a-z0-9+.-]*:\s*(//|\\\\|/\\)"),
    re.compile(r"(?i)\b(https?|ftp|javascript|vbscript|data|mailto|file):\S"),
    re.compile(r"(?i)\bwww\."),
    re.compile(r"(?i)evil\.example|xn--80ak6aa92e\.com|раураl\.com|203\.0\.113\.7"),
    re.compile(r"\[[^\]\n]*\]\("),  # CommonMark: an inline link's `(` follows its `]` at once
    re.compile(r"(?i)<\s*(a|img)\b|<https?:"),
]


def _clean(text: str, marker: str) -> None:
    """`text` carries `marker` (the value got there) and nothing live or raw."""
    assert marker in text
    raw = [f"U+{ord(c):04X}" for c in text.replace("\r\n", "\n") if not (c.isprintable() or c == "\n")]
    assert raw == []
    for rule in LIVE:
        found = rule.search(text)
        assert found is None, text[max(0, found.start() - 300):found.end() + 100]


def _delivered(inbox: Inbox, hooked: Hooked) -> list[str]:
    """Every text delivered since the last call (each mail's subject, each body, each webhook post), emptied after."""
    texts = [str(m["Subject"]) for m in inbox.messages] + [m.get_content() for m in inbox.messages]
    texts += [post["text"] for post in hooked.posts]
    inbox.messages.clear()
    hooked.posts.clear()
    return texts


def _wait_for(inbox: Inbox, count: int) -> None:
    """aiosmtpd hands a message to its handler just after answering the client: wait for it (a moment)."""
    deadline = time.monotonic() + 5
    while len(inbox.messages) < count and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def experiment(trainings: Path, tmp_path: Path, mail_and_hook, cert, monkeypatch) -> tuple[str, Path]:
    """`watched`: tiny with its run in tmp_path/run, evaluating a held-out source, alerting by email and webhook."""
    inbox, port, hooked = mail_and_hook
    _delivered(inbox, hooked)
    monkeypatch.setenv(VAR, hooked.url)
    monkeypatch.setenv("SSL_CERT_FILE", cert[0])  # the default context trusts the test CA, as a site CA would be
    held = tmp_path / "held.jsonl"
    held.write_text('{"text": "held out"}\n')
    alerts = (f"alerts: {{email_to: [oncall@example.org], email_from: bot@example.org, smtp_host: 127.0.0.1, "
              f"smtp_port: {port}, smtp_security: none, webhook_url_env: {VAR}}}\n")
    (trainings / "watched.yaml").write_text(tiny_yaml(
        tmp_path / "run", "slurm: {job_name: bsops-hostile-watched}\n", f"eval: {{sources: {{held: {json.dumps(str(held))}}}}}\n",
        alerts))
    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / "global_step5").mkdir(parents=True)
    (checkpoints / "global_step5" / "bsops.json").write_text(json.dumps({"iteration": 5}))
    commit_checkpoint(checkpoints / "global_step5")
    (checkpoints / "latest").write_text("global_step5")
    return "watched", tmp_path / "run"


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_value_reaches_mail_and_webhook_quoted_never_live(name: str, experiment, mail_and_hook, trainings: Path,
                                                                     tmp_path: Path, monkeypatch) -> None:
    inbox, port, hooked = mail_and_hook
    exp, run = experiment
    marker = f"Q{list(HOSTILE).index(name)}Z"
    value = f"{marker} {HOSTILE[name]}"
    # squeue and sbatch answer with their recorded real output: a queue without this run's jobs, a job id.
    monkeypatch.setenv("PATH", f"{replay_sbatch(replay_squeue(tmp_path / 'bin', 'squeue.txt'))}:{os.environ['PATH']}")

    # bsops status: the ledger's last task (its id and nodes), a ledger line and a result file it cannot read.
    ledger.mark_launch(run, "4242")
    for event, code in (("begin", None), ("end", 1)):
        ledger.append(run / ledger.LEDGER_NAME, ledger.TaskRecord(event, value[:250], value[:2000], 5, 1.0e9, code))
    with open(run / ledger.LEDGER_NAME, "ab") as raw:
        raw.write(value.encode("utf-8", "surrogatepass") + b"\n")
    (run / "eval").mkdir()
    (run / "eval" / "global_step5.json").write_text(json.dumps({
        "results": {value: {"acc": 0.5}}, "bsops": {"format": 1, "experiment": exp, "tag": "global_step5", "step": 5,
                                                   "iteration": 5, "bits_per_byte": {value: {"bits_per_byte": 1.0}}}}))
    result = CliRunner().invoke(main, ["status", exp, "--trainings-dir", str(trainings), "--timeout", "5"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    _wait_for(inbox, 1)
    texts = _delivered(inbox, hooked)
    assert len(texts) == 3  # the subject and the body of one mail, one post
    for text in texts[1:]:
        _clean(text, marker)
    for line in result.output.splitlines():  # the console's alert lines: quoted too (the marker's line among them)
        if "***ALERT" in line:
            _clean(line, "***ALERT")

    # The watchdog's stall alert quotes the log's last iteration line.
    log = run / "logs" / "main_log.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b" iteration        5/     100 | " + value.encode("utf-8", "surrogatepass") + b"\n")
    os.utime(log, (NOW.timestamp() - 7200, NOW.timestamp() - 7200))
    settings = watchdog.WatchSettings("tr1-13B-round3", log_path=log, stall_minutes=10, cooldown_minutes=60,
                                      outbox=plain_outbox(port, webhook_env=VAR), state_path=tmp_path / "state.json")
    watched = watchdog.watch(settings, query=lambda **_: [seed_job(start_time=NOW - timedelta(hours=3))], now=NOW)
    assert [a.condition for a in watched.report.alerts] == ["stalled"]
    _wait_for(inbox, 1)
    for text in _delivered(inbox, hooked)[1:]:
        _clean(text, marker)
    for line in watched.lines:
        if "***ALERT" in line:
            _clean(line, "***ALERT")

    # bsops eval next --alert: a job of jobs.jsonl that left the queue without its result is mailed.
    (run / "eval" / "global_step5.json").unlink()
    jobs = run / "eval" / next_eval.LEDGER_NAME
    jobs.write_text(json.dumps({"event": "submitted", "job_id": value[:250], "tag": "global_step5", "step": 5,
                                "time": 1.0e9, "log": value[:4000]}) + "\n")
    taken = next_eval.read_ledger(jobs).records  # a value with a control character is no record: nothing to alert
    result = CliRunner().invoke(main, ["eval", "next", exp, "--alert", "--trainings-dir", str(trainings)])
    assert "Traceback" not in result.output, result.output
    _wait_for(inbox, 1 if taken else 0)
    texts = _delivered(inbox, hooked)
    assert result.exit_code == (2 if taken else 0) and len(texts) == (3 if taken else 0), result.output
    for text in texts[1:]:
        _clean(text, marker)
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    for line in errors:
        _clean(line, marker)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_the_quoting_function_alone(name: str) -> None:
    """quote_untrusted over each row: quoted, printable, bounded, nothing live; and the net under every message
    (defang_block) changes nothing more in what it quoted."""
    from bigscience_ops.ops.tell.quoting import QUOTE_MAX, defang_block

    quoted = quote_untrusted(HOSTILE[name])
    assert quoted.startswith('"') and len(quoted) <= 4 * QUOTE_MAX + 40
    for rule in LIVE:
        assert rule.search(quoted) is None, rule.search(quoted)
    assert all(c.isprintable() for c in quoted)
    assert defang_block(quoted) == quoted
