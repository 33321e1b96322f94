"""A run is its record: commands that read a run read the experiment it recorded, name it by its folder, and say
in one line where the YAML has moved on since (run_ref.py). Records are written here as a launch writes them
(experiment.json of the resolved experiment): no trainer runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import rollbacks
from bigscience_ops.run import opening as run_ref
from bigscience_ops.cli import main
from bigscience_ops.config.loading import Overrides, apply_overrides, load_experiment, to_dict
from bigscience_ops.launch.launch_plan import LaunchOptions, build_launch_plan
from bigscience_ops.run.opening import RunRecordError, open_run
from bigscience_ops.views import samples
from tests.fixtures_experiments import SHRUNK_MODEL, tiny_yaml

SMALL = (SHRUNK_MODEL, "batch: {global_batch_size: 8, micro_batch_size: 2, rampup: {start: 4, increment: 2, samples: 40}}\n"
         "train: {samples: 200, seed: 1234}\n", "lr_schedule: {warmup_samples: 40}\n")


def _launched(trainings: Path, run: Path, *extra: str, corpus: str | None = None) -> dict:
    """small.yaml at `run`, and its record as a local launch writes it (<run>/experiment.json): the record's data."""
    data = (f"data: {{blend: [{{prefix: {json.dumps(corpus)}}}]}}\n",) if corpus else ()
    (trainings / "small.yaml").write_text(tiny_yaml(run, *SMALL, *data, *extra))
    record = to_dict(load_experiment("small", trainings))
    run.mkdir(parents=True, exist_ok=True)
    (run / "experiment.json").write_text(json.dumps(record, indent=2))
    return record


def _reseed(trainings: Path, seed: int = 42) -> None:
    """The YAML moved on after the launch: another seed (the data order and the initial weights change)."""
    path = trainings / "small.yaml"
    path.write_text(re.sub(r"seed: \d+", f"seed: {seed}", path.read_text()))


def _notes(output: str) -> list[str]:
    return [line for line in output.splitlines() if "differs from the run's record" in line]


def test_a_run_is_read_as_recorded_and_the_yaml_that_moved_on_is_said_once(trainings, tmp_path):
    run = tmp_path / "run"
    _launched(trainings, run)
    _reseed(trainings)
    opened = open_run("small", trainings)
    assert opened.experiment.train.seed == 1234 and opened.folder == run and opened.record == run / "experiment.json"
    assert [(d.field, d.recorded, d.now) for d in opened.differences] == [("train.seed", 1234, 42)]
    result = CliRunner().invoke(main, ["info", "small", "--trainings-dir", str(trainings)])
    assert result.exit_code == 0, result.output
    [note] = _notes(result.output)
    assert "train.seed (1234 -> 42)" in note and str(trainings / "small.yaml") in note
    assert f"run folder: {run}" in result.output
    # The same YAML as the record: nothing to say.
    _reseed(trainings, 1234)
    again = CliRunner().invoke(main, ["info", "small", "--trainings-dir", str(trainings)])
    assert again.exit_code == 0 and not _notes(again.output)


def test_samples_shows_what_the_recorded_seed_fed_and_says_the_yaml_differs(trainings, tmp_path, bundled_corpus):
    from bigscience_ops.trainer.sampling import TaskLayout

    run = tmp_path / "run"
    _launched(trainings, run, corpus=bundled_corpus)
    recorded = load_experiment("small", trainings)
    (run / "logs").mkdir()
    (run / "logs" / "main_log.txt").write_text(TaskLayout("small", 1000, 1, 1, 1, 2, False, 28, 0).line() + "\n")
    _reseed(trainings)
    argv = ["samples", "small", "--iteration", "3", "--json", "--no-text", "--trainings-dir", str(trainings)]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    shown = [s["tokens"] for b in json.loads(result.stdout)["micro_batches"] for s in b["samples"]]
    trained = [list(s.tokens) for b in samples.iteration_samples(recorded, 3, text=False).micro_batches
               for s in b.samples]
    today = [list(s.tokens) for b in samples.iteration_samples(load_experiment("small", trainings), 3,
                                                               text=False).micro_batches for s in b.samples]
    assert shown == trained and shown != today  # the seed orders the data: the YAML's would be other text
    [note] = _notes(result.stderr)
    assert "train.seed (1234 -> 42)" in note


def test_a_run_folder_names_the_run_where_exp_goes_and_with_run(trainings, tmp_path):
    run = tmp_path / "elsewhere" / "my run"
    record = _launched(trainings, run)
    (trainings / "small.yaml").unlink()  # no YAML needed: the folder is the run
    for argv in (["info", str(run)], ["info", "--run", str(run)], ["logs", str(run)], ["status", "--run", str(run),
                                                                                         "--no-email", "--timeout", "1"]):
        result = CliRunner().invoke(main, argv)
        assert f"run folder: {run} (named on the command line" in result.output, (argv, result.output)
        assert "Traceback" not in result.output and "no such experiment" not in result.output, result.output
    info = CliRunner().invoke(main, ["info", str(run), "--json"])
    assert info.exit_code == 0 and json.loads(info.stdout)["run_folder"] == str(run)
    assert open_run(folder=run).experiment.name == record["name"] == "small"


def test_the_newest_record_wins_and_a_moved_folder_reads_its_paths_under_it(trainings, tmp_path):
    run = tmp_path / "run"
    record = _launched(trainings, run)
    later = run / "launches" / "20990101-000000"
    later.mkdir(parents=True)
    newer = {**record, "train": {**record["train"], "seed": 99}}
    (later / "experiment.json").write_text(json.dumps(newer))
    past = time.time() - 3600
    os.utime(run / "experiment.json", (past, past))
    assert run_ref.newest_record(run) == later / "experiment.json"
    assert open_run(folder=run).experiment.train.seed == 99
    moved = tmp_path / "copied"
    shutil.copytree(run, moved)
    opened = open_run(str(moved))
    assert opened.folder == moved and opened.moved_from == str(run)
    assert opened.experiment.paths.checkpoints == str(moved.resolve() / "checkpoints")


def test_a_rollbacks_skips_are_the_runs_and_no_difference_of_the_yaml(trainings, tmp_path):
    run = tmp_path / "run"
    _launched(trainings, run)
    rollbacks.append(run, rollbacks.Rollback(0.0, 20, 10, "11-12", ""))
    opened = open_run("small", trainings)
    assert opened.experiment.train.skip_iterations == ["11-12"] and opened.differences == ()
    path = trainings / "small.yaml"
    path.write_text(path.read_text().replace("seed: 1234}", "seed: 1234, skip_iterations: ['3-4']}"))
    assert open_run("small", trainings).differences == ()


def test_never_launched_is_todays_yaml_and_another_experiments_record_is_refused(trainings, tmp_path):
    run = tmp_path / "run"
    (trainings / "small.yaml").write_text(tiny_yaml(run, *SMALL))
    opened = open_run("small", trainings)
    assert opened.record is None and opened.experiment == load_experiment("small", trainings)
    with pytest.raises(RunRecordError, match="no experiment.json"):
        open_run(folder=tmp_path)
    _launched(trainings, run)
    with pytest.raises(RunRecordError, match="records experiment 'small', not 'tiny'"):
        open_run("tiny", trainings, folder=run)


@pytest.mark.parametrize("hostile, what", [
    (lambda p: p.write_text('{"name": "small", "model": {'), "not JSON"),
    (lambda p: p.write_text("[1, 2]"), "a JSON list"),
    (lambda p: p.write_text(json.dumps({"name": "small", "train": 5})), "train"),
    (lambda p: p.write_text(json.dumps({"name": "../x"})), "name"),
    (lambda p: p.write_bytes(b"{" * 300_000), "not JSON"),
    (lambda p: p.write_bytes(b" " * (run_ref.RECORD_LIMIT + 1)), "more than"),
    (lambda p: (p.unlink(), p.symlink_to("/etc/passwd")), "link"),
    (lambda p: (p.unlink(), p.mkdir()), "folder"),
    (lambda p: (p.unlink(), os.mkfifo(p)), "special file"),
])
def test_a_record_that_is_not_one_is_one_error_line_naming_the_file(trainings, tmp_path, hostile, what):
    run = tmp_path / "run"
    _launched(trainings, run)
    (run / "checkpoints").mkdir(exist_ok=True)
    record = run / "experiment.json"
    hostile(record)
    with pytest.raises(RunRecordError, match=what) as caught:
        open_run(folder=run)
    assert str(record) in str(caught.value) and "expected" in str(caught.value)
    result = CliRunner().invoke(main, ["info", "small", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: ") and str(record) in line
    # The watchdog and the hourly jobs do not go blind: the run is read as its file says, the record alerted on.
    watched = CliRunner().invoke(main, ["status", "small", "--trainings-dir", str(trainings), "--timeout", "1",
                                        "--no-email"], env={"SLURM_CONF": str(tmp_path / "no-slurm.conf")})
    assert "Traceback" not in watched.output and "error: " not in watched.output, watched.output
    assert f"cannot read its run file {record}" in watched.stdout, watched.output
    kept = CliRunner().invoke(main, ["backup", "small", "--dry-run", "--to", str(tmp_path / "store"),
                                     "--trainings-dir", str(trainings)])
    assert kept.exit_code == 0 and f"note: {record}" in kept.stderr, kept.output


def test_launch_local_out_reads_the_out_folders_skips_not_the_default_folders(trainings, tmp_path):
    default, out = tmp_path / "run", tmp_path / "out"
    (trainings / "small.yaml").write_text(tiny_yaml(default, *SMALL))
    exp = load_experiment("small", trainings)
    rollbacks.append(default, rollbacks.Rollback(0.0, 20, 10, "11-12", ""))
    rollbacks.append(out, rollbacks.Rollback(0.0, 20, 10, "14-15", ""))
    plan = build_launch_plan(apply_overrides(exp, Overrides(out=out)), LaunchOptions(job="local", allow_incomplete=True))
    assert plan.experiment.train.skip_iterations == ["14-15"] and plan.record_dir == out.resolve()
    assert plan.experiment.paths.checkpoints == str(out.resolve() / "checkpoints")


def test_plot_draws_the_recorded_run_against_its_recorded_sequence_length(trainings, tmp_path):
    from bigscience_ops.trainer.report import Board
    from bigscience_ops.views import plot

    run = tmp_path / "run"
    _launched(trainings, run)
    board = Board(str(run / "tensorboard"))
    for iteration, samples_seen in enumerate((8, 16, 24), 1):
        board.scalar("lm loss", 9.0 - iteration, iteration, samples_seen)
    board.close()
    path = trainings / "small.yaml"
    path.write_text(path.read_text().replace("seq_length: 64", "seq_length: 32"))  # the YAML moved on
    argv = ["plot", "small", "--trainings-dir", str(trainings), "--out", str(tmp_path / "p.png")]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    [note] = _notes(result.output)
    assert "model.seq_length (64 -> 32)" in note
    shown = open_run("small", trainings).experiment  # what the command drew: plot.plot reads it so
    series, _ = plot.read_series(Path(shown.paths.tensorboard), shown.model.seq_length)
    assert series["training loss"].tokens == [8 * 64, 16 * 64, 24 * 64]  # the record's tokens per sample


def test_a_bare_name_is_a_run_folder_only_where_a_folder_of_that_name_holds_a_record(trainings, tmp_path, monkeypatch):
    run = tmp_path / "run"
    _launched(trainings, run)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "small").mkdir()  # a folder that only shares the experiment's name
    assert not run_ref.is_run_folder_name("small") and open_run("small", trainings).yaml is not None
    assert run_ref.is_run_folder_name("run") and open_run("run").by_folder
    assert run_ref.is_run_folder_name(str(tmp_path / "small"))  # a path: a folder named, record or not


def test_a_relaunch_with_another_seed_than_the_runs_last_launch_warns_in_one_line(trainings, tmp_path, bundled_corpus):
    run = tmp_path / "run"
    _launched(trainings, run, corpus=bundled_corpus)
    argv = ["launch", "small", "--dry-run", "--allow-incomplete", "--trainings-dir", str(trainings)]
    same = CliRunner().invoke(main, argv)
    assert same.exit_code == 0, same.output
    assert "differs from the run's last launch" not in same.output
    _reseed(trainings)
    moved = CliRunner().invoke(main, argv)
    assert moved.exit_code == 0, moved.output
    [warning] = [line for line in moved.stderr.splitlines() if "differs from the run's last launch" in line]
    assert warning.startswith("warning: ") and "train.seed (1234 -> 42)" in warning
    assert str(run / "experiment.json") in warning
    (run / "experiment.json").write_text('{"name": "small", "model": ')  # torn: said, and the launch goes on
    torn = CliRunner().invoke(main, argv)
    assert torn.exit_code == 0 and "not JSON" in torn.stderr and "not compared with this launch" in torn.stderr


def test_who_is_told_and_where_a_token_goes_come_from_the_experiment_file_never_from_the_record(trainings, tmp_path):
    run = tmp_path / "run"
    record = _launched(trainings, run)
    record["alerts"].update(smtp_host="mail.attacker.example", smtp_user="me", email_to=["attacker@example.com"],
                            smtp_password_env="BSOPS_SMTP_PASSWORD")
    record["hub"].update(host="hub.attacker.example")
    record["backup"].update(dest=str(tmp_path / "attacker-store"))
    record["eval"] = {"tasks": ["mmlu"], "sources": {"x": "/etc/shadow"}, "partition": "gpu-big"}
    (run / "experiment.json").write_text(json.dumps(record))
    opened = open_run(None, trainings, run)
    assert opened.recorded.alerts.smtp_host == "mail.attacker.example"  # the record as it is ...
    told = opened.configured()  # ... but told as the experiment file says
    today = load_experiment("small", trainings)
    assert told.alerts == today.alerts and told.hub == today.hub and told.backup == today.backup
    assert told.eval == today.eval and opened.recorded.eval.tasks == ["mmlu"]
    assert told.paths == opened.recorded.paths and told.train == opened.recorded.train
    (trainings / "small.yaml").unlink()  # no experiment file to take them from: nothing is sent
    blind = open_run(None, trainings, run)
    with pytest.raises(RunRecordError, match="never from a run's record"):
        blind.configured()
    assert blind.experiment.alerts.email_to == [] and blind.experiment.hub.host != "hub.attacker.example"
    assert blind.experiment.backup.dest is None and blind.experiment.eval.tasks == []
    result = CliRunner().invoke(main, ["status", "--run", str(run), "--trainings-dir", str(trainings),
                                       "--timeout", "5"])
    assert "alerts: not sent: " in result.stderr and "attacker" not in result.output


def test_hub_sync_and_backup_take_a_run_folder_and_its_experiment_files_destinations(trainings, tmp_path):
    run = tmp_path / "run"
    record = _launched(trainings, run)
    (run / "checkpoints").mkdir()
    shown = CliRunner().invoke(main, ["backup", str(run), "--dry-run", "--to", str(tmp_path / "store"),
                                      "--trainings-dir", str(trainings)])
    assert shown.exit_code == 0, shown.output
    assert f"run folder: {run} (named on the command line" in shown.output and "no new checkpoint" in shown.output
    record["hub"].update(host="hub.attacker.example", logs_repo="bs/logs")
    (run / "experiment.json").write_text(json.dumps(record))
    (trainings / "small.yaml").unlink()  # nothing to take the Hub host and token from: nothing is pushed
    for argv in (["hub-sync", "--run", str(run)], ["backup", str(run), "--dry-run"]):
        refused = CliRunner().invoke(main, [*argv, "--trainings-dir", str(trainings)])
        assert refused.exit_code == 2 and "never from a run's record" in refused.stderr, refused.output
        assert "attacker" not in refused.output
    assert not (run / "hub").exists()
