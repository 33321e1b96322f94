"""trainer/deepspeed_state.py against the installed DeepSpeed: every optimizer wrapper the trainer can get is built
in this process (one rank; fp16 with DeepSpeed's CPU check lifted, as fixtures_matrix does), and the adapter reads
its real loss scale, applied steps and grad norm; a forced overflow is a skipped step and a lower scale; a wrapper
or an attribute the installed DeepSpeed lacks fails at start-up. FP16_Optimizer needs DeepSpeed's FusedAdam (a
CUDA op): it is checked against its installed class."""

from __future__ import annotations

import math

import pytest

from bigscience_ops.trainer import deepspeed_state
from bigscience_ops.trainer.deepspeed_state import WRAPPERS, DeepSpeedState, DeepSpeedStateError
from tests.fixtures_matrix import matrix_experiment

pytestmark = pytest.mark.slow  # imports DeepSpeed and builds its engines

INITIAL_SCALE = 2.0**12  # render.deepspeed_config's initial_scale_power


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(precision, ZeRO stage) -> (engine, adapter, loss function) of the shrunk tiny model at PP=1 on one rank,
    whose loss function multiplies the gradients of iterations 2 and 3 by inf (faults.py)."""
    import os

    import deepspeed.accelerator.cpu_accelerator as cpu
    import torch

    from bigscience_ops.launch.local import free_port
    from bigscience_ops.launch.render import deepspeed_config
    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer import pipeline_engine
    from bigscience_ops.trainer.faults import Faults

    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    lifted = pytest.MonkeyPatch()
    lifted.setattr(cpu.CPU_Accelerator, "is_fp16_supported", lambda self: True)
    pipeline_engine.init_distributed("cpu")
    built = {}
    out = tmp_path_factory.mktemp("engines")
    for precision, zero in WRAPPERS:
        exp = matrix_experiment(out, precision, zero, "pp1")
        b = pipeline_engine.build(exp, deepspeed_config(exp), GPTShape.from_experiment(exp), 1, torch.device("cpu"),
                                  Faults(scale_grad={2: math.inf, 3: math.inf}), 4)
        built[(precision, zero)] = (b.engine, b.state, b.loss_fn)
    yield built
    torch.distributed.destroy_process_group()
    lifted.undo()
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def _step(engine, loss_fn, iteration: int) -> None:
    import torch

    loss_fn.iteration = iteration
    generator = torch.Generator().manual_seed(iteration)
    tokens = torch.randint(0, 256, (2, 32), generator=generator)
    batch = (tokens, (torch.roll(tokens, -1, 1), torch.ones(2, 32)))
    engine.train_batch(data_iter=iter([batch, batch]))


def test_each_precision_and_stage_gets_the_wrapper_the_table_names(engines):
    names = {key: state.wrapper.name for key, (_, state, _) in engines.items()}
    assert names == {("fp32", 0): "AdamW", ("fp32", 1): "DeepSpeedZeroOptimizer", ("bf16", 0): "BF16_Optimizer",
                     ("bf16", 1): "DeepSpeedZeroOptimizer", ("fp16", 0): "FP16_UnfusedOptimizer",
                     ("fp16", 1): "DeepSpeedZeroOptimizer"}
    for key, (engine, state, _) in engines.items():
        assert type(engine.optimizer) is deepspeed_state.wrapper_class(state.wrapper), key


def test_the_loss_scale_is_the_scalers_own_and_falls_on_overflow(engines):
    """fp16: 4096 at start (ZeRO-0 used to log 1.0); a step with inf gradients is not applied and has no grad norm;
    FP16_UnfusedOptimizer halves at once, ZeRO's scaler after its hysteresis of 2. bf16 and fp32 scale nothing."""
    for (precision, zero), (engine, state, loss_fn) in engines.items():
        key = (precision, zero)
        assert state.loss_scale() == (INITIAL_SCALE if precision == "fp16" else 1.0), key
        _step(engine, loss_fn, 1)
        assert state.step_applied() and state.grad_norm() is not None and math.isfinite(state.grad_norm()), key
        before = engine.optimizer.param_groups[0]["params"][0].detach().clone()
        _step(engine, loss_fn, 2)
        assert not state.step_applied(), key
        assert engine.optimizer.param_groups[0]["params"][0].equal(before), key  # no update
        first = state.loss_scale()
        _step(engine, loss_fn, 3)
        assert not state.step_applied(), key
        if precision != "fp16":
            assert first == state.loss_scale() == 1.0, key
        elif zero == 0:
            assert (first, state.loss_scale()) == (INITIAL_SCALE / 2, INITIAL_SCALE / 4), key
        else:
            assert (first, state.loss_scale()) == (INITIAL_SCALE, INITIAL_SCALE / 2), key


def test_the_learning_rate_is_set_and_read_in_every_group(engines):
    for key, (engine, state, _) in engines.items():
        state.set_learning_rate(3.5e-4)
        assert state.learning_rate() == 3.5e-4, key
        assert {g["lr"] for g in engine.optimizer.param_groups} == {3.5e-4}, key


def test_a_missing_attribute_fails_at_start_up(engines, monkeypatch):
    engine, _, _ = engines[("fp16", 0)]
    monkeypatch.delattr(type(engine.optimizer), "loss_scale")
    with pytest.raises(DeepSpeedStateError, match="FP16_UnfusedOptimizer.loss_scale"):
        DeepSpeedState(engine, "fp16", 0)
    monkeypatch.undo()
    engine, _, _ = engines[("fp32", 1)]
    monkeypatch.setattr(type(engine), "was_step_applied", None)
    with pytest.raises(DeepSpeedStateError, match="engine.was_step_applied"):
        DeepSpeedState(engine, "fp32", 1)


def test_another_wrapper_than_the_tables_fails_at_start_up(engines):
    engine, _, _ = engines[("fp32", 0)]
    with pytest.raises(DeepSpeedStateError, match="wrapped the optimizer in AdamW.*FP16_UnfusedOptimizer or FP16_Optimizer"):
        DeepSpeedState(engine, "fp16", 0)
    with pytest.raises(DeepSpeedStateError, match="zero_stage 2: no optimizer wrapper"):
        DeepSpeedState(engine, "fp32", 2)


def test_fp16_optimizer_keeps_its_scale_where_the_adapter_reads_it():
    """FP16_Optimizer (DeepSpeed's FusedAdam only) cannot be built on CPU: its installed class exposes `loss_scale`
    as a property over loss_scale_config, set up from the dynamic-scale arguments of the rendered config."""
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.loss_scaler import INITIAL_LOSS_SCALE, MIN_LOSS_SCALE, SCALE_WINDOW, LossScaleConfig
    import torch

    assert deepspeed_state.wrapper_class(deepspeed_state.FP16_FUSED) is FP16_Optimizer
    assert isinstance(FP16_Optimizer.loss_scale, property)
    optimizer = FP16_Optimizer.__new__(FP16_Optimizer)  # the attributes its loss_scale reads, as __init__ sets them
    optimizer.custom_loss_scaler = False
    optimizer.loss_scale_config = LossScaleConfig(
        torch.float16, True, 0, {INITIAL_LOSS_SCALE: INITIAL_SCALE, SCALE_WINDOW: 500, MIN_LOSS_SCALE: 1})
    assert optimizer.loss_scale == INITIAL_SCALE
