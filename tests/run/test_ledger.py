"""The failure budget: a crash loop stops after K tasks without progress, and a launch resets it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bigscience_ops.run import ledger
from bigscience_ops.launch import render as rendering
from bigscience_ops.plan import make_plan
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import BsopsError
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_render import install_shims
from tests.fixtures_runs import commit_checkpoint
from tests.fixtures_smtp import alerts_yaml


def env_for(job: str, nodes: str) -> dict[str, str]:
    return {"SLURM_ARRAY_JOB_ID": job, "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_NODELIST": nodes}


def save(checkpoints: Path, step: int) -> None:
    """A committed save of `step` (bsops.json, manifest) and `latest` naming it, as the trainer leaves them."""
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bsops.json").write_text(f'{{"iteration": {step}}}')
    commit_checkpoint(folder)
    (checkpoints / "latest").write_text(f"global_step{step}")


def test_budget_counts_only_tasks_without_progress(tmp_path: Path) -> None:
    ck = tmp_path / "checkpoints"
    assert ledger.begin(tmp_path, ck, 2, env_for("10", "n1")) is None
    save(ck, 100)
    assert ledger.end(tmp_path, ck, 0, env_for("10", "n1")).progressed
    for job in ("11", "12"):
        assert ledger.begin(tmp_path, ck, 2, env_for(job, f"n{job}")) is None
        assert not ledger.end(tmp_path, ck, 1, env_for(job, f"n{job}")).progressed
    failing = ledger.begin(tmp_path, ck, 2, env_for("13", "n13"))
    assert [a.nodes for a in failing] == ["n11", "n12"]
    assert [a.start_iteration for a in failing] == [100, 100]
    ledger.mark_launch(tmp_path, "99")
    assert ledger.begin(tmp_path, ck, 2, env_for("14", "n14")) is None


def test_a_killed_task_counts_as_no_progress(tmp_path: Path) -> None:
    ck = tmp_path / "checkpoints"
    ledger.begin(tmp_path, ck, 1, env_for("1", "n1"))  # never ends: killed
    assert ledger.begin(tmp_path, ck, 1, env_for("2", "n2")) is not None
    assert ledger.begin(tmp_path, ck, 0, env_for("2", "n2")) is None  # 0 disables


def test_a_killed_task_is_judged_by_the_checkpoint_the_next_task_begins_at(tmp_path: Path) -> None:
    """No end record (its node died, its save outlasted Slurm's KillWait): a task that saved first made progress."""
    ck = tmp_path / "checkpoints"
    ledger.begin(tmp_path, ck, 1, env_for("1", "n1"))
    save(ck, 50)  # then killed
    assert ledger.begin(tmp_path, ck, 1, env_for("2", "n2")) is None  # killed with no save: the budget's 1 is spent
    failing = ledger.begin(tmp_path, ck, 1, env_for("3", "n3"))
    assert [(a.job_id, a.start_iteration, a.end_iteration, a.ended) for a in failing] == [("2_1", 50, 50, None)]
    first, second = ledger.attempts(ledger.read(tmp_path / ledger.LEDGER_NAME))
    assert first.progressed and first.end_iteration == 50 and first.ended is None and first.exit_code is None
    assert second.end_iteration is None and ledger.running(ledger.read(tmp_path / ledger.LEDGER_NAME)) == second


def test_progress_is_the_checkpoint_a_resume_starts_from_whatever_latest_says(tmp_path: Path) -> None:
    """A task is judged by where the next one resumes: `latest` unreadable, naming a folder that is not there or a
    save that never committed, the newest committed checkpoint counts (as the trainer's resume falls back to it)."""
    (tmp_path / "latest").write_text("step12")
    assert ledger.latest_iteration(tmp_path) == 0
    save(tmp_path, 20)
    (tmp_path / "global_step40").mkdir()  # a save cut short: no manifest
    for named in ("step12", "global_step99", "global_step40", "global_step5"):
        (tmp_path / "latest").write_text(named)
        assert ledger.latest_iteration(tmp_path) == 20, named


def test_job_script_stops_a_crash_loop(tmp_path: Path, trainings: Path, plain_server) -> None:
    inbox, port = plain_server
    (trainings / "loop.yaml").write_text(
        tiny_yaml(tmp_path / "run", "slurm: {failure_budget: 2}\n", alerts_yaml(port)))
    exp = load_experiment("loop", trainings)
    script = rendering.write(rendering.render(exp, tmp_path / "r", make_plan(exp)), tmp_path / "r")
    env = install_shims(tmp_path, torchrun_exit=1)  # the trainer crashes at once, saving nothing
    env["BSOPS_LOCAL_LAUNCH"] = "1"  # made-up Slurm ids: nothing to scancel
    codes = []
    for task in range(4):
        env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"] = "500", str(task + 1)
        codes.append(subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=60).returncode)
    assert codes == [1, 1, 1, 1]
    launches = (tmp_path / "argv.jsonl").read_text().splitlines()
    assert len(launches) == 2, "the third and fourth tasks must not start the trainer"
    log = (tmp_path / "run" / "logs" / "main_log.txt").read_text()
    assert "***ALERT: loop: the last 2 array tasks made no progress" in log
    assert "node-[a-b]" in log
    [mail] = inbox.messages  # the fourth task stops without alerting again
    assert ledger.stopped(ledger.read(tmp_path / "run" / ledger.LEDGER_NAME))
    assert "crash loop" in mail["Subject"] and "500_1 on node-[a-b]" in mail.get_content()


def test_job_script_tasks_end_at_once_without_a_failure_while_the_kill_switch_exists(
        tmp_path: Path, trainings: Path, plain_server) -> None:
    """Stopped on purpose: no task starts the trainer, none counts against the budget, no crash-loop mail."""
    inbox, port = plain_server
    (trainings / "halt.yaml").write_text(
        tiny_yaml(tmp_path / "run", "slurm: {failure_budget: 1}\n", alerts_yaml(port)))
    exp = load_experiment("halt", trainings)
    script = rendering.write(rendering.render(exp, tmp_path / "r", make_plan(exp)), tmp_path / "r")
    env = install_shims(tmp_path)
    env["BSOPS_LOCAL_LAUNCH"] = "1"  # made-up Slurm ids: nothing to scancel
    Path(exp.checkpoint.kill_switch_path).parent.mkdir(parents=True, exist_ok=True)
    Path(exp.checkpoint.kill_switch_path).touch()
    for task in range(3):
        env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"] = "600", str(task + 1)
        assert subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=60).returncode == 0
    assert not (tmp_path / "argv.jsonl").exists(), "no task may start the trainer"
    log = (tmp_path / "run" / "logs" / "main_log.txt").read_text()
    assert log.count(f"not training: the kill switch {exp.checkpoint.kill_switch_path} exists") == 3, log
    assert ledger.attempts(ledger.read(tmp_path / "run" / ledger.LEDGER_NAME)) == [] and inbox.messages == []


# --- untrusted lines ------------------------------------------------------------------------------------

def test_a_line_torn_mid_write_loses_only_itself(tmp_path: Path) -> None:
    """A node dies mid-append: the next record still starts a line of its own, the strict reader names the torn
    line (file, line, a short excerpt) and the checked reader returns the rest."""
    path = tmp_path / ledger.LEDGER_NAME
    ledger.append(path, ledger.TaskRecord("begin", "1_1", "n1", 0, 1000.0))
    with open(path, "ab") as handle:
        handle.write(b'{"event": "end", "job_id": "1_1", "nodes": "n1", "iteration": 5' + b"x" * 500)
    ledger.append(path, ledger.TaskRecord("begin", "1_2", "n2", 0, 2000.0))
    checked = ledger.read_checked(path)
    assert [r.job_id for r in checked.records] == ["1_1", "1_2"]
    [problem] = checked.problems
    assert (problem.file, problem.line) == (str(path), 2) and len(problem.held) < 120
    with pytest.raises(ledger.LedgerError, match=f"{path}:2: ") as refused:
        ledger.read(path)
    assert "x" * 100 not in str(refused.value)  # a capped excerpt, never the whole line


@pytest.mark.parametrize("line, field", [
    ('{"event": "begin", "job_id": "1", "nodes": "n", "iteration": 1, "time": NaN}', "time"),
    ('{"event": "begin", "job_id": "1", "nodes": ["n1"], "iteration": 1, "time": 1}', "nodes"),
    ('{"event": "begin", "job_id": "1", "nodes": "n", "iteration": "1", "time": 1}', "iteration"),
    ('{"event": "begin", "job_id": "1", "nodes": "n", "iteration": true, "time": 1}', "iteration"),
    ('{"event": "end", "job_id": "1", "nodes": "n", "iteration": 1, "time": 1, "exit_code": 1.5}', "exit_code"),
    ('{"event": "launch", "job_id": "1\\n2", "nodes": "", "iteration": 0, "time": 1}', "job_id"),
])
def test_each_field_is_checked_by_type_and_range(tmp_path: Path, line: str, field: str) -> None:
    path = tmp_path / ledger.LEDGER_NAME
    path.write_text(line + "\n")
    [problem] = ledger.read_checked(path).problems
    assert problem.line == 1 and f"field {field}:" in problem.what


def test_a_ledger_that_is_a_fifo_or_a_link_is_never_opened(tmp_path: Path) -> None:
    import os

    fifo, link = tmp_path / "fifo.jsonl", tmp_path / "link.jsonl"
    os.mkfifo(fifo)
    (tmp_path / "secret").write_text('{"event": "launch", "job_id": "TOPSECRET", "nodes": "", "iteration": 0, '
                                     '"time": 1}\n')
    link.symlink_to(tmp_path / "secret")
    for path in (fifo, link):
        checked = ledger.read_checked(path)
        assert checked.records == [] and [p.line for p in checked.problems] == [0]
        assert "TOPSECRET" not in str(checked.problems[0])
        with pytest.raises(ledger.LedgerError):
            ledger.read(path)
        with pytest.raises(BsopsError):
            ledger.append(path, ledger.TaskRecord("launch", "1", "", 0, 1.0))
    assert (tmp_path / "secret").read_text().count("\n") == 1


def test_the_task_hooks_pass_over_a_torn_line_and_keep_counting(tmp_path: Path) -> None:
    """A node died mid-write: the next task begins and ends (the torn line costs only itself), the budget still
    counts the tasks around it, and the hook names the line it passed over."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    path = out / ledger.LEDGER_NAME
    env = {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_NODELIST": "n1"}
    assert ledger.begin(out, out / "checkpoints", budget=2, env=env) is None
    with open(path, "ab") as handle:
        handle.write(b'{"event": "end", "job_id": "9_1", "nod')  # the node died here
    env2 = {**env, "SLURM_ARRAY_TASK_ID": "2"}
    assert ledger.begin(out, out / "checkpoints", budget=2, env=env2) is None
    attempt = ledger.end(out, out / "checkpoints", 1, env=env2)
    assert (attempt.job_id, attempt.exit_code) == ("9_2", 1)
    [skipped] = ledger.skipped_lines(out)
    assert skipped.startswith(f"{path}:2: ")
