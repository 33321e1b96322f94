"""`bsops runs`: the runs this user launched, from the runs index every launch appends to (runs_index.py), each with
its state read from its own folder (views/runs.py). The runs' records are written here as launches write them; the
real launches that append to the index are checked in tests/launch/test_launch.py (--local --out) and
tests/cluster/test_cluster_launch.py (Slurm), and execute's one append in tests/launch/test_launch_plan.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from bigscience_ops.run import ledger
from bigscience_ops.run import lock as run_lock
from bigscience_ops.run import index as runs_index
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment, to_dict
from bigscience_ops.run.ledger import TaskRecord
from bigscience_ops.run.opening import open_run
from tests.fixtures_experiments import SHRUNK_MODEL, tiny_yaml
from tests.fixtures_runs import commit_checkpoint

SMALL = (SHRUNK_MODEL, "batch: {global_batch_size: 8, micro_batch_size: 2, rampup: {start: 4, increment: 2, samples: 40}}\n"
         "train: {samples: 200}\n", "lr_schedule: {warmup_samples: 40}\n")
TOTAL = 28  # SMALL's iterations


def _run(trainings: Path, name: str, folder: Path, record_in: str = "", job: str = "local", job_id: str = "1") -> Path:
    """A run of experiment `name` at `folder` as a launch leaves it: its record (in <folder>/`record_in`) and its
    line in the runs index."""
    (trainings / f"{name}.yaml").write_text(tiny_yaml(folder, *SMALL))
    record = folder / record_in / "experiment.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps(to_dict(load_experiment(name, trainings))))
    if record_in:  # a Slurm launch folder: sbatch's answer beside the record (submit.SlurmExecutor.start)
        (record.parent / "sbatch.json").write_text(json.dumps({"argv": ["sbatch", "x"], "job_id": job_id}))
    assert runs_index.record_launch(name, folder, job, job_id) is None
    return folder


def _saved(folder: Path, step: int) -> None:
    checkpoints = folder / "checkpoints"
    (checkpoints / f"global_step{step}").mkdir(parents=True)
    (checkpoints / f"global_step{step}" / "bsops.json").write_text("{}")
    commit_checkpoint(checkpoints / f"global_step{step}")
    (checkpoints / "latest").write_text(f"global_step{step}")


def _task(folder: Path, job_id: str, start: int, end: int | None, code: int | None) -> None:
    path = folder / ledger.LEDGER_NAME
    ledger.append(path, TaskRecord("begin", job_id, "n1", start, time.time() - 60))
    if end is not None:
        ledger.append(path, TaskRecord("end", job_id, "n1", end, time.time(), code))


def test_runs_lists_each_launched_run_with_its_state_from_any_folder(trainings, tmp_path):
    finished = _run(trainings, "tiny2", tmp_path / "cwd-of-launch" / "runs" / "tiny2")  # a default run folder
    _saved(finished, TOTAL)
    _task(finished, "local-1", 0, TOTAL, 0)
    failed = _run(trainings, "outrun", tmp_path / "out dir")  # launch --local --out
    _saved(failed, 10)
    _task(failed, "local-2", 0, 10, 1)
    (failed / "logs").mkdir()
    (failed / "logs" / ".bsops-alerts.json").write_text(json.dumps({"version": 2, "active": {
        "outrun::ended": {"since": "2026-01-02T03:04:05", "message": "task local-2 ended with exit code 1\nmore",
                          "sent": {}}}}))
    slurm = _run(trainings, "onslurm", tmp_path / "slurm-run", "launches/20260101-000000", "slurm", "4242")
    ledger.mark_launch(slurm, "4242")  # submitted; no array task has begun
    stopped = _run(trainings, "stopped", tmp_path / "stopped")
    _saved(stopped, 15)
    _task(stopped, "local-3", 0, 15, 0)
    _run(trainings, "never", tmp_path / "never")
    gone = _run(trainings, "gone", tmp_path / "gone")
    (gone / "experiment.json").unlink()
    gone.rmdir()
    training = _run(trainings, "busy", tmp_path / "busy")
    _task(training, "local-4", 0, None, None)
    index = runs_index.index_path()
    with open(index, "a") as f:  # a torn line and a hostile one: reported and skipped
        f.write('{"time": 1, "experiment": "x", "folder": "/x", "job": "local"}\x1b[2J\n{"time": 1, "experiment": "a\\nb"')

    with run_lock.hold(training, "bsops launch --local"):
        result = CliRunner().invoke(main, ["runs", "--json"])
        text = CliRunner().invoke(main, ["runs"])
    assert result.exit_code == 0 and text.exit_code == 0, result.output + text.output
    data = json.loads(result.stdout)
    states = {row["experiment"]: (row["state"], row["iteration"], row["total"]) for row in data["runs"]}
    assert states == {"tiny2": ("finished", TOTAL, TOTAL), "outrun": ("failed", 10, TOTAL),
                      "onslurm": ("waiting", 0, TOTAL), "stopped": ("stopped", 15, TOTAL),
                      "never": ("never trained", 0, TOTAL), "gone": ("missing", None, None),
                      "busy": ("training", 0, TOTAL)}
    rows = {row["experiment"]: row for row in data["runs"]}
    assert rows["onslurm"]["job"] == "slurm" and rows["onslurm"]["job_id"] == "4242"
    assert rows["outrun"]["last_alert"] == "outrun::ended since 2026-01-02T03:04:05: task local-2 ended with exit code 1"
    assert [row["experiment"] for row in data["runs"]][0] == "busy"  # the newest launch first
    assert len(data["problems"]) == 2 and all(str(index) in p for p in data["problems"])
    assert "\x1b" not in text.output and "skipped (not a launch)" in text.output
    for folder in (finished, failed, slurm):  # each is named by its folder from here, a folder of no run
        info = CliRunner().invoke(main, ["info", str(folder)])
        assert info.exit_code == 0 and f"run folder: {folder} (named on the command line" in info.output, info.output


def test_a_launch_of_a_run_listed_twice_is_one_row_with_its_newest_launch(trainings, tmp_path):
    run = _run(trainings, "again", tmp_path / "run", job_id="1")
    _task(run, "1_1", 0, 5, 0)
    runs_index.record_launch("again", run, "local", "2", now=time.time() + 5)
    _task(run, "2_1", 5, None, None)  # the second local launch's first task (its id: the made-up array id, 2)
    result = CliRunner().invoke(main, ["runs", "--json"])
    [row] = json.loads(result.stdout)["runs"]
    assert (row["launches"], row["job"], row["job_id"], row["index_says"]) == (2, "local", "2", [])
    text = CliRunner().invoke(main, ["runs"]).output
    assert "launched 2 times" in text


def test_no_index_yet_says_how_one_comes(tmp_path):
    result = CliRunner().invoke(main, ["runs"])
    assert result.exit_code == 0 and "no runs launched yet" in result.output


def test_the_index_is_in_the_users_data_folder_unless_named(tmp_path):
    assert runs_index.index_path({"BSOPS_RUNS_INDEX": "/i/runs.jsonl", "XDG_DATA_HOME": "/x"}) == Path("/i/runs.jsonl")
    assert runs_index.index_path({"XDG_DATA_HOME": "/x", "HOME": "/h"}) == Path("/x/bsops/runs.jsonl")
    assert runs_index.index_path({"HOME": "/h"}) == Path("/h/.local/share/bsops/runs.jsonl")
    assert runs_index.index_path() != runs_index.index_path({})  # each test has its own: never the user's
    link = tmp_path / "index"
    link.symlink_to(tmp_path / "elsewhere")
    assert "cannot be written" in runs_index.record_launch("x", tmp_path, "local", "1", path=link)
    assert not (tmp_path / "elsewhere").exists()
    [problem] = runs_index.read_index(link).problems  # nor read through one: reported, not followed
    assert "link" in problem.what


def test_a_bundled_experiments_run_elsewhere_is_pointed_to(trainings, tmp_path):
    run = _run(trainings, "tiny", tmp_path / "launched-from-there" / "runs" / "tiny")
    result = CliRunner().invoke(main, ["info", "tiny"])  # the bundled tiny: its run would be under this folder
    assert result.exit_code == 0
    assert f"your runs index (bsops runs) has 1, the newest in {run}" in result.output


def test_rollback_names_a_run_by_its_folder_and_says_how_to_relaunch_that_folder(trainings, tmp_path):
    run = _run(trainings, "small", tmp_path / "out run")  # a launch --local --out run: no experiment puts it there
    for step in (10, 20):
        _saved(run, step)
    result = CliRunner().invoke(main, ["rollback", "--run", str(run), "--step", "10", "--skip", "11-12"])
    assert result.exit_code == 0, result.output
    assert (run / "checkpoints" / "latest").read_text().strip() == "global_step10"
    assert f"relaunch with: bsops launch small --local --out '{run}'" in result.output
    assert open_run(str(run)).experiment.train.skip_iterations == ["11-12"]  # what every view and the relaunch read


def test_a_run_named_by_its_folder_takes_overrides_after_it_and_an_old_option_name_says_its_new_one(trainings,
                                                                                                    tmp_path):
    run = _run(trainings, "small", tmp_path / "out run")
    for step in (10, 20):
        _saved(run, step)
    store = tmp_path / "store"
    # --run DIR KEY=VALUE: the assignment is an override, not the name of the experiment the run must have recorded
    planned = CliRunner().invoke(main, ["backup", "--run", str(run), "--dry-run", f"backup.dest={store}",
                                        "--trainings-dir", str(trainings)])
    assert planned.exit_code == 0, planned.output
    assert "would copy global_step10" in planned.output and "would copy global_step20" in planned.output
    assert not store.exists()  # a dry run writes nothing
    unknown = CliRunner().invoke(main, ["backup", "--run", str(run), "--dry-run", "backup.dset=x",
                                        "--trainings-dir", str(trainings)])
    assert unknown.exit_code == 2 and "backup.dset" in unknown.output and "unknown key" in unknown.output
    # rollback --to (last release's name) is read as --step, and says so once on stderr
    result = CliRunner().invoke(main, ["rollback", "--run", str(run), "--to=10"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("note: bsops rollback --to is now --step") == 1
    assert (run / "checkpoints" / "latest").read_text().strip() == "global_step10"
