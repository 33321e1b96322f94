"""Pure arithmetic shared by plan, trainer and converter: parameters, vocab padding, FLOPs, bytes.

No torch and no config loading: functions take the config sections they need and return numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bigscience_ops.config import ModelConfig

GB = 10**9


# ----------------------------------------------------------------------------- parameters

def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP."""
    multiple = divisible_by * tensor_parallel
    return math.ceil(vocab_size / multiple) * multiple


def seed_formula_parameters(model: ModelConfig) -> int:
    """The tr1-13B notes' sanity check: l*(12h^2 + 13h) + v*h + s*h (unpadded vocab, ffn = 4h)."""
    h, l, v, s = model.hidden_size, model.num_layers, model.vocab_size, model.seq_length
    return l * (12 * h**2 + 13 * h) + v * h + s * h


@dataclass(frozen=True)
class ParamCount:
    padded_vocab: int
    seed_formula: int  # the tr1-13B notes' formula, for comparison with the training notes' "13B", "104B"
    total: int  # unique parameters of the model
    per_stage: tuple[int, ...]  # on each pipeline stage, per tensor rank, as Megatron reports them

    @property
    def max_per_gpu(self) -> int:
        return max(self.per_stage)


def ffn_size(model: ModelConfig) -> int:
    return model.ffn_hidden_size if model.ffn_hidden_size is not None else 4 * model.hidden_size


def _positions(model: ModelConfig) -> int:
    return model.max_position_embeddings or model.seq_length


def count_parameters(model: ModelConfig, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> ParamCount:
    """Exact counts: padded vocab, the real ffn size, LayerNorms and biases.

    Per stage follows Megatron's `number of parameters on (tensor, pipeline) model parallel rank`:
    matrices split over TP, biases of row-parallel layers and LayerNorms replicated; the first
    stage holds the embeddings, the last the final LayerNorm and, when PP > 1, a copy of the word
    embedding for the tied output head.
    """
    h, f, tp = model.hidden_size, ffn_size(model), tensor_parallel
    vocab = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, tp)
    layer = (2 * h  # input LayerNorm
             + 3 * h * h // tp + 3 * h // tp  # fused QKV, column parallel
             + h * h // tp + h  # attention output, row parallel (bias replicated)
             + 2 * h  # post-attention LayerNorm
             + h * f // tp + f // tp  # h -> ffn, column parallel
             + f * h // tp + h)  # ffn -> h, row parallel
    word = vocab * h // tp
    embed = word + _positions(model) * h + (2 * h if model.embed_layernorm else 0)
    layers_per_stage = model.num_layers // pipeline_parallel
    stages = [layers_per_stage * layer for _ in range(pipeline_parallel)]
    stages[0] += embed
    stages[-1] += 2 * h + (word if pipeline_parallel > 1 else 0)
    total_layer = 4 * h * h + 2 * h * f + 9 * h + f
    total = model.num_layers * total_layer + vocab * h + _positions(model) * h + 2 * h
    total += 2 * h if model.embed_layernorm else 0
    return ParamCount(vocab, seed_formula_parameters(model), total, tuple(stages))


# ----------------------------------------------------------------------------- memory and time


# ----------------------------------------------------------------------------- bytes and FLOPs

# Bytes per parameter while training, as the tr1-13B notes breaks them down for mixed precision.
TRAIN_BYTES = {
    "mixed": {"fp32 weights": 4, "half weights": 2, "optimizer states": 8, "gradients": 4},
    "fp32": {"fp32 weights": 4, "optimizer states": 8, "gradients": 4},
}
# What a checkpoint holds per parameter: half (or fp32) weights, and optionally fp32 master + Adam.
CHECKPOINT_BYTES = {"mixed": (2, 2 + 4 + 8), "fp32": (4, 4 + 8)}


def estimate_days(tokens: float, params: float, gpus: int, tflops_per_gpu: float) -> float:
    """The tr1-13B notes' estimate: 8 * tokens * params / (gpus * TFLOPs), in days."""
    return 8 * tokens * params / (gpus * tflops_per_gpu * 1e12 * 86400)


def model_flops_per_token(model: ModelConfig, params: int) -> int:
    """Training FLOPs per token: 6N plus attention's 12 * layers * hidden * seq."""
    return 6 * params + 12 * model.num_layers * model.hidden_size * model.seq_length


# ----------------------------------------------------------------------------- activations

def layer_activation_bytes(model: ModelConfig, micro_batch: int, tensor_parallel: int) -> int:
    """Activations one transformer layer keeps for the backward pass of one micro-batch (16-bit).

    Megatron's count (Korthikanti et al. 2022, "Reducing Activation Recomputation", table 2, no
    sequence parallelism): s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes: LayerNorm inputs and dropout
    masks are replicated over TP, the attention and MLP inner activations are split, and the
    a*s*s attention scores (softmax output and its dropout mask) grow with the square of seq.
    """
    s, b, h, a, t = model.seq_length, micro_batch, model.hidden_size, model.num_attention_heads, tensor_parallel
    return math.ceil(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))


def checkpointed_layer_bytes(model: ModelConfig, micro_batch: int) -> int:
    """With full activation checkpointing a layer keeps only its 16-bit input: 2*s*b*h bytes."""
    return 2 * model.seq_length * micro_batch * model.hidden_size


def in_flight_micro_batches(stage: int, pipeline: int, micro_batches_per_step: int) -> int:
    """1F1B: stage i runs PP - i forward passes before its first backward, so it holds that many."""
    return max(1, min(pipeline - stage, micro_batches_per_step))


@dataclass(frozen=True)
class StageActivations:
    stage: int
    in_flight: int  # micro-batches whose activations the stage holds at once
    stored: int  # bytes kept between forward and backward for all of them
    recompute: int  # bytes of one layer rebuilt in the backward pass (activation checkpointing), else 0
    logits: int  # the last stage's fp32 logits for the cross entropy of one micro-batch

    @property
    def total(self) -> int:
        return self.stored + self.recompute + self.logits


def activation_bytes(model: ModelConfig, micro_batch: int, tensor_parallel: int, pipeline: int,
                     micro_batches_per_step: int, checkpointing: bool, padded_vocab: int,
                     bytes_per_value: int = 2) -> tuple[StageActivations, ...]:
    """Activation memory of each pipeline stage under the 1F1B schedule.

    `bytes_per_value` is 2 for fp16/bf16 and 4 for fp32 training (Megatron's count assumes 16 bits
    and 1-byte dropout masks; fp32 doubles it, a slight overestimate of the masks).
    """
    scale = bytes_per_value / 2
    layers = model.num_layers // pipeline
    full = layer_activation_bytes(model, micro_batch, tensor_parallel)
    per_layer = checkpointed_layer_bytes(model, micro_batch) if checkpointing else full
    stages = []
    for stage in range(pipeline):
        flight = in_flight_micro_batches(stage, pipeline, micro_batches_per_step)
        logits = 4 * model.seq_length * micro_batch * padded_vocab // tensor_parallel if stage == pipeline - 1 else 0
        stages.append(StageActivations(stage, flight, math.ceil(scale * flight * layers * per_layer),
                                       math.ceil(scale * full) if checkpointing else 0, logits))
    return tuple(stages)


# ----------------------------------------------------------------------------- GPU memory limits

GIB = 2**30
# Memory of one GPU by Slurm constraint as clusters name them; vendors' "GB" here are GiB.
KNOWN_GPU_MEMORY_GB = {
    "v100-16g": 16, "v100-32g": 32, "v100": 32, "a100-40g": 40, "a100-80g": 80, "a100": 80,
    "h100": 80, "h100-80g": 80, "h100-94g": 94, "h200": 141, "a10": 24, "l40s": 48,
}


def gpu_memory_from_constraint(constraint: str | None) -> tuple[str, float] | None:
    """(feature, GB) for the first feature of a Slurm --constraint this table knows, else None."""
    if not constraint:
        return None
    import re

    for feature in re.split(r"[&|,\[\]()*\s]+", constraint.lower()):
        if feature in KNOWN_GPU_MEMORY_GB:
            return feature, KNOWN_GPU_MEMORY_GB[feature]
        sized = re.fullmatch(r"[a-z]+\d+[a-z]*-(\d+)gb?", feature)
        if sized:
            return feature, float(sized.group(1))
    return None


# ----------------------------------------------------------------------------- checkpoints over a run

def save_steps(last_step: int, save_schedule: list, save_interval: int | None) -> list[int]:
    """Every step the trainer saves, up to `last_step`, plus `last_step` itself (the final save).

    The same rule as trainer/checkpointing.save_due, by ranges instead of step by step: each range
    saves at previous_until + k * interval, then save_interval counts from the last range's end.
    """
    steps: list[int] = []
    start = 0
    for rng in save_schedule:
        steps.extend(range(start + rng.interval, min(rng.until, last_step) + 1, rng.interval))
        start = rng.until
    if save_interval is not None and start < last_step:
        steps.extend(range(start + save_interval, last_step + 1, save_interval))
    return steps if steps and steps[-1] == last_step else steps + [last_step]


def kept_on_scratch(steps: list[int], keep_last: int | None, keep_every: int | None) -> list[int]:
    """The checkpoints retention leaves at the end: the newest keep_last and every keep_every-th step."""
    if keep_last is None:
        return list(steps)
    newest = set(steps[-keep_last:])
    return [s for s in steps if s in newest or (keep_every is not None and s % keep_every == 0)]
