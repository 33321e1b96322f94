"""Pure arithmetic shared by plan, trainer and converter: parameters, vocab padding, FLOPs, bytes.

`size_run` computes in one call what a run occupies (parameters, GPU memory per stage, checkpoint
storage, GPU-days per phase); the plan checks those numbers. No torch and no config loading:
functions take the config sections they need and return numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from bigscience_ops.schema import Experiment, ModelConfig

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
    blocks_per_stage: tuple[int, ...] = ()  # transformer blocks on each stage
    parts: tuple[int, ...] = ()  # stage boundaries over the pipeline layers (DeepSpeed's PipelineModule.parts)

    @property
    def max_per_gpu(self) -> int:
        return max(self.per_stage)


def ffn_size(model: ModelConfig) -> int:
    return model.ffn_hidden_size if model.ffn_hidden_size is not None else 4 * model.hidden_size


def _positions(model: ModelConfig) -> int:
    """Rows of the learned position table; ALiBi has none."""
    if model.position_embedding == "alibi":
        return 0
    return model.max_position_embeddings or model.seq_length


def pipeline_layers(model: ModelConfig, tensor_parallel: int = 1) -> list[tuple[str, int]]:
    """The trainer's pipeline layers in order (trainer/model.layer_specs): class name, parameters per TP rank.

    The word embedding, with positions (and its LayerNorm), then the blocks, the final LayerNorm and the
    tied output head (the word embedding again). These are the names and weights DeepSpeed's partition
    methods see: `type:REGEX` matches the class names, `parameters` the counts.
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
    return [(EMBEDDING, embed)] + [(BLOCK, layer)] * model.num_layers + [("FinalNorm", 2 * h), (EMBEDDING, word)]


EMBEDDING, BLOCK = "EmbeddingPipe", "TransformerBlock"
PARTITION_METHODS = ("uniform: the same number of layers per stage; parameters: balanced parameter counts; "
                     "type:REGEX: balanced counts of the layers whose class name matches REGEX (case-insensitive), "
                     "e.g. type:transformer (the blocks) or type:transformer|embedding (the embeddings count as layers)")


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ds_utils.partition_uniform: stage boundaries, the first stages one item longer."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """DeepSpeed's ds_utils.partition_balanced: the linear partition minimising max - min part weight.

    The same dynamic programme, the same tie-breaking (the last split of equal cost wins), so the
    boundaries are DeepSpeed's own.
    """
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = math.inf
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    dp_max[0][0] = 0
    dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                max_sum, min_sum = max(dp_max[k][j - 1], part), min(dp_min[k][j - 1], part)
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j], dp_max[i][j], dp_min[i][j], position[i][j] = cost, max_sum, min_sum, k
    parts = [n]
    for j in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][j])
    return parts[::-1]


def check_partition_method(method: str) -> None:
    """Raise ValueError unless DeepSpeed's PipelineModule accepts `method` for this model's layers."""
    lowered = method.lower()
    if lowered in ("uniform", "parameters"):
        return
    if not lowered.startswith("type:"):
        raise ValueError(PARTITION_METHODS)
    pattern = method.split(":")[1]
    try:
        regex = re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a regular expression ({exc}); {PARTITION_METHODS}") from None
    names = (EMBEDDING, BLOCK, "FinalNorm")
    if not pattern or not any(regex.search(name) for name in names):
        raise ValueError(f"{pattern!r} matches none of the layer classes {', '.join(names)}; {PARTITION_METHODS}")


def partition(method: str, layers: list[tuple[str, int]], stages: int) -> list[int]:
    """Stage boundaries over `layers` as DeepSpeed's PipelineModule._partition_layers computes them."""
    check_partition_method(method)
    lowered = method.lower()
    if lowered == "uniform":
        return partition_uniform(len(layers), stages)
    if lowered == "parameters":
        return partition_balanced([count for _, count in layers], stages)
    regex = re.compile(lowered.split(":")[1], re.IGNORECASE)
    return partition_balanced([1 if regex.search(name) else 0 for name, _ in layers], stages)


def count_parameters(model: ModelConfig, tensor_parallel: int = 1, pipeline_parallel: int = 1,
                     partition_method: str = "type:transformer") -> ParamCount:
    """Exact counts: padded vocab, the real ffn size, LayerNorms and biases.

    Per stage follows Megatron's `number of parameters on (tensor, pipeline) model parallel rank`:
    matrices split over TP, biases of row-parallel layers and LayerNorms replicated. The stages hold
    the layers DeepSpeed's partition gives them (`partition_method`); the tied word embedding is
    built once on a stage holding the embedding, the head or both (a head-only stage holds the word
    embedding without positions).
    """
    h, f = model.hidden_size, ffn_size(model)
    layers = pipeline_layers(model, tensor_parallel)
    parts = partition(partition_method, layers, pipeline_parallel)
    stages, blocks = [], []
    for start, stop in zip(parts, parts[1:]):
        names = [name for name, _ in layers[start:stop]]
        count = sum(c for name, c in layers[start:stop] if name != EMBEDDING)
        if start == 0 and stop > 0:
            count += layers[0][1]  # the embedding with positions (the tied module built from the first spec)
        elif stop == len(layers) and stop > start:
            count += layers[-1][1]  # the head's copy of the word embedding
        stages.append(count)
        blocks.append(names.count(BLOCK))
    vocab = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, tensor_parallel)
    total_layer = 4 * h * h + 2 * h * f + 9 * h + f
    total = model.num_layers * total_layer + vocab * h + _positions(model) * h + 2 * h
    total += 2 * h if model.embed_layernorm else 0
    return ParamCount(vocab, seed_formula_parameters(model), total, tuple(stages), tuple(blocks), tuple(parts))

# ----------------------------------------------------------------------------- bytes and FLOPs

# Bytes per parameter while training, as the tr1-13B notes breaks them down for mixed precision.
TRAIN_BYTES = {
    "mixed": {"fp32 weights": 4, "half weights": 2, "optimizer states": 8, "gradients": 4},
    "fp32": {"fp32 weights": 4, "optimizer states": 8, "gradients": 4},
}


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
                     bytes_per_value: int = 2, blocks_per_stage: tuple[int, ...] = ()) -> tuple[StageActivations, ...]:
    """Activation memory of each pipeline stage under the 1F1B schedule.

    `bytes_per_value` is 2 for fp16/bf16 and 4 for fp32 training (Megatron's count assumes 16 bits
    and 1-byte dropout masks; fp32 doubles it, a slight overestimate of the masks). `blocks_per_stage`
    gives each stage's transformer blocks (an uneven partition); default: num_layers / pipeline each.
    """
    scale = bytes_per_value / 2
    blocks = blocks_per_stage or (model.num_layers // pipeline,) * pipeline
    full = layer_activation_bytes(model, micro_batch, tensor_parallel)
    per_layer = checkpointed_layer_bytes(model, micro_batch) if checkpointing else full
    stages = []
    for stage in range(pipeline):
        flight = in_flight_micro_batches(stage, pipeline, micro_batches_per_step)
        logits = 4 * model.seq_length * micro_batch * padded_vocab // tensor_parallel if stage == pipeline - 1 else 0
        stages.append(StageActivations(stage, flight, math.ceil(scale * flight * blocks[stage] * per_layer),
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
    for feature in re.split(r"[&|,\[\]()*\s]+", constraint.lower()):
        if feature in KNOWN_GPU_MEMORY_GB:
            return feature, KNOWN_GPU_MEMORY_GB[feature]
        sized = re.fullmatch(r"[a-z]+\d+[a-z]*-(\d+)gb?", feature)
        if sized:
            return feature, float(sized.group(1))
    return None


# ----------------------------------------------------------------------------- one checkpoint's files

# What a checkpoint of this trainer holds besides its tensors' own bytes, measured on its checkpoints
# (DeepSpeed's layout in torch's zip format): each torch.save file's headers and pickle, each stored
# tensor's zip entries and alignment, an unsharded Adam state's records per parameter (step, exp_avg,
# exp_avg_sq), an engine-state file, a ZeRO partition file's own records, each rank's RNG states and
# bsops.json (the resolved config). A 64-wide test model feels them (5% of its checkpoint); from tiny's
# 5M parameters on they are below 0.2%.
TORCH_FILE_BYTES = 1_400
TENSOR_ENTRY_BYTES = 290
ADAM_ENTRY_BYTES = 780
MODEL_STATES_FILE_BYTES = 3_000
OPTIM_FILE_BYTES = 6_000
BF16_STATE_BYTES = 4_000  # bf16 without ZeRO: the optimizer's state dict records in each model-states file
RNG_STATE_BYTES = 19_800
META_BYTES = 6_000
MANIFEST_BYTES = 330  # manifest.json: its fields, and one entry (path, size, xxh3_128) per file of the checkpoint
MANIFEST_ENTRY_BYTES = 100
BLOCK_TENSORS = 12  # two LayerNorms, QKV, attention output, two MLP matrices: a weight and a bias each


def layer_tensors(model: ModelConfig) -> list[int]:
    """Parameter tensors of each of pipeline_layers' layers: the embedding (words, positions, its
    LayerNorm), the blocks, the final LayerNorm, the head (the tied word embedding)."""
    embedding = 1 + (1 if _positions(model) else 0) + (2 if model.embed_layernorm else 0)
    return [embedding] + [BLOCK_TENSORS] * model.num_layers + [2, 1]


@dataclass(frozen=True)
class CheckpointSize:
    """One `global_stepN/` of this trainer, file by file, in bytes.

    weights: DeepSpeed's `layer_NN[-model_TT]-model_states.pt`, one per layer and TP rank at the
    training precision's width; the tied head is the embedding's module, saved once. optimizer: Adam's
    two fp32 moments per parameter, plus fp32 master weights under mixed precision and in ZeRO's
    partitions; held by each model-parallel rank's `mp_rank_NN_model_states.pt` at ZeRO-0 (fp32 or fp16),
    else split over the DP ranks' `*zero_pp_rank_D_mp_rank_NN_optim_states.pt` (ZeRO-1, and DeepSpeed's
    bf16 optimizer at any stage; without ZeRO that optimizer's state of DP rank 0 is written into the
    model-states file as well). The tied word embedding is in the optimizer of both stages that hold it.
    records: the engine-state files, every rank's `rng_state_NNN.pt`, bsops.json, manifest.json. Checked against every run
    of the configurations matrix (tests/trainer/test_trainer_matrix_*.py: fp32, bf16 and fp16 x ZeRO-0 and 1 x
    PP, TP, DP; within 2%).
    """

    weights: int
    optimizer: int
    records: int
    files: int  # in global_stepN/

    @property
    def total(self) -> int:
        return self.weights + self.optimizer + self.records

    @property
    def weights_only(self) -> int:
        """What a weights-only backup copy keeps: everything but the optimizer states."""
        return self.weights + self.records


def partitioned_optimizer(exp: Experiment) -> bool:
    """Whether DeepSpeed saves the optimizer in per-DP-rank partition files (ZeRO-1, or its bf16 optimizer)."""
    return exp.parallel.zero_stage >= 1 or exp.train.precision == "bf16"


def checkpoint_size(exp: Experiment, params: ParamCount, dp: int) -> CheckpointSize:
    """The bytes of one checkpoint of `exp` trained at `dp` DP ranks, from the shapes."""
    tp, pp, dp = exp.parallel.tensor, exp.parallel.pipeline, max(dp, 1)
    layers, tensors = pipeline_layers(exp.model, tp), layer_tensors(exp.model)
    width = 4 if exp.train.precision == "fp32" else 2
    weights = tp * sum(width * count + TORCH_FILE_BYTES + TENSOR_ENTRY_BYTES * n
                       for (_, count), n in zip(layers[:-1], tensors[:-1]))
    stage_tensors = []
    for start, stop in zip(params.parts, params.parts[1:]):
        n = sum(t for (name, _), t in zip(layers[start:stop], tensors[start:stop]) if name != EMBEDDING)
        if start == 0 and stop > 0:
            n += tensors[0]
        elif stop == len(layers) and stop > start:
            n += tensors[-1]
        stage_tensors.append(n)
    partitioned = partitioned_optimizer(exp)
    per_param = 8 + (4 if partitioned or width == 2 else 0)  # Adam's moments, fp32 master weights
    optimizer = tp * sum(per_param * count for count in params.per_stage)
    if partitioned:
        optimizer += tp * pp * dp * OPTIM_FILE_BYTES
        if exp.parallel.zero_stage == 0:  # bf16 without ZeRO: each model-states file holds DP rank 0's partition too
            optimizer += tp * sum(12 * (count // dp) for count in params.per_stage) + tp * pp * BF16_STATE_BYTES
    else:
        optimizer += tp * ADAM_ENTRY_BYTES * sum(stage_tensors)
    files = tp * (len(layers) - 1) + tp * pp * (1 + dp * (2 if partitioned else 1)) + 1  # layers, mp_rank, optim, rng
    records = (tp * pp * MODEL_STATES_FILE_BYTES + tp * pp * dp * RNG_STATE_BYTES + META_BYTES + MANIFEST_BYTES
               + MANIFEST_ENTRY_BYTES * files)
    return CheckpointSize(weights, optimizer, records, files + 1)  # and the manifest


# ----------------------------------------------------------------------------- checkpoints over a run

def saved_steps(schedule_steps: Sequence[int], train_iters: int, exit_interval: int | None,
                phase_ends: Sequence[int]) -> list[int]:
    """Every step the trainer saves at (trainer/stopping.py, checkpointing.py): the save schedule's, the
    final step included; each multiple of checkpoint.exit_interval before the end (the task saves and
    exits, the next resumes there); the last step of each node phase but the last (the task saves and
    exits, the next trains at the new size). A step saved twice is written once."""
    steps = set(schedule_steps) | {s for s in phase_ends if 0 < s < train_iters}
    if exit_interval:
        steps |= set(range(exit_interval, train_iters, exit_interval))
    return sorted(steps)


def time_limit_exits(phase_minutes: Sequence[float], exit_minutes: int, stops_per_phase: Sequence[int]) -> int:
    """About how many tasks end at checkpoint.exit_duration_in_mins (each saves): a phase of M minutes
    takes ceil(M / exit_minutes) tasks, less the task ends its exit-interval saves make already."""
    return sum(max(0, math.ceil(minutes / exit_minutes) - 1 - stops)
               for minutes, stops in zip(phase_minutes, stops_per_phase))


def kept_on_scratch(steps: list[int], keep_last: int | None, keep_every: int | None) -> list[int]:
    """The checkpoints retention leaves at the end: the newest keep_last and every keep_every-th step."""
    if keep_last is None:
        return list(steps)
    newest = set(steps[-keep_last:])
    return [s for s in steps if s in newest or (keep_every is not None and s % keep_every == 0)]


# ----------------------------------------------------------------------------- what a run occupies

@dataclass(frozen=True)
class Memory:
    bytes_per_param: int
    training_total: int  # bytes per model replica (TP x PP GPUs)
    training_seed_rounded: int  # bytes_per_param x size rounded to whole billions, as the training notes write it
    per_gpu: int  # model states of the largest stage, ZeRO / bf16-optimizer sharding included
    sharded_over: int  # DP ranks the fp32 master weights and Adam moments are split over (1: not sharded)
    model_states_per_stage: tuple[int, ...]  # bytes per GPU of each stage: weights, gradients, optimizer
    activations: tuple[StageActivations, ...]
    gpu_limit: int | None  # bytes of one GPU, or None when unknown (or a CPU run)
    gpu_limit_source: str  # "slurm.gpu_memory_gb", "slurm.constraint <feature>", or "" when unknown

    @property
    def total_per_stage(self) -> tuple[int, ...]:
        return tuple(m + a.total for m, a in zip(self.model_states_per_stage, self.activations))

    @property
    def largest_stage(self) -> int:
        totals = self.total_per_stage
        return totals.index(max(totals))

    @property
    def largest_total(self) -> int:
        return max(self.total_per_stage)


def sharded_over(exp: Experiment, dp: int) -> int:
    """ZeRO-1 splits the fp32 master weights and Adam moments over DP; so does DeepSpeed's bf16
    optimizer (BF16_Optimizer) even at ZeRO stage 0."""
    return max(dp, 1) if exp.parallel.zero_stage >= 1 or exp.train.precision == "bf16" else 1


def gpu_limit(exp: Experiment) -> tuple[int | None, str]:
    if exp.slurm.device != "gpu":
        return None, ""
    if exp.slurm.gpu_memory_gb is not None:
        return int(exp.slurm.gpu_memory_gb * GIB), "slurm.gpu_memory_gb"
    known = gpu_memory_from_constraint(exp.slurm.constraint)
    if known is None:
        return None, ""
    return int(known[1] * GIB), f"slurm.constraint {known[0]}"


def memory(exp: Experiment, params: ParamCount, dp: int) -> Memory:
    kind = "fp32" if exp.train.precision == "fp32" else "mixed"
    parts = TRAIN_BYTES[kind]
    per_param = sum(parts.values())
    sharded = parts["optimizer states"] + (parts["fp32 weights"] if kind == "mixed" else 0)
    shard = sharded_over(exp, dp)
    states = tuple(math.ceil(n * ((per_param - sharded) + sharded / shard)) for n in params.per_stage)
    b, p = exp.batch, exp.parallel
    micro_batches = max(1, b.global_batch_size // max(1, b.micro_batch_size * max(dp, 1)))
    activations = activation_bytes(exp.model, b.micro_batch_size, p.tensor, p.pipeline, micro_batches,
                                   p.activation_checkpointing, params.padded_vocab,
                                   4 if exp.train.precision == "fp32" else 2, params.blocks_per_stage)
    limit, source = gpu_limit(exp)
    return Memory(per_param, per_param * params.total, per_param * round(params.total / GB) * GB, max(states),
                  shard, states, activations, limit, source)


@dataclass(frozen=True)
class Storage:
    """Checkpoints over the whole run: what the trainer saves and what retention and backup keep."""

    saves: int  # checkpoints the trainer writes: the save schedule's, the final one and the task ends it knows
    schedule_saves: int  # of them, the save schedule's (save_interval, save_schedule), the final one included
    exit_saves: int  # of them, task ends at checkpoint.exit_interval and node phase boundaries
    time_exit_saves: int | None  # about this many more at exit_duration_in_mins at the estimated time; None: unknown
    checkpoint: CheckpointSize  # one checkpoint's files
    checkpoint_bytes: int  # one checkpoint on scratch: weights, optimizer states, records
    weights_bytes: int  # one checkpoint without optimizer states
    written: int  # (saves + time_exit_saves) x checkpoint_bytes: scratch at the end with no retention
    kept_on_scratch: int  # checkpoints retention leaves (backup.keep_last / keep_every); all without it
    scratch: int  # bytes on scratch at the end of the run
    backed_up_whole: int  # checkpoints the backup keeps with optimizer states (the last, every keep_optimizer_every-th)
    backup: int  # bytes in the backup (0 without backup.dest)

    @property
    def total_saves(self) -> int:
        """The saves the trainer writes, those at time limits included (about)."""
        return self.saves + (self.time_exit_saves or 0)


def storage(exp: Experiment, params: ParamCount, dp: int, steps: Sequence[int], schedule_saves: int,
            time_exit_saves: int | None = None) -> Storage:
    """Checkpoint bytes of a run saving at `steps` (saved_steps: `schedule_saves` of them the save
    schedule's) at `dp` DP ranks, and about `time_exit_saves` more at task time limits."""
    bk, steps = exp.backup, list(steps)
    ck = checkpoint_size(exp, params, dp)
    whole, weights = ck.total, ck.weights_only
    more = time_exit_saves or 0
    count = len(steps) + more
    kept = kept_on_scratch(steps, bk.keep_last, bk.keep_every)
    on_scratch = len(kept) + (more if bk.keep_last is None else 0)
    full = [s for s in steps if s == steps[-1] or (bk.keep_optimizer_every and s % bk.keep_optimizer_every == 0)]
    backup = 0 if bk.dest is None else len(full) * whole + (count - len(full)) * weights
    return Storage(len(steps), schedule_saves, len(steps) - schedule_saves, time_exit_saves, ck, whole, weights,
                   count * whole, on_scratch, on_scratch * whole, len(full) if bk.dest else 0, backup)


@dataclass(frozen=True)
class RunSize:
    """What a run occupies, computed once: its parameters, GPU memory, checkpoint storage and GPU time."""

    params: ParamCount
    ffn: int  # the model's ffn size, derived (4 x hidden) when not given
    memory: Memory
    storage: Storage
    days: tuple[float | None, ...]  # per node phase, at estimate.tflops_per_gpu; None on CPU (no estimate)
    days_seed_rounded: tuple[float | None, ...]  # likewise, with the seed formula's size rounded to whole billions


def size_run(exp: Experiment, dp: int, save_steps: Sequence[int], phase_work: Sequence[tuple[int, int]],
             schedule_saves: int | None = None, exit_stops: Sequence[int] = ()) -> RunSize:
    """The run's sizes: memory at `dp` DP ranks, storage of `save_steps` (saved_steps; `schedule_saves` of
    them the save schedule's, all by default), and the days of each phase's (tokens, GPUs) in `phase_work`,
    with `exit_stops` exit-interval task ends in each phase (for the time-limit ends between them).

    A CPU run (slurm.device: cpu) gets no time: the TFLOPs rate is a GPU's, and nothing measures a CPU's.
    """
    p, tflops = exp.parallel, exp.estimate.tflops_per_gpu
    params = count_parameters(exp.model, p.tensor, p.pipeline, p.partition_method)
    rounded = round(params.seed_formula / GB) * GB
    days: tuple[float | None, ...] = tuple(None for _ in phase_work)
    days_rounded = days
    time_exits = None
    if exp.slurm.device == "gpu":
        days = tuple(estimate_days(tokens, params.total, gpus, tflops) for tokens, gpus in phase_work)
        days_rounded = tuple(estimate_days(tokens, rounded, gpus, tflops) for tokens, gpus in phase_work)
        time_exits = time_limit_exits([d * 1440 for d in days], exp.checkpoint.exit_duration_in_mins,
                                      list(exit_stops) or [0] * len(days))
    schedule = len(save_steps) if schedule_saves is None else schedule_saves
    return RunSize(params, ffn_size(exp.model), memory(exp, params, dp),
                   storage(exp, params, dp, save_steps, schedule, time_exits), days, days_rounded)


@dataclass(frozen=True)
class GPTShape:
    """What the trainer's layers need from the experiment: ModelConfig with derived sizes filled in (also
    recorded in each checkpoint's bsops.json, and written there by a warm start)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    padded_vocab_size: int
    embed_layernorm: bool
    init_method_std: float
    hidden_dropout: float
    attention_dropout: float
    layernorm_epsilon: float
    position_embedding: str = "learned"  # learned | alibi

    @classmethod
    def from_experiment(cls, exp) -> GPTShape:
        m = exp.model
        return cls(
            num_layers=m.num_layers,
            hidden_size=m.hidden_size,
            num_attention_heads=m.num_attention_heads,
            ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
            seq_length=m.seq_length,
            max_position_embeddings=m.max_position_embeddings or m.seq_length,
            padded_vocab_size=padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, exp.parallel.tensor),
            embed_layernorm=m.embed_layernorm,
            init_method_std=m.init_method_std,
            hidden_dropout=m.hidden_dropout,
            attention_dropout=m.attention_dropout,
            layernorm_epsilon=m.layernorm_epsilon,
            position_embedding=m.position_embedding,
        )
