"""A run's own files are untrusted input: the table of hostile run files.

Each case damages one file of a stopped run (two array tasks, saves at 40 and 80, the second task ended with
exit 1 at 80, a verified backup of both) the way a dying node, NFS, a careless hand or a hostile user of shared
scratch would: torn lines, wrong types, NaN/inf/huge numbers, strings, nested objects, links, FIFOs, folders
where files belong, binary garbage, huge lines, Markdown/HTML payloads. Then every reader runs on real files:
the watchdog (run_state and watch), the chronicle (rendered by Python-Markdown as the Hub would show it),
`bsops info` (text and JSON). Each case expects either a clear report (a problem naming the file and the line,
an alert of the watchdog's next to the stopped-run alert) or the correct result: never a traceback, never a hang
(a SIGALRM guard), never the content of a file that was not what was expected, never a silent wrong result.

The end-to-end checks (`bsops status EXP` emailing through a real SMTP server, hub-sync --alert) follow the table.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.checkpoints import layout
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.keep import backup, chronicle
from bigscience_ops.ops.keep import store as backup_store
from bigscience_ops.ops.watch import lifecycle, watchdog
from bigscience_ops.views import runinfo
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_slurm import replay_squeue
from tests.fixtures_smtp import alerts_yaml, plain_outbox
from tests.fixtures_runs import commit_checkpoint

SECRET = "TOPSECRET-not-to-be-quoted"
"""What the file outside the run holds: no report, alert, page or error may show it."""
NOW = datetime(2026, 11, 22, 12, 0, 0)
T0 = 1_795_000_000.0
LEDGER_LINES = 5
"""The fixture's ledger: launch, begin 0, end 40 (exit 0), begin 40, end 80 (exit 1)."""
PAGE_TAGS = {"h1", "h2", "p", "ul", "li", "code"}
"""The only HTML a chronicle renders to: headings, paragraphs, lists, code spans; no link, image or script."""


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A reader blocked on a FIFO (or looping on a huge file) fails the test instead of hanging the suite."""
    def hung(*_: object) -> None:
        raise TimeoutError("a reader hung on a hostile run file")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _save(checkpoints: Path, step: int) -> None:
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "layer_00-model_states.pt").write_bytes(os.urandom(500))
    (folder / layout.META).write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)
    (checkpoints / layout.LATEST).write_text(f"global_step{step}")


@pytest.fixture
def exp(trainings: Path, tmp_path: Path):
    """A run that stopped at 80 of 221: its ledger, checkpoints, backup, log and watchdog.log as bsops writes them."""
    (trainings / "hostile.yaml").write_text(tiny_yaml(
        tmp_path / "run", "backup: " + json.dumps({"dest": str(tmp_path / "store")}) + "\n"))
    exp = load_experiment("hostile", trainings)
    out, checkpoints, logs = Path(exp.paths.output), Path(exp.paths.checkpoints), Path(exp.paths.logs)
    for record in [ledger.TaskRecord("launch", "7", "", 0, T0),
                   ledger.TaskRecord("begin", "7_1", "n[1-2]", 0, T0 + 60),
                   ledger.TaskRecord("end", "7_1", "n[1-2]", 40, T0 + 1200, exit_code=0),
                   ledger.TaskRecord("begin", "7_2", "n[3-4]", 40, T0 + 1300),
                   ledger.TaskRecord("end", "7_2", "n[3-4]", 80, T0 + 2400, exit_code=1)]:
        ledger.append(out / ledger.LEDGER_NAME, record)
    _save(checkpoints, 40)
    _save(checkpoints, 80)
    assert backup.run_backup(backup.settings(exp)).backed_up == ["global_step40", "global_step80"]
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "main_log.txt").write_text("task 7_1 begins at iteration 0\n  successfully saved checkpoint at iteration"
                                       "      40 to /c (1.0 ms)\ntask 7_2 begins at iteration 40\n")
    (tmp_path / "outside.txt").write_text(f"global_step80\n{SECRET}\n")
    return exp


# ----------------------------------------------------------------------------------------------- the damage

def _ledger(exp) -> Path:
    return Path(exp.paths.output) / ledger.LEDGER_NAME


def _append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def _ledger_line(data: bytes) -> Callable:
    return lambda exp, tmp: _append_bytes(_ledger(exp), data)


def _record(**changes: object) -> Callable:
    """A ledger line: a valid begin record with `changes` (a value of None leaves the field out)."""
    fields = {"event": "begin", "job_id": "7_3", "nodes": "n5", "iteration": 80, "time": T0 + 3000,
              "exit_code": None, "next_job": None}
    fields.update(changes)
    text = json.dumps({k: v for k, v in fields.items() if v is not _GONE})
    return _ledger_line(text.encode() + b"\n")


_GONE = object()


def _raw_record(text: str) -> Callable:
    """A ledger line written as given (NaN and Infinity are what Python's json writes for float('nan'), float('inf'))."""
    return _ledger_line(text.encode() + b"\n")


def _replace_with(kind: str) -> Callable[[Path, Path], None]:
    """Put a folder, a FIFO, a link to the secret file, or a link to nothing where the file `path` is."""
    def make(path: Path, tmp: Path) -> None:
        if path.exists() or path.is_symlink():
            path.unlink()
        if kind == "folder":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "link":
            path.symlink_to(tmp / "outside.txt")
        elif kind == "dangling":
            path.symlink_to(tmp / "nothing-here")
    return make


def _at_ledger(kind: str) -> Callable:
    return lambda exp, tmp: _replace_with(kind)(_ledger(exp), tmp)


def _latest(content: bytes) -> Callable:
    return lambda exp, tmp: (Path(exp.paths.checkpoints) / layout.LATEST).write_bytes(content)


def _at_latest(kind: str) -> Callable:
    return lambda exp, tmp: _replace_with(kind)(Path(exp.paths.checkpoints) / layout.LATEST, tmp)


def _latest_names_a_link(exp, tmp: Path) -> None:
    folder = Path(exp.paths.checkpoints) / "global_step80"
    os.rename(folder, tmp / "moved80")
    folder.symlink_to(tmp / "moved80")


def _linked_checkpoint(exp, tmp: Path) -> None:
    (tmp / "elsewhere").mkdir()
    (tmp / "elsewhere" / layout.META).write_text(SECRET)
    (Path(exp.paths.checkpoints) / "global_step60").symlink_to(tmp / "elsewhere")


def _rollbacks(data: bytes) -> Callable:
    return lambda exp, tmp: _append_bytes(Path(exp.paths.output) / rollbacks.RECORD, data)


def _rollback(**changes: object) -> Callable:
    fields = {"time": T0 + 2500, "from_step": 80, "to_step": 40, "skip": None, "set_aside": ""}
    fields.update(changes)
    return _rollbacks(json.dumps(fields).encode() + b"\n")


def _store(exp) -> Path:
    return backup_store.run_store(Path(exp.backup.dest), exp.name, layout.run_id(Path(exp.paths.checkpoints)))


def _manifest(change: Callable[[dict], object] | bytes) -> Callable:
    """Rewrite global_step40's manifest: with bytes, or with `change` applied to its JSON."""
    def make(exp, tmp: Path) -> None:
        path = backup_store.manifest_path(_store(exp), "global_step40")
        if isinstance(change, bytes):
            path.write_bytes(change)
            return
        data = json.loads(path.read_text())
        changed = change(data)
        path.write_text(json.dumps(data if changed is None else changed))
    return make


def _at_manifest(kind: str) -> Callable:
    return lambda exp, tmp: _replace_with(kind)(backup_store.manifest_path(_store(exp), "global_step40"), tmp)


def _journal(lines: bytes) -> Callable:
    def make(exp, tmp: Path) -> None:
        staged = _store(exp) / backup_store.PARTIAL / "global_step90"
        staged.mkdir(parents=True)
        (staged / backup_store.JOURNAL).write_bytes(lines)
    return make


GOOD_JOURNAL = json.dumps({"path": "a.pt", "size": 3, "sha256": "ab" * 32}).encode() + b"\n"


def _log(text: str, name: str = "main_log.txt") -> Callable:
    return lambda exp, tmp: _append_bytes(Path(exp.paths.logs) / name, text.encode())


@dataclass(frozen=True)
class Case:
    make: Callable
    file: str | None
    """Which file must be reported (ledger, latest, rollbacks, manifest, journal, checkpoint); None: nothing is
    wrong, the result must be correct."""
    line: int = 0
    """The line the problem names (0: the file as a whole; None: any)."""
    iteration: int = 80
    """Where the run stands after the damage (a torn `latest` falls back to the newest finished save)."""
    last_exit: int | None = 1
    """The last task's exit code as the watchdog sees it (None: killed, or no task readable)."""


NEXT = LEDGER_LINES + 1
CASES: dict[str, Case] = {
    # the task ledger: lines
    "ledger: last line torn mid-write": Case(_ledger_line(b'{"event": "begin", "job_id": "7_3", "nod'), "ledger", NEXT),
    "ledger: torn line, then the next task's record": Case(
        lambda exp, tmp: (_append_bytes(_ledger(exp), b'{"event": "beg'),
                          ledger.append(_ledger(exp), ledger.TaskRecord("begin", "7_3", "n5", 80, T0 + 3000))),
        "ledger", NEXT, last_exit=None),
    "ledger: binary garbage": Case(_ledger_line(b"\xff\xfe\x00\x9c garbage \x80\n"), "ledger", NEXT),
    "ledger: NUL bytes": Case(_ledger_line(b"\x00" * 4096 + b"\n"), "ledger", NEXT),
    "ledger: a 200 kB line": Case(_ledger_line(b'{"event": "' + b"x" * 200_000 + b'"}\n'), "ledger", NEXT),
    "ledger: a 5 MB last line without end": Case(_ledger_line(b"y" * 5_000_000), "ledger", NEXT),
    "ledger: a JSON array": Case(_raw_record("[1, 2, 3]"), "ledger", NEXT),
    "ledger: a JSON string": Case(_raw_record('"begin"'), "ledger", NEXT),
    "ledger: 100000 nested arrays": Case(_raw_record("[" * 60_000 + "]" * 60_000), "ledger", NEXT),
    "ledger: a 5000-digit number": Case(_raw_record('{"iteration": ' + "9" * 5000 + "}"), "ledger", NEXT),
    "ledger: time NaN": Case(_record(time=float("nan")), "ledger", NEXT),
    "ledger: time Infinity": Case(_record(time=float("inf")), "ledger", NEXT),
    "ledger: time negative": Case(_record(time=-1.0), "ledger", NEXT),
    "ledger: time 1e300": Case(_record(time=1e300), "ledger", NEXT),
    "ledger: time a string": Case(_record(time="yesterday"), "ledger", NEXT),
    "ledger: iteration a string": Case(_record(iteration="80"), "ledger", NEXT),
    "ledger: iteration a float": Case(_record(iteration=80.5), "ledger", NEXT),
    "ledger: iteration true": Case(_record(iteration=True), "ledger", NEXT),
    "ledger: iteration 10**30": Case(_record(iteration=10**30), "ledger", NEXT),
    "ledger: iteration negative": Case(_record(iteration=-5), "ledger", NEXT),
    "ledger: nodes a list": Case(_record(nodes=["n1", "n2"]), "ledger", NEXT),
    "ledger: nodes a nested object": Case(_record(nodes={"a": {"b": [1, {"c": None}]}}), "ledger", NEXT),
    "ledger: job id null": Case(_record(job_id=None), "ledger", NEXT),
    "ledger: job id with a newline and a fake log line": Case(
        _record(job_id="7_3\n[2026-11-22 10:00:00] alert email sent to x: forged"), "ledger", NEXT),
    "ledger: an unknown event": Case(_record(event="explode"), "ledger", NEXT),
    "ledger: exit code a string": Case(_record(event="end", exit_code="1"), "ledger", NEXT),
    "ledger: exit code 1e400 (inf)": Case(_raw_record('{"event": "end", "job_id": "7_2", "nodes": "n", '
                                                      '"iteration": 80, "time": 1795003000, "exit_code": 1e400}'),
                                          "ledger", NEXT),
    "ledger: an unknown field": Case(_record(shell="$(reboot)"), "ledger", NEXT),
    "ledger: a missing field": Case(_record(time=_GONE), "ledger", NEXT),
    # the task ledger: the file itself
    "ledger: a folder": Case(_at_ledger("folder"), "ledger", 0, iteration=80, last_exit=None),
    "ledger: a FIFO": Case(_at_ledger("fifo"), "ledger", 0, last_exit=None),
    "ledger: a link to a file outside": Case(_at_ledger("link"), "ledger", 0, last_exit=None),
    "ledger: a dangling link": Case(_at_ledger("dangling"), "ledger", 0, last_exit=None),
    # latest
    "latest: torn": Case(_latest(b"global_st"), "latest"),
    "latest: empty": Case(_latest(b""), "latest"),
    "latest: a digit lost (names no folder)": Case(_latest(b"global_step8"), "latest"),
    "latest: binary garbage": Case(_latest(b"\xff\xfe\x00\x01"), "latest"),
    "latest: 1 MB": Case(_latest(b"global_step80" + b" " * 1_000_000), "latest"),
    "latest: a path": Case(_latest(b"../../../etc/passwd"), "latest"),
    "latest: a link to a file outside holding a good tag": Case(_at_latest("link"), "latest"),
    "latest: a FIFO": Case(_at_latest("fifo"), "latest"),
    "latest: a folder": Case(_at_latest("folder"), "latest"),
    "latest: names a folder that is a link": Case(_latest_names_a_link, "latest", iteration=40),
    "global_step60 is a link (info refuses it, the watchdog is not fooled)": Case(_linked_checkpoint, "checkpoint"),
    # rollbacks.jsonl
    "rollbacks: torn": Case(_rollbacks(b'{"time": 1795002500, "from_st'), "rollbacks", 1),
    "rollbacks: skip not a range": Case(_rollback(skip="91-x"), "rollbacks", 1),
    "rollbacks: to_step a string": Case(_rollback(to_step="40"), "rollbacks", 1),
    "rollbacks: time NaN": Case(_rollback(time=float("nan")), "rollbacks", 1),
    "rollbacks: a FIFO": Case(lambda exp, tmp: os.mkfifo(Path(exp.paths.output) / rollbacks.RECORD), "rollbacks", 0),
    "rollbacks: binary garbage after a good line": Case(
        lambda exp, tmp: (_rollback()(exp, tmp), _rollbacks(b"\x89PNG\r\n\x1a\n")(exp, tmp)), "rollbacks", 2),
    # the backup store
    "manifest: binary garbage": Case(_manifest(b"\x00\xff" * 100), "manifest"),
    "manifest: step a string": Case(_manifest(lambda m: m.update(step="40")), "manifest"),
    "manifest: verified_at not a time": Case(_manifest(lambda m: m.update(verified_at="yesterday")), "manifest"),
    "manifest: a JSON list": Case(_manifest(lambda m: [m]), "manifest"),
    "manifest: files of the wrong shape": Case(_manifest(lambda m: m.update(files={"a.pt": [1, 2]})), "manifest"),
    "manifest: kind is HTML": Case(_manifest(lambda m: m.update(kind="<img src=x onerror=alert(1)>")), "manifest"),
    "manifest: a link to a file outside": Case(_at_manifest("link"), "manifest"),
    "manifest: a FIFO": Case(_at_manifest("fifo"), "manifest"),
    "journal: a bad line before the last": Case(_journal(b"garbage\n" + GOOD_JOURNAL), "journal", 1),
    "journal: only its last line cut by a kill (redone, no problem)": Case(_journal(GOOD_JOURNAL + b'{"path": "b'),
                                                                          None),
    # Markdown and HTML in records and logs that are otherwise valid: shown as text, never acted on
    "payload: job id and nodes": Case(_record(job_id="<script>alert(1)</script>", nodes="![t](https://evil.example/p.png)",
                                              iteration=80), None, last_exit=None),
    "payload: resize with a javascript link": Case(
        _record(event="resize", job_id="7", nodes="[x](javascript:alert(1))", next_job="<iframe src=//evil>"), None),
    "payload: rollback set aside in an HTML path": Case(_rollback(set_aside="/x/`<img src=x onerror=alert(1)>`"), None),
    "payload: the trainer's stop line": Case(_log("> <b>stopped</b> [x](javascript:alert(1)) at iteration 80\n"), None),
    "payload: a task id in main_log.txt": Case(_log("task <svg/onload=alert(1)> begins at iteration 80\n"), None),
    "payload: an email subject in watchdog.log": Case(
        _log("[2026-11-22 10:00:00] alert email sent to a@b <1@x>: <script>x</script> ![i](http://evil/i.png) "
             "www.evil.example https://evil.example\n", "watchdog.log"), None),
    "payload: a huge main_log.txt line": Case(_log("> " + "z" * 300_000 + " at iteration 80\n"), None),
}

PROBLEM_FILE = {"ledger": ledger.LEDGER_NAME, "latest": layout.LATEST, "rollbacks": rollbacks.RECORD,
                "manifest": backup_store.MANIFEST_SUFFIX, "journal": backup_store.JOURNAL}
CONDITION = {"ledger": "run-file-ledger", "latest": "run-file-latest", "rollbacks": "run-file-rollbacks",
             "manifest": "run-file-backup", "journal": "run-file-backup"}


def _tags(page: str) -> set[tuple[str, tuple[str, ...]]]:
    """Each HTML tag the page renders to, with its attributes' names, as Python-Markdown (tensorboard's own
    dependency) renders it: it passes raw HTML through, as a careless page would."""
    from html.parser import HTMLParser

    import markdown

    found: set[tuple[str, tuple[str, ...]]] = set()

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list) -> None:
            found.add((tag, tuple(sorted(name for name, _ in attrs))))

    Tags().feed(markdown.markdown(page))
    return found


def test_the_table_holds_every_kind_of_damage() -> None:
    assert len(CASES) >= 40
    assert {c.file for c in CASES.values()} == {None, *PROBLEM_FILE, "checkpoint"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_run_file_is_reported_or_read_right(name: str, exp, tmp_path: Path) -> None:
    case = CASES[name]
    case.make(exp, tmp_path)

    run = lifecycle.run_state(exp)
    expected = PROBLEM_FILE.get(case.file or "")
    if expected is None:
        assert run.problems == (), [str(p) for p in run.problems]
    else:
        found = [p for p in run.problems if p.file.endswith(expected)]
        assert found and len(found) == len(run.problems), [str(p) for p in run.problems]
        assert case.line is None or found[0].line == case.line, str(found[0])
    assert (run.iteration, run.train_iters, run.launched) == (case.iteration, 221, True)
    assert (run.last_task.exit_code if run.last_task else None) == case.last_exit

    # The watchdog: the stopped run's alert first, then one alert per damaged file, naming it.
    log = Path(exp.paths.logs) / "main_log.txt"
    result = watchdog.watch(watchdog.WatchSettings(exp.slurm.job_name, log_path=log), run=run, query=lambda **_: [],
                            now=NOW)
    conditions = [a.condition for a in result.report.alerts]
    assert conditions[0] == "not-scheduled" and f"stopped at iteration {case.iteration} of 221" in \
        result.report.alerts[0].message
    if expected is None:
        assert conditions == ["not-scheduled"]
    else:
        [alert] = [a for a in result.report.alerts if a.condition == CONDITION[case.file]]
        assert found[0].file in alert.message and alert.headline and alert.advice
    assert (log.parent / "watchdog.log").read_text().count("***ALERT") >= len(conditions)

    # The chronicle, as the Hub shows it: no HTML, image or link of the records' making.
    page = chronicle.markdown(exp, now=T0 + 7200)
    assert {(tag, ()) for tag in PAGE_TAGS} >= _tags(page), page
    assert page.startswith("# hostile: run chronicle")
    if run.last_task is not None and run.last_task.job_id == "7_2":  # the ledger was readable up to its damage
        assert "task 7\\_2 on n\\[3-4\\]: iterations 40 → 80, exit 1" in page
    if case.file in ("ledger", "rollbacks", "manifest"):
        assert "## Records not read" in page and expected.removeprefix(".") in page.split("## Records not read")[1]

    # bsops info: text and JSON, the damaged file named.
    info = runinfo.run_info(exp)
    text = runinfo.info_text(info)
    data = json.dumps(runinfo.info_data(info))
    if case.file in ("ledger", "latest", "rollbacks", "manifest", "checkpoint"):
        named = {"checkpoint": "global_step60", "manifest": "global_step40.manifest.json"}.get(case.file, expected)
        assert any(named in p for p in info.problems), info.problems
    elif case.file is None:
        assert info.problems == []

    shown = "\n".join([*result.lines, page, text, data, *map(str, run.problems)])
    assert SECRET not in shown  # nothing of a file outside the run, read through a link


def test_a_fifo_where_the_alert_state_belongs_never_blocks_and_is_reported(exp, plain_server) -> None:
    inbox, port = plain_server
    log = Path(exp.paths.logs) / "main_log.txt"
    state = log.parent / ".bsops-alerts.json"
    os.mkfifo(state)
    result = watchdog.watch(watchdog.WatchSettings(exp.slurm.job_name, log_path=log, outbox=plain_outbox(port)),
                            run=lifecycle.run_state(exp), query=lambda **_: [], now=NOW)
    assert [a.condition for a in result.report.alerts] == ["not-scheduled", "alert-state"]
    assert result.email_error is None and len(inbox.messages) == 1
    assert str(state) in inbox.messages[0].get_content()
    assert state.is_file() and json.loads(state.read_text())["active"]  # started afresh, the alerts recorded
    [aside] = [p for p in state.parent.iterdir() if ".unreadable-" in p.name]
    assert aside.is_fifo()  # moved as it was, never opened


@pytest.mark.parametrize("content", [
    b"\x00\xff garbage", b'{"active": {"x::y": {"since": "yesterday", "sent": {}}}}',
    b'{"active": {"x::y": {"since": "2026-11-22T10:00:00", "sent": {"email": 5}}}}', b"[1, 2]",
    b'{"active": {"x": {"since": "2026-11-22T10:00:00", "message": {"nested": true}}}}',
    b'{"finished": {"hostile": NaN}}', b'{"active": ' + b"[" * 50_000,
], ids=["garbage", "since not a time", "sent a number", "a list", "message an object", "NaN", "deep nesting"])
def test_an_unreadable_alert_state_is_an_alert_and_the_stopped_run_is_still_emailed(exp, plain_server,
                                                                                   content: bytes) -> None:
    inbox, port = plain_server
    log = Path(exp.paths.logs) / "main_log.txt"
    state = log.parent / ".bsops-alerts.json"
    state.write_bytes(content)

    def watch(minutes: int) -> watchdog.WatchResult:
        settings = watchdog.WatchSettings(exp.slurm.job_name, log_path=log, outbox=plain_outbox(port))
        return watchdog.watch(settings, run=lifecycle.run_state(exp), query=lambda **_: [],
                              now=NOW.replace(minute=minutes))

    first = watch(0)
    assert [a.condition for a in first.report.alerts] == ["not-scheduled", "alert-state"]
    assert first.exit_code == 1 and first.email_error is None and len(inbox.messages) == 1
    body = inbox.messages[0].get_content()
    assert "stopped at iteration 80 of 221" in body and str(state) in body
    # Within the cooldown nothing repeats; the copy set aside keeps the alert open until it is deleted.
    assert [a.condition for a in watch(10).report.alerts] == ["not-scheduled", "alert-state"]
    assert len(inbox.messages) == 1
    for aside in state.parent.glob(".bsops-alerts.json.unreadable-*"):
        aside.unlink()
    assert [a.condition for a in watch(20).report.alerts] == ["not-scheduled"]
    assert len(inbox.messages) == 2 and inbox.messages[1]["Subject"] == "[RECOVERED] hostile: alert-state cleared"


# ------------------------------------------------------------------------- bsops status, as the hourly job runs it

@pytest.fixture
def watched(exp, trainings: Path, tmp_path: Path, plain_server, monkeypatch) -> Path:
    """The stopped run's experiment with alerts to the real SMTP server, and squeue answering with recorded
    output in which no job of the run is queued."""
    _, port = plain_server
    (trainings / "hostile.yaml").write_text((trainings / "hostile.yaml").read_text() + alerts_yaml(port, 60))
    monkeypatch.setenv("PATH", f"{replay_squeue(tmp_path / 'bin', 'squeue.txt')}:{os.environ['PATH']}")
    return trainings


@pytest.mark.parametrize("torn, file", [
    (lambda exp: _append_bytes(_ledger(exp), b'{"event": "end", "job_id": "7_3", "no'), ledger.LEDGER_NAME),
    (lambda exp: (Path(exp.paths.checkpoints) / layout.LATEST).write_bytes(b"global_st"), "checkpoints/latest"),
    (lambda exp: _append_bytes(Path(exp.paths.output) / rollbacks.RECORD, b'{"time": 17950'), rollbacks.RECORD),
], ids=["torn ledger line", "torn latest", "torn rollbacks.jsonl"])
def test_bsops_status_still_emails_the_stopped_run_naming_the_torn_file(exp, watched: Path, plain_server,
                                                                        torn, file: str) -> None:
    inbox, _ = plain_server
    torn(exp)
    result = CliRunner().invoke(main, ["status", "hostile", "--trainings-dir", str(watched)])
    assert result.exit_code == 1 and "Traceback" not in result.output and "error:" not in result.output, result.output
    assert "is not RUNNING or SCHEDULED: it stopped at iteration 80 of 221" in result.output
    [mail] = inbox.messages
    body = mail.get_content()
    assert "stopped at iteration 80 of 221" in body and str(Path(exp.paths.output) / file) in body
    log = (Path(exp.paths.logs) / "watchdog.log").read_text()
    assert str(Path(exp.paths.output) / file) in log and "alert email sent to oncall@example.org" in log


def test_chronicle_and_info_commands_on_hostile_records_print_escaped_text_without_a_traceback(exp,
                                                                                               trainings: Path) -> None:
    for make in (_record(job_id="<script>alert(1)</script>", nodes="[x](javascript:alert(1))"),
                 _record(time=float("nan")), _record(nodes={"deep": [{"er": 1}]}), _ledger_line(b"\xff\n"),
                 _rollback(to_step="40"), _manifest(lambda m: m.update(step=None))):
        make(exp, Path("."))
    page = CliRunner().invoke(main, ["chronicle", "hostile", "--trainings-dir", str(trainings)])
    assert page.exit_code == 0 and "Traceback" not in page.output, page.output
    assert "&lt;script&gt;" in page.stdout and "<script" not in page.stdout and "](javascript" not in page.stdout
    shown = CliRunner().invoke(main, ["info", "hostile", "--trainings-dir", str(trainings)])
    assert shown.exit_code == 0 and shown.output.count("could not read:") == 5, shown.output
    as_json = CliRunner().invoke(main, ["info", "hostile", "--json", "--trainings-dir", str(trainings)])
    assert as_json.exit_code == 0 and len(json.loads(as_json.stdout)["problems"]) == 5
