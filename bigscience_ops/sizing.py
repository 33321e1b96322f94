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
