"""The hourly eval job's choice (ops/evaluate/next_eval.py) over fake run folders, and the eval job it renders.

No torch, no cluster: the queue and sbatch are stand-ins, except where sbatch's own #SBATCH reader checks the script.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bigscience_ops.config import loading as config

from bigscience_ops import slurm
from bigscience_ops.run import rollbacks
from bigscience_ops.checkpoints import layout
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import ConfigError
from bigscience_ops.launch import jobs
from bigscience_ops.ops.evaluate import jobscript, next_eval
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_sbatch import sbatch_options  # noqa: F401  (the fixture)
from tests.fixtures_runs import commit_checkpoint

FINAL = 221  # tiny's last step


def _exp(trainings: Path, tmp_path: Path, extra: str = "", name: str = "ev"):
    (tmp_path / "held.jsonl").write_text('{"text": "held out"}\n')
    (trainings / f"{name}.yaml").write_text(tiny_yaml(
        tmp_path / "run", f"eval: {{sources: {{held: {json.dumps(str(tmp_path / 'held.jsonl'))}}}{extra}}}\n"))
    return load_experiment(name, trainings)


def _saved(exp, *steps: int, latest: int | None = None, meta: bool = True) -> None:
    folder = Path(exp.paths.checkpoints)
    for step in steps:
        (folder / f"global_step{step}").mkdir(parents=True)
        if meta:
            (folder / f"global_step{step}" / "bsops.json").write_text(json.dumps({"iteration": step}))
            commit_checkpoint(folder / f"global_step{step}")
    (folder / "latest").write_text(f"global_step{latest if latest is not None else max(steps)}")


def _result(exp, step: int) -> None:
    path = Path(exp.paths.output) / "eval" / f"global_step{step}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")


def _job(job_id: str, name: str, state: str = "RUNNING") -> slurm.Job:
    return slurm.Job(job_id, job_id, None, name, "me", state, "None", "p", 1, "n1", 0, 10, None, None, None)


def _rec(event: str, job_id: str, step: int, log: str | None = None) -> next_eval.JobRecord:
    return next_eval.JobRecord(event, job_id, f"global_step{step}", step, 1.0, log)


def _run(exp) -> next_eval.EvalRun:
    """The run as `bsops eval next` hands it to the scheduler (commands.next_pass), the user `me` watched."""
    return next_eval.EvalRun(exp.name, Path(exp.paths.output), Path(exp.paths.checkpoints),
                            jobs.SlurmJob(next_eval.job_name(exp), ("me",)), next_eval.chooser(exp))


def _decide(exp, records=(), queue=()) -> next_eval.Decision:
    return next_eval.decide(_run(exp), list(records), list(queue), now=2.0)


def test_the_newest_committed_checkpoint(trainings: Path, tmp_path: Path) -> None:
    exp = _exp(trainings, tmp_path)
    _saved(exp, 50, 100, latest=100)
    (Path(exp.paths.checkpoints) / "global_step150").mkdir()  # a save in progress: no manifest committed yet
    (Path(exp.paths.checkpoints) / "global_step150" / "bsops.json").write_text(json.dumps({"iteration": 150}))
    (Path(exp.paths.checkpoints) / "global_step120").mkdir()  # no bsops.json: not a finished save
    assert _decide(exp).submit.step == 100
    _result(exp, 100)
    decision = _decide(exp)
    assert (decision.submit.step, decision.left) == (50, 0)
    _result(exp, 50)
    assert _decide(exp).submit is None


def test_a_result_of_another_run_is_no_result_and_a_limited_one_is_when_the_run_is_limited(trainings: Path,
                                                                                            tmp_path: Path) -> None:
    from tests.evaluate.test_ops_evaluate_results import eval_result

    exp = _exp(trainings, tmp_path)
    layout.new_run_id(Path(exp.paths.output))
    _saved(exp, 50, 100)
    other = eval_result(100)
    other["bsops"]["run_id"] = "c" * 32  # copied in from another run's folder
    next_eval.results.write(next_eval.results.result_path(exp, "global_step100"), other)
    assert _decide(exp).submit.step == 100
    limited = eval_result(100)
    limited["bsops"]["limit"] = 5
    next_eval.results.write(next_eval.results.result_path(exp, "global_step100", limited=True), limited)
    assert _decide(exp).submit.step == 100  # a limited result is no full one
    run = next_eval.EvalRun(exp.name, Path(exp.paths.output), Path(exp.paths.checkpoints),
                           jobs.SlurmJob(next_eval.job_name(exp), ("me",)), next_eval.chooser(exp), limited=True)
    assert next_eval.decide(run, [], [], now=2.0).submit.step == 50  # eval.limit set: it is the step's result


def test_a_step_saved_again_after_a_rollback_is_evaluated_again(trainings: Path, tmp_path: Path) -> None:
    exp = _exp(trainings, tmp_path)
    _saved(exp, 50, 100)
    _result(exp, 50)
    _result(exp, 100)
    assert _decide(exp).submit is None
    rollbacks.append(exp.paths.output, rollbacks.Rollback(time.time() + 5, 100, 50, None, ""))
    assert _decide(exp).submit.step == 100  # its result is the abandoned branch's; 50's still counts


def test_no_checkpoint_yet(trainings: Path, tmp_path: Path) -> None:
    decision = _decide(_exp(trainings, tmp_path))
    assert decision.submit is None and "no complete checkpoint" in decision.reason


def test_every_saves_keeps_every_nth_save_and_the_final_step(trainings: Path, tmp_path: Path) -> None:
    exp = _exp(trainings, tmp_path, ", every_saves: 2")  # tiny saves every 50 steps
    _saved(exp, 50, 100, 120, 150, 200, FINAL)  # 120: an exit save
    chosen = []
    while (pick := _decide(exp).submit) is not None:
        chosen.append(pick.step)
        _result(exp, pick.step)
    assert chosen == [FINAL, 200, 100]
    shutil.rmtree(Path(exp.paths.checkpoints) / "global_step50")  # retention: the choice stays
    assert [s for s in range(FINAL + 1) if next_eval.chooser(exp)(s)] == [100, 200, FINAL]
    every = _exp(trainings, tmp_path, ", every_saves: 1", name="all")
    assert all(next_eval.chooser(every)(s) for s in (50, 120, 150))
    (trainings / "ranges.yaml").write_text(tiny_yaml(tmp_path / "r", "checkpoint: {save_schedule: [{until: 60, interval: "
                                                     "20}, {until: 221, interval: 70}]}\neval: {every_saves: 2, sources: "
                                                     f"{{held: {json.dumps(str(tmp_path / 'held.jsonl'))}}}}}\n"))
    ranges = load_experiment("ranges", trainings)
    assert [s for s in range(FINAL + 1) if next_eval.chooser(ranges)(s)] == [40, 130, FINAL]


def test_one_eval_job_of_the_run_at_a_time(trainings: Path, tmp_path: Path) -> None:
    exp = _exp(trainings, tmp_path)
    _saved(exp, 50, 100)
    name = next_eval.job_name(exp)
    assert name == "bsops.ev.eval"
    for state in ("PENDING", "RUNNING", "COMPLETING"):
        decision = _decide(exp, queue=[_job("7", name, state)])
        assert decision.submit is None and [j.job_id for j in decision.queued] == ["7"]
    # Other runs' eval jobs, the hourly scheduler itself and the training do not count.
    others = [_job("8", "bsops.other.eval"), _job("9", "bsops.ev.eval-next"), _job("10", "ev")]
    assert _decide(exp, queue=others).submit.step == 100


def test_outcomes_of_jobs_that_left_the_queue(trainings: Path, tmp_path: Path) -> None:
    exp = _exp(trainings, tmp_path)
    _saved(exp, 50, 100, 150)
    _result(exp, 150)
    records = [_rec("submitted", "1", 150), _rec("submitted", "2", 100, "/logs/100-2.out")]
    decision = _decide(exp, records)
    assert [(r.event, r.job_id, r.tag, r.time) for r in decision.outcomes] == [
        ("done", "1", "global_step150", 2.0), ("failed", "2", "global_step100", 2.0)]
    assert decision.submit.step == 100 and "again" in decision.reason  # one failure: tried once more
    # Still queued: no outcome yet, nothing new submitted.
    queued = _decide(exp, records[1:], queue=[_job("2", next_eval.job_name(exp))])
    assert queued.outcomes == () and queued.submit is None
    # Twice failed: skipped, the older one goes next.
    twice = [*records, _rec("failed", "2", 100, "/logs/100-2.out"), _rec("submitted", "3", 100, "/logs/100-3.out")]
    decision = _decide(exp, twice)
    assert [(r.event, r.job_id) for r in decision.outcomes] == [("done", "1"), ("failed", "3")]
    assert decision.skipped == (("global_step100", ("/logs/100-2.out", "/logs/100-3.out")),)
    assert decision.submit.step == 50


def _pass(exp, queue=(), submitted: list | None = None, now: float = 5.0) -> next_eval.NextReport:
    calls = submitted if submitted is not None else []

    def submit(ckpt, folder):
        calls.append(ckpt.tag)
        before = next_eval.read_ledger(_run(exp).ledger).records
        job_id = str(101 + sum(r.event == "submitted" for r in before))  # as Slurm's, a new id each time
        return job_id, folder / "logs" / f"{ckpt.tag}-{job_id}.out"

    def query(**kwargs):
        assert kwargs == {"users": ["me"], "name": next_eval.job_name(exp)}
        return list(queue)

    return next_eval.run_next(_run(exp), submit, query=query, now=lambda: now)


def test_a_pass_records_submissions_and_failures(trainings: Path, tmp_path: Path) -> None:
    exp = _exp(trainings, tmp_path)
    _saved(exp, 50, 100)
    ledger = Path(exp.paths.output) / "eval" / "jobs.jsonl"
    first = _pass(exp)
    assert first.submitted.tag == "global_step100" and first.failures == () and first.failure_text() is None
    assert [json.loads(line)["event"] for line in ledger.read_text().splitlines()] == ["submitted"]
    assert _pass(exp, queue=[_job("101", next_eval.job_name(exp))]).submitted is None
    # The job left the queue without its result: failed (named in the alert with its log), then tried once more.
    again = _pass(exp)
    assert [(r.event, r.job_id) for r in again.failures] == [("failed", "101")]
    text = again.failure_text()
    assert "global_step100" in text and str(Path(exp.paths.output) / "eval" / "logs" / "global_step100-101.out") in text
    assert again.submitted.tag == "global_step100"
    events = [(r.event, r.job_id) for r in next_eval.read_ledger(ledger).records]
    assert events == [("submitted", "101"), ("failed", "101"), ("submitted", "102")]
    # While the retry runs, the alert lasts (its cooldown holds the emails back); once its result lands, it is over
    # (done), and the older checkpoint goes next.
    waiting = _pass(exp, queue=[_job("102", next_eval.job_name(exp))])
    assert waiting.failures == () and "101" in waiting.failure_text() and "102" in waiting.failure_text()
    _result(exp, 100)
    done = _pass(exp)
    assert done.failures == () and done.failure_text() is None and done.submitted.tag == "global_step50"
    assert [r.event for r in next_eval.read_ledger(ledger).records][-2:] == ["done", "submitted"]


def test_a_torn_ledger_line_is_reported_and_passed_over(trainings: Path, tmp_path: Path) -> None:
    exp = _exp(trainings, tmp_path)
    _saved(exp, 50)
    ledger = Path(exp.paths.output) / "eval" / "jobs.jsonl"
    ledger.parent.mkdir(parents=True)
    hostile = {"event": "submitted", "job_id": "1\n2", "tag": "global_step50", "step": 50, "time": 1.0}
    ledger.write_text(json.dumps(hostile) + "\n" + '{"event": "subm')
    report = _pass(exp)
    assert len(report.problems) == 2 and report.submitted.tag == "global_step50"
    assert [r.job_id for r in next_eval.read_ledger(ledger).records] == ["101"]  # the cut line was ended first


def test_a_second_pass_at_once_does_nothing(trainings: Path, tmp_path: Path) -> None:
    import fcntl
    import os

    exp = _exp(trainings, tmp_path)
    _saved(exp, 50)
    folder = Path(exp.paths.output) / "eval"
    folder.mkdir(parents=True)
    fd = os.open(folder / next_eval.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        calls: list = []
        assert _pass(exp, submitted=calls).submitted is None and calls == []
    finally:
        os.close(fd)


def test_an_unreadable_run_id_is_an_error(trainings: Path, tmp_path: Path) -> None:
    """The results are compared with the run's id: a run whose id cannot be read cannot say which are its own."""
    exp = _exp(trainings, tmp_path)
    _saved(exp, 50)
    (Path(exp.paths.output) / "bsops-run-id").write_text("not an id\n")
    with pytest.raises(next_eval.EvalScheduleError, match="bsops-run-id"):
        _pass(exp)


# ----------------------------------------------------------------------------- the eval job's script

def test_the_eval_job_script_reads_back_as_rendered(tmp_path: Path, sbatch_options) -> None:
    trainings = tmp_path / "it's \"my\" trainings #1"
    trainings.mkdir()
    exp = _exp(trainings, tmp_path, ", partition: 'gpu,v100', account: six@gpu, time: '01:30:00'")
    _saved(exp, 50)
    [ckpt] = layout.complete_checkpoints(Path(exp.paths.checkpoints))
    workdir = tmp_path / "work dir; $(x)"
    workdir.mkdir()
    job = jobscript.render(exp, ckpt, Path(exp.paths.output) / "eval", workdir=workdir)
    job.script.parent.mkdir(parents=True)
    job.script.write_text(job.text)
    parsed = sbatch_options(job.script)
    assert dict(parsed) == {"job-name": "bsops.ev.eval", "nodes": "2", "ntasks-per-node": "1", "cpus-per-task": "1",
                            "time": "01:30:00", "partition": "gpu,v100", "account": "six@gpu",
                            "output": slurm.output_path(job.log_folder, "global_step50-%j.out")}
    assert len(parsed) == 8
    assert subprocess.run(["bash", "-n", str(job.script)], timeout=30).returncode == 0
    # The worker's argv as the shell reads it, with the config's layout.
    array = job.text.split("WORKER=(", 1)[1].split("\n)\n", 1)[0]
    words = subprocess.run(["bash", "-c", f"WORKER=({array})\nprintf '%s\\n' \"${{WORKER[@]}}\""], capture_output=True,
                           text=True, timeout=30).stdout.split("\n")[:-1]
    record = Path(exp.paths.output).resolve() / "eval" / "jobs" / "global_step50.experiment.json"
    assert words == ["-m", "bigscience_ops.ops.evaluate.worker", "--experiment", str(record), "--step", "50",
                     "--tensor", "1", "--pipeline", "2", "--cwd", str(workdir.resolve())]
    assert job.experiment == record  # the ranks read the experiment the scheduler decided with, as it reads back
    assert config.to_dict(config.from_dict(json.loads(job.experiment_text), "record")) == config.to_dict(exp)
    assert f"cd {shlex.quote(str(workdir.resolve()))}\n" in job.text


def test_the_eval_job_shape_follows_the_layout(trainings: Path, tmp_path: Path) -> None:
    exp = _exp(trainings, tmp_path)  # TP 1 x PP 2, one process per node
    assert jobscript.shape(exp) == (2, 1)
    held = json.dumps(str(tmp_path / "held.jsonl"))
    (trainings / "gpu.yaml").write_text(tiny_yaml(tmp_path / "g", "slurm: {device: gpu, gpus_per_node: 4}\n",
                                                  f"eval: {{sources: {{held: {held}}}}}\n"))
    gpu = load_experiment("gpu", trainings)
    assert jobscript.shape(gpu) == (1, 2)
    _saved(gpu, 50)
    [ckpt] = layout.complete_checkpoints(Path(gpu.paths.checkpoints))
    text = jobscript.render(gpu, ckpt, tmp_path / "e", workdir=tmp_path).text
    assert "#SBATCH --nodes=1\n" in text and "#SBATCH --gres=gpu:2\n" in text and "DS_ACCELERATOR" not in text
    assert "    --nproc_per_node 2\n" in text
    for nodes in (3, 1):  # 2 processes: not over 3 nodes; not 2 on one node of 1 GPU
        (trainings / "gpu.yaml").write_text(tiny_yaml(tmp_path / "g", "slurm: {device: gpu, gpus_per_node: 1}\n",
                                                      f"eval: {{sources: {{held: {held}}}, nodes: {nodes}}}\n"))
        with pytest.raises(ConfigError) as info:
            jobscript.shape(load_experiment("gpu", trainings))
        assert info.value.field == "eval.nodes" and info.value.value == nodes
