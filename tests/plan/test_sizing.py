"""Uneven pipelines: the plan's stage split is DeepSpeed's own, and 30 layers train on PP=4."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

from bigscience_ops import plan, sizing
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import ConfigError
from tests.fixtures_trainer import REPO, run_ok, scalars, small_experiment, write_run

PARAM_LINE = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank \((\d+), (\d+)\): (\d+)")


def _deepspeed_stages(exp, method: str, tensor: int) -> tuple[list[int], list[int]]:
    """DeepSpeed's PipelineModule._partition_layers on the trainer's real layer specs, and the parameters
    each stage builds (a tied module once per stage, from its first spec), without a process group."""
    from deepspeed.pipe import PipelineModule, TiedLayerSpec

    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer.model import layer_specs
    from bigscience_ops.trainer.tensor_parallel import TensorParallel

    specs = layer_specs(GPTShape.from_experiment(exp), 1, TensorParallel(0, tensor), "torch")
    module = SimpleNamespace(num_stages=exp.parallel.pipeline, global_rank=1, _layer_specs=specs,
                             _topo=SimpleNamespace(get_coord=lambda rank: SimpleNamespace(pipe=0)),
                             _set_bounds=lambda start, stop: None)
    module._count_layer_params = PipelineModule._count_layer_params.__get__(module)
    module._find_layer_type = PipelineModule._find_layer_type.__get__(module)
    PipelineModule._partition_layers(module, method=method)
    counts = []
    for start, stop in zip(module.parts, module.parts[1:]):
        built, total = set(), 0
        for spec in specs[start:stop]:
            if isinstance(spec, TiedLayerSpec):
                if spec.key in built:
                    continue
                built.add(spec.key)
            total += sum(p.numel() for p in spec.build().parameters())
        counts.append(total)
    return list(module.parts), counts


def _shaped(layers: int, pipeline: int, tensor: int = 1, method: str = "type:transformer", **model):
    exp = load_experiment("tiny", REPO / "trainings")
    m = dataclasses.replace(exp.model, num_layers=layers, hidden_size=32, num_attention_heads=4, seq_length=16,
                            max_position_embeddings=16, vocab_size=300, ffn_hidden_size=64, **model)
    p = dataclasses.replace(exp.parallel, pipeline=pipeline, tensor=tensor, partition_method=method)
    return dataclasses.replace(exp, model=m, parallel=p, slurm=dataclasses.replace(exp.slurm, nodes=pipeline * tensor))


@pytest.mark.parametrize("layers, pipeline, tensor, method, model", [
    (30, 4, 1, "type:transformer", {}),
    (30, 4, 2, "type:transformer|embedding", {}),
    (30, 4, 1, "parameters", {"embed_layernorm": True}),
    (30, 4, 2, "uniform", {}),
    (7, 3, 1, "parameters", {}),
    (5, 5, 1, "type:transformer|embedding", {}),
    (4, 2, 1, "type:TransformerBlock", {}),
    (2, 1, 1, "type:transformer", {}),
])
def test_plan_split_and_stage_parameters_equal_deepspeeds(layers, pipeline, tensor, method, model):
    exp = _shaped(layers, pipeline, tensor, method, **model)
    parts, counts = _deepspeed_stages(exp, method, tensor)
    params = sizing.count_parameters(exp.model, tensor, pipeline, method)
    assert list(params.parts) == parts
    assert list(params.per_stage) == counts
    assert sum(params.blocks_per_stage) == layers


def test_30_layers_on_pp4_plan_uneven_stages_and_check_the_largest():
    exp = _shaped(30, 4)
    p = plan.make_plan(exp)
    assert not p.errors
    assert p.params.blocks_per_stage == (8, 8, 7, 7)
    # Activations follow the blocks: stage 1 holds 8 blocks, stage 2 seven, in-flight micro-batches aside.
    acts = p.memory.activations
    assert acts[1].stored * 7 * acts[2].in_flight == acts[2].stored * 8 * acts[1].in_flight
    assert p.memory.largest_total == max(p.memory.total_per_stage)
    # Counting the embeddings as layers moves a block off stage 0 and off the last stage.
    with_embeddings = plan.make_plan(dataclasses.replace(
        exp, parallel=dataclasses.replace(exp.parallel, partition_method="type:transformer|embedding")))
    assert with_embeddings.params.blocks_per_stage == (7, 8, 8, 7)


def test_memory_check_uses_the_largest_stage_of_an_uneven_split():
    exp = _shaped(30, 4)
    fitted = plan.make_plan(exp)
    largest = max(fitted.memory.total_per_stage)
    tight = dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, device="gpu",
                                                                  gpu_memory_gb=largest * 0.99 / 2**30))
    assert [pr.field for pr in plan.make_plan(tight).errors] == ["slurm.gpu_memory_gb"]
    roomy = dataclasses.replace(tight, slurm=dataclasses.replace(tight.slurm, gpu_memory_gb=largest * 1.01 / 2**30))
    assert not plan.make_plan(roomy).errors


@pytest.mark.parametrize("method", ["random", "type:", "type:Attention", "type:[unclosed"])
def test_bad_partition_methods_are_refused_with_the_field(tmp_path, method):
    (tmp_path / "bad.yaml").write_text(f"base: tiny\nparallel: {{partition_method: '{method}'}}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("bad", tmp_path)
    assert "parallel.partition_method" in str(err.value) and method in str(err.value)


def test_more_stages_than_layers_is_refused(tmp_path):
    (tmp_path / "deep.yaml").write_text("base: tiny\nparallel: {pipeline: 5}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("deep", tmp_path)
    assert "model.num_layers" in str(err.value)


@pytest.mark.slow
def test_30_layers_train_on_pp4(tmp_path):
    """A 30-layer, 32-wide GPT on 4 pipeline stages trains a few steps; each stage holds the plan's parameters."""
    exp = small_experiment(tmp_path, model=dict(num_layers=30, hidden_size=32, ffn_hidden_size=64),
                           parallel=dict(pipeline=4), train=dict(samples=40),
                           logging=dict(log_interval=1, eval_interval=100, eval_iters=0),
                           checkpoint=dict(save_interval=100))
    write_run(exp, tmp_path)
    proc = run_ok(tmp_path, 4)
    counts = {int(s): int(n) for _, s, n in PARAM_LINE.findall(proc.stdout)}
    params = sizing.count_parameters(exp.model, 1, 4, exp.parallel.partition_method)
    assert counts == dict(enumerate(params.per_stage))
    losses = scalars(tmp_path / "tensorboard", "lm loss")
    assert sorted(losses) == list(range(1, run_schedule(exp).train_iters + 1))
    assert losses[max(losses)] < losses[1]


# ----------------------------------------------------------------------------- checkpoint storage from the shapes

def _du(folder) -> int:
    """`du -b` of a folder: the bytes of its files."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_tinys_checkpoints_from_the_shapes_are_what_its_run_wrote() -> None:
    """`bsops launch tiny --local` wrote 6 checkpoints of 80,372,596-80,372,605 bytes (du -b of each
    global_stepN, measured 2026-11-27): 5 by save_interval 50 (the final step 221 included) and one where
    array task 1 ends at exit_interval 120. The plan counted 5 of 63.5 MB before: without the exit save,
    the tied embedding's Adam moments on the last stage, and the files' records. The slow tests below
    hold the same against live runs."""
    exp = load_experiment("tiny")
    st = plan.make_plan(exp).storage
    assert sizing.saved_steps(run_schedule(exp).save_steps, 221, 120, []) == [50, 100, 120, 150, 200, 221]
    assert (st.saves, st.schedule_saves, st.exit_saves, st.time_exit_saves) == (6, 5, 1, None)
    assert st.checkpoint.files == 12  # 6 layer files, 2 mp_rank, 2 rng_state, bsops.json, manifest.json
    assert st.checkpoint_bytes == pytest.approx(80_372_604, rel=0.001)
    assert st.written == pytest.approx(6 * 80_372_604, rel=0.001)


def test_saves_at_exit_intervals_and_node_phase_ends_once_each() -> None:
    # an exit at 120 and 240; at 360 (the end) the final save; 300 is both a scheduled save and a phase end
    assert sizing.saved_steps([100, 200, 300, 360], 360, 120, [300]) == [100, 120, 200, 240, 300, 360]
    assert sizing.saved_steps([10, 15], 15, 5, []) == [5, 10, 15]
    # tasks of 100 minutes over phases of 250 and 99 minutes: 2 + 0 time-limit ends, less the exit-interval ends
    assert sizing.time_limit_exits([250, 99], 100, [0, 0]) == 2
    assert sizing.time_limit_exits([250, 99], 100, [1, 0]) == 1
    assert sizing.time_limit_exits([250], 100, [5]) == 0


@pytest.mark.parametrize("precision, zero, per_param", [("fp32", 0, 8), ("fp32", 1, 12), ("bf16", 0, 18),
                                                         ("bf16", 1, 12), ("fp16", 0, 12), ("fp16", 1, 12)])
def test_optimizer_bytes_per_parameter(precision, zero, per_param) -> None:
    """Adam's two fp32 moments; fp32 master weights too under mixed precision and in ZeRO's partitions; bf16 without
    ZeRO also writes DP rank 0's partition (12 bytes a parameter over DP 2) into the model-states file."""
    exp = load_experiment("tiny")
    exp = dataclasses.replace(exp, train=dataclasses.replace(exp.train, precision=precision),
                              parallel=dataclasses.replace(exp.parallel, zero_stage=zero))
    params = sizing.count_parameters(exp.model, 1, 2)
    ck = sizing.checkpoint_size(exp, params, 2)  # at DP 2: partitions split the same bytes over 2 files
    assert ck.optimizer // sum(params.per_stage) == per_param
    width = 4 if precision == "fp32" else 2
    assert ck.weights // params.total == width  # the head's tied embedding is saved once


@pytest.mark.slow  # reads the session's golden run (no launch of its own)
def test_the_golden_runs_checkpoints_are_the_plans_size(golden_run) -> None:
    """fp32, ZeRO-0, PP=2, a 64-wide model whose files' own records weigh 5%: every checkpoint is the
    plan's size within 1%, with the plan's files, at the plan's steps."""
    exp, out, _ = golden_run
    st = plan.make_plan(exp).storage
    folders = sorted((out / "checkpoints").glob("global_step*"), key=lambda p: int(p.name[len("global_step"):]))
    assert len(folders) == st.saves == 6
    for folder in folders:
        assert _du(folder) == pytest.approx(st.checkpoint_bytes, rel=0.01), folder
        assert len(list(folder.iterdir())) == st.checkpoint.files
    assert sum(_du(f) for f in folders) == pytest.approx(st.written, rel=0.05)
