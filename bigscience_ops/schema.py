"""The experiment's sections: frozen dataclasses with their docs, defaults and bounds.

What an experiment IS, field by field; config/loading.py loads a YAML file into these, checks what spans
several fields and derives what was left out. A field's own bounds (`at_least`, `above`, `below`,
...) are declared beside it here and checked by typedyaml while the value is read, so the error
names the field, the value and the allowed range. Imports nothing of the package but typedyaml (and
slurm.names: the job-name form bsops reserves for its hourly jobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bigscience_ops.slurm.names import RESERVED_PREFIX, reserved_problem
from bigscience_ops.typedyaml import Charset, documented

# What may reach an `#SBATCH` or `#SCRON` line. Slurm reads those lines with parsers of its own, not
# bash: sbatch takes a backslash as an escape even inside quotes and a bare `#` as the end of the
# line, scrontab splits on spaces and knows no quotes. Names are therefore kept to characters that
# mean nothing to either parser; a path is written quoted for sbatch (render.py) and refused only
# where Slurm cannot carry it.
SLURM_NAME = Charset(r"[A-Za-z0-9._@+-]", "a Slurm name: ASCII letters, digits and . _ @ + -, not starting with -")


@dataclass(frozen=True)
class _JobNameCharset(Charset):
    """SLURM_NAME, less the form of bsops' own hourly jobs (slurm.names): a training named so would be taken
    for an hourly job of another experiment, and that job for the training."""

    def problem(self, text: str) -> str | None:
        return super().problem(text) or reserved_problem(text)


SLURM_JOB_NAME = _JobNameCharset(SLURM_NAME.chars, f"{SLURM_NAME.allowed}, and not starting with "
                                                   f"{RESERVED_PREFIX!r} (bsops' hourly jobs)")
SLURM_NAMES = Charset(r"[A-Za-z0-9._@+,-]", "Slurm names separated by commas: ASCII letters, digits and . _ @ + -, "
                                            "not starting with -")
SLURM_CONSTRAINT = Charset(r"[A-Za-z0-9._@+,&|*:\[\]()-]", "node features: ASCII letters, digits and . _ @ + - "
                                                            "joined by & | , * : [ ] ( ), not starting with -")
SLURM_NODES = Charset(r"[A-Za-z0-9._\[\],-]", "a node name or range (r7i4n[1-7]): ASCII letters, digits, . _ - "
                                              "and [ ] , for ranges, not starting with -")
ENV_NAME = Charset(r"[A-Za-z0-9_]", "the name of an environment variable: ASCII letters, digits and _")
SLURM_TIME = Charset(r"[0-9:-]", "a Slurm time limit: digits, ':' and '-' (20:00:00, 1-00:00:00)")
# Bounds several fields share; each field's doc gives its unit. Every number has a lower and an upper
# bound: far beyond any real run, close enough that no value overflows what reads it (timedelta, int64,
# a float sum, a retry loop).
MAX_STEPS = 10**7  # optimizer steps of a run (BLOOM-176B trained about 100k)
"""Optimizer steps of a run (BLOOM-176B trained about 100k): step counts, intervals and step numbers."""
MAX_SAMPLES = 2**48
"""Samples of a run (281 trillion)."""
MAX_TOKENS = 2**62
"""Tokens of a run (samples x seq_length), what an int64 holds."""
YEAR_MINUTES = 525_600
"""Minutes of waiting, cooling down or timing out: at most a year."""
MAX_LOG_LINES = 100_000
"""Iteration lines the watchdog reads back from the log (about 30 MB)."""
PORT_SPREAD = 1000
"""A job's rendezvous port is slurm.master_port + its job id % PORT_SPREAD (templates/train.slurm.j2)."""

OUTPUT_PATH = Charset(r"[^\\\x00-\x1f\x7f\x85\u2028\u2029]",
                      "a path without backslash (Slurm drops it from --output and stops expanding %x there), "
                      "control characters or Unicode line breaks")


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int = documented(doc="transformer blocks, at most 512 (DeepSpeed's balanced pipeline partition, which "
                                     "the plan computes too, is quadratic in them)", at_least=1, at_most=512)
    hidden_size: int = documented(doc="model width h", at_least=1, below=2**20)
    num_attention_heads: int = documented(doc="attention heads; must divide hidden_size", at_least=1, below=2**14)
    seq_length: int = documented(doc="tokens per sample", at_least=1, below=2**22)
    ffn_hidden_size: int | None = documented(None, "MLP width; derived as 4 * hidden_size when left out", at_least=1, below=2**22)
    max_position_embeddings: int | None = documented(None, "learned positions; derived as seq_length", at_least=1, below=2**22)
    position_embedding: Literal["learned", "alibi"] = documented(
        "learned", "learned (a position table, GPT-2 and Megatron's default) or alibi (BLOOM's: no table, per-head "
                   "linear biases on the attention scores)")
    vocab_size: int = documented(50257, "tokenizer vocabulary before padding", at_least=1, below=2**26)
    make_vocab_size_divisible_by: int = documented(128, "the vocabulary is padded to a multiple of this x TP", at_least=1, below=2**16)
    embed_layernorm: bool = documented(False, "LayerNorm after the embedding (tr8's stability fix)")
    init_method_std: float = documented(0.02, "std of the normal initialisation, in (0, 1]", above=0, at_most=1)
    hidden_dropout: float = documented(0.1, "dropout on residual branches", at_least=0, below=1)
    attention_dropout: float = documented(0.1, "dropout on attention probabilities", at_least=0, below=1)
    layernorm_epsilon: float = documented(1e-5, "LayerNorm epsilon, in (0, 1]", above=0, at_most=1)
    kernels: Literal["auto", "triton", "torch"] = documented(
        "auto", "LayerNorm, residual+LayerNorm, bias-GeLU, attention and cross-entropy kernels: auto (on CUDA each "
                "op timed at the run's shape, Triton kept where it is faster; torch elsewhere), triton (CUDA, or "
                "CPU under TRITON_INTERPRET=1) or torch (the references: eager, SDPA for attention)")
    compile: bool = documented(False, "compile each transformer block with torch.compile (recompiles bounded)")


@dataclass(frozen=True)
class ParallelConfig:
    tensor: int = documented(1, "tensor-parallel size (TP); must divide the attention heads", at_least=1, below=2**16)
    pipeline: int = documented(1, "pipeline-parallel size (PP); at most num_layers and 128 (the balanced partition "
                                  "over the stages takes seconds there)", at_least=1, at_most=128)
    partition_method: str = documented(
        "type:transformer", "how DeepSpeed splits the layers over the PP stages, as Megatron-DeepSpeed's "
                            "--pp-partition-method: type:transformer (balanced blocks), type:transformer|embedding "
                            "(the embeddings count as layers), parameters (balanced parameter counts) or uniform")
    zero_stage: Literal[0, 1] = documented(1, "DeepSpeed ZeRO stage for data parallelism")
    activation_checkpointing: bool = documented(False, "recompute transformer blocks in the backward pass")
    collective_timeout_minutes: int = documented(
        30, "a collective waiting this long aborts its process (a hung or dead peer ends the job instead of "
            "holding it to the time limit); must exceed the longest checkpoint save or load a rank waits on; "
            "at most a week (10,080)", at_least=1, at_most=7 * 24 * 60)


@dataclass(frozen=True)
class RampupConfig:
    start: int = documented(doc="global batch size at the first step", at_least=1, below=2**22)
    increment: int = documented(doc="batch size added at each increment", at_least=1, below=2**22)
    samples: int = documented(doc="samples over which the batch size ramps up to global_batch_size", at_least=1,
                              below=MAX_SAMPLES)


@dataclass(frozen=True)
class BatchConfig:
    global_batch_size: int = documented(doc="samples per optimizer step (GBS)", at_least=1, below=2**22)
    micro_batch_size: int = documented(1, "samples per GPU per micro-step (MBS)", at_least=1, below=2**16)
    rampup: RampupConfig | None = documented(None, "Megatron's --rampup-batch-size start increment samples")


@dataclass(frozen=True)
class TrainConfig:
    samples: int | None = documented(None, "training length in samples (exclusive with iters)", at_least=1,
                                     below=MAX_SAMPLES)
    iters: int | None = documented(None, "training length in steps (exclusive with samples; no rampup)", at_least=1,
                                   below=MAX_STEPS)
    seed: int = documented(42, "seed for initialisation, dropout and data order", at_least=0, below=2**32)
    precision: Literal["fp32", "fp16", "bf16"] = documented("fp16", "training precision")
    skip_iterations: list[str] = documented(
        factory=list, doc="iteration ranges to step over, e.g. ['100-120'] (1-based, inclusive; Megatron's "
                          "--skip-train-iteration-range): their data is consumed, no update is made")


@dataclass(frozen=True)
class CurriculumConfig:
    total_curriculum_step: int = documented(
        doc="steps from min_difficulty to model.seq_length (seed 001: about train tokens / GBS / seq_length / 2; "
            "tr8-104B's was 36,000); below 2**18, which keeps the plan's count of every step's tokens under a "
            "second", at_least=1, below=2**18)
    min_difficulty: int = documented(64, "sequence length of the first steps (a multiple of difficulty_step)",
                                     at_least=1, below=2**22)
    difficulty_step: int = documented(8, "sequence lengths are multiples of this (8 for tensor cores)", at_least=1,
                                      below=2**22)
    schedule_type: Literal["fixed_linear"] = documented("fixed_linear", "DeepSpeed's seqlen schedule")


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = documented(doc="peak learning rate, in (0, 1]", above=0, at_most=1)
    min_lr: float = documented(0.0, "learning rate at the end of decay, in [0, lr]", at_least=0, at_most=1)
    beta1: float = documented(0.9, "AdamW beta1", at_least=0, below=1)
    beta2: float = documented(0.999, "AdamW beta2", at_least=0, below=1)
    eps: float = documented(1e-8, "AdamW epsilon, in (0, 1]", above=0, at_most=1)
    weight_decay: float = documented(0.01, "AdamW weight decay, in [0, 10]", at_least=0, at_most=10)
    clip_grad: float = documented(1.0, "global gradient-norm clipping, in [0, 1e6]; 0 disables", at_least=0,
                                  at_most=1e6)


@dataclass(frozen=True)
class LRScheduleConfig:
    style: Literal["cosine", "linear", "constant"] = documented("cosine", "decay shape after warmup")
    warmup_samples: int | None = documented(None, "warmup length in samples", at_least=0, below=MAX_SAMPLES)
    warmup_tokens: int | None = documented(None, "warmup length in tokens (converted to samples)", at_least=0,
                                           below=MAX_TOKENS)
    warmup_iters: int | None = documented(None, "warmup length in steps (converted to samples)", at_least=0,
                                          at_most=MAX_STEPS)
    decay_samples: int | None = documented(None, "decay length in samples; default: the whole training", at_least=0,
                                           below=MAX_SAMPLES)
    decay_tokens: int | None = documented(None, "decay length in tokens (converted to samples)", at_least=0,
                                          below=MAX_TOKENS)
    decay_iters: int | None = documented(None, "decay length in steps (converted to samples)", at_least=0,
                                         at_most=MAX_STEPS)
    override_on_resume: bool = documented(False, "on resume, take the schedule from this config, not the checkpoint")


@dataclass(frozen=True)
class SaveRange:
    until: int = documented(doc="last step (inclusive) this interval applies to", at_least=1, at_most=MAX_STEPS)
    interval: int = documented(doc="save every this many steps", at_least=1, at_most=MAX_STEPS)


@dataclass(frozen=True)
class CheckpointConfig:
    save_interval: int | None = documented(None, "save every this many steps after the save_schedule ranges",
                                           at_least=1, at_most=MAX_STEPS)
    save_schedule: list[SaveRange] = documented(factory=list, doc="step ranges with their own save intervals")
    exit_interval: int | None = documented(None, "save and exit once the step is a multiple of this", at_least=1,
                                           at_most=MAX_STEPS)
    exit_duration_in_mins: int | None = documented(None, "save and exit after this many minutes (at most a year); "
                                                         "derived from slurm.time", at_least=1, at_most=YEAR_MINUTES)
    exit_margin_mins: int | None = documented(None, "minutes kept free before the time limit (at most a day); derived "
                                                    "from model size", at_least=1, at_most=24 * 60)
    kill_switch_path: str | None = documented(None, "if this file exists, save and exit; derived under paths.output",
                                              charset=OUTPUT_PATH)


@dataclass(frozen=True)
class DataSource:
    prefix: str = documented(doc="indexed dataset prefix (without .bin/.idx)")
    weight: float = documented(1.0, "blending weight, in (0, 1e6] (relative to the others)", above=0, at_most=1e6)


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
    num_workers: int = documented(2, "data loader workers", at_least=0, below=1024)
    cache_dir: str | None = documented(
        None, "folder for the dataset index files (.npy); default: beside each dataset, which must then be writable")


@dataclass(frozen=True)
class LoggingConfig:
    log_interval: int = documented(1, "steps between iteration lines", at_least=1, below=10**7)
    eval_interval: int = documented(1000, "steps between validation runs", at_least=1, below=10**9)
    eval_iters: int = documented(5, "validation steps per run; 0 disables validation", at_least=0, below=10**6)
    tensorboard: bool = documented(True, "write TensorBoard events")
    tensorboard_queue_size: int = documented(5, "TensorBoard writer queue size", at_least=1, below=10**6)
    log_timers: bool = documented(True, "timers to TensorBoard")
    log_batch_size: bool = documented(True, "batch size to TensorBoard")
    log_validation_ppl: bool = documented(True, "validation perplexity to TensorBoard")
    codecarbon: bool = documented(False, "record energy with codecarbon")


@dataclass(frozen=True)
class NodePhase:
    nodes: int = documented(doc="--nodes of the array tasks of this phase", at_least=1, below=2**20)
    from_samples: int | None = documented(
        None, "the phase starts at the first step boundary where this many samples are consumed (not on the first "
              "phase)", at_least=1, below=MAX_SAMPLES)
    from_iteration: int | None = documented(None, "or: the phase starts after this iteration (not on the first phase)",
                                            at_least=1, at_most=MAX_STEPS)


@dataclass(frozen=True)
class SlurmConfig:
    job_name: str | None = documented(None, "Slurm job name; derived as the experiment name", charset=SLURM_JOB_NAME)
    partition: str | None = documented(None, "--partition", charset=SLURM_NAMES)
    account: str | None = documented(None, "--account", charset=SLURM_NAME)
    constraint: str | None = documented(None, "--constraint", charset=SLURM_CONSTRAINT)
    gpu_memory_gb: float | None = documented(
        None, "memory of one GPU in GB as sold (32 for a V100-32GB), at most 4096; default: known from constraint "
              "(v100-32g, a100-80g, h100, ...)", above=0, at_most=4096)
    qos: str | None = documented(None, "--qos", charset=SLURM_NAME)
    time: str = documented("20:00:00", "--time of each array task", charset=SLURM_TIME)
    nodes: int | None = documented(
        None, "--nodes of a run on one node count; derived as 1, or from node_schedule (the phase being launched)",
        at_least=1, below=2**20)
    node_schedule: list[NodePhase] = documented(
        factory=list, doc="phases with their own node counts: [{nodes: 16}, {nodes: 64, from_samples: N}, ...]; "
                          "bsops launch and each array task use the phase of the latest checkpoint")
    gpus_per_node: int = documented(1, "training processes per node (GPUs, or CPU processes when device: cpu)", at_least=1, below=1024)
    device: Literal["gpu", "cpu"] = documented("gpu", "gpu: NCCL and --gres; cpu: gloo")
    cpus_per_task: int = documented(1, "--cpus-per-task of the per-node launcher", at_least=1, below=2**16)
    array: int = documented(1, "array length: tasks run one at a time (--array=1-N%1)", at_least=1, below=10**6)
    group: str | None = documented(None, "watch jobs of every user in this Unix group")
    exclude: list[str] = documented(factory=list, doc="nodes to keep the job off (--exclude)", charset=SLURM_NODES)
    env_setup: list[str] = documented(factory=list, doc="shell lines run before training (trusted shell code, one line per item)",
                                      trusted_shell_line=True)
    master_port: int = documented(6000, f"rendezvous ports on the first node start here: a job listens on master_port + "
                                         f"its job id % {PORT_SPREAD}, so jobs sharing a node never meet",
                                  at_least=1, below=65536 - PORT_SPREAD)
    failure_budget: int = documented(3, "array tasks in a row without progress before the next one stops; 0: never", at_least=0, below=10**6)
    signal_seconds: int | None = documented(
        None, "--signal=B:USR1@N: Slurm warns the job N s before its time limit and the trainer saves and exits; "
              "derived from checkpoint.exit_margin_mins (the time an iteration and a save take); Slurm takes at most "
              "65535", at_least=1, at_most=65535)


@dataclass(frozen=True)
class PathsConfig:
    output: str | None = documented(None, "run folder; derived as runs/<name>", charset=OUTPUT_PATH)
    checkpoints: str | None = documented(None, "derived as <output>/checkpoints")
    tensorboard: str | None = documented(None, "derived as <output>/tensorboard")
    logs: str | None = documented(None, "derived as <output>/logs (the job's --output folder)", charset=OUTPUT_PATH)
    codecarbon: str | None = documented(None, "derived as <output>/codecarbon")


@dataclass(frozen=True)
class HubConfig:
    logs_repo: str | None = documented(None, "Hub repo for logs/main_log.txt")
    tensorboard_repo: str | None = documented(None, "Hub repo for TensorBoard events")
    codecarbon_repo: str | None = documented(None, "Hub repo for codecarbon records")
    checkpoints_repo: str | None = documented(None, "Hub repo for converted checkpoints")
    host: str = documented("huggingface.co", "the Hub's host (and port): its endpoint is https://HOST, and the token "
                                               "is offered to nothing else, and only over https")
    token_env: str = documented("HF_TOKEN", "environment variable holding the Hub token (never a URL or a file)",
                                charset=ENV_NAME)
    remote_template: str | None = documented(
        None, "push to this git remote instead of the Hub, {repo} replaced by the repo name (file:///srv/mirror/{repo}.git); "
              "https://, ssh:// or file://, no credential inside: the token is offered only to https://HOST")
    lfs_size_mb: float = documented(10.0, "files larger than this many MB are stored with git-lfs, in (0, 1e6]",
                                    above=0, at_most=1e6)
    private: bool = documented(True, "repos bsops creates on the Hub are private (false makes what is pushed public)")
    push_attempts: int = documented(4, "tries of a failing push, at most 10 (waits 10 s, 20 s, 40 s ... up to 5 "
                                       "minutes between: all 10 wait 25 minutes, less than the hourly period)",
                                    at_least=1, at_most=10)


@dataclass(frozen=True)
class BackupConfig:
    dest: str | None = documented(None, "backup folder (a store outside the training's scratch); bsops backup --to overrides")
    keep_last: int | None = documented(None, "on scratch keep the newest N checkpoints; none: delete nothing",
                                       at_least=1, at_most=MAX_STEPS)
    keep_every: int | None = documented(None, "on scratch also keep checkpoints whose step is a multiple of this",
                                        at_least=1, at_most=MAX_STEPS)
    keep_optimizer_every: int | None = documented(
        None, "back up whole (with optimizer states) every checkpoint whose step is a multiple of this, beside the "
              "final one", at_least=1, at_most=MAX_STEPS)
    tar: bool = documented(False, "one tar file per checkpoint, for stores with few inodes")


@dataclass(frozen=True)
class HealthConfig:
    """What the watchdog counts as a training in trouble (ops/health.py reads the run's iteration lines)."""

    enabled: bool = documented(True, "check the loss, grad norm, loss scale and throughput of the log's iteration lines")
    recent: int = documented(50, "iteration lines counted as now: a finding among them is an open alert (at most "
                                 "100,000 lines: recent and window are read back from the log)", at_least=1,
                             at_most=MAX_LOG_LINES)
    window: int = documented(50, "iteration lines the loss, grad norm and throughput are compared against (at most "
                                 "100,000)", at_least=2, at_most=MAX_LOG_LINES)
    min_window: int = documented(8, "lines a window needs before the spike, grad-norm and throughput checks speak",
                                 at_least=2, at_most=MAX_LOG_LINES)
    spike_score: float = documented(8.0, "a loss spike's distance above the median of the last min_window lines, in "
                                         "units of the window's step-to-step noise (robust: MAD), in (0, 1e6]",
                                    above=0, at_most=1e6)
    spike_ratio: float = documented(1.3, "a loss spike is also at least this many times that median, in (1, 1e6]",
                                    above=1, at_most=1e6)
    grad_norm_ratio: float = documented(10.0, "grad norm above this many times the window's median, in (1, 1e6]",
                                        above=1, at_most=1e6)
    scale_collapse: float = documented(1024.0, "fp16: the loss scale this many times below where it settled, in "
                                               "(1, 2**64]", above=1, at_most=2.0**64)
    skipped_lines: int = documented(3, "log lines in a row with skipped iterations, after the initial search",
                                    at_least=1, at_most=MAX_LOG_LINES)
    initial_search: int = documented(3, "lines at the start of a task whose skipped iterations are fp16's search",
                                     at_least=0, at_most=MAX_LOG_LINES)
    slow_ratio: float = documented(0.5, "throughput below this share of the window's median ...", above=0, below=1)
    slow_lines: int = documented(3, "... for this many lines in a row (none with a save or an evaluation)", at_least=1,
                                 at_most=MAX_LOG_LINES)


@dataclass(frozen=True)
class AlertsConfig:
    email_to: list[str] = documented(factory=list, doc="alert recipients")
    email_from: str | None = documented(None, "sender address")
    smtp_host: str = documented("localhost", "SMTP server")
    smtp_port: int = documented(25, "SMTP port", at_least=1, below=65536)
    smtp_security: Literal["none", "starttls", "ssl"] = documented("none", "SMTP transport security")
    smtp_user: str | None = documented(None, "SMTP login")
    smtp_password_env: str = documented("BSOPS_SMTP_PASSWORD", "environment variable holding the SMTP password",
                                        charset=ENV_NAME)
    webhook_url_env: str | None = documented(
        None, "environment variable holding a Slack-compatible webhook URL (https) that gets every alert and recovery "
              "too, under the same cooldown; the URL is a secret, so it is never written in this file", charset=ENV_NAME)
    stall_minutes: int = documented(60, "alert when no iteration line was logged for this many minutes (at most a "
                                        "year)", at_least=1, at_most=YEAR_MINUTES)
    cooldown_minutes: int = documented(240, "minimum minutes between two emails about one condition (at most a year)",
                                       at_least=1, at_most=YEAR_MINUTES)
    blocked_minutes: int = documented(
        120, "alert when a task of the training has been pending this many minutes on nodes that only an administrator "
             "brings back: down, drained, reserved or not available (Slurm's ReqNodeNotAvail, NodeDown, 'Nodes "
             "required for job are DOWN, DRAINED ...'), measured from its submission or the end of the task before "
             "it, whichever is later (at most a year)", at_least=1, at_most=YEAR_MINUTES)
    health: HealthConfig = documented(factory=HealthConfig, doc="training health: loss spikes, NaN, overflow, slow nodes")


@dataclass(frozen=True)
class EstimateConfig:
    tflops_per_gpu: float = documented(45.0, "achieved TFLOPs per GPU used for the duration estimate, in (0, 1e5]",
                                       above=0, at_most=1e5)
    peak_tflops: float | None = documented(
        None, "dense bf16/fp16 peak TFLOPs of one GPU for MFU, in (0, 1e5]; detected for V100, A100, H100 and H200 "
              "when left out", above=0, at_most=1e5)
    budget_days: float | None = documented(
        None, "the days the run may take, in (0, 1e4]: `bsops plan` warns when its estimate is over 1.25x this",
        above=0, at_most=1e4)
    budget_storage_tb: float | None = documented(
        None, "the TB (1e12 bytes) of scratch the run's checkpoints may fill, in (0, 1e6]: `bsops plan` warns when "
              "they would fill over 1.25x this", above=0, at_most=1e6)


METRIC_NAME = Charset(r"[A-Za-z0-9._,@+-]", "an lm-eval task or source name: ASCII letters, digits and . _ , @ + -, "
                                          "not starting with -")
METRIC_KEY = Charset(r"[A-Za-z0-9._,@+/-]", "a metric as task/metric (lambada_openai/acc, pile_cc/bits_per_byte): "
                                           "ASCII letters, digits and . _ , @ + - around one /")


MAX_FEWSHOT = 1000
"""Few-shot examples per task at most (lm-eval's own tasks ask 0 to 25; every example lengthens each request)."""


@dataclass(frozen=True)
class EvalConfig:
    """Downstream evaluation of the run's checkpoints (`bsops eval`, the hourly eval job): lm-evaluation-harness
    tasks and bits per byte on held-out sources, scored by the model in its checkpoint's TP/PP layout."""

    tasks: list[str] = documented(
        factory=list, doc="lm-eval tasks: registered names (lambada_openai, piqa, hellaswag: lm-eval reads their data "
                          "through `datasets`, so from your cache or mirror) or task YAML files of your own (a path "
                          "ending .yaml or .yml; relative data_files inside are read from the YAML's folder)")
    sources: dict[str, str] = documented(
        factory=dict, doc="held-out jsonl files scored for bits per byte, by source name ({pile_cc: /data/cc.jsonl}); "
                          "each line a JSON object with the text under text_key")
    text_key: str = documented("text", "the key of a source line's text")
    docs_per_source: int = documented(3000, "documents scored per source, the first ones of the file",
                                      at_least=1, below=10**9)
    batch_size: int = documented(8, "sequences per forward pass", at_least=1, below=2**16)
    limit: int | None = documented(None, "examples per lm-eval task (lm-eval's --limit), for smoke runs; default: all",
                                   at_least=1, below=10**9)
    num_fewshot: int | None = documented(
        None, "few-shot examples per lm-eval task (lm-eval's --num_fewshot), for every task of eval.tasks; default: "
              "each task's own (0 for most); a task whose config says 0 keeps 0, as lm-eval's rule is",
        at_least=0, at_most=MAX_FEWSHOT)
    num_fewshot_per_task: dict[str, int] = documented(
        factory=dict, doc="few-shot examples by eval.tasks entry ({piqa: 5, /data/tasks/mine.yaml: 3}), over "
                          "num_fewshot for that entry (a group's or tag's member tasks alike); each in "
                          f"[0, {MAX_FEWSHOT}]",
        at_least=0, at_most=MAX_FEWSHOT)
    every_saves: int = documented(1, "the hourly job evaluates every Nth saved checkpoint (and the run's last)",
                                  at_least=1, below=MAX_STEPS)
    alert_drop: dict[str, float] = documented(
        factory=dict, doc="task/metric -> margin: the watchdog alerts when a checkpoint's metric is worse than the "
                          "run's best so far by more than the margin (in the metric's units), in (0, 1e9]",
        above=0, at_most=1e9)
    references: dict[str, dict[str, float]] = documented(
        factory=dict, doc="reference models shown beside the run's results: name -> task/metric -> value "
                          "({GPT2-Large: {lambada_openai/acc: 0.476}}), each in [-1e9, 1e9]", at_least=-1e9, at_most=1e9)
    partition: str | None = documented(None, "--partition of the eval job; default: slurm.partition", charset=SLURM_NAMES)
    account: str | None = documented(None, "--account of the eval job; default: slurm.account", charset=SLURM_NAME)
    qos: str | None = documented(None, "--qos of the eval job; default: slurm.qos", charset=SLURM_NAME)
    nodes: int | None = documented(
        None, "--nodes of the eval job; derived as the checkpoint's TP x PP processes over slurm.gpus_per_node",
        at_least=1, below=2**20)
    time: str = documented("02:00:00", "--time of the eval job", charset=SLURM_TIME)
    trust_task_code: bool = documented(
        False, "task YAML files are code the team trusts: `!function` tags, `include:` outside a task file's folder "
               "(lm-eval's own installed task files are allowed anyway) and unsandboxed templates, as lm-eval runs "
               "them; default: refused")
    bootstrap_iters: int = documented(
        100000, "resamples for the stderr of bootstrapped metrics (perplexity); lm-eval's default; 0: no stderr",
        at_least=0, below=10**7)
    dtype: Literal["training", "fp32"] = documented(
        "training", "precision the checkpoint is scored in on GPUs: the training's (train.precision) or fp32 (as "
                    "lm-eval's hf model loads an export by default); CPUs score in fp32")
    hf_cache: str | None = documented(
        None, "shared Hugging Face cache folder for lm-eval's registered tasks' datasets: `bsops eval prefetch` "
              "fills it on a login node, the eval job reads it offline; default: the environment's own cache")
    max_bad_lines: int = documented(
        0, "lines of a source that are not a document (torn, not JSON, no text under text_key) tolerated before the "
           "source fails: it is then left out of the result, the evaluation exits non-zero and the hourly job "
           "alerts; default 0: any such line fails it", at_least=0, below=10**9)
    prefetch_minutes: int = documented(
        60, "the deadline of `bsops eval prefetch` (download or mirror copy, then the offline check), in minutes: "
            "past it the copy is stopped and the command fails", at_least=1, at_most=24 * 60)

    @property
    def configured(self) -> bool:
        """Whether there is anything to evaluate."""
        return bool(self.tasks or self.sources)


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
    eval: EvalConfig = documented(factory=EvalConfig, doc="downstream evaluation of checkpoints (bsops eval)")
    record: bool = documented(False, "a record of a run others made (bsops' bundled seeds): its run folder paths, "
                                     "alert addresses and Hub repos are shown as what that run used and never used: "
                                     "its outputs go under the current folder, and no alert or push goes out. A "
                                     "file's own statement: never inherited through base:")
    overrides: list[str] = documented(
        factory=list, doc="the SECTION.KEY=VALUE assignments of the command line this experiment was loaded with, in "
                          "order (their values are in the fields already): set by bsops, never in a file")
    derived: tuple[str, ...] = field(default=(), metadata={"doc": "field paths computed, not written", "internal": True})
    recorded: tuple[tuple[str, object], ...] = field(default=(), metadata={
        "doc": "a record's site values as its run used them, set aside by derivation (field path, value)",
        "internal": True})

    @property
    def world_size(self) -> int:
        return self.slurm.nodes * self.slurm.gpus_per_node

    @property
    def model_parallel_size(self) -> int:
        return self.parallel.tensor * self.parallel.pipeline
