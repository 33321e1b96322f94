"""`bsops info`: the run's state from its folder, and the iteration-line reader it (and the watchdog) use.

The end-to-end check on a real local launch is in tests/launch/test_launch.py (several checks per launch).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import ledger
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.run.iterations import IterationStats, iteration_line, parse_iteration_line
from bigscience_ops.views import runinfo
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import commit_checkpoint, complete_checkpoint

SEED_LINES = Path(__file__).resolve().parents[1] / "assets" / "seeds" / "megatron_log_lines.txt"
"""The Megatron log lines the project's source documents quote (copied from ../shared/seeds, its first line says where)."""


def _stats(rng: random.Random, **extra) -> IterationStats:
    return IterationStats(rng.randrange(1, 10**6), 10**6, rng.randrange(10**9), rng.randrange(10**12),
                          round(rng.uniform(1, 9e4), 1), 1e-4, rng.choice([16, 2048]), round(rng.uniform(1, 9.9), 6),
                          65536.0, round(rng.uniform(0, 50), 3), round(rng.uniform(1, 500), 3), rng.randrange(5),
                          rng.randrange(5), round(rng.uniform(0.1, 900), 3), round(rng.uniform(0, 300), 2), **extra)


@pytest.mark.parametrize("seed", range(20))
def test_iteration_lines_read_back_what_the_trainer_wrote(seed):
    rng = random.Random(seed)
    extra = rng.choice([{}, {"mfu": 0.412, "curriculum_seqlen": 64}])
    stats = _stats(rng, **extra)
    assert parse_iteration_line(iteration_line(stats)) == stats


@pytest.mark.parametrize("line", [
    "validation loss at iteration 50 | lm loss value: 5.7E+00 |",
    " iteration 10/ 221",  # no fields: not a complete line
    " iteration 1x0/ 221 | lm loss: 1 |",
    " iteration 10/ 221 | lm loss: 8.6638E+0",  # truncated mid-number: still a float
    " iteration 10/ 221 | global batch size: 1.5 |",  # a field of the wrong type
    "  successfully saved checkpoint at iteration      50 to /x (145.0 ms)",
    "\u2028 iteration 10/ 221 | lm loss: 1 |\u2028",
])
def test_other_lines_are_not_iteration_lines(line):
    stats = parse_iteration_line(line)
    if stats is not None:  # the truncated number is still a number; nothing else may parse
        assert line.endswith("E+0") and stats.lm_loss == pytest.approx(8.6638)


def test_megatron_lines_of_the_seed_logs_are_read():
    lines = SEED_LINES.read_text().splitlines()
    read = [stats for stats in map(parse_iteration_line, lines) if stats is not None]
    assert [s.iteration for s in read] == [25, 26, 27, 1, 2, 3, 168000]  # the rest (fences, dataset sizes) are not
    assert any(s.iteration == 168000 and s.grad_norm == 19767.052 and s.loss_scale == 131072.0 for s in read)
    labelled = [s for s in read if s.train_iters == 73242187]  # srun --label's "   1:  iteration ..."
    assert labelled and labelled[0].lm_loss == pytest.approx(10.86954)


@pytest.fixture
def exp(trainings: Path, tmp_path: Path):
    (trainings / "run.yaml").write_text(tiny_yaml(tmp_path / "run"))
    return load_experiment("run", trainings)


def test_a_run_not_launched_from_here_says_so(exp):
    info = runinfo.run_info(exp)
    assert info.last is None and info.latest is None and info.tasks == [] and not info.problems
    text = runinfo.info_text(info)
    assert "no such folder" in text and "no iteration logged yet" in text and "checkpoint:  none yet" in text


def test_a_bad_ledger_line_is_reported_and_the_rest_still_shown(exp):
    out, logs = Path(exp.paths.output), Path(exp.paths.logs)
    logs.mkdir(parents=True)
    rng = random.Random(1)
    (logs / "main_log.txt").write_text("".join(iteration_line(_stats(rng)) + "\n" for _ in range(3)) + "garbage\n")
    (out / ledger.LEDGER_NAME).write_text('{"event": "begin"\n')
    info = runinfo.run_info(exp)
    assert info.last is not None and len(info.problems) == 1 and "task ledger" in info.problems[0]
    assert "could not read: task ledger" in runinfo.info_text(info)


def test_tasks_show_nodes_iterations_exits_and_times(exp, trainings: Path):
    out = Path(exp.paths.output)
    path = out / ledger.LEDGER_NAME
    for record in [ledger.TaskRecord("launch", "7", "", 0, 1000.0),
                   ledger.TaskRecord("begin", "7_1", "n[1-2]", 0, 1100.0),
                   ledger.TaskRecord("end", "7_1", "n[1-2]", 300, 1700.0, exit_code=0),
                   ledger.TaskRecord("begin", "7_2", "n[3-4]", 300, 1800.0)]:
        ledger.append(path, record)
    info = runinfo.run_info(exp)
    assert [(t.job_id, t.nodes, t.start_iteration, t.end_iteration, t.exit_code, t.started, t.ended)
            for t in info.tasks] == [("7_1", "n[1-2]", 0, 300, 0, 1100.0, 1700.0),
                                     ("7_2", "n[3-4]", 300, None, None, 1800.0, None)]
    text = runinfo.info_text(info, now=1800.0 + 3600)
    assert "7_1  nodes n[1-2]  iterations 0 -> 300  exit 0" in text and "10.0 min" in text
    assert "7_2  nodes n[3-4]  iterations 300 -> ?  running or killed" in text and "since the launch" in text
    result = CliRunner().invoke(main, ["info", "run", "--trainings-dir", str(trainings), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["run_folder"] == str(out) and [t["job_id"] for t in data["tasks"]] == ["7_1", "7_2"]
    assert result.stderr == f"run folder: {out} (relative paths of {trainings / 'run.yaml'} resolve against " \
                            f"{trainings.parent})\n"


def test_last_backup_is_read_from_the_stores_manifests(trainings: Path, tmp_path: Path):
    from bigscience_ops.ops.keep import backup

    store = tmp_path / "store"
    (trainings / "saved.yaml").write_text(tiny_yaml(tmp_path / "run", f"backup: {{dest: {json.dumps(str(store))}}}\n"))
    exp = load_experiment("saved", trainings)
    assert runinfo.run_info(exp).backup.note == "the run has no run id yet (no checkpoint saved): nothing backed up"
    checkpoints = Path(exp.paths.checkpoints)
    for step in (5, 10):
        (checkpoints / f"global_step{step}").mkdir(parents=True)
        (checkpoints / f"global_step{step}" / "layer_00-model_states.pt").write_bytes(bytes(100 * step))
        (checkpoints / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
        commit_checkpoint(checkpoints / f"global_step{step}")
        (checkpoints / "latest").write_text(f"global_step{step}")
        report = backup.run_backup(backup.settings(exp))
    assert report.backed_up == ["global_step10"] and report.already == ["global_step5"]
    info = runinfo.run_info(exp)
    b = info.backup
    assert (b.last, b.step, b.copies, b.kind, b.store) == ("global_step10", 10, 2, "weights-only", report.store)
    assert abs(b.verified_at - (store / "saved").stat().st_mtime) < 3600 and not info.problems
    text = runinfo.info_text(info, now=b.verified_at + 120)
    assert f"backup:      global_step10 (weights-only), verified " in text and f"(2 min ago); 2 copies in {b.store}" in text
    assert runinfo.info_data(info)["backup"]["store"] == str(report.store)
    (trainings / "nodest.yaml").write_text(tiny_yaml(tmp_path / "run"))
    assert "backup:      none (backup.dest is not set)" in runinfo.info_text(runinfo.run_info(
        load_experiment("nodest", trainings)))


def test_info_imports_neither_torch_nor_deepspeed(exp, trainings: Path):
    import subprocess

    code = ("import sys; from bigscience_ops.cli import main; "
            f"main(['info', 'run', '--trainings-dir', {str(trainings)!r}], standalone_mode=False); "
            "print(sorted(m for m in ('torch', 'deepspeed', 'lm_eval') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("[]")


def test_hostile_records_and_a_linked_checkpoint_are_named_and_the_rest_shown(exp, tmp_path: Path):
    out, checkpoints = Path(exp.paths.output), Path(exp.paths.checkpoints)
    (checkpoints / "global_step5").mkdir(parents=True)
    (checkpoints / "global_step5" / "bsops.json").write_text('{"iteration": 5}')
    commit_checkpoint(checkpoints / "global_step5")
    (checkpoints / "latest").write_text("global_step5")
    (tmp_path / "elsewhere").mkdir()
    (checkpoints / "global_step9").symlink_to(tmp_path / "elsewhere")
    ledger.append(out / ledger.LEDGER_NAME, ledger.TaskRecord("begin", "7_1", "n1", 0, 1100.0))
    with open(out / ledger.LEDGER_NAME, "a") as handle:
        handle.write('{"event": "end", "job_id": "7_1", "nodes": {"x": [1]}, "iteration": 5, "time": 1e999}\n')
        handle.write('{"event": "end", "job_id": "7_1", "nodes": "n1", "iteration": 5, "time": "soon"}\n')
    (out / "rollbacks.jsonl").write_text('{"time": 1, "from_step": 9, "to_step": 5, "skip": "a-b", "set_aside": ""}\n')
    info = runinfo.run_info(exp)
    assert info.latest == 5 and info.checkpoints == [5] and [t.job_id for t in info.tasks] == ["7_1"]
    assert [p.split(":", 1)[0] for p in info.problems] == ["checkpoints", "task ledger", "task ledger", "rollbacks"]
    assert "global_step9" in info.problems[0] and f"{out / ledger.LEDGER_NAME}:2:" in info.problems[1]
    assert json.loads(json.dumps(runinfo.info_data(info)))["problems"] == info.problems
    assert runinfo.info_text(info).count("could not read:") == 4


def test_a_log_ending_in_a_line_longer_than_the_window_is_said_not_shown_as_empty(exp):
    """64 MiB of NULs a crashed node left: info names what it could not read instead of 'no iteration logged'."""
    import os

    logs = Path(exp.paths.logs)
    logs.mkdir(parents=True)
    log = logs / "main_log.txt"
    log.write_text(iteration_line(_stats(random.Random(2))) + "\n")
    with open(log, "ab") as handle:
        handle.truncate(os.path.getsize(log) + (65 << 20))  # a sparse run of NULs past the tail's window
    info = runinfo.run_info(exp)
    assert any("NUL bytes" in problem for problem in info.problems), info.problems


def _log_task(exp, start: int, last: int, mtime: float) -> None:
    """A task of tiny (221 iterations, logged every 10) resumed at `start`, logged to `last`, as the trainer writes
    it; main_log.txt is then dated `mtime`."""
    import os

    from bigscience_ops.trainer.sampling import TaskLayout

    rng = random.Random(start)
    lines = [TaskLayout(exp.name, 1000, 1, 1, 1, 1, False, 221, start).line()]
    logged = range(start + 10 - start % 10, last + 1, 10)  # every log_interval
    lines += [iteration_line(IterationStats(i, 221, 16 * i, 2048 * i, 10.0, 1e-4, 16, rng.uniform(4, 9), 1.0, 1.0,
                                            None, 0, 0, 2.0, 0.1)) for i in logged]
    log = Path(exp.paths.logs) / "main_log.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        handle.write("\n".join(lines) + "\n")
    os.utime(log, (mtime, mtime))


def test_a_finished_run_is_finished_though_its_last_iteration_is_not_logged(exp):
    """tiny logs every 10 iterations: its last line is 220 of 221, and its exit save global_step221 says it trained
    221, its last (iterations are 1-based)."""
    import time

    _log_task(exp, 0, 221, time.time())
    for step in (50, 100, 150, 200, 221):
        complete_checkpoint(exp, step)
    info = runinfo.run_info(exp)
    text = runinfo.info_text(info)
    assert "progress:    iteration 221/221 (100.0%): finished" in text and "99.5%" not in text
    assert (info.last.iteration, info.iteration, info.train_iters, info.finished) == (220, 221, 221, True)
    assert "last line:   iteration 220, lm loss" in text
    assert runinfo.info_data(info)["finished"] is True
    (Path(exp.paths.checkpoints) / "latest").write_text("global_step200")  # a run that stopped at 200
    stopped = runinfo.run_info(exp)
    assert (stopped.iteration, stopped.finished) == (220, False) and ": finished" not in runinfo.info_text(stopped)


def test_after_a_rollback_info_shows_the_live_iteration(exp):
    """rollback --step 100 of a finished run: iteration 100 (not 221, not finished) until a task runs again, then the
    relaunch's iterations; the abandoned lines are never the last line."""
    import time

    from bigscience_ops.run.rollback import rollback

    now = time.time()
    _log_task(exp, 0, 221, now - 600)
    for step in (50, 100, 150, 200, 221):
        complete_checkpoint(exp, step)
    rollback(exp, 100, "103-110", now=now - 300)
    info = runinfo.run_info(exp)
    text = runinfo.info_text(info, now=now)
    assert "progress:    iteration 100/221 (45.2%)" in text and ": finished" not in text
    assert (info.iteration, info.finished, info.last.iteration, info.relaunched) == (100, False, 100, False)
    assert "rollback:    from global_step221 to global_step100, skipping 103-110" in text and "not relaunched" in text
    assert info.rollback.to_step == 100 and runinfo.info_data(info)["rollback"]["skip"] == "103-110"
    ledger.append(Path(exp.paths.output) / ledger.LEDGER_NAME, ledger.TaskRecord("begin", "8_1", "n1", 100, now - 60))
    begun = runinfo.run_info(exp)  # the relaunch began; its trainer has logged nothing yet
    assert (begun.iteration, begun.last.iteration, begun.relaunched) == (100, 100, True)
    with open(Path(exp.paths.logs) / "main_log.txt", "a") as handle:
        handle.write("task 8_1 begins at iteration 100\n")  # as `bsops task begin` writes it
    assert runinfo.run_info(exp).iteration == 100
    _log_task(exp, 100, 150, now)  # the relaunch's trainer, started at 100: still running
    again = runinfo.run_info(exp)
    assert (again.iteration, again.last.iteration, again.relaunched, again.finished) == (150, 150, True, False)
    assert "progress:    iteration 150/221" in runinfo.info_text(again, now=now)


def test_the_live_branch_starts_at_the_relaunchs_begin_line_not_at_an_abandoned_task_that_started_there():
    """The abandoned task had itself resumed at the rollback's target (100): until the relaunch's job script writes its
    begin line, its iteration lines are not the live branch's, though the ledger says a task began."""
    import dataclasses

    from bigscience_ops.run import rollbacks
    from bigscience_ops.trainer.sampling import TaskLayout
    from bigscience_ops.views import branch

    def task(start: int, last: int) -> list[str]:
        return [TaskLayout("run", 1000, 1, 1, 1, 1, False, 221, start).line(),
                *(iteration_line(dataclasses.replace(_stats(random.Random(i)), iteration=i, train_iters=221))
                  for i in range(start + 10, last + 1, 10))]

    log = [*task(0, 120), *task(100, 150)]  # a task resumed at 100 and trained to 150: rolled back to 100
    done = [rollbacks.Rollback(1000.0, 150, 100, "101-110", "")]
    before = branch.live_branch(log, latest=100, rollbacks=done, begins=[10.0], log_mtime=900.0)
    assert (before.trained, before.relaunched, before.pending) == (100, False, done[0])
    began = branch.live_branch(log, latest=100, rollbacks=done, begins=[10.0, 1100.0], log_mtime=1100.0)
    assert (began.trained, began.relaunched, began.pending) == (150, True, None)  # its begin line not written yet
    log.append("task 9_1 begins at iteration 100")
    relaunch = branch.live_branch(log, latest=100, rollbacks=done, begins=[10.0, 1100.0], log_mtime=1100.0, keep=5)
    assert relaunch.trained == 100 and all(s.iteration <= 100 for s in relaunch.lines)  # of the last 5 read
    log += task(100, 130)[1:]  # its trainer's lines (its start line at 100 too)
    assert branch.live_branch(log, latest=100, rollbacks=done, begins=[10.0, 1100.0], log_mtime=1200.0).trained == 130


def test_the_evaluation_table_shows_steps_and_references_and_a_bad_result_file_is_named(exp):
    import dataclasses

    from tests.evaluate.test_ops_evaluate_results import write_results

    out = Path(exp.paths.output)
    for step in range(100, 1000, 100):
        complete_checkpoint(exp, step)
    write_results(out, {s: {"smoke_choice/acc": s / 1000} for s in range(100, 900, 100)}, bpb={800: {"cc": 1.25}})
    write_results(out, {850: {"smoke_choice/acc": 0.01}})  # a step never saved: named, not counted
    (out / "eval" / "global_step900.json").write_bytes(b"\xff")
    exp = dataclasses.replace(exp, eval=dataclasses.replace(exp.eval, references={"GPT2-XL": {"cc/bits_per_byte": 1.1}}))
    info = runinfo.run_info(exp)
    table = info.evaluation
    assert table.steps == [300, 400, 500, 600, 700, 800] and table.left_out == 2 and table.references == ["GPT2-XL"]
    assert {r.metric: r.values for r in table.rows}["cc/bits_per_byte"] == [None] * 5 + [1.25, 1.1]
    assert [p.split(":")[0] for p in info.problems] == ["evaluation", "evaluation"]
    assert "global_step900.json" in info.problems[0] and "global_step850.json" in info.problems[1]
    lines = runinfo.info_text(info).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  evaluation:"))
    assert lines[start + 1].split() == ["metric", "step", "300", "step", "400", "step", "500", "step", "600", "step",
                                        "700", "step", "800", "GPT2-XL"]
    assert lines[start + 3].split() == ["smoke_choice/acc", "0.3000", "0.4000", "0.5000", "0.6000", "0.7000",
                                        "0.8000", "-"]
    assert json.loads(json.dumps(runinfo.info_data(info)))["evaluation"]["steps"][-1] == 800
