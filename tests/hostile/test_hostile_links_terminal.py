"""Hostile inputs of two classes (issue 48): a name in a run's file never becomes a link in an alert, and a run's
log or a cron folder's file name never reaches the terminal raw.

LINKS: each row is written where anyone on the project can write, in the three places the issue found live: the eval
ledger (eval/jobs.jsonl: a job id and its log), a result file's `missing` reasons (eval/global_stepN.json) and the
alert state (.bsops-alerts.json: the message a recovery repeats). One `bsops eval next EXP --alert` pass sends
all three to a real SMTP server (aiosmtpd) and a real https webhook. Every delivered subject, body and webhook text is
then run through a real linkifier (linkify-it-py, the linkify rules of markdown-it and chat renderers, here with
every top-level domain of any script allowed, as a mail client that knows them all would) and rendered to HTML by
markdown-it with it, as written and as a client folds it (NFKC, dot and at look-alikes): no link is found, and no
`<a>` tag made, while the value is there (its marker). NAMES: an experiment and a cron job file named like a host
(the names subjects are built from), checked the same way.

TERMINAL (LOG_LINES, CRON_ENTRIES): each row puts an escape sequence or a control character in main_log.txt (`bsops logs`) or in a cron
job's file name (`bsops cron list`, `bsops cron run`), or a job file that is not a plain file where `cron run` looks:
the output holds no raw control character (the escape is shown, visible), and only plain files are submitted.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from linkify_it import LinkifyIt
from linkify_it.tlds import TLDS
from markdown_it import MarkdownIt

from bigscience_ops.cli import main
from bigscience_ops.cli.base import EXIT_PROBLEMS
from bigscience_ops.ops.evaluate.commands import FAILURES
from bigscience_ops.ops.evaluate import next_eval
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_slurm import replay_sbatch, replay_squeue, sbatch_calls
from tests.fixtures_smtp import Hooked, Inbox

VAR = "BSOPS_TEST_LINKS_WEBHOOK"

# ----------------------------------------------------------------------------- links in alerts

LINKS = {
    "a new gTLD": "evil.support/login",
    "a brand gTLD": "paypal.bank/verify",
    "a two-letter ccTLD": "evil.sh/x",
    "a subdomain under a ccTLD": "okta.evil.in/sso",
    "upper case": "EVIL.SUPPORT/LOGIN",
    "fullwidth letters and dot": "ｅｖｉｌ．ｓｕｐｐｏｒｔ/login",
    "ideographic full stop": "evil。com/login",
    "halfwidth ideographic full stop": "evil｡com/login",
    "one dot leader": "evil․com/login",
    "small full stop": "evil﹒com/login",
    "Syriac full stops": "okta܁evil܂com/sso",
    "a Cyrillic IDN": "пример.рф/вход",
    "a Japanese IDN": "例え.テスト/ログイン",
    "a punycode TLD": "evil.xn--p1ai/login",
    "an address": "helpdesk@evil.support",
    "a fullwidth at sign": "helpdesk＠evil．support",
    "a small at sign": "helpdesk﹫evil.bank",
    "a port": "evil.support:8443/login",
    "in quotes and brackets": '("evil.support") [evil.bank] <evil.sh> {evil.in}',
    "after a backslash and a tilde": "C:\\evil.support\\login ~evil.bank",
    "an IPv4 address": "198.51.100.7/login",
    "a mathematical bold host": "𝐞𝐯𝐢𝐥.𝐬𝐮𝐩𝐩𝐨𝐫𝐭/login",
}


def _linkifier() -> LinkifyIt:
    """linkify-it with every IANA top-level domain and any other of 2-63 letters of any script (a new gTLD, an IDN
    one), fuzzy links, addresses and IP addresses on: what the strictest chat app or mail client would link."""
    return LinkifyIt(options={"fuzzy_link": True, "fuzzy_email": True, "fuzzy_ip": True}).tlds(
        [t.lower() for t in TLDS] + [r"[^\W\d_]{2,63}"], True)


LINKIFY = _linkifier()
MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": True}).enable("linkify")
MARKDOWN.linkify = LINKIFY


# What a browser's or mail client's host parsing takes for a dot or an at sign (IDNA's label separators, what NFKC
# folds to them, other scripts' full stops): a client that reads the text so must find no link either.
DOTS = "\u3002\uff0e\uff61\ufe12\u2024\ufe52\u0701\u0702\u06d4\u0589\u1362\u1803\u166e\ua4ff\ua60e\u2e3c"
FOLDED = str.maketrans({**{c: "." for c in DOTS}, "\uff20": "@", "\ufe6b": "@"})


def _links(text: str) -> list[str]:
    """Every link the linkifier finds in `text`, as it is and as a client folds it (NFKC, dot and at look-alikes),
    and every `<a` tag markdown-it makes of it (rendered as HTML); but those bsops puts there itself: the name of
    the host that checked (`... on node1.example.org`) and its cron folders (`cron.hourly`, which only a linkifier
    that takes any word for a top-level domain links)."""
    for ours in (socket.gethostname(), "cron.hourly", "cron.daily"):
        text = text.replace(ours, "bsops-own-words")
    folded = unicodedata.normalize("NFKC", text.translate(FOLDED)).translate(FOLDED)
    found = [m.raw for t in (text, folded) for m in LINKIFY.match(t) or []]
    return found + re.findall(r"<a [^>]*>", MARKDOWN.render(text) + MARKDOWN.render(folded))


def _delivered(inbox: Inbox, hooked: Hooked, count: int) -> list[str]:
    """The texts of the `count` (or more) messages delivered since the last call, emptied after: each mail's subject
    and body, each webhook post's text. aiosmtpd hands a message over just after answering: waited for (a moment)."""
    deadline = time.monotonic() + 5
    while len(inbox.messages) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(inbox.messages) == len(hooked.posts) >= count
    texts = [str(m["Subject"]) for m in inbox.messages] + [m.get_content() for m in inbox.messages]
    texts += [post["text"] for post in hooked.posts]
    inbox.messages.clear()
    hooked.posts.clear()
    return texts


@pytest.fixture
def alerting(mail_and_hook, cert, trainings: Path, tmp_path: Path, monkeypatch) -> Callable[[str], Path]:
    """`alerting(name)`: experiment `name`, evaluating a held-out source, alerting by email and webhook to the
    module's mail_and_hook, with its run (committed checkpoints of steps 5 and 10) in tmp_path/run; squeue and sbatch
    answer with their recorded real output (a queue without this run's jobs, a job id)."""
    inbox, port, hooked = mail_and_hook
    _delivered(inbox, hooked, 0)
    monkeypatch.setenv(VAR, hooked.url)
    monkeypatch.setenv("SSL_CERT_FILE", cert[0])  # the default context trusts the test CA, as a site CA would be
    monkeypatch.setenv("PATH", f"{replay_sbatch(replay_squeue(tmp_path / 'bin', 'squeue.txt'))}:{os.environ['PATH']}")

    def make(name: str) -> Path:
        run = tmp_path / "run"
        held = tmp_path / "held.jsonl"
        held.write_text('{"text": "held out"}\n')
        (trainings / f"{name}.yaml").write_text(tiny_yaml(
            run, "slurm: {job_name: bsops-hostile-links}\n", f"eval: {{sources: {{held: {json.dumps(str(held))}}}}}\n",
            f"alerts: {{email_to: [oncall@example.org], email_from: bot@example.org, smtp_host: 127.0.0.1, "
            f"smtp_port: {port}, smtp_security: none, webhook_url_env: {VAR}}}\n"))
        for step in (5, 10):
            (run / "checkpoints" / f"global_step{step}").mkdir(parents=True)
            (run / "checkpoints" / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        (run / "checkpoints" / "latest").write_text("global_step10")
        return run
    return make


@pytest.mark.parametrize("name", list(LINKS))
def test_a_host_in_a_run_file_is_never_a_link_in_mail_or_webhook(name: str, alerting, mail_and_hook, trainings: Path) -> None:
    inbox, _, hooked = mail_and_hook
    value = LINKS[name]
    marker = f"Q{list(LINKS).index(name)}Z"
    run = alerting("links")
    # The eval ledger: the job of step 10 left the queue without its result (its id and its log are the value).
    (run / "eval").mkdir()
    (run / "eval" / next_eval.LEDGER_NAME).write_text(json.dumps({
        "event": "submitted", "job_id": f"{marker}j {value}", "tag": "global_step10", "step": 10, "time": 1.0e9,
        "log": f"{marker}l {value}"}) + "\n")
    # The result of step 5 left a source out, for a reason (and under a name) that is the value.
    (run / "eval" / "global_step5.json").write_text(json.dumps({"results": {"held": {"bits_per_byte": 1.0}}, "bsops": {
        "format": 1, "experiment": "links", "tag": "global_step5", "step": 5, "iteration": 5,
        "missing": {f"{marker}m {value}": f"{marker}w {value}"}}}))
    # The alert state: each kind of eval failure this pass does not have was told on both channels, with the value
    # as its message, which the recovery of each repeats.
    since = (datetime.now() - timedelta(hours=2)).replace(microsecond=0).isoformat()
    recovering = [f"eval-{kind}" for kind in FAILURES if kind not in ("job", "tasks")]
    (run / "logs").mkdir()
    (run / "logs" / ".bsops-alerts.json").write_text(json.dumps({"jobs": {job: {
        "since": since, "message": f"{marker}s {value}", "sent": {"email": since, "webhook": since}}
        for job in recovering}}))

    result = CliRunner().invoke(main, ["eval", "next", "links", "--alert", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    texts = _delivered(inbox, hooked, 2 + len(recovering))  # an alert for the job and one for the tasks
    for part in "jlmws":  # each place the value was written reached the alerts
        assert f"{marker}{part}" in "\n".join(texts), part
    for text in texts:
        assert _links(text) == [], text


def _experiment_named_like_a_host(alerting, trainings: Path, tmp_path: Path, port: int) -> None:
    """An experiment (whose name a run's record may give) called `okta.evil.support`: a failed eval job of its
    ledger, told in a subject and a body that name it."""
    run = alerting("okta.evil.support")
    (run / "eval").mkdir()
    (run / "eval" / next_eval.LEDGER_NAME).write_text(json.dumps({
        "event": "submitted", "job_id": "41", "tag": "global_step10", "step": 10, "time": 1.0e9}) + "\n")
    result = CliRunner().invoke(main, ["eval", "next", "okta.evil.support", "--alert", "--trainings-dir",
                                       str(trainings)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output


def _cron_job_named_like_a_host(alerting, trainings: Path, tmp_path: Path, port: int) -> None:
    """A cron job file `login at evil.support now.slurm` (a link, so refused): the failure's mail names it in its
    subject and body."""
    cron_dir = tmp_path / "cron"
    (cron_dir / "cron.hourly").mkdir(parents=True)
    (cron_dir / "cron.yaml").write_text(
        f"alerts: {{email_to: [oncall@example.org], email_from: bot@example.org, smtp_host: 127.0.0.1, "
        f"smtp_port: {port}, smtp_security: none, webhook_url_env: {VAR}}}\n")
    (cron_dir / "cron.hourly" / "login at evil.support now.slurm").symlink_to(tmp_path / "elsewhere.slurm")
    alerting("unused")  # the servers' environment (the webhook's variable, its CA)
    result = CliRunner().invoke(main, ["cron", "run", "hourly", "--cron-dir", str(cron_dir), "--no-rearm"])
    assert result.exit_code == EXIT_PROBLEMS and "Traceback" not in result.output, result.output


NAMES: dict[str, Callable[..., None]] = {
    "an experiment named like a host": _experiment_named_like_a_host,
    "a cron job's file named like a host": _cron_job_named_like_a_host,
}


@pytest.mark.parametrize("name", list(NAMES))
def test_a_name_a_message_is_built_from_is_no_link(name: str, alerting, mail_and_hook, trainings: Path,
                                                   tmp_path: Path) -> None:
    """A name in a subject (an experiment's, a cron job file's) is quoted as a value is: no link in the subject,
    the body or the webhook's text."""
    inbox, port, hooked = mail_and_hook
    NAMES[name](alerting, trainings, tmp_path, port)
    texts = _delivered(inbox, hooked, 1)
    assert "support" in "".join(texts)  # the name reached the message
    for text in texts:
        assert _links(text) == [], text


# ----------------------------------------------------------------------------- terminal and listings

LOG_LINES = {
    "an OSC 8 hyperlink": "\x1b]8;;https://evil.example/login\x07click to re-authenticate\x1b]8;;\x07",
    "clear screen and cursor home": "\x1b[2J\x1b[Hall checks passed",
    "a window title": "\x1b]0;root@login1: ~\x07",
    "concealed text": "\x1b[8mhidden\x1b[0m",
    "a terminal status query": "\x1b[6n\x1b[21t",
    "an 8-bit CSI": "\x9b2J\x9bH",
    "an 8-bit OSC hyperlink": "\x9d8;;https://evil.example\x9cclick\x9d8;;\x9c",
    "a carriage return over the loss": "lm loss: 9.9E+00\rlm loss: 1.0E+00",
    "backspaces over a word": "FAILED\x08\x08\x08\x08\x08\x08PASSED",
    "a bidi override": "checkpoint exe.\u202etxt\u202c saved",
    "a line separator": "ok\u2028 iteration      999/     999 | lm loss: 1.0E+00",
    "bell, DEL and a vertical tab": "\x07\x7f\x0bdone",
}


def _raw_controls(text: str) -> list[str]:
    """The characters of `text` a terminal would act on (all but printable ones and the line breaks)."""
    return [f"U+{ord(c):04X}" for c in text if not (c.isprintable() or c == "\n")]


def _escapes(payload: str) -> list[str]:
    """How each control character of `payload` must show: `\\x1b`, `\\u202e`."""
    return [f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" for c in payload if not c.isprintable()]


@pytest.fixture
def logged(trainings: Path, tmp_path: Path) -> Callable[[str], Path]:
    """`logged(line)`: experiment `term` whose main_log.txt holds an iteration line, then `line`."""
    def write(line: str) -> Path:
        (trainings / "term.yaml").write_text(tiny_yaml(tmp_path / "run"))
        log = tmp_path / "run" / "logs" / "main_log.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b" iteration        5/     100 | lm loss: 7.0E+00 |\n" + line.encode("utf-8") + b"\n")
        return log
    return write


@pytest.mark.parametrize("name", list(LOG_LINES))
def test_bsops_logs_shows_a_control_sequence_of_the_log_escaped(name: str, logged, trainings: Path) -> None:
    payload = LOG_LINES[name]
    logged(f"M{list(LOG_LINES).index(name)}K {payload}")
    # color=True: the output is treated as a terminal's, so click strips nothing itself
    result = CliRunner().invoke(main, ["logs", "term", "--trainings-dir", str(trainings), "-n", "5"], color=True)
    assert result.exit_code == 0, result.output
    assert _raw_controls(result.stdout) == []
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"M{list(LOG_LINES).index(name)}K ")
    assert all(escape in lines[1] for escape in _escapes(payload))


def test_bsops_logs_follow_shows_an_appended_escape_sequence_escaped(logged, trainings: Path) -> None:
    """`--follow` streams what is appended through the same escaping (a real `bsops logs -f` process)."""
    log = logged("M99K first")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", "from bigscience_ops.cli import main; main()", "logs", "term",
                             "--trainings-dir", str(trainings), "-n", "1", "-f", "--interval", "0.05"],
                            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out = _read_until(proc, b"M99K first\n", 30)
        with open(log, "ab") as handle:
            handle.write(LOG_LINES["an OSC 8 hyperlink"].encode() + b" M100K\n")
        out += _read_until(proc, b"M100K\n", 30)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    text = out.decode("utf-8")
    assert _raw_controls(text) == [] and text.count("\n") == 2
    assert all(escape in text for escape in _escapes(LOG_LINES["an OSC 8 hyperlink"]))


def _read_until(proc: subprocess.Popen, end: bytes, seconds: float) -> bytes:
    """What `proc` prints on stdout up to and including `end`, within `seconds`."""
    import select

    out, deadline = b"", time.monotonic() + seconds
    while not out.endswith(end):
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, out
        if select.select([proc.stdout], [], [], left)[0]:
            out += os.read(proc.stdout.fileno(), 4096)
    return out


def _fifo(path: Path) -> None:
    os.mkfifo(path)


CRON_ENTRIES: dict[str, tuple[Callable[[Path, Path], None], bool]] = {
    # name: (make the entry in cron.hourly/ (folder, elsewhere), whether `cron run` submits it)
    "a line break in a job's name": (
        lambda d, _: (d / "x\n[2026-11-22 12:00:00] submitted fake.slurm").write_text(JOB.format(name="nl")), True),
    "an escape sequence in a job's name": (
        lambda d, _: (d / "\x1b]8;;https:evil.example\x07x\x1b[2J.slurm").write_text(JOB.format(name="esc")), True),
    "a line separator and a bidi override in a job's name": (
        lambda d, _: (d / "ok\u2028\u202ex.slurm").write_text(JOB.format(name="sep")), True),
    "a link to a job script elsewhere": (lambda d, e: (d / "linked.slurm").symlink_to(e), False),
    "a link to nothing": (lambda d, e: (d / "dangling.slurm").symlink_to(e.parent / "missing.slurm"), False),
    "a FIFO": (lambda d, _: _fifo(d / "fifo.slurm"), False),
    "a folder": (lambda d, _: (d / "folder.slurm").mkdir(), False),
}
JOB = "#!/bin/bash\n#SBATCH --job-name={name}\necho\n"


@pytest.mark.parametrize("name", list(CRON_ENTRIES))
def test_cron_list_and_run_show_names_escaped_and_run_only_plain_files(name: str, tmp_path: Path,
                                                                        monkeypatch) -> None:
    make, runs = CRON_ENTRIES[name]
    cron_dir = tmp_path / "cron"
    folder = cron_dir / "cron.hourly"
    folder.mkdir(parents=True)
    (folder / "good.slurm").write_text(JOB.format(name="good"))
    elsewhere = tmp_path / "elsewhere.slurm"
    elsewhere.write_text(JOB.format(name="elsewhere"))
    make(folder, elsewhere)
    [entry] = [p for p in folder.iterdir() if p.name != "good.slurm"]
    stand_ins = replay_sbatch(replay_squeue(tmp_path / "bin", "squeue.txt"))  # recorded real answers
    monkeypatch.setenv("PATH", f"{stand_ins}:{os.environ['PATH']}")

    listed = CliRunner().invoke(main, ["cron", "list", "--cron-dir", str(cron_dir)], color=True)
    assert listed.exit_code == 0 and _raw_controls(listed.stdout) == []
    assert len(listed.stdout.splitlines()) == 2  # one line per entry, whatever its name holds

    ran = CliRunner().invoke(main, ["cron", "run", "hourly", "--cron-dir", str(cron_dir), "--no-rearm"], color=True)
    assert _raw_controls(ran.output) == [], ran.output
    assert "Traceback" not in ran.output
    submitted = [argv[-1] for argv in sbatch_calls(stand_ins)]
    assert sorted(submitted) == sorted([str(folder / "good.slurm"), *([str(entry)] if runs else [])])
    assert ran.exit_code == (0 if runs else EXIT_PROBLEMS), ran.output
    log = (cron_dir / "logs" / "cron.hourly.log").read_text()
    assert _raw_controls(log) == [] and len(log.splitlines()) == len(ran.output.splitlines())
    shown = "".join(c if c.isprintable() else _escapes(c)[0] for c in entry.name)
    assert shown in ran.output and shown in listed.stdout
