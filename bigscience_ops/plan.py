"""Calculators for `bsops plan`: parameters, memory, DP size, rampup, steps, tokens, days, node counts.

Every number the training notes computed by hand is computed here from the experiment and its
RunSchedule (run_schedule.py: the schedules the trainer runs, computed once), and every rule that
would fail or mislead a run is checked before a GPU hour is spent. Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from bigscience_ops.node_schedule import Phase
from bigscience_ops.run_schedule import RunSchedule, run_schedule
from bigscience_ops.schedules import BatchSchedule, Increment
from bigscience_ops.schema import Experiment
from bigscience_ops.sizing import (
    CHECKPOINT_BYTES, GB, GIB, TRAIN_BYTES, ParamCount, StageActivations, activation_bytes, count_parameters,
    estimate_days, ffn_size, gpu_memory_from_constraint, kept_on_scratch,
)
from bigscience_ops.slurm import parse_time_limit

# ----------------------------------------------------------------------------- memory and time

NEAR_LIMIT = 0.85  # above this share of a GPU's memory the plan warns: CUDA context, NCCL buffers, fragmentation


@dataclass(frozen=True)
class Memory:
    bytes_per_param: int
    training_total: int  # bytes per model replica (TP x PP GPUs)
    training_seed_rounded: int  # bytes_per_param x size rounded to whole billions, as the training notes write it
    per_gpu: int  # model states of the largest stage, ZeRO / bf16-optimizer sharding included
    checkpoint_with_optimizer: int
    checkpoint_without_optimizer: int
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


def train_bytes(precision: str) -> dict[str, int]:
    return TRAIN_BYTES["fp32" if precision == "fp32" else "mixed"]


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
    without, with_optim = CHECKPOINT_BYTES[kind]
    b, p = exp.batch, exp.parallel
    micro_batches = max(1, b.global_batch_size // max(1, b.micro_batch_size * max(dp, 1)))
    activations = activation_bytes(exp.model, b.micro_batch_size, p.tensor, p.pipeline, micro_batches,
                                   p.activation_checkpointing, params.padded_vocab,
                                   4 if exp.train.precision == "fp32" else 2, params.blocks_per_stage)
    limit, source = gpu_limit(exp)
    return Memory(per_param, per_param * params.total, per_param * round(params.total / GB) * GB, max(states),
                  with_optim * params.total, without * params.total, shard, states, activations, limit, source)


@dataclass(frozen=True)
class Storage:
    """Checkpoints over the whole run: what the save schedule writes and what retention and backup keep."""

    saves: int  # checkpoints the schedule writes, the final one included
    checkpoint_bytes: int  # one checkpoint on scratch: weights and optimizer states
    weights_bytes: int  # one checkpoint without optimizer states
    written: int  # saves x checkpoint_bytes: scratch at the end with no retention
    kept_on_scratch: int  # checkpoints retention leaves (backup.keep_last / keep_every); == saves without it
    scratch: int  # bytes on scratch at the end of the run
    backed_up_whole: int  # checkpoints the backup keeps with optimizer states (the last, every keep_optimizer_every-th)
    backup: int  # bytes in the backup (0 without backup.dest)


def storage(exp: Experiment, params: ParamCount, run: RunSchedule) -> Storage:
    bk = exp.backup
    steps = run.saves.steps(run.train_iters)
    without, with_optim = CHECKPOINT_BYTES["fp32" if exp.train.precision == "fp32" else "mixed"]
    whole, weights = with_optim * params.total, without * params.total
    kept = kept_on_scratch(steps, bk.keep_last, bk.keep_every)
    if bk.dest is None:
        return Storage(len(steps), whole, weights, len(steps) * whole, len(kept), len(kept) * whole, 0, 0)
    full = [s for s in steps if s == steps[-1] or (bk.keep_optimizer_every and s % bk.keep_optimizer_every == 0)]
    backup = len(full) * whole + (len(steps) - len(full)) * weights
    return Storage(len(steps), whole, weights, len(steps) * whole, len(kept), len(kept) * whole, len(full), backup)


# ----------------------------------------------------------------------------- node phases

@dataclass(frozen=True)
class PhasePlan:
    """One phase as the plan shows it: its steps, the batch sizes they use, tokens and days."""

    phase: Phase
    world_size: int
    dp: float
    first_step: int
    last_step: int  # first_step - 1 when the training ends before the phase starts
    samples: int
    tokens: int
    days: float
    days_seed_rounded: float
    batch_sizes: tuple[int, ...]  # every global batch size of the phase's steps

    @property
    def steps(self) -> int:
        return max(0, self.last_step - self.first_step + 1)


def plan_phases(exp: Experiment, run: RunSchedule, params: int, seed_rounded_params: int,
                model_parallel: int) -> list[PhasePlan]:
    """Steps, tokens and days of each node phase (days at estimate.tflops_per_gpu on the phase's GPUs).

    Tokens count each step's samples at its curriculum length, or at model.seq_length without a curriculum.
    """
    schedule, train_iters = run.batch, run.train_iters
    phases = list(run.node_phases)
    out = []
    for phase, following in zip(phases, phases[1:] + [None]):
        last = min(train_iters, following.first_step - 1 if following else train_iters)
        samples = max(0, schedule.consumed_after(max(last, phase.first_step - 1)) - phase.start_samples)
        tokens = samples * exp.model.seq_length
        if run.tokens is not None:
            tokens = max(0, run.tokens.through(last) - run.tokens.through(phase.first_step - 1))
        world = phase.nodes * exp.slurm.gpus_per_node
        tflops = exp.estimate.tflops_per_gpu
        out.append(PhasePlan(phase, world, world / model_parallel, phase.first_step, last, samples, tokens,
                             estimate_days(tokens, params, world, tflops),
                             estimate_days(tokens, seed_rounded_params, world, tflops),
                             schedule.sizes_of_steps(phase.first_step, last)))
    return out


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Problem:
    """A rule the experiment breaks; `severity` is error (blocks launching) or warning."""

    field: str
    value: object
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"{self.field}: {self.value!r}: {self.message}"


@dataclass(frozen=True)
class Plan:
    name: str
    params: ParamCount
    dp: float
    world_size: int
    memory: Memory
    storage: Storage
    increments: list[Increment]
    rampup_steps: int
    rampup_samples_consumed: int
    train_iters: int
    train_samples: int
    tokens: int  # trained: under a curriculum, each step's samples at its length
    full_length_tokens: int  # train_samples x model.seq_length
    curriculum_steps: int | None  # steps of the curriculum's ramp; None without a curriculum
    warmup_samples: int
    warmup_steps: int
    decay_samples: int
    decay_steps: int
    days: float
    days_seed_rounded: float
    phases: list[PhasePlan]  # one per slurm.node_schedule phase (one without a schedule): steps, tokens, days
    nodes_during_rampup: list[int]
    nodes_after_rampup: list[int]
    dataset_sizes: tuple[int, int, int]
    exit_duration_in_mins: int
    exit_margin_mins: int
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]


def valid_node_counts(exp: Experiment, batch_sizes: list[int], limit: int = 4096) -> list[int]:
    """Node counts whose DP size divides every batch size / MBS and fills whole nodes."""
    mp, gpn, mbs = exp.model_parallel_size, exp.slurm.gpus_per_node, exp.batch.micro_batch_size
    common = 0
    for b in batch_sizes:
        common = math.gcd(common, b)
    if common % mbs:
        return []
    nodes = []
    for dp in range(1, common // mbs + 1):
        if (common // mbs) % dp == 0 and (dp * mp) % gpn == 0 and dp * mp // gpn <= limit:
            nodes.append(dp * mp // gpn)
    return nodes


def _check_phases(exp: Experiment, schedule: BatchSchedule, phases: list[PhasePlan]) -> list[Problem]:
    """Each phase's GPUs split into whole replicas whose DP divides every batch size of the phase's steps."""
    problems: list[Problem] = []
    mp, mbs = exp.model_parallel_size, exp.batch.micro_batch_size
    several = len(phases) > 1
    if exp.slurm.node_schedule and exp.slurm.nodes not in [ph.phase.nodes for ph in phases]:
        problems.append(Problem("slurm.nodes", exp.slurm.nodes,
                                f"is the node count of the phase being launched: one of the node schedule's "
                                f"{[ph.phase.nodes for ph in phases]}"))
    for ph in phases:
        where = ph.phase.field if several else "slurm.nodes"
        label = f"{ph.phase.describe()}: " if several else ""
        if ph.world_size % mp:
            problems.append(Problem(where, ph.phase.nodes, f"{label}nodes x gpus_per_node = {ph.world_size} GPUs is not "
                                                           f"a multiple of TP x PP = {mp}"))
            continue
        if several and ph.steps == 0:
            problems.append(Problem(where, ph.phase.nodes, f"{label}starts after the training ends at step "
                                                           f"{ph.last_step}: it never runs", "warning"))
            continue
        dp = int(ph.dp)
        sizes = ph.batch_sizes if several else tuple(
            [inc.global_batch_size for inc in schedule.increments()] + [schedule.global_batch_size])
        for gbs in sizes:
            if gbs % (mbs * dp):
                field = where if several else ("batch.global_batch_size" if gbs == schedule.global_batch_size
                                               else "batch.rampup")
                value = ph.phase.nodes if several else gbs
                during = "" if gbs == schedule.global_batch_size else " during the rampup"
                problems.append(Problem(field, value,
                                        f"{label}global batch size {gbs}{during} is not divisible by MBS x DP = "
                                        f"{mbs} x {dp} = {mbs * dp}; valid node counts"
                                        f"{' for this phase' if several else ''}: {valid_node_counts(exp, list(sizes))[:12]}"))
                break
    return problems


def _check(exp: Experiment, run: RunSchedule, params: ParamCount, phases: list[PhasePlan]) -> list[Problem]:
    schedule = run.batch
    problems = _check_phases(exp, schedule, phases)
    empty = [stage for stage, (start, stop) in enumerate(zip(params.parts, params.parts[1:])) if start == stop]
    if empty:
        problems.append(Problem("parallel.partition_method", exp.parallel.partition_method,
                                f"leaves pipeline stage(s) {empty} without any layer (boundaries {list(params.parts)}); "
                                "use fewer stages or another method"))
    if exp.parallel.tensor > exp.slurm.gpus_per_node and exp.slurm.device == "gpu":
        problems.append(Problem("parallel.tensor", exp.parallel.tensor,
                                f"TP spans nodes (gpus_per_node = {exp.slurm.gpus_per_node}): tensor parallelism across nodes is very slow",
                                "warning"))
    ffn, h = ffn_size(exp.model), exp.model.hidden_size
    if ffn != 4 * h:
        problems.append(Problem("model.ffn_hidden_size", ffn,
                                f"differs from 4 x hidden_size = {4 * h}: tr8-104B copied tr1-13B's 20480 and trained a 57B "
                                "model believing it was 104B; leave the key out to derive it", "warning"))
    if schedule.has_rampup and exp.train.samples is not None and exp.train.samples <= schedule.rampup_samples:
        problems.append(Problem("train.samples", exp.train.samples,
                                f"must exceed batch.rampup.samples ({schedule.rampup_samples})"))
    if run.warmup_samples > run.decay_samples and exp.lr_schedule.style != "constant":
        problems.append(Problem("lr_schedule", {"warmup_samples": run.warmup_samples, "decay_samples": run.decay_samples},
                                "warmup must end before decay ends"))
    if exp.checkpoint.save_interval is None and not exp.checkpoint.save_schedule:
        problems.append(Problem("checkpoint.save_interval", None,
                                "no checkpoints will be saved before exit; set save_interval", "warning"))
    limit = parse_time_limit(exp.slurm.time)
    if exp.checkpoint.exit_duration_in_mins >= limit:
        problems.append(Problem("checkpoint.exit_duration_in_mins", exp.checkpoint.exit_duration_in_mins,
                                f"must be below the time limit slurm.time = {exp.slurm.time} ({limit} min), "
                                "or Slurm kills the job before it saves"))
    return problems


def _check_memory(exp: Experiment, mem: Memory) -> list[Problem]:
    if mem.gpu_limit is None:
        return []
    total, stage, limit = mem.largest_total, mem.largest_stage, mem.gpu_limit
    where = "slurm.gpu_memory_gb" if mem.gpu_limit_source == "slurm.gpu_memory_gb" else "slurm.constraint"
    value = exp.slurm.gpu_memory_gb if where == "slurm.gpu_memory_gb" else exp.slurm.constraint
    what = (f"pipeline stage {stage} needs {total / GIB:.1f} GiB per GPU (model states {mem.model_states_per_stage[stage] / GIB:.1f}"
            f" + activations {mem.activations[stage].total / GIB:.1f}) of the {limit / GIB:.0f} GiB GPU")
    fixes = "more pipeline or tensor parallelism, a smaller micro batch, ZeRO-1 over more DP ranks"
    if not exp.parallel.activation_checkpointing:
        fixes = "parallel.activation_checkpointing: true, " + fixes
    if total > limit:
        return [Problem(where, value, f"{what}: it does not fit; try {fixes}")]
    if total > NEAR_LIMIT * limit:
        return [Problem(where, value, f"{what}: above {NEAR_LIMIT:.0%}, little is left for the CUDA context, "
                                      "NCCL buffers and fragmentation", "warning")]
    return []


def _notes(run: RunSchedule) -> list[str]:
    notes = []
    schedule, warmup_samples, warmup_steps = run.batch, run.warmup_samples, run.warmup_steps
    if schedule.has_rampup:
        table = schedule.increments()
        off = [inc for inc in table if inc.steps != inc.naive_steps]
        if off:
            first = off[0]
            notes.append(
                f"rampup steps per increment are exact, not samples/GBS: Megatron changes the batch size when consumed "
                f"samples pass k x {schedule.samples_per_increment:.2f}, so the last step of an increment overshoots "
                f"(GBS {first.global_batch_size}: {first.steps} steps, not {first.naive_steps})")
        notes.append(
            f"the rampup lasts {schedule.rampup_steps} steps ({schedule.consumed_after(schedule.rampup_steps)} samples): "
            f"steps per increment shrink as the batch grows, so a constant steps-per-increment guess is wrong "
            f"(the tr1-13B draft assumed 160 per increment, the tr1-13B notes '5k steps')")
        if 0 < warmup_samples <= schedule.rampup_samples:
            gbs = schedule.batch_size_of_step(warmup_steps)
            notes.append(
                f"LR warmup of {warmup_samples} samples ends inside the rampup, at step {warmup_steps} (GBS {gbs}): "
                f"samples and steps convert only through the rampup schedule, never at a fixed steps-per-increment "
                f"rate (the tr1-13B notes did that and took their 216_320 warmup samples for 2000 steps)")
    return notes


def make_plan(exp: Experiment, run: RunSchedule | None = None) -> Plan:
    """The plan of `exp`; `run` is its RunSchedule when the caller has built it already."""
    run = run or run_schedule(exp)
    params = count_parameters(exp.model, exp.parallel.tensor, exp.parallel.pipeline, exp.parallel.partition_method)
    mp = exp.model_parallel_size
    dp = exp.world_size / mp
    schedule, iters, samples = run.batch, run.train_iters, run.train_samples
    rampup_sizes = [inc.global_batch_size for inc in schedule.increments()] + [schedule.global_batch_size]
    tokens = run.tokens_through(iters, exp.model.seq_length)
    gbs, ev = schedule.global_batch_size, exp.logging
    valid = (iters // ev.eval_interval + 1) * ev.eval_iters * gbs
    phases = plan_phases(exp, run, params.total, round(params.seed_formula / GB) * GB, mp)
    schedule_problems = []
    if run.node_schedule_error is not None:
        schedule_problems = [Problem("slurm.node_schedule", [dataclasses.asdict(p) for p in exp.slurm.node_schedule],
                                     run.node_schedule_error)]
    # The memory of the phase with the fewest DP ranks: ZeRO shards least and the most micro-batches are in flight.
    fewest = min(ph.dp for ph in phases)
    mem = memory(exp, params, int(fewest) if fewest == int(fewest) else 1)
    return Plan(
        name=exp.name,
        params=params,
        dp=dp,
        world_size=exp.world_size,
        memory=mem,
        storage=storage(exp, params, run),
        increments=schedule.increments(),
        rampup_steps=schedule.rampup_steps,
        rampup_samples_consumed=schedule.consumed_after(schedule.rampup_steps),
        train_iters=iters,
        train_samples=samples,
        tokens=tokens,
        full_length_tokens=samples * exp.model.seq_length,
        curriculum_steps=run.tokens.ramp_steps if run.tokens is not None else None,
        warmup_samples=run.warmup_samples,
        warmup_steps=run.warmup_steps,
        decay_samples=run.decay_samples,
        decay_steps=run.decay_steps,
        days=sum(ph.days for ph in phases),
        days_seed_rounded=sum(ph.days_seed_rounded for ph in phases),
        phases=phases,
        nodes_during_rampup=valid_node_counts(exp, rampup_sizes) if schedule.has_rampup else [],
        nodes_after_rampup=valid_node_counts(exp, [gbs]),
        # Megatron's dataset targets: train.samples as written (or iters x GBS), then eval and test.
        dataset_sizes=(exp.train.samples or iters * gbs, valid, ev.eval_iters * gbs),
        exit_duration_in_mins=exp.checkpoint.exit_duration_in_mins,
        exit_margin_mins=exp.checkpoint.exit_margin_mins,
        problems=schedule_problems + _check(exp, run, params, phases) + _check_memory(exp, mem),
        notes=_notes(run),
    )
