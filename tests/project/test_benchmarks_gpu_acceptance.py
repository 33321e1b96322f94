"""benchmarks/gpu_acceptance.py, the GPU acceptance command, in what a CPU can check: its arguments, its table, the
reading of the trainer's lines, and that each experiment it launches plans and finishes in its two array tasks.
(Its matrix and eval checks run end to end on CPU with --device cpu: a few minutes, not part of the suite.)"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from bigscience_ops.config.loading import load_experiment
from bigscience_ops.run.iterations import IterationStats, iteration_line
from bigscience_ops.schedule.run import run_schedule

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def acceptance():
    spec = importlib.util.spec_from_file_location("gpu_acceptance", REPO / "benchmarks" / "gpu_acceptance.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_arguments(acceptance, capsys):
    args = acceptance.parse_args(["--only", "matrix,eval", "--device", "cpu", "--budget-s", "60"])
    assert args.only == ("matrix", "eval") and args.device == "cpu" and args.budget_s == 60
    assert acceptance.parse_args([]).only == acceptance.CHECKS
    for bad in (["--only", "matrix,speed"], ["--only", ","], ["--budget-s", "0"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as exit_:
            acceptance.parse_args(bad)
        assert exit_.value.code == 2, bad
    assert "'speed'" in capsys.readouterr().err
    assert acceptance.main(["--dry-run", "--only", "kernels,env"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["kernels", "env"]


def test_the_table_counts_and_escapes(acceptance):
    Row = acceptance.Row
    text = acceptance.table([Row("matrix", "fp16 ZeRO-0", True, "loss scale 4096 | resumed at 60", 41.2),
                             Row("eval", "t: bsops vs hf", False, "max rel diff 3.0e-02"),
                             Row("kernels", "compiled", None, "needs a GPU")], "header line")
    lines = text.splitlines()
    assert lines[0] == "header line" and lines[1].startswith("| check |")
    assert "| matrix | fp16 ZeRO-0 | pass | loss scale 4096 \\| resumed at 60 | 41 |" in lines
    assert "| eval | t: bsops vs hf | FAIL |" in text and "| kernels | compiled | skip |" in text
    assert lines[-1] == "1 passed, 1 failed, 1 skipped"


def test_losses_are_read_off_the_trainers_own_lines(acceptance):
    def line(it, loss, scale):
        return iteration_line(IterationStats(it, 9, it * 8, it * 1024, 12.5, 1e-4, 8, loss, scale, 1.5, 60.0, 0, 0,
                                             640.0, 1.0))
    text = "\n".join([line(1, 8.25, 4096.0), "  successfully saved checkpoint", line(2, 8.0, 2048.0)])
    got = acceptance.losses(text)
    assert got == {1: (8.25, 4096.0), 2: (8.0, 2048.0)}
    assert acceptance.max_rel_diff(got, {1: (8.25, 1.0), 2: (8.08, 1.0)}) == pytest.approx(0.08 / 8.08)
    assert math.isinf(acceptance.max_rel_diff({}, got))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_each_launched_experiment_plans_and_ends_in_its_array(acceptance, tmp_path, device, precision):
    """The two-task experiment resumes once and finishes in its second task; the uninterrupted one in its first."""
    from bigscience_ops.plan import make_plan

    if device == "cpu" and precision == "fp16":
        pytest.skip("the command skips fp16 on a CPU")
    (tmp_path / "trainings").mkdir()
    for whole in (False, True):
        (tmp_path / "trainings" / "acc.yaml").write_text(acceptance.experiment_yaml(precision, 0, device, whole))
        exp = load_experiment("acc", tmp_path / "trainings")
        make_plan(exp)  # raises on any problem
        iters = run_schedule(exp).train_iters
        assert exp.parallel.pipeline == 1 and exp.slurm.nodes * exp.slurm.gpus_per_node == 1
        if whole:
            assert exp.checkpoint.exit_interval is None and exp.slurm.array == 1
        else:
            assert exp.checkpoint.exit_interval < iters <= 2 * exp.checkpoint.exit_interval and exp.slurm.array == 2


def test_the_checks_that_need_a_gpu_say_so_on_a_cpu(acceptance, tmp_path):
    args = acceptance.parse_args(["--device", "cpu", "--out", str(tmp_path)])
    for check in (acceptance.check_kernels, acceptance.check_throughput):
        assert all(row.ok is None and "GPU" in row.figures for row in check(args, 0.0))
