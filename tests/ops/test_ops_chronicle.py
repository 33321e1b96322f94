"""The run's chronicle (ops/keep/chronicle.py, `bsops chronicle`): its timeline read back from the ledger, main_log.txt,
watchdog.log, rollbacks.jsonl and the backup manifests.

A real two-task local launch is chronicled in tests/launch/test_launch.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.run.iterations import IterationStats, iteration_line
from bigscience_ops.ops.keep import chronicle
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import commit_checkpoint, complete_checkpoint

T0 = time.mktime(time.strptime("2026-11-23 23:50:00", "%Y-%m-%d %H:%M:%S"))


def _line(it: int, loss: float) -> str:
    return iteration_line(IterationStats(it, 400, it * 8, it * 1024, 100.0, 1e-4, 8, loss, 1.0, 1.0, 50.0, 0, 0,
                                         80.0 + it % 3, 1.0))


@pytest.fixture
def run(trainings: Path, tmp_path: Path):
    (trainings / "run.yaml").write_text(tiny_yaml(tmp_path / "run"))
    exp = load_experiment("run", trainings)
    out, logs = Path(exp.paths.output), Path(exp.paths.logs)
    logs.mkdir(parents=True)
    records = [ledger.TaskRecord("launch", "7", "", 0, T0),
               ledger.TaskRecord("begin", "7_1", "n[1-2]", 0, T0 + 60),
               ledger.TaskRecord("end", "7_1", "n[1-2]", 100, T0 + 1260, exit_code=0),
               ledger.TaskRecord("resize", "7", "4", 100, T0 + 1261, next_job="9"),
               ledger.TaskRecord("begin", "9_1", "n[1-4]\u2028*evil*", 100, T0 + 1400)]
    for record in records:
        ledger.append(out / ledger.LEDGER_NAME, record)
    log = ["task 7_1 begins at iteration 0", *(_line(i, 3.0 + 0.01 * (i % 5)) for i in range(1, 101)),
           "  successfully saved checkpoint at iteration      50 to /c (1.0 ms)",
           "  successfully saved checkpoint at iteration     100 to /c (1.0 ms)",
           "> exit interval 100 reached: saved and exiting at iteration 100",
           "task 9_1 begins at iteration 100", *(_line(i, 3.0 + (9.0 if i == 150 else 0.01 * (i % 5)))
                                                  for i in range(101, 161))]
    (logs / "main_log.txt").write_text("\n".join(log) + "\n")
    (logs / chronicle.WATCHDOG_LOG).write_text(
        "[2026-11-24 00:20:00] ***ALERT: something***\n"
        "[2026-11-24 00:21:00] alert email sent to on-call@example.org <1@x>: [bsops] run: act | now\n"
        "[2026-11-24 01:21:00] recovery email sent to on-call@example.org <2@x>: [bsops] run: recovered\n")
    return exp


def test_the_timeline_has_tasks_saves_phases_health_and_emails(run):
    text = chronicle.markdown(run, now=T0 + 7200)
    lines = text.splitlines()
    assert lines[0] == "# run: run chronicle"
    days = [line for line in lines if line.startswith("## ")]
    assert days == ["## 2026-11-23", "## 2026-11-24"]  # 23:50 and 00:10 onwards
    launch = next(i for i, line in enumerate(lines) if "launched: job array 7" in line)
    task = next(i for i, line in enumerate(lines) if "task 7\\_1 on n\\[1-2\\]: iterations 0 → 100, exit 0, 20.0 min" in line)
    assert launch < task and lines[task + 1] == "  - checkpoints saved at iterations 50, 100"
    assert "stopped: exit interval 100 reached" in lines[task + 2]
    resize = next(i for i, line in enumerate(lines) if "node phase: array 7 handed the run to job 9 at 4 nodes" in line)
    second = next(i for i, line in enumerate(lines) if "task 9\\_1" in line)
    assert resize < second and "(running or killed)" in lines[second]
    assert "\u2028" not in text and "\\*evil\\*" in lines[second]  # untrusted text stays one plain line
    assert lines[second + 1].startswith("  - health: iteration 150: lm loss 12.")
    emails = [line for line in lines if "email:" in line]
    assert [e.split(" ", 2)[2] for e in emails] == ["alert email: \\[bsops\\] run: act \\| now",
                                                    "recovery email: \\[bsops\\] run: recovered"]


def _saved(exp, *steps: int) -> None:
    """Complete checkpoints (a bsops.json each; weights in one small file) with `latest` at the last."""
    import json

    checkpoints = Path(exp.paths.checkpoints)
    for step in steps:
        (checkpoints / f"global_step{step}").mkdir(parents=True)
        (checkpoints / f"global_step{step}" / "layer_00-model_states.pt").write_bytes(b"w" * (100 + step))
        (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(checkpoints / f"global_step{step}")
    (checkpoints / "latest").write_text(f"global_step{steps[-1]}")


def test_rollbacks_and_backups_are_in_the_timeline(trainings: Path, tmp_path: Path):
    from bigscience_ops.run.rollback import rollback
    from bigscience_ops.ops.keep import backup

    store = tmp_path / "store"
    (trainings / "kept.yaml").write_text(tiny_yaml(tmp_path / "kept", f"backup: {{dest: {str(store)!r}}}\n"))
    exp = load_experiment("kept", trainings)
    _saved(exp, 50, 100)
    report = backup.run_backup(backup.settings(exp))  # the real backup: verified copies and their manifests
    assert report.backed_up == ["global_step50", "global_step100"]
    done = rollback(exp, 50, "51-100", now=T0)
    story = chronicle.markdown(exp, now=T0)
    [back] = [line for line in story.splitlines() if "rollback:" in line]
    assert back.startswith("- 23:50 rollback: latest moved from global\\_step100 back to global\\_step50")
    assert "iterations 51-100 skipped" in back and f"{Path(done.record.set_aside).name}`" in back
    assert "set aside in `" in back and "(nothing deleted)" in back
    lines = story.splitlines()
    [copied] = [i for i, line in enumerate(lines) if "backup: 2 checkpoint(s) copied and verified" in line]
    assert lines[copied + 1] == "  - global\\_step50 weights-only, global\\_step100 weights-only"
    kinds = {e.kind: e.iteration for e in chronicle.events(exp)}
    assert kinds == {"rollback": 50, "backup": 100}


def test_a_run_with_nothing_recorded_says_so(trainings: Path, tmp_path: Path):
    (trainings / "empty.yaml").write_text(tiny_yaml(tmp_path / "empty"))
    text = chronicle.markdown(load_experiment("empty", trainings))
    assert "Nothing recorded yet" in text


def test_chronicle_command_writes_the_file(run, trainings: Path, tmp_path: Path):
    out = tmp_path / "CHRONICLE.md"
    result = CliRunner().invoke(main, ["chronicle", "run", "--trainings-dir", str(trainings), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("# run: run chronicle") and f"wrote {out}" in result.output


# --- untrusted values are plain text on the Hub ---------------------------------------------------------------

PAYLOADS = {
    "script": "<script>alert(1)</script>",
    "image calling out": "![pixel](https://evil.example/p.png?run=x)",
    "javascript link": "[click](javascript:alert(1))",
    "autolink": "<https://evil.example>",
    "bare url": "see https://evil.example/x now",
    "www": "www.evil.example",
    "email address": "mail ops@evil.example",
    "html entity": "&lt;b&gt;bold&lt;/b&gt;",
    "img tag": "<img src=x onerror=alert(1)>",
    "reference link": "[a][1]\n\n[1]: https://evil.example",
    "heading and list": "# big\n- item\n1. one",
    "code fence": "```\ncode\n```",
    "table pipe": "a | b | c",
    "bidi override": "\u202egnp.exe",
    "zero width": "ev\u200bil",
    "line separator": "one\u2028two\u2029three",
    "emphasis": "**bold** _it_ ~~gone~~",
    "math": "$$x^2$$",
    "backslashes": "\\<b>\\</b>",
    "huge": "x" * 100_000,
}


def _rendered_tags(page: str) -> set[str]:
    """The HTML tags a page renders to, by Python-Markdown (tensorboard's dependency, which passes raw HTML) and
    markdown-it (CommonMark with GFM's tables and strikethrough, the Hub's kind of renderer), with linkify
    (linkify-it-py). Both are test dependencies: neither is left out where it is missing."""
    from html.parser import HTMLParser

    import markdown
    from markdown_it import MarkdownIt

    found: set[str] = set()

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list) -> None:
            found.add(tag + "".join(f" {name}" for name, _ in attrs))

    Tags().feed(markdown.markdown(page))
    # linkify-it-py (a test dependency): bare URLs, `www.` names and addresses made links, as GFM and the Hub do
    renderer = MarkdownIt("commonmark", {"html": True, "linkify": True}).enable(["table", "strikethrough", "linkify"])
    Tags().feed(renderer.render(page))
    return found


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_a_payload_in_any_record_field_is_plain_text(name: str, trainings: Path, tmp_path: Path) -> None:
    payload = PAYLOADS[name]
    (trainings / "evil.yaml").write_text(tiny_yaml(tmp_path / "run"))
    exp = load_experiment("evil", trainings)
    out, logs = Path(exp.paths.output), Path(exp.paths.logs)
    logs.mkdir(parents=True)
    shown = payload.replace("\n", " ")  # a job id or node name holds no line break (the ledger refuses them)
    for record in [ledger.TaskRecord("launch", shown, "", 0, T0), ledger.TaskRecord("begin", "7_1", shown, 0, T0 + 1),
                   ledger.TaskRecord("resize", "7", shown, 5, T0 + 2, next_job=shown)]:
        ledger.append(out / ledger.LEDGER_NAME, record)
    rollbacks.append(out, rollbacks.Rollback(T0 + 3, 9, 5, None, f"/aside/{shown}"))
    (logs / "main_log.txt").write_text(f"task 7_1 begins at iteration 0\n> {shown} at iteration 5\n")
    (logs / chronicle.WATCHDOG_LOG).write_text(f"[2026-11-24 00:21:00] alert email sent to x <1@x>: {shown}\n")
    page = chronicle.markdown(exp, now=T0)
    assert _rendered_tags(page) <= {"h1", "h2", "p", "ul", "li", "code"}, page
    assert "\u202e" not in page and "\u200b" not in page and "\u2028" not in page
    assert all(len(line) < 2000 for line in page.splitlines())
    if name != "huge":  # over the records' bounds: listed as not read instead (test_records_that_cannot_be_read...)
        lines = page.splitlines()
        assert [line[:2] for line in lines if line and not line.startswith(("#", "  - "))][1:] == ["- "] * 5, page


@pytest.mark.parametrize("text, shown", [
    ("7_1", "7\\_1"), ("n[1-2]", "n\\[1-2\\]"), ("a<b>&c", "a&lt;b&gt;&amp;c"), ("https://x", "https\\://x"),
    ("WWW.x.org", "WWW\\.x.org"), ("a@b", "a\\@b"), ("one\ntwo", "one two"),
])
def test_plain_escapes_exactly_what_a_renderer_acts_on(text: str, shown: str) -> None:
    assert chronicle.plain(text) == shown


def test_records_that_cannot_be_read_are_listed_and_the_rest_is_shown(run) -> None:
    with open(Path(run.paths.output) / ledger.LEDGER_NAME, "ab") as handle:
        handle.write(b'{"event": "begin", "job_id": "<b>x</b>", "nodes": ["n1"], "iteration": 1, "time": 1}\n')
        handle.write(b'{"event": "end", "job_id": "7_2", "nod')
    (Path(run.paths.output) / rollbacks.RECORD).write_text('{"time": NaN}\n')
    page = chronicle.markdown(run, now=T0 + 7200)
    assert "task 7\\_1 on n\\[1-2\\]: iterations 0 → 100, exit 0, 20.0 min" in page  # the rest still shown
    listed = page.split("## Records not read")[1].strip().splitlines()
    assert listed[0].startswith("3 record line(s)") and [line.split(":")[0] for line in listed[2:]] == [
        "- `task-ledger.jsonl` line 6", "- `task-ledger.jsonl` line 7", "- `rollbacks.jsonl` line 1"]
    assert "<b>" not in page


# --- the evaluation table ---------------------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    """A Markdown table row's cells (a pipe escaped as \\| stays inside its cell)."""
    import re

    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_the_evaluation_table_has_steps_then_references_and_plain_names(run) -> None:
    import dataclasses

    from tests.evaluate.test_ops_evaluate_results import write_results

    output = Path(run.paths.output)
    evil = "<img src=x onerror=alert(1)> | x"
    for step in (50, 100, 150):
        complete_checkpoint(run, step)
    write_results(output, {100: {"smoke_choice/acc": 0.5}, 150: {"smoke_choice/acc": 0.625}}, bpb={150: {"cc": 1.5}})
    write_results(output, {84: {"smoke_choice/acc": 0.0}})  # a step the run never saved: not in the table, listed
    import json

    newest = output / "eval" / "global_step150.json"  # a configured task that did not run at 150: said under the table
    data = json.loads(newest.read_text())
    data["bsops"]["missing"] = {"lambada_openai": "its dataset is not in eval.hf_cache <b>x</b>"}
    newest.write_text(json.dumps(data))
    (output / "eval" / "global_step50.json").write_text('{"results": {')  # torn: listed, the rest shown
    exp = dataclasses.replace(run, eval=dataclasses.replace(run.eval, references={
        "GPT2 [Large]": {"smoke_choice/acc": 0.476, "cc/bits_per_byte": 1.2, f"{evil}/acc": 0.25}}))
    page = chronicle.markdown(exp, now=T0 + 7200)
    section = page.split("## Evaluation")[1].split("## Records not read")[0].strip().splitlines()
    table = [line for line in section if line.startswith("|")]
    assert _cells(table[0]) == ["metric", "step 100", "step 150", "GPT2 \\[Large\\]"]
    rows = {cells[0]: cells[1:] for cells in map(_cells, table[2:])}
    assert rows["smoke\\_choice/acc"] == ["0.5000", "0.6250", "0.4760"]
    assert rows["cc/bits\\_per\\_byte (lower)"] == ["-", "1.5000", "1.2000"]
    assert rows["&lt;img src=x onerror=alert\\(1\\)&gt; \\| x/acc"] == ["-", "-", "0.2500"]
    assert all(len(_cells(line)) == 4 for line in table)
    [missing] = [line for line in section if line.startswith("- missing")]
    assert missing.startswith("- missing at step 150: lambada\\_openai: its dataset is not in eval.hf\\_cache")
    assert "<b>" not in missing
    listed = page.split("## Records not read")[1]
    assert "- `eval/global_step50.json`: not JSON" in listed
    assert "- `eval/global_step84.json`: a result of step 84, which the run has no checkpoint of" in listed
    assert _rendered_tags(page) <= {"h1", "h2", "p", "ul", "li", "code", "table", "thead", "tbody", "tr", "th", "td",
                                    'th style', 'td style'}, page
