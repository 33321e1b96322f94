"""lr_schedule.override_on_resume both ways on real trainer ranks (issue 51: inverting the rule passed every test).

The golden run's checkpoint at step 16 is resumed for two steps with twice the learning rate in the config: without
override_on_resume the checkpoint's schedule goes on (the LRs logged are the golden run's own), with it the config's
(the LRs of the new schedule at the same consumed samples). Both launches run side by side.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import layout
from bigscience_ops.schedule.run import run_schedule
from tests.fixtures_trainer import GOLDEN_SAVE_SCHEDULE, concurrently, run_ok, scalars, small_experiment, write_run

pytestmark = pytest.mark.slow  # two real trainer launches

RESUMED_AT, STOP_AT = 16, 18


def _resume_with_doubled_lr(golden_exp, golden_out: Path, out: Path, override: bool):
    """The golden checkpoints up to RESUMED_AT, resumed to STOP_AT with optimizer.lr doubled."""
    shutil.copytree(golden_out / "checkpoints", out / "checkpoints",
                    ignore=lambda folder, names: [n for n in names if (layout.step_of(n) or 0) > RESUMED_AT])
    layout.write_latest(out / "checkpoints", f"global_step{RESUMED_AT}")
    exp = small_experiment(out, optimizer=dict(lr=2 * golden_exp.optimizer.lr),
                           lr_schedule=dict(warmup_samples=40, override_on_resume=override),
                           checkpoint=dict(save_schedule=GOLDEN_SAVE_SCHEDULE, save_interval=10, exit_interval=STOP_AT))
    write_run(exp, out)
    run_ok(out, 2)
    return out, scalars(out / "tensorboard", "learning-rate")


@pytest.fixture(scope="module")
def resumed(golden_run, tmp_path_factory) -> dict:
    gexp, gout, _ = golden_run
    jobs = {override: (lambda override=override: _resume_with_doubled_lr(
        gexp, gout, tmp_path_factory.mktemp(f"override-{override}"), override)) for override in (False, True)}
    return concurrently(jobs)


def test_the_checkpoints_lr_schedule_goes_on_unless_the_config_overrides_it(golden_run, resumed) -> None:
    gexp, gout, _ = golden_run
    golden = scalars(gout / "tensorboard", "learning-rate")
    steps = range(RESUMED_AT + 1, STOP_AT + 1)
    kept_out, kept = resumed[False]
    new_out, new = resumed[True]
    new_exp = small_experiment(new_out, optimizer=dict(lr=2 * gexp.optimizer.lr))
    assert sorted(kept) == sorted(new) == list(steps)  # the resumed launches logged only their own steps
    schedule = run_schedule(new_exp)
    for step in steps:
        config = schedule.lr.lr_at(schedule.batch.consumed_after(step))
        assert not math.isclose(config, golden[step], rel_tol=1e-3)  # the two schedules differ here
        assert math.isclose(kept[step], golden[step], rel_tol=1e-6), (step, kept[step], golden[step])
        assert math.isclose(new[step], config, rel_tol=1e-6), (step, new[step], config)
    # Each launch's checkpoint at STOP_AT records the schedule it trained with: the checkpoint's, or the config's.
    def saved(out: Path, step: int) -> dict:
        return layout.Checkpoint(f"global_step{step}", step, out / "checkpoints" / f"global_step{step}").meta()[
            "lr_schedule"]

    assert saved(kept_out, STOP_AT) == saved(gout, RESUMED_AT) != saved(new_out, STOP_AT)
    assert saved(new_out, STOP_AT)["max_lr"] == 2 * saved(gout, RESUMED_AT)["max_lr"]
