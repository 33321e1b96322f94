"""The run's chronicle (ops/keep/chronicle.py, `bsops chronicle`): its timeline read back from the ledger, main_log.txt,
watchdog.log, rollbacks.jsonl and the backup manifests.

A real two-task local launch is chronicled in tests/test_launch.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops import ledger
from bigscience_ops.cli import main
from bigscience_ops.config import load_experiment
from bigscience_ops.iteration_log import IterationStats, iteration_line
from bigscience_ops.ops.keep import chronicle
from tests.fixtures_experiments import tiny_yaml

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
    (checkpoints / "latest").write_text(f"global_step{steps[-1]}")


def test_rollbacks_and_backups_are_in_the_timeline(trainings: Path, tmp_path: Path):
    from bigscience_ops.checkpoints.rollback import rollback
    from bigscience_ops.ops.keep import backup

    store = tmp_path / "store"
    (trainings / "kept.yaml").write_text(tiny_yaml(tmp_path / "kept", f"backup: {{dest: {str(store)!r}}}\n"))
    exp = load_experiment("kept", trainings)
    _saved(exp, 50, 100)
    report = backup.run_backup(exp)  # the real backup: verified copies and their manifests
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
