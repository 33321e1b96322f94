"""`bsops rollback`: latest moved back, later checkpoints set aside (never deleted), the skip recorded
and read back by every command, and a real run that continues from the target over the skipped data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.run import ledger
from bigscience_ops.run import rollbacks
from bigscience_ops.checkpoints import layout
from bigscience_ops.run.rollback import rollback
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.run.records import as_recorded
from bigscience_ops.ops.keep import backup
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import commit_checkpoint


def _save(checkpoints: Path, step: int) -> None:
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "layer_00-model_states.pt").write_bytes(os.urandom(1000))
    (folder / layout.META).write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)
    (checkpoints / layout.LATEST).write_text(f"global_step{step}")


@pytest.fixture
def exp(trainings: Path, tmp_path: Path):
    (trainings / "run.yaml").write_text(tiny_yaml(tmp_path / "run", "backup: {dest: " + json.dumps(str(tmp_path / "store"))
                                                  + ", keep_last: 1}\n"))
    exp = load_experiment("run", trainings)
    for step in (50, 100, 120):
        _save(Path(exp.paths.checkpoints), step)
    (Path(exp.paths.checkpoints) / "global_step120_universal").mkdir()
    return exp


def test_rollback_sets_aside_records_and_every_command_reads_the_skip(exp, trainings: Path) -> None:
    checkpoints = Path(exp.paths.checkpoints)
    result = CliRunner().invoke(main, ["rollback", "run", "--step", "50", "--skip", "91-100", "--trainings-dir", str(trainings)])
    assert result.exit_code == 0, result.output
    assert layout.latest_step(checkpoints) == 50 and [c.step for c in layout.list_checkpoints(checkpoints)] == [50]
    [aside] = [p for p in checkpoints.iterdir() if p.name.startswith("rolled-back-")]
    assert sorted(p.name for p in aside.iterdir()) == ["global_step100", "global_step120", "global_step120_universal"]
    assert "set aside (nothing deleted): global_step100, global_step120" in result.output
    assert "relaunch with: bsops launch run" in result.output
    [record] = rollbacks.read(Path(exp.paths.output))
    assert (record.from_step, record.to_step, record.skip, record.set_aside) == (120, 50, "91-100", str(aside))
    again = load_experiment("run", trainings)
    assert again.train.skip_iterations == []  # reading a config never reads a run folder
    assert as_recorded(again).train.skip_iterations == ["91-100"]
    plan = CliRunner().invoke(main, ["plan", "run", "--json", "--trainings-dir", str(trainings)])
    assert plan.exit_code in (0, 1), plan.output
    assert [(s["first"], s["last"]) for s in json.loads(plan.output)["skips"]] == [(91, 100)]
    render = CliRunner().invoke(main, ["render", "run", "--trainings-dir", str(trainings), "--out",
                                       str(Path(exp.paths.output) / "rendered")])
    rendered = json.loads((Path(exp.paths.output) / "rendered" / "experiment.json").read_text())
    assert render.exit_code == 0 and rendered["train"]["skip_iterations"] == ["91-100"]
    # The backup's retention never sees the set-aside checkpoints.
    report = backup.run_backup(backup.settings(again))
    assert report.backed_up == ["global_step50"] and report.deleted == []
    assert sorted(p.name for p in aside.iterdir()) == ["global_step100", "global_step120", "global_step120_universal"]


@pytest.mark.parametrize("args, message", [
    (["--step", "60"], "not a complete checkpoint"),
    (["--step", "50", "--skip", "40-60"], "must come after --step 50"),
    (["--step", "50", "--skip", "60-x"], "expected START-END"),
    (["--step", "50", "--skip", "60-999999"], "end by the last step"),
])
def test_bad_requests_are_refused_and_nothing_moves(exp, trainings: Path, args: list[str], message: str) -> None:
    before = sorted(p.name for p in Path(exp.paths.checkpoints).iterdir())
    result = CliRunner().invoke(main, ["rollback", "run", *args, "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in Path(exp.paths.checkpoints).iterdir()) == before
    assert rollbacks.read(Path(exp.paths.output)) == []


def test_a_training_task_still_running_is_not_rolled_back_under(exp, trainings: Path) -> None:
    ledger.append(Path(exp.paths.output) / ledger.LEDGER_NAME, ledger.TaskRecord("begin", "9_1", "n1", 120, 1.0))
    refused = CliRunner().invoke(main, ["rollback", "run", "--step", "50", "--trainings-dir", str(trainings)])
    assert refused.exit_code == 2 and "9_1 began at iteration 120 and has not ended" in refused.output
    assert layout.latest_step(Path(exp.paths.checkpoints)) == 120
    forced = CliRunner().invoke(main, ["rollback", "run", "--step", "100", "--force", "--trainings-dir", str(trainings)])
    assert forced.exit_code == 0 and "set aside (nothing deleted): global_step120" in forced.output


@pytest.mark.slow
def test_a_spike_rolled_back_with_its_data_skipped_trains_on_from_the_target(spiked_run, tmp_path: Path) -> None:
    """Spike, rollback with --skip, relaunch: the run continues from the target, the skipped iterations consume
    their data without an update, the next one trains on the data after them, which `bsops samples` names
    bit for bit (the relaunch records it), and the relaunch (a resume, saves, an evaluation) raises no alert."""
    import shutil

    import numpy as np

    from bigscience_ops.ops import health
    from bigscience_ops.schedule.run import run_schedule
    from bigscience_ops.trainer.faults import token_record_path
    from bigscience_ops.views import samples
    from tests.fixtures_trainer import (
        SPIKE_AT, append_main_log, checkpoint_steps, run_ok, scalars, spiked_experiment, write_run,
    )

    spiked_exp, spiked_out, spiked = spiked_run
    out = tmp_path / "run"
    shutil.copytree(spiked_out, out)  # the shared run stays as it was
    first = spiked_experiment(out, spiked_exp.data.blend[0].prefix)
    schedule = run_schedule(first)
    assert [f.iteration for f in health.check(health.entries(spiked.stdout.split("\n")), every=True)
            if f.kind == "loss-spike"] == [SPIKE_AT]
    before = scalars(out / "tensorboard", "lm loss")
    done = rollback(first, 40, f"44-{SPIKE_AT}")
    assert done.moved == [f"global_step{s}" for s in schedule.save_steps if s > 40]
    assert checkpoint_steps(out) == [10, 20, 30, 40]
    relaunched = as_recorded(first)  # what the next launch (and plan, samples) make of the run
    assert relaunched.train.skip_iterations == [f"44-{SPIKE_AT}"]
    write_run(relaunched, out)
    again = run_ok(out, 2, env={"BSOPS_RECORD_TOKENS_AT": str(SPIKE_AT + 1)}, synthetic=False)
    log = append_main_log(relaunched, again)
    assert "global_step40" in again.stdout and f"> skipping iterations 44 to {SPIKE_AT}" in again.stdout
    after = scalars(out / "tensorboard", "lm loss")
    assert [after[i] for i in (41, 42, 43)] == [before[i] for i in (41, 42, 43)]  # same data, same state: bitwise
    trained = {int(line.split("/")[0].split()[-1]) for line in again.stdout.split("\n")
               if line.strip().startswith("iteration") and "lm loss" in line}
    assert 44 not in trained and SPIKE_AT not in trained and schedule.train_iters in trained
    assert layout.latest_step(out / "checkpoints") == schedule.train_iters

    # `bsops samples` agrees: 44 and SPIKE_AT consumed their samples unused, the next iteration trains on the ones
    # after them (what the spiked run trained at that iteration too), and those are the recorded token ids.
    shown = {i: samples.iteration_samples(relaunched, i, text=False) for i in (43, 44, SPIKE_AT, SPIKE_AT + 1)}
    assert [shown[i].skipped for i in shown] == [False, True, True, False]
    for i, result in shown.items():
        first_position = schedule.batch.consumed_after(i - 1)
        assert [s.position for b in result.micro_batches for s in b.samples] == list(
            range(first_position, first_position + result.global_batch_size)), i
    for batch in shown[SPIKE_AT + 1].micro_batches:
        ids = np.array([s.tokens for s in batch.samples])
        for folder in (out / "debug", spiked_out / "debug"):  # the relaunch's record, and the spiked run's
            fed = np.load(token_record_path(folder, SPIKE_AT + 1, batch.dp_rank, batch.micro_batch))
            assert np.array_equal(fed["tokens"], ids[:, :-1]) and np.array_equal(fed["labels"], ids[:, 1:]), folder

    # The relaunch is a clean run with a resume, saves and an evaluation: the watchdog finds nothing in its lines.
    lines = log.read_text().split("\n")
    relaunch_lines = len(health.entries(again.stdout.split("\n")))
    assert relaunch_lines >= 20 and "validation loss at iteration 50" in again.stdout
    found = health.check(health.entries(lines), relaunched.alerts.health, recent=relaunch_lines, every=True)
    assert [f for f in found if f.kind != "slow"] == []  # throughput: other processes share this machine's 2 cores


# --- links: refused alike, never read ---------------------------------------------------------------------

def test_a_latest_that_is_a_link_is_refused_without_quoting_what_it_points_to(exp, trainings: Path,
                                                                              tmp_path: Path) -> None:
    checkpoints = Path(exp.paths.checkpoints)
    (tmp_path / "outside.txt").write_text("global_step50\nTOPSECRET the start of someone's file\n")
    (checkpoints / layout.LATEST).unlink()
    (checkpoints / layout.LATEST).symlink_to(tmp_path / "outside.txt")
    before = sorted(p.name for p in checkpoints.iterdir())
    for command in (["rollback", "run", "--step", "50"], ["backup", "run"], ["info", "run"]):  # backup names the run
        result = CliRunner().invoke(main, [*command, "--trainings-dir", str(trainings)])
        assert "TOPSECRET" not in result.output and "Traceback" not in result.output, result.output
        assert f"{checkpoints / layout.LATEST}" in result.output and "symbolic link" in result.output, result.output
        assert result.exit_code == (0 if command[0] == "info" else 2)
    assert sorted(p.name for p in checkpoints.iterdir() if p.name != layout.RUN_ID) == before
    assert (checkpoints / layout.LATEST).is_symlink() and rollbacks.read(Path(exp.paths.output)) == []


def test_a_target_that_is_a_link_is_refused(exp, trainings: Path, tmp_path: Path) -> None:
    checkpoints = Path(exp.paths.checkpoints)
    os.rename(checkpoints / "global_step50", tmp_path / "elsewhere")
    (checkpoints / "global_step50").symlink_to(tmp_path / "elsewhere")
    result = CliRunner().invoke(main, ["rollback", "run", "--step", "50", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and "--step 50: refused" in result.output and "symbolic link" in result.output
    assert layout.latest_step(checkpoints) == 120 and rollbacks.read(Path(exp.paths.output)) == []


def test_a_torn_ledger_line_stops_a_rollback_naming_the_line(exp, trainings: Path) -> None:
    with open(Path(exp.paths.output) / ledger.LEDGER_NAME, "ab") as handle:
        handle.write(b'{"event": "begin", "job_id": "9_1", "nodes": "n1", "iter')
    result = CliRunner().invoke(main, ["rollback", "run", "--step", "50", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2 and f"{Path(exp.paths.output) / ledger.LEDGER_NAME}:1: cut short" in result.output
    assert layout.latest_step(Path(exp.paths.checkpoints)) == 120
