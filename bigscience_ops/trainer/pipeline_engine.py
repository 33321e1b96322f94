"""The process group and DeepSpeed's pipeline engine, as the trainer builds them.

`init_distributed` makes the group (gloo on CPU; `cpu:gloo,cuda:nccl` on GPUs, the local GPU selected
first) and returns the device. `build` makes the PipelineModule from the model's layer specs (on the
(pipe, data, model) topology when TP > 1), checks that DeepSpeed split the layers where the plan did,
and wraps it with AdamW in `deepspeed.initialize`; on plain fp32 it guards the optimizer step so a
step with non-finite gradients is skipped, as DeepSpeed's ZeRO, bf16 and fp16 paths do. What the trainer then
reads off the engine goes through deepspeed_state.py, which checks the optimizer wrapper DeepSpeed chose.
"""

from __future__ import annotations

import importlib
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch

from bigscience_ops import sizing
from bigscience_ops.schema import Experiment
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer import tensor_parallel
from bigscience_ops.trainer.deepspeed_state import DeepSpeedState
from bigscience_ops.trainer.errors import TrainerError
from bigscience_ops.trainer.faults import Faults, with_faults
from bigscience_ops.kernels.choice import KernelChoice
from bigscience_ops.kernels.measure import select_kernels
from bigscience_ops.trainer.model import layer_specs, loss_function, weight_decay_groups


@dataclass(frozen=True)
class Built:
    engine: object
    """DeepSpeed's PipelineEngine."""
    state: DeepSpeedState
    """What the trainer reads off the engine (loss scale, applied steps, grad norm, LR, checkpoint loads)."""
    tp: tensor_parallel.TensorParallel
    """This rank's tensor-parallel group and position."""
    loss_fn: Callable
    parameters: int
    kernels: KernelChoice | None = None
    """The implementation of each fused op (model.kernels resolved; measured on CUDA for auto)."""
    """Parameters this rank holds (its stage, its tensor-parallel shard)."""


def init_distributed(device: str, timeout_minutes: int = 30) -> torch.device:
    """The process group, and the device this process trains on.

    CPU: gloo; the CPU accelerator's shm op is not JIT-built (a minute of compilation on a fresh
    machine). GPU: the local GPU is selected first (before any group, collective or allocation), the
    group serves CPU and CUDA tensors (`cpu:gloo,cuda:nccl`), and NCCL's async error handling turns
    a collective stuck past `timeout_minutes` into an aborted process instead of a hang.
    """
    import deepspeed

    # DeepSpeed broadcasts tied weights inside autograd; torch warns about it on every backward.
    warnings.filterwarnings("ignore", message="c10d::broadcast_: an autograd kernel was not registered")
    timeout = timedelta(minutes=timeout_minutes)
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        comm_torch = importlib.import_module("deepspeed.comm.torch")
        comm_torch.build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="gloo", timeout=timeout)
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # the name since torch 2.2 (was NCCL_...)
    deepspeed.init_distributed(dist_backend="cpu:gloo,cuda:nccl", timeout=timeout)
    return torch.device("cuda", local_rank)


def build(exp: Experiment, ds_config: dict, shape: GPTShape, dp: int, device: torch.device, faults: Faults,
          first_batch_size: int, recorded_kernels: dict | None = None) -> Built:
    """The engine for `exp` on this rank; `first_batch_size` is the batch size of the first step; `recorded_kernels`
    the kernel choice of the checkpoint the run resumes from (kept when measured at this shape and device)."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    kernels = select_kernels(exp.model.kernels, shape, exp.batch.micro_batch_size, exp.parallel.tensor,
                             exp.train.precision, device, recorded=recorded_kernels)  # before the seed: its inputs draw on no training RNG
    torch.manual_seed(exp.train.seed)
    if exp.parallel.tensor == 1:  # DeepSpeed's 2-D (pipe, data) grid: TP=1 checkpoints keep their file names
        layout: dict = {"num_stages": exp.parallel.pipeline}
        tp = tensor_parallel.SINGLE
    else:
        topology = tensor_parallel.topology(exp.parallel.pipeline, exp.parallel.tensor, dp)
        layout = {"topology": topology}
        tp = tensor_parallel.from_topology(topology)
    tensor_parallel.seed_model_parallel_rng(exp.train.seed, tp)  # attention dropout: per TP rank
    loss_fn = with_faults(loss_function(tp, kernels), faults)
    module = PipelineModule(
        layers=layer_specs(shape, exp.train.seed, tp, kernels, compile=exp.model.compile),
        loss_fn=loss_fn,
        **layout,
        partition_method=exp.parallel.partition_method,
        activation_checkpoint_interval=1 if exp.parallel.activation_checkpointing else 0,
        checkpointable_layers=["TransformerBlock"],
    )
    planned = sizing.count_parameters(exp.model, exp.parallel.tensor, exp.parallel.pipeline,
                                      exp.parallel.partition_method).parts
    if list(module.parts) != list(planned):
        raise TrainerError(f"parallel.partition_method {exp.parallel.partition_method!r}: DeepSpeed split the "
                           f"layers at {list(module.parts)}, the plan at {list(planned)}; the plan's memory and "
                           "parameter counts would be wrong")
    o = exp.optimizer
    fused = device.type == "cuda"
    if fused:  # torch's fused AdamW kernel: one launch per step instead of several per parameter
        module.to(device)
    optimizer = torch.optim.AdamW(weight_decay_groups(module, o.weight_decay), lr=0.0,
                                  betas=(o.beta1, o.beta2), eps=o.eps, fused=fused or None)
    config = dict(ds_config)
    config["train_batch_size"] = first_batch_size
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    _guard_fp32_steps(engine)
    state = DeepSpeedState(engine, exp.train.precision, exp.parallel.zero_stage)
    return Built(engine, state, tp, loss_fn, sum(p.numel() for p in module.parameters()), kernels)


def _guard_fp32_steps(engine) -> None:
    """DeepSpeed's plain fp32 path (no ZeRO, no bf16/fp16) clips without keeping the norm and steps whatever the
    gradients hold: keep the norm, and skip the update when it is not finite (a NaN or inf loss or gradient), as
    its ZeRO, bf16 and fp16 paths do; the engine then reports the step as not applied (its `overflow` check).
    The norm is reduced over every rank, so all ranks skip together. Without gradient clipping nothing changes."""
    from deepspeed.runtime.utils import clip_grad_norm_

    if engine.fp16_enabled() or engine.bfloat16_enabled() or engine.zero_optimization():
        return
    optimizer = engine.optimizer
    optimizer_step = optimizer.step
    optimizer.overflow = False

    def clip() -> None:
        norm = clip_grad_norm_(parameters=engine.module.parameters(), max_norm=engine.gradient_clipping(),
                               mpu=engine.mpu)
        engine._global_grad_norm = norm
        optimizer.overflow = not math.isfinite(float(norm))

    def step(*args, **kwargs):
        if optimizer.overflow:
            return None
        return optimizer_step(*args, **kwargs)

    engine.clip_fp32_gradients = clip
    optimizer.step = step
