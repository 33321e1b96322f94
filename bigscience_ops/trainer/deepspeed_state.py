"""What the trainer reads off DeepSpeed, in one place, with no silent default.

DeepSpeed wraps the trainer's AdamW in one of several optimizer classes, chosen from the precision and the
ZeRO stage, and each keeps its state elsewhere: the fp16 wrappers their loss scale in `loss_scale_config`
(0.19.8; `cur_scale` on the optimizer is ZeRO's alone), bf16's wrapper its fp32 master weights in per-DP-rank
partition files even under ZeRO-0. `DeepSpeedState` names the wrapper the engine must have chosen for the
experiment (`WRAPPERS`), checks at start-up that the installed DeepSpeed chose it and has every attribute read
here, and then answers the loop's questions: the loss scale, whether the step was applied, the gradient norm,
the learning rate, where the optimizer state is saved, and how to save and load a checkpoint. A DeepSpeed whose
classes or attributes differ fails at start-up naming what is missing, never with a logged 1.0.

Saving: DeepSpeed writes every file of a checkpoint through the engine's `checkpoint_engine.save(state, path)`
(the pipeline's layer files, the engine and optimizer states) and then, on rank 0, `latest` (truncated and
rewritten, before its peers are done). `save` asks it not to touch `latest` (`save_latest=False`: the trainer
moves it only after the manifest commits, trainer/checkpointing.py) and stands in for the checkpoint engine's
`save` while it runs: each file is written as DeepSpeed's TorchCheckpointEngine writes it (torch.save with its
`zipfile_serialization`), through a writer that hashes the bytes as they go by (xxh3_128, nothing read back),
then fsynced. So every rank records the size and hash of its own files at no cost a benchmark can see
(benchmarks/checkpoint_save.py). Another checkpoint engine (Nebula, a decoupled or fast writer) is refused at
start-up, naming it: its files would be written, or recorded, another way.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.checkpoints.manifest import FileRecord, HashingWriter
from bigscience_ops.trainer.errors import TrainerError


class DeepSpeedStateError(TrainerError):
    """The installed DeepSpeed does not give the trainer what it reads (a wrapper class, an attribute)."""


@dataclass(frozen=True)
class Wrapper:
    """An optimizer class DeepSpeed may wrap the trainer's AdamW in."""

    name: str
    module: str
    """Where the installed DeepSpeed defines it (torch's AdamW for plain fp32)."""
    scales_loss: bool
    """It keeps a dynamic loss scale (fp16), read through its `loss_scale` property."""
    partitioned: bool
    """Its state is saved as ZeRO saves it: one `*zero_pp_rank_*optim_states.pt` file per DP rank."""


ADAMW = Wrapper("AdamW", "torch.optim", scales_loss=False, partitioned=False)
ZERO = Wrapper("DeepSpeedZeroOptimizer", "deepspeed.runtime.zero.stage_1_and_2", scales_loss=False, partitioned=True)
ZERO_FP16 = Wrapper("DeepSpeedZeroOptimizer", "deepspeed.runtime.zero.stage_1_and_2", scales_loss=True,
                    partitioned=True)
BF16 = Wrapper("BF16_Optimizer", "deepspeed.runtime.bf16_optimizer", scales_loss=False, partitioned=True)
FP16_FUSED = Wrapper("FP16_Optimizer", "deepspeed.runtime.fp16.fused_optimizer", scales_loss=True, partitioned=False)
FP16_UNFUSED = Wrapper("FP16_UnfusedOptimizer", "deepspeed.runtime.fp16.unfused_optimizer", scales_loss=True,
                       partitioned=False)

WRAPPERS: dict[tuple[str, int], tuple[Wrapper, ...]] = {
    # (train.precision, parallel.zero_stage) -> the wrappers DeepSpeed 0.19 chooses for a PipelineModule and a
    # client torch AdamW (engine._do_optimizer_sanity_check): bf16 without ZeRO takes BF16_Optimizer (the
    # pipeline engine's bf16 path), with ZeRO-1 ZeRO's own; fp16 without ZeRO the fused wrapper only for
    # DeepSpeed's own FusedAdam.
    ("fp32", 0): (ADAMW,),
    ("fp32", 1): (ZERO,),
    ("bf16", 0): (BF16,),
    ("bf16", 1): (ZERO,),
    ("fp16", 0): (FP16_UNFUSED, FP16_FUSED),
    ("fp16", 1): (ZERO_FP16,),
}

ENGINE_METHODS = ("was_step_applied", "get_global_grad_norm", "load_checkpoint", "save_checkpoint",
                  "zero_optimization")


def wrapper_class(wrapper: Wrapper) -> type:
    """The installed class of `wrapper`; an error naming the module and class if the installed DeepSpeed has none."""
    try:
        return getattr(importlib.import_module(wrapper.module), wrapper.name)
    except (ImportError, AttributeError) as exc:
        raise DeepSpeedStateError(f"the installed DeepSpeed ({_version()}) has no {wrapper.module}.{wrapper.name}, "
                                  f"which the trainer reads its optimizer state from: {exc}") from None


class DeepSpeedState:
    """The engine of one rank, as the trainer reads it. Built right after `deepspeed.initialize`."""

    def __init__(self, engine, precision: str, zero_stage: int) -> None:
        self.engine = engine
        self.precision, self.zero_stage = precision, zero_stage
        self.wrapper = self._check_wrapper()
        self._check_attributes()

    def _check_wrapper(self) -> Wrapper:
        expected = WRAPPERS.get((self.precision, self.zero_stage))
        if expected is None:
            raise DeepSpeedStateError(f"train.precision {self.precision!r} with parallel.zero_stage "
                                      f"{self.zero_stage}: no optimizer wrapper is known for it; known: "
                                      f"{sorted(WRAPPERS)}")
        optimizer = self.engine.optimizer
        for wrapper in expected:
            if type(optimizer) is wrapper_class(wrapper):
                return wrapper
        names = " or ".join(w.name for w in expected)
        raise DeepSpeedStateError(f"train.precision {self.precision!r} with parallel.zero_stage {self.zero_stage}: "
                                  f"DeepSpeed ({_version()}) wrapped the optimizer in {type(optimizer).__name__}, "
                                  f"the trainer reads {names}; its loss scale, skipped steps and checkpoint "
                                  "layout would be read wrongly")

    def _check_attributes(self) -> None:
        missing = [f"engine.{m}" for m in ENGINE_METHODS if not callable(getattr(self.engine, m, None))]
        groups = getattr(self.engine.optimizer, "param_groups", None)
        if not groups or any("lr" not in g for g in groups):
            missing.append(f"{self.wrapper.name}.param_groups[*]['lr']")
        if self.wrapper.scales_loss and not isinstance(getattr(type(self.engine.optimizer), "loss_scale", None),
                                                       property):
            missing.append(f"{self.wrapper.name}.loss_scale")
        missing += self._saving_problems()
        if missing:
            raise DeepSpeedStateError(f"the installed DeepSpeed ({_version()}) lacks what the trainer reads of its "
                                      f"{self.wrapper.name}: {', '.join(missing)}")
        self.loss_scale()  # a scale that is not a positive number fails here, before the first step

    def _saving_problems(self) -> list[str]:
        """What `save` needs of the engine and is not there: the checkpoint engine it writes every file through
        (not a decoupled one, which writes later, in the background), and save_checkpoint's `save_latest`."""
        problems = []
        writer = getattr(self.engine, "checkpoint_engine", None)
        if type(writer).__name__ != "TorchCheckpointEngine":
            problems.append(f"engine.checkpoint_engine of DeepSpeed's TorchCheckpointEngine (got "
                            f"{type(writer).__name__}; the trainer writes and hashes each file as it does)")
        elif not isinstance(getattr(writer, "zipfile_serialization", None), bool):
            problems.append("TorchCheckpointEngine.zipfile_serialization (true or false)")
        elif not callable(getattr(writer, "is_decoupled", None)) or writer.is_decoupled():
            problems.append("a checkpoint engine that writes while save_checkpoint runs (is_decoupled() False)")
        try:
            if "save_latest" not in inspect.signature(self.engine.save_checkpoint).parameters:
                problems.append("engine.save_checkpoint(save_latest=...)")
        except (TypeError, ValueError):
            problems.append("engine.save_checkpoint's signature")
        return problems

    def save(self, folder: Path, tag: str, client_state: dict,
             after_each: Callable[[Path], None] | None = None) -> dict[Path, FileRecord]:
        """Save this rank's part of `folder/tag` (every rank calls it: DeepSpeed's barriers) without touching
        `latest`; each file this rank wrote, fsynced, with its size and hash. `after_each` is called with each file
        as it is written (the fault switch BSOPS_KILL_IN_SAVE)."""
        recorder = _Recorder(self.engine.checkpoint_engine, after_each)
        self.engine.checkpoint_engine = recorder
        try:
            self.engine.save_checkpoint(str(folder), tag=tag, client_state=client_state, save_latest=False)
        finally:
            self.engine.checkpoint_engine = recorder.inner
        return recorder.written

    def loss_scale(self) -> float:
        """The dynamic loss scale the next step multiplies the loss by (fp16); 1.0 where nothing scales the loss."""
        if not self.wrapper.scales_loss:
            return 1.0
        scale = self.engine.optimizer.loss_scale
        if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise DeepSpeedStateError(f"{self.wrapper.name}.loss_scale is {scale!r}: expected a positive number "
                                      f"(DeepSpeed {_version()})")
        return float(scale)

    def step_applied(self) -> bool:
        """False when the last step skipped its update (an fp16 overflow, a non-finite gradient)."""
        return bool(self.engine.was_step_applied())

    def grad_norm(self) -> float | None:
        """The last step's global gradient norm; None where DeepSpeed computed none (no clipping on plain fp32)."""
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    def learning_rate(self) -> float:
        return float(self.engine.optimizer.param_groups[0]["lr"])

    def set_learning_rate(self, lr: float) -> None:
        """The learning rate of the next step, in every parameter group."""
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def load(self, checkpoints: Path, tag: str, weights_only: bool = False) -> str | None:
        """Load `checkpoints/tag` into the engine (weights, optimizer state; or the weights alone); the path
        DeepSpeed loaded, None if it found nothing to load."""
        e = self.engine
        if weights_only:
            return e.load_checkpoint(str(checkpoints), tag=tag, load_module_only=True, load_optimizer_states=False,
                                     load_lr_scheduler_states=False)[0]
        if self.wrapper.partitioned and not e.zero_optimization():
            # bf16 without ZeRO: DeepSpeed saves BF16_Optimizer's state as ZeRO does (bf16_zero_pp_rank_* files,
            # one per DP rank) but loads it as a ZeRO-0 optimizer's, handing the dict of the model-states file to
            # a loader that indexes a list by DP rank (KeyError: 0). Load it as it was saved: the engine's ZeRO
            # path reads this DP rank's partition file, or the universal checkpoint's folder.
            e.zero_optimization = lambda: True
            try:
                return e.load_checkpoint(str(checkpoints), tag=tag, load_optimizer_states=True,
                                         load_lr_scheduler_states=False)[0]
            finally:
                del e.zero_optimization
        return e.load_checkpoint(str(checkpoints), tag=tag, load_optimizer_states=True,
                                 load_lr_scheduler_states=False)[0]


class _Recorder:
    """The engine's TorchCheckpointEngine, its `save` writing each file through a hashing writer and fsyncing it;
    everything else is its own."""

    def __init__(self, inner, after_each: Callable[[Path], None] | None = None) -> None:
        self.inner = inner
        self.after_each = after_each
        self.written: dict[Path, FileRecord] = {}

    def save(self, state_dict, path) -> None:
        import torch

        try:
            with open(path, "wb") as handle:
                writer = HashingWriter(handle)
                torch.save(state_dict, writer, _use_new_zipfile_serialization=self.inner.zipfile_serialization)
                handle.flush()
                os.fsync(handle.fileno())
        except Exception as exc:  # noqa: BLE001 - torch.save reports a full disk as a RuntimeError of its zip writer
            raise CheckpointError(f"writing {path} failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                                  f"{_room(Path(path).parent)}") from exc
        self.written[Path(path)] = writer.record()
        if self.after_each is not None:
            self.after_each(Path(path))

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _room(folder: Path) -> str:
    """What is left on the file system of `folder`, in words: the likeliest cause of a write that failed."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "the free space of its file system cannot be read"
    full = "no space left on device: " if free < (1 << 20) else ""
    return f"{full}{free / 1e6:,.1f} MB free on its file system"


def _version() -> str:
    try:
        from importlib.metadata import version

        return f"deepspeed {version('deepspeed')}"
    except Exception:  # noqa: BLE001 - only for the message
        return "deepspeed of unknown version"
