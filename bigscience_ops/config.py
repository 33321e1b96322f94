"""The experiment config: typed, frozen dataclasses loaded from trainings/<name>.yaml.

An experiment may start with `base: <other>` and list only what differs. Values are coerced to
the declared types (`10e6` for an int, `6e-5` for a float), unknown keys are rejected with the
valid ones, and every error names the file, the field path, the value and what is allowed.
Values left out that follow from others (ffn size, paths, job name, exit duration) are derived
once here and recorded in `Experiment.derived`, so nothing derived is typed twice.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bigscience_ops import sizing
from bigscience_ops.errors import ConfigError
from bigscience_ops.resources import bundled, is_installed_copy
from bigscience_ops.typedyaml import build, documented, merge, read_yaml


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int = documented(doc="transformer blocks")
    hidden_size: int = documented(doc="model width h")
    num_attention_heads: int = documented(doc="attention heads; must divide hidden_size")
    seq_length: int = documented(doc="tokens per sample")
    ffn_hidden_size: int | None = documented(None, "MLP width; derived as 4 * hidden_size when left out")
    max_position_embeddings: int | None = documented(None, "learned positions; derived as seq_length")
    position_embedding: Literal["learned", "alibi"] = documented(
        "learned", "learned (a position table, GPT-2 and Megatron's default) or alibi (BLOOM's: no table, per-head "
                   "linear biases on the attention scores)")
    vocab_size: int = documented(50257, "tokenizer vocabulary before padding")
    make_vocab_size_divisible_by: int = documented(128, "the vocabulary is padded to a multiple of this x TP")
    embed_layernorm: bool = documented(False, "LayerNorm after the embedding (tr8's stability fix)")
    init_method_std: float = documented(0.02, "std of the normal initialisation")
    hidden_dropout: float = documented(0.1, "dropout on residual branches")
    attention_dropout: float = documented(0.1, "dropout on attention probabilities")
    layernorm_epsilon: float = documented(1e-5, "LayerNorm epsilon")
    kernels: Literal["auto", "triton", "torch"] = documented(
        "auto", "LayerNorm, bias-GeLU, attention and cross-entropy kernels: auto (Triton on CUDA, torch "
                "elsewhere), triton (CUDA, or CPU under TRITON_INTERPRET=1) or torch (the references)")


@dataclass(frozen=True)
class ParallelConfig:
    tensor: int = documented(1, "tensor-parallel size (TP); must divide the attention heads")
    pipeline: int = documented(1, "pipeline-parallel size (PP); at most num_layers")
    partition_method: str = documented(
        "type:transformer", "how DeepSpeed splits the layers over the PP stages, as Megatron-DeepSpeed's "
                            "--pp-partition-method: type:transformer (balanced blocks), type:transformer|embedding "
                            "(the embeddings count as layers), parameters (balanced parameter counts) or uniform")
    zero_stage: Literal[0, 1] = documented(1, "DeepSpeed ZeRO stage for data parallelism")
    activation_checkpointing: bool = documented(False, "recompute transformer blocks in the backward pass")
    collective_timeout_minutes: int = documented(
        30, "a collective waiting this long aborts its process (a hung or dead peer ends the job instead of "
            "holding it to the time limit); must exceed the longest checkpoint save or load a rank waits on")


@dataclass(frozen=True)
class RampupConfig:
    start: int = documented(doc="global batch size at the first step")
    increment: int = documented(doc="batch size added at each increment")
    samples: int = documented(doc="samples over which the batch size ramps up to global_batch_size")


@dataclass(frozen=True)
class BatchConfig:
    global_batch_size: int = documented(doc="samples per optimizer step (GBS)")
    micro_batch_size: int = documented(1, "samples per GPU per micro-step (MBS)")
    rampup: RampupConfig | None = documented(None, "Megatron's --rampup-batch-size start increment samples")


@dataclass(frozen=True)
class TrainConfig:
    samples: int | None = documented(None, "training length in samples (exclusive with iters)")
    iters: int | None = documented(None, "training length in steps (exclusive with samples; no rampup)")
    seed: int = documented(42, "seed for initialisation, dropout and data order")
    precision: Literal["fp32", "fp16", "bf16"] = documented("fp16", "training precision")
    skip_iterations: list[str] = documented(
        factory=list, doc="iteration ranges to step over, e.g. ['100-120'] (1-based, inclusive; Megatron's "
                          "--skip-train-iteration-range): their data is consumed, no update is made")


@dataclass(frozen=True)
class CurriculumConfig:
    total_curriculum_step: int = documented(
        doc="steps from min_difficulty to model.seq_length (seed 001: about train tokens / GBS / seq_length / 2)")
    min_difficulty: int = documented(64, "sequence length of the first steps (a multiple of difficulty_step)")
    difficulty_step: int = documented(8, "sequence lengths are multiples of this (8 for tensor cores)")
    schedule_type: Literal["fixed_linear"] = documented("fixed_linear", "DeepSpeed's seqlen schedule")


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = documented(doc="peak learning rate")
    min_lr: float = documented(0.0, "learning rate at the end of decay")
    beta1: float = documented(0.9, "AdamW beta1")
    beta2: float = documented(0.999, "AdamW beta2")
    eps: float = documented(1e-8, "AdamW epsilon")
    weight_decay: float = documented(0.01, "AdamW weight decay")
    clip_grad: float = documented(1.0, "global gradient-norm clipping; 0 disables")


@dataclass(frozen=True)
class LRScheduleConfig:
    style: Literal["cosine", "linear", "constant"] = documented("cosine", "decay shape after warmup")
    warmup_samples: int | None = documented(None, "warmup length in samples")
    warmup_tokens: int | None = documented(None, "warmup length in tokens (converted to samples)")
    warmup_iters: int | None = documented(None, "warmup length in steps (converted to samples)")
    decay_samples: int | None = documented(None, "decay length in samples; default: the whole training")
    decay_tokens: int | None = documented(None, "decay length in tokens (converted to samples)")
    decay_iters: int | None = documented(None, "decay length in steps (converted to samples)")
    override_on_resume: bool = documented(False, "on resume, take the schedule from this config, not the checkpoint")


@dataclass(frozen=True)
class SaveRange:
    until: int = documented(doc="last step (inclusive) this interval applies to")
    interval: int = documented(doc="save every this many steps")


@dataclass(frozen=True)
class CheckpointConfig:
    save_interval: int | None = documented(None, "save every this many steps after the save_schedule ranges")
    save_schedule: list[SaveRange] = documented(factory=list, doc="step ranges with their own save intervals")
    exit_interval: int | None = documented(None, "save and exit once the step is a multiple of this")
    exit_duration_in_mins: int | None = documented(None, "save and exit after this long; derived from slurm.time")
    exit_margin_mins: int | None = documented(None, "minutes kept free before the time limit; derived from model size")
    kill_switch_path: str | None = documented(None, "if this file exists, save and exit; derived under paths.output")


@dataclass(frozen=True)
class DataSource:
    prefix: str = documented(doc="indexed dataset prefix (without .bin/.idx)")
    weight: float = documented(1.0, "blending weight")


@dataclass(frozen=True)
class TokenizerConfig:
    kind: Literal["gpt2-bpe", "json"] = documented("json", "gpt2-bpe: vocab_file + merges_file; json: json_file")
    vocab_file: str | None = documented(None, "GPT-2 vocab.json")
    merges_file: str | None = documented(None, "GPT-2 merges.txt")
    json_file: str | None = documented(None, "a tokenizers tokenizer.json")


@dataclass(frozen=True)
class DataConfig:
    blend: list[DataSource] = documented(factory=list, doc="datasets and their weights")
    split: str = documented("949,50,1", "train,valid,test proportions")
    tokenizer: TokenizerConfig = documented(factory=TokenizerConfig, doc="tokenizer files")
    num_workers: int = documented(2, "data loader workers")
    cache_dir: str | None = documented(
        None, "folder for the dataset index files (.npy); default: beside each dataset, which must then be writable")


@dataclass(frozen=True)
class LoggingConfig:
    log_interval: int = documented(1, "steps between iteration lines")
    eval_interval: int = documented(1000, "steps between validation runs")
    eval_iters: int = documented(5, "validation steps per run; 0 disables validation")
    tensorboard: bool = documented(True, "write TensorBoard events")
    tensorboard_queue_size: int = documented(5, "TensorBoard writer queue size")
    log_timers: bool = documented(True, "timers to TensorBoard")
    log_batch_size: bool = documented(True, "batch size to TensorBoard")
    log_validation_ppl: bool = documented(True, "validation perplexity to TensorBoard")
    codecarbon: bool = documented(False, "record energy with codecarbon")


@dataclass(frozen=True)
class NodePhase:
    nodes: int = documented(doc="--nodes of the array tasks of this phase")
    from_samples: int | None = documented(
        None, "the phase starts at the first step boundary where this many samples are consumed (not on the first phase)")
    from_iteration: int | None = documented(None, "or: the phase starts after this iteration (not on the first phase)")


@dataclass(frozen=True)
class SlurmConfig:
    job_name: str | None = documented(None, "Slurm job name; derived as the experiment name")
    partition: str | None = documented(None, "--partition")
    account: str | None = documented(None, "--account")
    constraint: str | None = documented(None, "--constraint")
    gpu_memory_gb: float | None = documented(
        None, "memory of one GPU in GB as sold (32 for a V100-32GB); default: known from constraint (v100-32g, a100-80g, h100, ...)")
    qos: str | None = documented(None, "--qos")
    time: str = documented("20:00:00", "--time of each array task")
    nodes: int | None = documented(
        None, "--nodes of a run on one node count; derived as 1, or from node_schedule (the phase being launched)")
    node_schedule: list[NodePhase] = documented(
        factory=list, doc="phases with their own node counts: [{nodes: 16}, {nodes: 64, from_samples: N}, ...]; "
                          "bsops launch and each array task use the phase of the latest checkpoint")
    gpus_per_node: int = documented(1, "training processes per node (GPUs, or CPU processes when device: cpu)")
    device: Literal["gpu", "cpu"] = documented("gpu", "gpu: NCCL and --gres; cpu: gloo")
    cpus_per_task: int = documented(1, "--cpus-per-task of the per-node launcher")
    array: int = documented(1, "array length: tasks run one at a time (--array=1-N%1)")
    group: str | None = documented(None, "watch jobs of every user in this Unix group")
    exclude: list[str] = documented(factory=list, doc="nodes to keep the job off (--exclude)")
    env_setup: list[str] = documented(factory=list, doc="shell lines run before training (trusted shell code, one line per item)",
                                      trusted_shell_line=True)
    master_port: int = documented(6000, "rendezvous port on the first node")
    failure_budget: int = documented(3, "array tasks in a row without progress before the next one stops; 0: never")
    signal_seconds: int | None = documented(
        None, "--signal=B:USR1@N: Slurm warns the job N s before its time limit and the trainer saves and exits; "
              "derived from checkpoint.exit_margin_mins (the time an iteration and a save take)")


@dataclass(frozen=True)
class PathsConfig:
    output: str | None = documented(None, "run folder; derived as runs/<name>")
    checkpoints: str | None = documented(None, "derived as <output>/checkpoints")
    tensorboard: str | None = documented(None, "derived as <output>/tensorboard")
    logs: str | None = documented(None, "derived as <output>/logs")
    codecarbon: str | None = documented(None, "derived as <output>/codecarbon")


@dataclass(frozen=True)
class HubConfig:
    logs_repo: str | None = documented(None, "Hub repo for logs/main_log.txt")
    tensorboard_repo: str | None = documented(None, "Hub repo for TensorBoard events")
    codecarbon_repo: str | None = documented(None, "Hub repo for codecarbon records")
    checkpoints_repo: str | None = documented(None, "Hub repo for converted checkpoints")
    token_env: str = documented("HF_TOKEN", "environment variable holding the Hub token")
    remote_template: str | None = documented(
        None, "push to this git remote instead of the Hub, {repo} replaced by the repo name (file:///srv/mirror/{repo}.git)")
    lfs_size_mb: float = documented(10.0, "files larger than this many MB are stored with git-lfs")
    private: bool = documented(True, "repos bsops creates on the Hub are private")
    push_attempts: int = documented(4, "tries of a failing push (waits 10 s, 20 s, 40 s ... between)")


@dataclass(frozen=True)
class BackupConfig:
    dest: str | None = documented(None, "backup folder (a store outside the training's scratch); bsops backup --to overrides")
    keep_last: int | None = documented(None, "on scratch keep the newest N checkpoints; none: delete nothing")
    keep_every: int | None = documented(None, "on scratch also keep checkpoints whose step is a multiple of this")
    keep_optimizer_every: int | None = documented(
        None, "back up whole (with optimizer states) every checkpoint whose step is a multiple of this, beside the final one")
    tar: bool = documented(False, "one tar file per checkpoint, for stores with few inodes")


@dataclass(frozen=True)
class AlertsConfig:
    email_to: list[str] = documented(factory=list, doc="alert recipients")
    email_from: str | None = documented(None, "sender address")
    smtp_host: str = documented("localhost", "SMTP server")
    smtp_port: int = documented(25, "SMTP port")
    smtp_security: Literal["none", "starttls", "ssl"] = documented("none", "SMTP transport security")
    smtp_user: str | None = documented(None, "SMTP login")
    smtp_password_env: str = documented("BSOPS_SMTP_PASSWORD", "environment variable holding the SMTP password")
    stall_minutes: int = documented(60, "alert when no iteration line was logged for this long")
    cooldown_minutes: int = documented(240, "minimum minutes between two emails about one condition")


@dataclass(frozen=True)
class EstimateConfig:
    tflops_per_gpu: float = documented(45.0, "achieved TFLOPs per GPU used for the duration estimate")
    peak_tflops: float | None = documented(
        None, "dense bf16/fp16 peak TFLOPs of one GPU for MFU; detected for V100, A100, H100 and H200 when left out")


@dataclass(frozen=True)
class Experiment:
    model: ModelConfig = documented(doc="GPT shape")
    batch: BatchConfig = documented(doc="batch size and rampup")
    train: TrainConfig = documented(doc="training length, seed, precision")
    optimizer: OptimizerConfig = documented(doc="AdamW")
    name: str = documented("", "experiment name: the file name")
    description: str = documented("", "one line on what this experiment is")
    parallel: ParallelConfig = documented(factory=ParallelConfig, doc="TP, PP, ZeRO")
    lr_schedule: LRScheduleConfig = documented(factory=LRScheduleConfig, doc="warmup and decay")
    curriculum: CurriculumConfig | None = documented(
        None, "curriculum learning by sequence length; lr_schedule.*_tokens then count the tokens really trained on")
    checkpoint: CheckpointConfig = documented(factory=CheckpointConfig, doc="saving and exiting")
    data: DataConfig = documented(factory=DataConfig, doc="datasets and tokenizer")
    logging: LoggingConfig = documented(factory=LoggingConfig, doc="log lines and TensorBoard")
    slurm: SlurmConfig = documented(factory=SlurmConfig, doc="resources of each array task")
    paths: PathsConfig = documented(factory=PathsConfig, doc="output folders")
    hub: HubConfig = documented(factory=HubConfig, doc="Hub repos to sync to")
    backup: BackupConfig = documented(factory=BackupConfig, doc="checkpoint backup and scratch retention")
    alerts: AlertsConfig = documented(factory=AlertsConfig, doc="who is told, and how")
    estimate: EstimateConfig = documented(factory=EstimateConfig, doc="assumptions of the plan")
    derived: tuple[str, ...] = field(default=(), metadata={"doc": "field paths computed, not written", "internal": True})

    @property
    def world_size(self) -> int:
        return self.slurm.nodes * self.slurm.gpus_per_node

    @property
    def model_parallel_size(self) -> int:
        return self.parallel.tensor * self.parallel.pipeline


# ----------------------------------------------------------------------------- loading

def default_trainings_dir() -> Path:
    """--trainings-dir, else $BSOPS_TRAININGS, else ./trainings, else the bundled trainings/."""
    env = os.environ.get("BSOPS_TRAININGS")
    if env:
        return Path(env)
    here = Path.cwd() / "trainings"
    if here.is_dir():
        return here
    return bundled("trainings")


def list_experiments(trainings_dir: Path | None = None) -> list[str]:
    directory = trainings_dir or default_trainings_dir()
    return sorted(p.stem for p in directory.glob("*.yaml"))


def experiment_path(name: str, trainings_dir: Path | None = None) -> Path:
    """The file of an experiment given by name or by path."""
    if name.endswith((".yaml", ".yml", ".json")) or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(str(path), "", name, "no such experiment file")
        return path
    directory = trainings_dir or default_trainings_dir()
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(list_experiments(directory)) or "none"
        raise ConfigError(str(directory), "", name, f"no such experiment; known: {known}")
    return path


def load_experiment(name: str, trainings_dir: Path | None = None) -> Experiment:
    """Load, merge `base:` chains, coerce, validate and derive one experiment."""
    path = experiment_path(name, trainings_dir)
    raw, origins = _read_with_bases(path, trainings_dir or path.parent, chain=())
    raw.pop("base", None)
    root = path.resolve().parent.parent
    # The bundled experiments of an installed bsops read the bundled corpus but write under ./ (runs/NAME).
    output_root = Path.cwd() if is_installed_copy(path) else root
    return _build(path.stem, raw, origins, str(path), root, output_root)


def _read_with_bases(path: Path, trainings_dir: Path, chain: tuple[str, ...]) -> tuple[dict, dict]:
    """The merged mapping and, for each field path, the file that set it."""
    if path.stem in chain:
        raise ConfigError(str(path), "base", " -> ".join(chain + (path.stem,)), "base chains must not loop")
    data = read_yaml(path)
    base = data.get("base")
    merged: dict = {}
    origins: dict = {}
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(str(path), "base", base, "the name of another experiment in the same folder")
        base_path = trainings_dir / f"{base}.yaml"
        if not base_path.is_file() and (bundled("trainings") / f"{base}.yaml").is_file():
            base_path = bundled("trainings") / f"{base}.yaml"  # a bundled experiment as a base, from any folder
        if not base_path.is_file():
            known = ", ".join(list_experiments(trainings_dir))
            raise ConfigError(str(path), "base", base, f"no such experiment; known: {known}")
        merged, origins = _read_with_bases(base_path, trainings_dir, chain + (path.stem,))
    _one_node_plan(data, merged, str(path))
    merge(merged, data, origins, str(path), "")
    return merged, origins


def field_origins(name: str, trainings_dir: Path | None = None) -> dict[str, str]:
    """For each field path written in EXP's file or its bases, the file that set it (the last one wins)."""
    path = experiment_path(name, trainings_dir)
    return _read_with_bases(path, trainings_dir or path.parent, chain=())[1]


def _one_node_plan(data: dict, merged: dict, source: str) -> None:
    """slurm.nodes and slurm.node_schedule say one thing: a file sets one of them, and replaces an inherited other."""
    slurm = data.get("slurm")
    if not isinstance(slurm, dict):
        return
    if "nodes" in slurm and slurm.get("node_schedule"):
        raise ConfigError(source, "slurm.node_schedule", slurm["node_schedule"],
                          f"set slurm.nodes ({slurm['nodes']}) or slurm.node_schedule, not both: a schedule's "
                          "first phase is the starting node count")
    inherited = merged.get("slurm")
    if isinstance(inherited, dict):
        if "nodes" in slurm:
            inherited.pop("node_schedule", None)
        if "node_schedule" in slurm:
            inherited.pop("nodes", None)


# ----------------------------------------------------------------------------- validation and derivation

def _check(condition: bool, source: str, dotted: str, value: Any, allowed: str) -> None:
    if not condition:
        raise ConfigError(source, dotted, value, allowed)


def _validate(exp: Experiment, src: str) -> None:
    m, p, b, t = exp.model, exp.parallel, exp.batch, exp.train
    for dotted, value in [
        ("model.num_layers", m.num_layers), ("model.hidden_size", m.hidden_size),
        ("model.num_attention_heads", m.num_attention_heads), ("model.seq_length", m.seq_length),
        ("model.vocab_size", m.vocab_size), ("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by),
        ("parallel.tensor", p.tensor), ("parallel.pipeline", p.pipeline),
        ("batch.global_batch_size", b.global_batch_size), ("batch.micro_batch_size", b.micro_batch_size),
        ("slurm.nodes", 1 if exp.slurm.nodes is None else exp.slurm.nodes), ("slurm.gpus_per_node", exp.slurm.gpus_per_node),
        ("slurm.cpus_per_task", exp.slurm.cpus_per_task), ("slurm.array", exp.slurm.array),
        ("logging.log_interval", exp.logging.log_interval), ("logging.eval_interval", exp.logging.eval_interval),
    ]:
        _check(value >= 1, src, dotted, value, "must be a positive integer")
    _validate_node_schedule(exp.slurm.node_schedule, src)
    _check(m.hidden_size % m.num_attention_heads == 0, src, "model.hidden_size", m.hidden_size,
           f"must be divisible by model.num_attention_heads ({m.num_attention_heads})")
    _check(m.num_layers >= p.pipeline, src, "model.num_layers", m.num_layers,
           f"must be at least parallel.pipeline ({p.pipeline}): every stage holds blocks")
    try:
        sizing.check_partition_method(p.partition_method)
    except ValueError as exc:
        raise ConfigError(src, "parallel.partition_method", p.partition_method, str(exc)) from None
    _check(m.num_attention_heads % p.tensor == 0, src, "parallel.tensor", p.tensor,
           f"must divide model.num_attention_heads ({m.num_attention_heads})")
    if m.ffn_hidden_size is not None:
        _check(m.ffn_hidden_size % p.tensor == 0, src, "model.ffn_hidden_size", m.ffn_hidden_size,
               f"must be divisible by parallel.tensor ({p.tensor})")
    if m.max_position_embeddings is not None:
        _check(m.max_position_embeddings >= m.seq_length, src, "model.max_position_embeddings",
               m.max_position_embeddings, f"must be at least model.seq_length ({m.seq_length})")
    for dotted, value in [("model.hidden_dropout", m.hidden_dropout), ("model.attention_dropout", m.attention_dropout)]:
        _check(0.0 <= value < 1.0, src, dotted, value, "must be in [0, 1)")

    _check((t.samples is None) != (t.iters is None), src, "train", {"samples": t.samples, "iters": t.iters},
           "set exactly one of train.samples and train.iters")
    for dotted, value in [("train.samples", t.samples), ("train.iters", t.iters)]:
        _check(value is None or value >= 1, src, dotted, value, "must be a positive integer")
    if b.rampup is not None:
        r = b.rampup
        _check(t.iters is None, src, "batch.rampup", dataclasses.asdict(r),
               "a batch-size rampup needs train.samples, not train.iters (Megatron rejects the pair)")
        for dotted, value in [("batch.rampup.start", r.start), ("batch.rampup.increment", r.increment),
                              ("batch.rampup.samples", r.samples)]:
            _check(value >= 1, src, dotted, value, "must be a positive integer")
        _check(r.start < b.global_batch_size, src, "batch.rampup.start", r.start,
               f"must be below batch.global_batch_size ({b.global_batch_size})")
        _check((b.global_batch_size - r.start) % r.increment == 0, src, "batch.rampup.increment", r.increment,
               f"must divide global_batch_size - start = {b.global_batch_size} - {r.start} = {b.global_batch_size - r.start}")

    lr = exp.lr_schedule
    for kind in ("warmup", "decay"):
        given = [u for u in ("samples", "tokens", "iters") if getattr(lr, f"{kind}_{u}") is not None]
        _check(len(given) <= 1, src, f"lr_schedule.{kind}_{given[-1] if given else 'samples'}",
               {f"{kind}_{u}": getattr(lr, f"{kind}_{u}") for u in given},
               f"set at most one of {kind}_samples, {kind}_tokens, {kind}_iters")
        for u in given:
            value = getattr(lr, f"{kind}_{u}")
            _check(value >= 0, src, f"lr_schedule.{kind}_{u}", value, "must not be negative")
    opt = exp.optimizer
    _check(opt.lr > 0, src, "optimizer.lr", opt.lr, "must be positive")
    _check(0 <= opt.min_lr <= opt.lr, src, "optimizer.min_lr", opt.min_lr, f"must be in [0, optimizer.lr = {opt.lr}]")
    for dotted, value in [("optimizer.beta1", opt.beta1), ("optimizer.beta2", opt.beta2)]:
        _check(0 <= value < 1, src, dotted, value, "must be in [0, 1)")
    _check(opt.clip_grad >= 0, src, "optimizer.clip_grad", opt.clip_grad, "must not be negative (0 disables)")

    ck = exp.checkpoint
    last = 0
    for i, rng in enumerate(ck.save_schedule):
        _check(rng.interval >= 1, src, f"checkpoint.save_schedule[{i}].interval", rng.interval, "must be a positive integer")
        _check(rng.until > last, src, f"checkpoint.save_schedule[{i}].until", rng.until,
               f"ranges must end in increasing order (previous ends at {last})")
        last = rng.until
    for dotted, value in [("checkpoint.save_interval", ck.save_interval), ("checkpoint.exit_interval", ck.exit_interval),
                          ("checkpoint.exit_duration_in_mins", ck.exit_duration_in_mins)]:
        _check(value is None or value >= 1, src, dotted, value, "must be a positive integer")

    if exp.slurm.device == "cpu":
        _check(t.precision != "fp16", src, "train.precision", t.precision,
               "fp16 needs a GPU; with slurm.device: cpu use fp32 or bf16")
    split = exp.data.split.split(",")
    _check(len(split) == 3 and all(re.fullmatch(r"\d+(\.\d+)?", s.strip()) for s in split)
           and sum(float(s) for s in split) > 0, src, "data.split", exp.data.split,
           "three non-negative numbers such as '949,50,1' (train,valid,test)")
    tok = exp.data.tokenizer
    if tok.kind == "gpt2-bpe":
        _check(tok.vocab_file is not None and tok.merges_file is not None, src, "data.tokenizer", dataclasses.asdict(tok),
               "kind gpt2-bpe needs vocab_file and merges_file")
    for i, ds in enumerate(exp.data.blend):
        _check(ds.weight > 0, src, f"data.blend[{i}].weight", ds.weight, "must be positive")
    for dotted, value in [("alerts.stall_minutes", exp.alerts.stall_minutes),
                          ("alerts.cooldown_minutes", exp.alerts.cooldown_minutes),
                          ("alerts.smtp_port", exp.alerts.smtp_port)]:
        _check(value >= 1, src, dotted, value, "must be a positive integer")
    _check(exp.estimate.tflops_per_gpu > 0, src, "estimate.tflops_per_gpu", exp.estimate.tflops_per_gpu, "must be positive")
    _check(exp.slurm.gpu_memory_gb is None or exp.slurm.gpu_memory_gb > 0, src, "slurm.gpu_memory_gb",
           exp.slurm.gpu_memory_gb, "must be positive (GB of one GPU), or left out")
    _check(exp.estimate.peak_tflops is None or exp.estimate.peak_tflops > 0, src, "estimate.peak_tflops",
           exp.estimate.peak_tflops, "must be positive, or left out to detect the GPU's peak")
    _check(p.collective_timeout_minutes >= 1, src, "parallel.collective_timeout_minutes", p.collective_timeout_minutes,
           "must be a positive integer")
    template = exp.hub.remote_template
    _check(template is None or template.count("{repo}") == 1 and "{" not in template.replace("{repo}", ""), src,
           "hub.remote_template", template, "a git URL with {repo} exactly once, e.g. file:///srv/mirror/{repo}.git")
    _check(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", exp.hub.token_env) is not None, src, "hub.token_env",
           exp.hub.token_env, "the name of an environment variable (letters, digits, _)")
    _check(exp.hub.lfs_size_mb > 0, src, "hub.lfs_size_mb", exp.hub.lfs_size_mb, "must be positive")
    _check(exp.hub.push_attempts >= 1, src, "hub.push_attempts", exp.hub.push_attempts, "must be a positive integer")
    _validate_curriculum(exp, src)
    for key in ("keep_last", "keep_every", "keep_optimizer_every"):
        value = getattr(exp.backup, key)
        _check(value is None or value >= 1, src, f"backup.{key}", value, "must be a positive integer (or left out)")


def _validate_curriculum(exp: Experiment, src: str) -> None:
    from bigscience_ops.schedules import parse_skip_ranges

    try:
        parse_skip_ranges(exp.train.skip_iterations)
    except ValueError as exc:
        raise ConfigError(src, "train.skip_iterations", exp.train.skip_iterations, str(exc)) from None
    c, seq = exp.curriculum, exp.model.seq_length
    if c is None:
        return
    for dotted, value in [("curriculum.min_difficulty", c.min_difficulty), ("curriculum.difficulty_step", c.difficulty_step),
                          ("curriculum.total_curriculum_step", c.total_curriculum_step)]:
        _check(value >= 1, src, dotted, value, "must be a positive integer")
    _check(c.min_difficulty % c.difficulty_step == 0, src, "curriculum.min_difficulty", c.min_difficulty,
           f"must be a multiple of curriculum.difficulty_step ({c.difficulty_step})")
    _check(c.min_difficulty <= seq, src, "curriculum.min_difficulty", c.min_difficulty,
           f"must not exceed model.seq_length ({seq}), the curriculum's end")
    _check(seq % c.difficulty_step == 0, src, "model.seq_length", seq,
           f"must be a multiple of curriculum.difficulty_step ({c.difficulty_step}), or the curriculum never reaches it")


def _validate_node_schedule(schedule: list[NodePhase], src: str) -> None:
    """Each phase's shape; whether the phases start in order (through the rampup) is the plan's check."""
    for i, phase in enumerate(schedule):
        where = f"slurm.node_schedule[{i}]"
        _check(phase.nodes >= 1, src, f"{where}.nodes", phase.nodes, "must be a positive integer")
        starts = {k: v for k in ("from_samples", "from_iteration") if (v := getattr(phase, k)) is not None}
        if i == 0:
            _check(not starts, src, where, starts,
                   "the first phase starts the run: leave out from_samples and from_iteration")
            continue
        _check(len(starts) == 1, src, where, dataclasses.asdict(phase), "set exactly one of from_samples and from_iteration")
        for key, value in starts.items():
            _check(value >= 1, src, f"{where}.{key}", value, "must be a positive integer")
        _check(phase.nodes != schedule[i - 1].nodes, src, f"{where}.nodes", phase.nodes,
               f"must differ from the previous phase's {schedule[i - 1].nodes} nodes (or remove the phase)")


SIGNAL_SECONDS_MAX = 65535


def exit_margin_minutes(num_params: float) -> int:
    """Minutes kept free before the time limit to finish an iteration and write a checkpoint.

    The tr1-13B notes kept 10 minutes for 13B and warned that bigger models need more; the margin grows
    with the square root of the size (about 29 minutes at 104B) and is never below 5 minutes.
    """
    return max(5, math.ceil(10 * math.sqrt(num_params / 13e9)))


def _resolve_path(value: str, root: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else root / path)


def _build(name: str, raw: dict, origins: dict, source: str, root: Path, output_root: Path | None = None) -> Experiment:
    if "name" in raw and raw["name"] != name:
        raise ConfigError(source, "name", raw["name"], f"the name is the file name ({name!r}); remove the key")
    raw = {**raw, "name": name}
    if "derived" in raw:
        raise ConfigError(source, "derived", raw["derived"], "computed by bsops; remove the key")
    exp: Experiment = build(Experiment, raw, "", origins, source)
    _validate(exp, source)
    return derive(exp, root, source, output_root)


def derive(exp: Experiment, root: Path, source: str = "", output_root: Path | None = None) -> Experiment:
    """Fill every field left out that follows from others, and record which were filled.

    Relative paths are resolved against `root` (the folder holding trainings/), those of outputs
    (paths.*, the kill switch, the backup and index cache folders) against `output_root` when given.
    """
    out_root = output_root or root
    from bigscience_ops.slurm import parse_time_limit  # light module: no torch
    from bigscience_ops import sizing

    derived: list[str] = []

    def fill(obj: Any, section: str, **values: Any) -> Any:
        changes = {k: v for k, v in values.items() if getattr(obj, k) is None}
        derived.extend(f"{section}.{k}" for k in changes)
        return dataclasses.replace(obj, **changes) if changes else obj

    m = fill(exp.model, "model", ffn_hidden_size=4 * exp.model.hidden_size,
             max_position_embeddings=exp.model.seq_length)
    output = _resolve_path(exp.paths.output or f"runs/{exp.name}", out_root)
    if exp.paths.output is None:
        derived.append("paths.output")
    paths = dataclasses.replace(exp.paths, output=output)
    paths = fill(paths, "paths", checkpoints=f"{output}/checkpoints", tensorboard=f"{output}/tensorboard",
                 logs=f"{output}/logs", codecarbon=f"{output}/codecarbon")
    paths = dataclasses.replace(paths, **{k: _resolve_path(getattr(paths, k), out_root)
                                          for k in ("checkpoints", "tensorboard", "logs", "codecarbon")})
    data = dataclasses.replace(
        exp.data,
        blend=[dataclasses.replace(d, prefix=_resolve_path(d.prefix, root)) for d in exp.data.blend],
        tokenizer=dataclasses.replace(exp.data.tokenizer, **{
            k: _resolve_path(v, root) for k in ("vocab_file", "merges_file", "json_file")
            if (v := getattr(exp.data.tokenizer, k)) is not None}),
        cache_dir=None if exp.data.cache_dir is None else _resolve_path(exp.data.cache_dir, out_root),
    )
    slurm = fill(exp.slurm, "slurm", job_name=exp.name,
                 nodes=exp.slurm.node_schedule[0].nodes if exp.slurm.node_schedule else 1)
    try:
        limit = parse_time_limit(slurm.time)
    except ValueError as exc:
        raise ConfigError(source, "slurm.time", slurm.time, str(exc)) from None
    backup = exp.backup
    if backup.dest is not None:
        backup = dataclasses.replace(backup, dest=_resolve_path(backup.dest, out_root))
    exp = dataclasses.replace(exp, model=m, paths=paths, data=data, slurm=slurm, backup=backup)
    params = sizing.count_parameters(exp.model, exp.parallel.tensor).total
    ck = fill(exp.checkpoint, "checkpoint", exit_margin_mins=exit_margin_minutes(params),
              kill_switch_path=f"{output}/kill-switch")
    if ck.exit_duration_in_mins is None:
        _check(limit > ck.exit_margin_mins, source, "slurm.time", slurm.time,
               f"must be longer than the exit margin of {ck.exit_margin_mins} minutes")
        ck = fill(ck, "checkpoint", exit_duration_in_mins=limit - ck.exit_margin_mins)
    ck = dataclasses.replace(ck, kill_switch_path=_resolve_path(ck.kill_switch_path, out_root))
    slurm = fill(exp.slurm, "slurm", signal_seconds=min(SIGNAL_SECONDS_MAX, ck.exit_margin_mins * 60))
    _check(1 <= slurm.signal_seconds <= SIGNAL_SECONDS_MAX, source, "slurm.signal_seconds", slurm.signal_seconds,
           f"must be 1 to {SIGNAL_SECONDS_MAX} seconds (Slurm's limit for --signal)")
    return dataclasses.replace(exp, checkpoint=ck, slurm=slurm, derived=tuple(exp.derived) + tuple(derived))


def to_dict(exp: Experiment) -> dict:
    """The resolved experiment as plain data (what `bsops show` prints and run records keep)."""
    data = dataclasses.asdict(exp)
    data.pop("derived")
    return data


def from_dict(data: dict, source: str = "<resolved config>") -> Experiment:
    """Rebuild an experiment from `to_dict` output (a run record) without re-deriving anything."""
    exp: Experiment = build(Experiment, data, "", {}, source)
    _validate(exp, source)
    return exp
