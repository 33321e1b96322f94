"""bsops logs (tail, follow through rotation) and bsops plot (the curves read back from real event files)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import log as runlog
from bigscience_ops.cli import EXIT_ERROR, main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.views import plot
from tests.fixtures_experiments import tiny_yaml

BSOPS = str(Path(sys.executable).with_name("bsops"))
SEQ = 128  # tiny's seq_length


@pytest.fixture
def run_exp(trainings: Path, tmp_path: Path):
    """An experiment `run` (tiny with its run folder under tmp_path) and its resolved config."""
    (trainings / "run.yaml").write_text(tiny_yaml(tmp_path / "run"))
    return load_experiment("run", trainings)


def _lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


# ---------------------------------------------------------------- tail and follow


@pytest.mark.parametrize("n", [0, 1, 3, 5000, 7000])
def test_tail_returns_the_last_complete_lines(tmp_path, n):
    log = tmp_path / "main_log.txt"
    text = [f" iteration {i:8d}/    5000 | lm loss: {i / 7:.6E} |" for i in range(1, 5001)]  # > one 64 KiB block
    _lines(log, text)
    with open(log, "a") as f:
        f.write(" iteration     5001/")  # being written: not a line yet
    lines, offset = runlog.tail(log, n)
    assert lines == (text[-n:] if n else [])
    assert offset == log.stat().st_size - len(" iteration     5001/")


def test_follow_sees_appends_rotation_and_truncation(tmp_path):
    """The poll is driven by the sleep function: each 'sleep' changes the file, no clock involved."""
    log = tmp_path / "main_log.txt"
    _lines(log, ["old 1", "old 2"])
    _, offset = runlog.tail(log, 10)
    actions = [
        lambda: _lines(log, ["appended 1", "appended 2"]),
        lambda: log.open("a").write("partial"),
        lambda: log.open("a").write(" line\n"),
        lambda: (log.rename(tmp_path / "main_log.txt.1"), None),  # rotated away: the new file is not there yet
        lambda: _lines(log, ["new file 1"]),
        lambda: log.write_text("short\n"),  # truncated and rewritten in place (same inode, smaller)
    ]
    def sleep(_):
        if actions:
            actions.pop(0)()
    got = list(runlog.follow(log, offset, interval=5.0, stop=lambda: not actions, sleep=sleep))
    assert got == ["appended 1", "appended 2", "partial line", "new file 1", "short"]


def test_find_log_prefers_the_run_folder_then_the_synced_clone(run_exp, tmp_path):
    run = Path(run_exp.paths.output)
    with pytest.raises(runlog.LogError) as err:
        runlog.find_log(run_exp)
    assert str(run / "logs" / "main_log.txt") in str(err.value) and str(run / "hub" / "logs") in str(err.value)
    _lines(run / "hub" / "logs" / "main_log.txt", ["from the clone"])
    assert runlog.find_log(run_exp) == run / "hub" / "logs" / "main_log.txt"
    _lines(run / "logs" / "main_log.txt", ["from the run"])
    assert runlog.find_log(run_exp) == run / "logs" / "main_log.txt"
    other = tmp_path / "elsewhere"
    _lines(other / "logs" / "main_log.txt", ["from another clone"])
    assert runlog.find_log(run_exp, other) == other / "logs" / "main_log.txt"


def test_logs_command_prints_the_tail(run_exp, trainings):
    _lines(Path(run_exp.paths.logs) / "main_log.txt", [f"line {i}" for i in range(10)])
    result = CliRunner().invoke(main, ["logs", "run", "--trainings-dir", str(trainings), "-n", "3"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["line 7", "line 8", "line 9"]  # the log alone: it may be piped
    assert result.stderr.startswith(f"run folder: {run_exp.paths.output} (")
    missing = CliRunner().invoke(main, ["logs", "run", "--trainings-dir", str(trainings), "--from-clone", "/nonexistent"])
    assert missing.exit_code == EXIT_ERROR


def _reader(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in stream], daemon=True).start()
    return lines


def test_logs_follow_prints_lines_appended_after_it_started(run_exp, trainings):
    log = Path(run_exp.paths.logs) / "main_log.txt"
    _lines(log, ["before 1", "before 2"])
    proc = subprocess.Popen([BSOPS, "logs", "run", "--trainings-dir", str(trainings), "-n", "1", "--follow",
                             "--interval", "0.2"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        out = _reader(proc.stdout)
        assert out.get(timeout=60) == "before 2"  # the tail is printed: following has started
        _lines(log, ["after 1"])
        assert out.get(timeout=60) == "after 1"
        log.rename(log.with_name("main_log.txt.1"))  # rotated: a new file starts
        _lines(log, ["rotated 1"])
        assert out.get(timeout=60) == "rotated 1"
        assert proc.poll() is None  # still following
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---------------------------------------------------------------- plot


def _write_events(directory: Path, points: dict[str, list[tuple[int, float]]], iteration_base: int = 0) -> None:
    """Real event files, written by the trainer's own Board (scalars also against consumed samples)."""
    from bigscience_ops.trainer.report import Board

    board = Board(str(directory))
    for tag, values in points.items():
        for i, (samples, value) in enumerate(values):
            board.scalar(tag, value, iteration_base + i + 1, samples)
    board.close()


def test_plot_draws_each_series_against_tokens(run_exp, tmp_path):
    tb = Path(run_exp.paths.tensorboard)
    first = {"lm loss": [(8, 9.0), (16, 8.5), (24, 8.1)], "learning-rate": [(8, 1e-4), (16, 2e-4), (24, 3e-4)],
             "batch-size": [(8, 8), (16, 8), (24, 8)], "grad-norm": [(8, 3.0), (16, 2.5), (24, 2.0)],
             "lm loss validation": [(16, 8.7)]}
    _write_events(tb, first)
    os.utime(next(tb.iterdir()), (1, 1))  # the first run's file is the older one, whatever the clock
    # the resumed run logs again from samples 24 (a later value for the same point wins) and goes on
    _write_events(tb, {"lm loss": [(24, 8.0), (36, 7.5)], "batch-size": [(24, 12), (36, 12)]}, iteration_base=2)
    out = tmp_path / "curves.png"
    result = plot.plot(run_exp, out)
    s = result.series
    assert list(s) == ["training loss", "validation loss", "learning rate", "batch size", "grad norm"]
    assert s["training loss"].tokens == [8 * SEQ, 16 * SEQ, 24 * SEQ, 36 * SEQ]
    assert s["training loss"].values == pytest.approx([9.0, 8.5, 8.0, 7.5])
    assert s["batch size"].values == [8, 8, 12, 12]
    assert s["validation loss"].tokens == [16 * SEQ] and s["validation loss"].values == pytest.approx([8.7])
    assert s["learning rate"].values == pytest.approx([1e-4, 2e-4, 3e-4])
    assert len(result.event_files) == 2
    import matplotlib.image

    image = matplotlib.image.imread(out)  # a valid PNG
    assert image.shape[0] > 600 and image.shape[1] > 800 and image[..., :3].std() > 0


def test_plot_command(run_exp, trainings, tmp_path):
    runner = CliRunner()
    out = tmp_path / "p.png"
    empty = runner.invoke(main, ["plot", "run", "--trainings-dir", str(trainings), "--out", str(out)])
    assert empty.exit_code == EXIT_ERROR and not out.exists()  # no event files yet
    _write_events(Path(run_exp.paths.tensorboard), {"lm loss": [(8, 9.0)]})
    result = runner.invoke(main, ["plot", "run", "--trainings-dir", str(trainings), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (Path(run_exp.paths.output) / "eval").mkdir()
    (Path(run_exp.paths.output) / "eval" / "global_step8.json").write_text('{"bsops": ')  # torn: named, plot drawn
    torn = runner.invoke(main, ["plot", "run", "--trainings-dir", str(trainings), "--out", str(out)])
    assert torn.exit_code == 0 and "global_step8.json" in torn.stderr


def test_plot_marks_the_chronicles_events_on_the_loss_curve(run_exp, tmp_path):
    """Task starts, a node-phase resize and a rollback at their iterations' tokens; an alert at the last point
    logged before it (one before any point is not drawn). Read back from the loss panel's lines."""
    import time

    from bigscience_ops.run import ledger
    from bigscience_ops.run import rollbacks
    from bigscience_ops.schedule.run import run_schedule

    _write_events(Path(run_exp.paths.tensorboard), {"lm loss": [(8, 9.0), (16, 8.5), (24, 8.1)]})
    out, now = Path(run_exp.paths.output), time.time()
    for record in [ledger.TaskRecord("launch", "7", "", 0, now - 100),
                   ledger.TaskRecord("begin", "7_1", "n1", 0, now - 90),
                   ledger.TaskRecord("resize", "7", "2", 2, now - 50, next_job="9"),
                   ledger.TaskRecord("begin", "9_1", "n[1-2]", 2, now - 40)]:
        ledger.append(out / ledger.LEDGER_NAME, record)
    rollbacks.append(out, rollbacks.Rollback(now - 30, 3, 1, "2-3", ""))
    stamps = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) for t in (now - 7200, now + 60)]
    _lines(Path(run_exp.paths.logs) / "watchdog.log",
           [f"[{stamp}] alert email sent to a@example.org <{i}@x>: [ALERT] run: x" for i, stamp in enumerate(stamps)])
    result = plot.plot(run_exp, tmp_path / "p.png")
    at = run_schedule(run_exp).batch.consumed_after
    assert sorted((m.kind, m.tokens) for m in result.markers) == sorted([
        ("task", 0), ("resize", at(2) * SEQ), ("task", at(2) * SEQ), ("rollback", at(1) * SEQ), ("alert", 24 * SEQ)])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_after_a_rollback_draws_the_live_branch_and_the_abandoned_points_apart(run_exp, tmp_path):
    """Trained to 8, rolled back to 4, relaunched to 6: the curves are 1-6 (5 and 6 the relaunch's values), the
    first branch's 5-8 are grey 'rolled back' points; the learning rate never jumps back up on the live curve."""
    import time

    from bigscience_ops.run import rollbacks
    from bigscience_ops.schedule.run import run_schedule

    at = run_schedule(run_exp).batch.consumed_after
    tb = Path(run_exp.paths.tensorboard)
    first = {"lm loss": [(at(i), 10.0 - i) for i in range(1, 9)], "learning-rate": [(at(i), i * 1e-5) for i in
                                                                                    range(1, 9)]}
    _write_events(tb, first)
    os.utime(next(tb.iterdir()), (1, 1))  # the first branch's file is the older one
    rollbacks.append(run_exp.paths.output, rollbacks.Rollback(time.time(), 8, 4, None, ""))
    _write_events(tb, {"lm loss": [(at(i), 20.0 + i) for i in (5, 6)],
                       "learning-rate": [(at(i), i * 1e-5) for i in (5, 6)]}, iteration_base=4)
    result = plot.plot(run_exp, tmp_path / "p.png")
    loss, lr = result.series["training loss"], result.series["learning rate"]
    assert loss.tokens == [at(i) * SEQ for i in range(1, 7)]
    assert loss.values == pytest.approx([9, 8, 7, 6, 25, 26])  # the relaunch's 5 and 6, never the first branch's
    assert loss.abandoned_tokens == [at(i) * SEQ for i in range(5, 9)]
    assert loss.abandoned_values == pytest.approx([5, 4, 3, 2])
    assert lr.values == sorted(lr.values) and lr.tokens[-1] == at(6) * SEQ
    assert result.series["grad norm"].abandoned_values == []
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_draws_the_evaluation_results_one_axis_per_kind_against_tokens(run_exp, tmp_path):
    """The eval panels: one per kind of metric (accuracies, perplexities, bits per byte: each its own axis), one line
    per metric against the checkpoints' consumed tokens as the other panels, read back from the panels; a torn result
    file is named and the rest drawn; a name that matplotlib would hide (a leading _) is still drawn."""
    import dataclasses

    from tests.evaluate.test_ops_evaluate_results import write_results

    _write_events(Path(run_exp.paths.tensorboard), {"lm loss": [(8, 9.0), (16, 8.5)]})
    out = tmp_path / "p.png"
    output = Path(run_exp.paths.output)
    write_results(output, {20: {"smoke_choice/acc": 0.25, "_x/acc": 0.5}, 10: {"smoke_choice/acc": 0.5}},
                  bpb={20: {"cc": 1.5}})
    (output / "eval" / "global_step30.json").write_text('{"bsops": ')
    exp = dataclasses.replace(run_exp, eval=dataclasses.replace(run_exp.eval,
                                                                references={"ref": {"cc/bits_per_byte": 1.2}}))
    result = plot.plot(exp, out)
    tokens = {step: step * 8 * 64 for step in (10, 20)}  # the result files' consumed tokens (eval_result)
    assert result.evaluation["smoke_choice/acc"] == [(tokens[10], 0.5), (tokens[20], 0.25)]
    assert result.evaluation["_x/acc"] == [(tokens[20], 0.5)]
    assert result.evaluation["cc/bits_per_byte"] == [(tokens[20], 1.5)]
    ppl = pytest.approx(55.6965641)
    assert result.evaluation["smoke_lastword/perplexity"] == [(tokens[10], ppl), (tokens[20], ppl)]
    assert sorted(result.eval_panels) == ["accuracy", "bits_per_byte", "perplexity"]
    assert result.eval_panels["bits_per_byte"] == ["cc/bits_per_byte", "smoke_ppl/bits_per_byte"]
    assert all(plot.metric_kind(m, False) == "perplexity" for m in result.eval_panels["perplexity"])
    assert [Path(p.file).name for p in result.problems] == ["global_step30.json"]
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[0] > 1800  # two more rows of panels (three rows are 1210 pixels high)
