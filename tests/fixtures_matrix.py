"""The configurations matrix: every precision x ZeRO stage x layout the schema accepts, trained uninterrupted with a
save at EXIT_AT, and resumed from that save by the next launch, as the next array task resumes (the same files in a
run folder of its own): the resumed launch must log the uninterrupted run's iteration lines. Stopping at an exit
interval does not depend on the configuration (test_trainer_runs.py stops there; benchmarks/gpu_acceptance.py runs
every precision x stage as two array tasks through `bsops launch --local`).

One module a precision (tests/trainer/test_trainer_matrix_{fp32,bf16,fp16}.py) so that pytest-xdist spreads them over its
workers; each module's twelve launches run two at a time. fp16 cannot be initialized on this CPU (DeepSpeed's CPU
accelerator says so when oneDNN has no fp16 kernels): its ranks run the trainer under `FP16_ON_CPU`, which lifts
that one check, so DeepSpeed's real fp16 wrappers (FP16_UnfusedOptimizer, ZeRO's with its loss scaler) train,
save and resume here; CPU is the rehearsal, benchmarks/gpu.sh runs the same matrix on a GPU.
"""

from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bigscience_ops import sizing
from bigscience_ops.run.iterations import parse_iteration_line
from bigscience_ops.schema import Experiment
from bigscience_ops.trainer.checkpointing import find_resume
from tests.fixtures_trainer import checkpoint_steps, concurrently, ranks, scalars, small_experiment, write_run


@dataclass(frozen=True)
class Layout:
    pipeline: int
    tensor: int
    processes: int

    @property
    def data(self) -> int:
        return self.processes // (self.pipeline * self.tensor)


LAYOUTS = {"pp2": Layout(2, 1, 2), "tp2": Layout(1, 2, 2), "dp2": Layout(1, 1, 2), "pp1": Layout(1, 1, 1)}
ZERO_STAGES = (0, 1)
CHECKPOINTED = {(1, "pp2"), (0, "tp2")}
"""(ZeRO stage, layout) trained with activation checkpointing: each stage with it on and off."""
EXIT_AT, STEPS = 2, 5  # 4 samples a step, no rampup: each launch is mostly its start-up
TIMING = ("elapsed_ms", "samples_per_second", "tflops", "mfu")
FP16_ON_CPU = ("import sys, deepspeed.accelerator.cpu_accelerator as cpu; "
               "cpu.CPU_Accelerator.is_fp16_supported = lambda self: True; "
               "from bigscience_ops.trainer.__main__ import start; sys.exit(start())")
"""A trainer rank for which DeepSpeed's CPU accelerator accepts fp16 (torch computes it on CPU, slowly)."""


def matrix_experiment(out: Path, precision: str, zero: int, layout: str, **sections: dict) -> Experiment:
    """The shrunk tiny model in one cell of the matrix, logging every iteration, without validation."""
    grid = LAYOUTS[layout]
    base = dict(
        train=dict(precision=precision, samples=4 * STEPS),
        lr_schedule=dict(warmup_samples=8),
        parallel=dict(pipeline=grid.pipeline, tensor=grid.tensor, zero_stage=zero,
                      activation_checkpointing=(zero, layout) in CHECKPOINTED),
        batch=dict(global_batch_size=4, micro_batch_size=1 if grid.data > 1 else 2, rampup=None),  # 2 micro-batches
        checkpoint=dict(save_interval=EXIT_AT, exit_interval=None),
        logging=dict(log_interval=1, eval_interval=100, eval_iters=0),
        estimate=dict(peak_tflops=0.25),  # MFU beside TFLOPs (a CPU has no entry in the peaks table)
        **({"slurm": dict(device="gpu")} if precision == "fp16" else {}),  # fp16 is refused on a cpu device
    )
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return small_experiment(out, **base)


def train(out: Path, exp: Experiment, processes: int, env: dict | None = None) -> subprocess.CompletedProcess:
    """One launch of `exp` on `processes` ranks (written into `out` first), fp16 under FP16_ON_CPU; fails the test
    if it fails."""
    write_run(exp, out)
    args = ["--experiment", str(out / "experiment.json"), "--deepspeed-config", str(out / "ds_config.json"),
            "--synthetic-data"]
    argv = ["-c", FP16_ON_CPU, *args] if exp.train.precision == "fp16" else ["-m", "bigscience_ops.trainer", *args]
    proc = ranks(argv, processes, env)
    p = exp.parallel
    assert proc.returncode == 0, (f"{exp.train.precision} ZeRO-{p.zero_stage} TP={p.tensor} PP={p.pipeline} in "
                                  f"{out.name}: trainer exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-5000:]}")
    return proc


@dataclass
class Cell:
    """One (ZeRO stage, layout) of a precision: its two run folders and each launch's stdout."""

    zero: int
    layout: str
    whole: Path
    resumed: Path
    whole_out: str = ""
    resumed_out: str = ""


def resume_from(source: Path, out: Path, step: int) -> None:
    """`out`'s checkpoints: `source`'s global_stepN alone, named by `latest`, as the next array task finds them."""
    import shutil

    shutil.copytree(source / "checkpoints" / f"global_step{step}", out / "checkpoints" / f"global_step{step}")
    (out / "checkpoints" / "latest").write_text(f"global_step{step}")


def _launch_cell(cell: Cell, precision: str) -> None:
    processes = LAYOUTS[cell.layout].processes
    cell.whole_out = train(cell.whole, matrix_experiment(cell.whole, precision, cell.zero, cell.layout),
                           processes).stdout
    resume_from(cell.whole, cell.resumed, EXIT_AT)
    cell.resumed_out = train(cell.resumed, matrix_experiment(cell.resumed, precision, cell.zero, cell.layout),
                             processes).stdout


def matrix_runs(tmp_path_factory, precision: str) -> dict[tuple[int, str], Cell]:
    """Every (ZeRO stage, layout) of `precision`: trained uninterrupted, then resumed from its save at EXIT_AT."""
    cells = {(zero, layout): Cell(zero, layout, tmp_path_factory.mktemp(f"{precision}z{zero}{layout}whole"),
                                  tmp_path_factory.mktemp(f"{precision}z{zero}{layout}resumed"))
             for zero in ZERO_STAGES for layout in LAYOUTS}
    concurrently({key: (lambda cell=cell: _launch_cell(cell, precision)) for key, cell in cells.items()})
    return cells


def iteration_lines(stdout: str) -> dict[int, dict]:
    """iteration -> the fields of its Megatron line but the timings."""
    lines = {}
    for line in stdout.splitlines():
        stats = parse_iteration_line(line)
        if stats is not None:
            fields = dataclasses.asdict(stats)
            for key in TIMING:
                fields.pop(key)
            lines[stats.iteration] = fields
    return lines


def assert_resumes_exactly(cells: dict[tuple[int, str], Cell]) -> None:
    """Each cell's resumed launch started from the save at EXIT_AT and logged the uninterrupted run's iteration lines
    from there (every field but the timings) and its TensorBoard losses bit for bit."""
    saves = list(range(EXIT_AT, STEPS, EXIT_AT)) + [STEPS]
    for (zero, layout), cell in cells.items():
        name = f"ZeRO-{zero} {layout}"
        assert f"resumed from {cell.resumed / 'checkpoints' / f'global_step{EXIT_AT}'}" in cell.resumed_out, name
        assert checkpoint_steps(cell.whole) == checkpoint_steps(cell.resumed) == saves, name
        grid, meta = LAYOUTS[layout], find_resume(cell.resumed / "checkpoints").meta
        assert meta["parallel"] == {"tensor": grid.tensor, "pipeline": grid.pipeline, "data": grid.data}, name
        whole, resumed = iteration_lines(cell.whole_out), iteration_lines(cell.resumed_out)
        assert sorted(whole) == list(range(1, STEPS + 1)) and sorted(resumed) == list(range(EXIT_AT + 1, STEPS + 1))
        for it in resumed:
            assert resumed[it] == whole[it], (name, it, resumed[it], whole[it])
        losses = scalars(cell.whole / "tensorboard", "lm loss")
        assert scalars(cell.resumed / "tensorboard", "lm loss") == {it: losses[it] for it in resumed}, name


def assert_checkpoint_sizes(cells: dict[tuple[int, str], Cell], precision: str) -> None:
    """Every checkpoint has the files and bytes sizing.checkpoint_size computes for its cell (the plan's storage)."""
    for (zero, layout), cell in cells.items():
        exp = matrix_experiment(cell.whole, precision, zero, layout)
        p = exp.parallel
        params = sizing.count_parameters(exp.model, p.tensor, p.pipeline, p.partition_method)
        expected = sizing.checkpoint_size(exp, params, LAYOUTS[layout].data)
        for folder in (cell.whole / "checkpoints" / f"global_step{EXIT_AT}",
                       cell.resumed / "checkpoints" / f"global_step{STEPS}"):
            files = list(folder.iterdir())
            assert len(files) == expected.files, (precision, zero, layout, sorted(f.name for f in files))
            total = sum(f.stat().st_size for f in files)
            assert total == pytest.approx(expected.total, rel=0.02), (precision, zero, layout, total, expected)


def reshape_and_warm_starts(cells: dict[tuple[int, str], Cell], precision: str, tmp_path_factory) -> dict:
    """What a run of `precision` may do to its checkpoints besides resuming them, from the matrix's PP=1 cells:
    "reshape": the ZeRO-1 checkpoint at EXIT_AT resumed at DP=2 (DeepSpeed's universal checkpoint, converted once);
    ("warm", stage): the stage's last checkpoint warm-started (weights only) into a 3-block model of the same
    precision and stage, trained a few steps. Each entry: (run folder, stdout)."""
    from bigscience_ops.checkpoints import warm_start

    def reshape() -> tuple[Path, str]:
        out = tmp_path_factory.mktemp(f"{precision}reshape")
        resume_from(cells[(1, "pp1")].whole, out, EXIT_AT)
        exp = matrix_experiment(out, precision, 1, "dp2")
        return out, train(out, exp, LAYOUTS["dp2"].processes).stdout

    def warm(zero: int) -> tuple[Path, str]:
        out = tmp_path_factory.mktemp(f"{precision}z{zero}warm")
        exp = matrix_experiment(out, precision, zero, "pp1", model=dict(num_layers=3), train=dict(samples=8))
        write_run(exp, out)
        source = cells[(zero, "pp1")].whole
        warm_start.build(exp, warm_start.find_source(source / "checkpoints", None, str(source)))
        return out, train(out, exp, 1).stdout

    jobs = {"reshape": reshape, ("warm", 0): lambda: warm(0), ("warm", 1): lambda: warm(1)}
    return concurrently(jobs)


def assert_reshaped_and_warm_started(runs: dict, cells: dict[tuple[int, str], Cell], tolerance: float) -> None:
    """The DP=2 resume converted once and continued the uninterrupted PP=1 run's losses (to `tolerance`: the
    reduction over two ranks rounds otherwise); each warm start trained its own fresh steps from iteration 1."""
    out, stdout = runs["reshape"]
    assert f"global_step{EXIT_AT}_universal" in stdout and (out / "checkpoints" / f"global_step{STEPS}").is_dir()
    whole = scalars(cells[(1, "pp1")].whole / "tensorboard", "lm loss")
    reshaped = scalars(out / "tensorboard", "lm loss")
    assert sorted(reshaped) == list(range(EXIT_AT + 1, STEPS + 1))
    for step, value in reshaped.items():
        assert abs(value - whole[step]) <= tolerance * abs(whole[step]), (step, value, whole[step])
    for zero in ZERO_STAGES:
        out, stdout = runs[("warm", zero)]
        lines = sorted(iteration_lines(stdout))
        assert "warm start from" in stdout and lines == list(range(1, len(lines) + 1)), (zero, lines)
        assert checkpoint_steps(out) == [0, lines[-1]], zero


def matrix_tests(precision: str):
    """A precision's module of the matrix: its runs (a module fixture) and the checks every precision passes, as
    `cells, test_resumes, test_sizes = matrix_tests("bf16")` at the top of tests/trainer/test_trainer_matrix_bf16.py."""
    @pytest.fixture(scope="module")
    def cells(tmp_path_factory):
        return matrix_runs(tmp_path_factory, precision)

    def test_every_layout_and_zero_stage_resumes_with_the_uninterrupted_lines(cells):
        assert_resumes_exactly(cells)

    def test_every_checkpoint_is_the_size_the_plan_computes(cells):
        assert_checkpoint_sizes(cells, precision)

    return (cells, test_every_layout_and_zero_stage_resumes_with_the_uninterrupted_lines,
            test_every_checkpoint_is_the_size_the_plan_computes)


def reshape_tests(precision: str, tolerance: float):
    """The reshape and warm starts of a mixed precision (reshape_and_warm_starts), as a module fixture and its check."""
    @pytest.fixture(scope="module")
    def reshaped(cells, tmp_path_factory):
        return reshape_and_warm_starts(cells, precision, tmp_path_factory)

    def test_reshape_and_warm_start_at_each_stage(reshaped, cells):
        assert_reshaped_and_warm_started(reshaped, cells, tolerance)

    return reshaped, test_reshape_and_warm_start_at_each_stage
