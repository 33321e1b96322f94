"""The plan `bsops plan` shows: parameters, memory, DP size, rampup, steps, tokens, days, node counts.

The numbers come first, each computed once: the RunSchedule (schedule/run.py: the schedules the
trainer runs) and the run's sizes (sizing.size_run: parameters, memory per GPU, checkpoint storage,
days). Then every rule that would fail or mislead a run is checked against them, before a GPU hour
is spent. Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from bigscience_ops.schedule.nodes import Phase
from bigscience_ops.schedule.run import RunSchedule, SkipSpan, run_schedule
from bigscience_ops.schedule.batch_lr import Increment
from bigscience_ops.schema import Experiment
from bigscience_ops.sizing import GIB, Memory, ParamCount, RunSize, Storage, saved_steps, size_run
from bigscience_ops.slurm import parse_time_limit

NEAR_LIMIT = 0.85  # above this share of a GPU's memory the plan warns: CUDA context, NCCL buffers, fragmentation
OVER_BUDGET = 1.25  # above this multiple of estimate.budget_days / budget_storage_tb the plan warns


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
    days: float | None  # None on CPU: no time estimate
    days_seed_rounded: float | None
    batch_sizes: tuple[int, ...]  # every global batch size of the phase's steps

    @property
    def steps(self) -> int:
        return max(0, self.last_step - self.first_step + 1)


def plan_phases(run: RunSchedule, gpus: list[int], model_parallel: int, size: RunSize) -> list[PhasePlan]:
    """Steps, tokens and days of each node phase (days at estimate.tflops_per_gpu on the phase's `gpus`)."""
    return [PhasePlan(span.phase, world, world / model_parallel, span.phase.first_step, span.last_step,
                      span.samples, span.tokens, days, rounded, span.batch_sizes)
            for span, world, days, rounded in zip(run.spans, gpus, size.days, size.days_seed_rounded)]


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Finding:
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
    days: float | None  # at estimate.tflops_per_gpu; None on CPU (the TFLOPs assumption is a GPU's)
    days_seed_rounded: float | None
    phases: list[PhasePlan]  # one per slurm.node_schedule phase (one without a schedule): steps, tokens, days
    nodes_during_rampup: list[int]
    nodes_after_rampup: list[int]
    dataset_sizes: tuple[int, int, int]
    exit_duration_in_mins: int
    exit_margin_mins: int
    skips: list[SkipSpan] = field(default_factory=list)  # train.skip_iterations, a rollback's skips included
    problems: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [p for p in self.problems if p.severity == "warning"]


def valid_node_counts(exp: Experiment, batch_sizes: list[int], limit: int = 4096) -> list[int]:
    """Node counts whose DP size divides every batch size / MBS and fills whole nodes."""
    mp, gpn, mbs = exp.model_parallel_size, exp.slurm.gpus_per_node, exp.batch.micro_batch_size
    common = 0
    for b in batch_sizes:
        common = math.gcd(common, b)
    if common % mbs:
        return []
    n = common // mbs
    divisors = {d for k in range(1, math.isqrt(n) + 1) if n % k == 0 for d in (k, n // k)}  # sqrt(n) steps
    return [dp * mp // gpn for dp in sorted(divisors) if (dp * mp) % gpn == 0 and dp * mp // gpn <= limit]


def _check_phases(exp: Experiment, run: RunSchedule, phases: list[PhasePlan]) -> list[Finding]:
    """Each phase's GPUs split into whole replicas whose DP divides every batch size of the phase's steps."""
    problems: list[Finding] = []
    mp, mbs, final = exp.model_parallel_size, exp.batch.micro_batch_size, exp.batch.global_batch_size
    several = len(phases) > 1
    if exp.slurm.node_schedule and exp.slurm.nodes not in [ph.phase.nodes for ph in phases]:
        problems.append(Finding("slurm.nodes", exp.slurm.nodes,
                                f"is the node count of the phase being launched: one of the node schedule's "
                                f"{[ph.phase.nodes for ph in phases]}"))
    for ph in phases:
        where = ph.phase.field if several else "slurm.nodes"
        label = f"{ph.phase.describe()}: " if several else ""
        if ph.world_size % mp:
            problems.append(Finding(where, ph.phase.nodes, f"{label}nodes x gpus_per_node = {ph.world_size} GPUs is not "
                                                           f"a multiple of TP x PP = {mp}"))
            continue
        if several and ph.steps == 0:
            problems.append(Finding(where, ph.phase.nodes, f"{label}starts after the training ends at step "
                                                           f"{ph.last_step}: it never runs", "warning"))
            continue
        dp = int(ph.dp)
        sizes = ph.batch_sizes if several else tuple(
            [inc.global_batch_size for inc in run.increments] + [final])
        for gbs in sizes:
            if gbs % (mbs * dp):
                field = where if several else ("batch.global_batch_size" if gbs == final
                                               else "batch.rampup")
                value = ph.phase.nodes if several else gbs
                during = "" if gbs == final else " during the rampup"
                problems.append(Finding(field, value,
                                        f"{label}global batch size {gbs}{during} is not divisible by MBS x DP = "
                                        f"{mbs} x {dp} = {mbs * dp}; valid node counts"
                                        f"{' for this phase' if several else ''}: {valid_node_counts(exp, list(sizes))[:12]}"))
                break
    return problems


def _check(exp: Experiment, run: RunSchedule, size: RunSize, phases: list[PhasePlan]) -> list[Finding]:
    schedule, params = run.batch, size.params
    problems = _check_phases(exp, run, phases)
    empty = [stage for stage, (start, stop) in enumerate(zip(params.parts, params.parts[1:])) if start == stop]
    if empty:
        problems.append(Finding("parallel.partition_method", exp.parallel.partition_method,
                                f"leaves pipeline stage(s) {empty} without any layer (boundaries {list(params.parts)}); "
                                "use fewer stages or another method"))
    if exp.parallel.tensor > exp.slurm.gpus_per_node and exp.slurm.device == "gpu":
        problems.append(Finding("parallel.tensor", exp.parallel.tensor,
                                f"TP spans nodes (gpus_per_node = {exp.slurm.gpus_per_node}): tensor parallelism across nodes is very slow",
                                "warning"))
    ffn, h = size.ffn, exp.model.hidden_size
    if ffn != 4 * h:
        problems.append(Finding("model.ffn_hidden_size", ffn,
                                f"differs from 4 x hidden_size = {4 * h}: tr8-104B copied tr1-13B's 20480 and trained a 57B "
                                "model believing it was 104B; leave the key out to derive it", "warning"))
    if schedule.has_rampup and exp.train.samples is not None and exp.train.samples <= schedule.rampup_samples:
        problems.append(Finding("train.samples", exp.train.samples,
                                f"must exceed batch.rampup.samples ({schedule.rampup_samples})"))
    if run.warmup_samples > run.decay_samples and exp.lr_schedule.style != "constant":
        problems.append(Finding("lr_schedule", {"warmup_samples": run.warmup_samples, "decay_samples": run.decay_samples},
                                "warmup must end before decay ends"))
    if exp.checkpoint.save_interval is None and not exp.checkpoint.save_schedule:
        problems.append(Finding("checkpoint.save_interval", None,
                                "no checkpoints will be saved before exit; set save_interval", "warning"))
    beyond = [f"{a}-{b}" for a, b in run.skip_ranges if b > run.train_iters]
    if beyond:
        problems.append(Finding("train.skip_iterations", beyond, f"goes past the last iteration {run.train_iters}: "
                                                                 "those iterations never run", "warning"))
    limit = parse_time_limit(exp.slurm.time)
    if exp.checkpoint.exit_duration_in_mins >= limit:
        problems.append(Finding("checkpoint.exit_duration_in_mins", exp.checkpoint.exit_duration_in_mins,
                                f"must be below the time limit slurm.time = {exp.slurm.time} ({limit} min), "
                                "or Slurm kills the job before it saves"))
    return problems


def _check_memory(exp: Experiment, mem: Memory) -> list[Finding]:
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
        return [Finding(where, value, f"{what}: it does not fit; try {fixes}")]
    if total > NEAR_LIMIT * limit:
        return [Finding(where, value, f"{what}: above {NEAR_LIMIT:.0%}, little is left for the CUDA context, "
                                      "NCCL buffers and fragmentation", "warning")]
    return []


def _check_budget(exp: Experiment, days: float | None, storage: Storage) -> list[Finding]:
    """A warning where the estimated days or the checkpoints left on scratch are far beyond the experiment's budget."""
    est, problems = exp.estimate, []
    if est.budget_days is not None and days is not None and days > OVER_BUDGET * est.budget_days:
        problems.append(Finding("estimate.budget_days", est.budget_days,
                                f"the plan estimates {days:.1f} days at {est.tflops_per_gpu:g} TFLOPs/GPU, "
                                f"{days / est.budget_days:.1f}x the budget", "warning"))
    tb = storage.scratch / 1e12
    if est.budget_storage_tb is not None and tb > OVER_BUDGET * est.budget_storage_tb:
        problems.append(Finding("estimate.budget_storage_tb", est.budget_storage_tb,
                                f"the checkpoints left on scratch fill {tb:.1f} TB, {tb / est.budget_storage_tb:.1f}x "
                                "the budget; backup.keep_last / keep_every, or a longer save_interval, keep fewer",
                                "warning"))
    return problems


def _notes(run: RunSchedule) -> list[str]:
    notes = []
    schedule, warmup_samples, warmup_steps = run.batch, run.warmup_samples, run.warmup_steps
    if schedule.has_rampup:
        off = [inc for inc in run.increments if inc.steps != inc.naive_steps]
        if off:
            first = off[0]
            notes.append(
                f"rampup steps per increment are exact, not samples/GBS: Megatron changes the batch size when consumed "
                f"samples pass k x {schedule.samples_per_increment:.2f}, so the last step of an increment overshoots "
                f"(GBS {first.global_batch_size}: {first.steps} steps, not {first.naive_steps})")
        notes.append(
            f"the rampup lasts {schedule.rampup_steps} steps ({run.rampup_consumed} samples): "
            f"steps per increment shrink as the batch grows, so a constant steps-per-increment guess is wrong "
            f"(the tr1-13B draft assumed 160 per increment, the tr1-13B notes '5k steps')")
        if 0 < warmup_samples <= schedule.rampup_samples:
            gbs = schedule.batch_size_of_step(warmup_steps)
            notes.append(
                f"LR warmup of {warmup_samples} samples ends inside the rampup, at step {warmup_steps} (GBS {gbs}): "
                f"samples and steps convert only through the rampup schedule, never at a fixed steps-per-increment "
                f"rate (the tr1-13B notes did that and took their 216_320 warmup samples for 2000 steps)")
    return notes


def _exit_stops(exit_interval: int | None, first: int, last: int, train_iters: int) -> int:
    """Tasks that end at a multiple of checkpoint.exit_interval within steps first..last (not at the end)."""
    if not exit_interval:
        return 0
    last = min(last, train_iters - 1)
    return max(0, last // exit_interval - (first - 1) // exit_interval)


def _total(days) -> float | None:
    values = list(days)
    return None if any(d is None for d in values) else sum(values)


def make_plan(exp: Experiment, run: RunSchedule | None = None) -> Plan:
    """The plan of `exp`; `run` is its RunSchedule when the caller has built it already.

    The numbers first (the run schedule's, then the sizes), then the checks that read them.
    """
    run = run or run_schedule(exp)
    mp = exp.model_parallel_size
    gpus = [span.phase.nodes * exp.slurm.gpus_per_node for span in run.spans]
    # The memory of the phase with the fewest DP ranks: ZeRO shards least and the most micro-batches are in flight.
    fewest = min(gpus) / mp
    saves = saved_steps(run.save_steps, run.train_iters, exp.checkpoint.exit_interval,
                        [span.last_step for span in run.spans[:-1]])
    exit_stops = [_exit_stops(exp.checkpoint.exit_interval, span.phase.first_step, span.last_step, run.train_iters)
                  for span in run.spans]
    size = size_run(exp, int(fewest) if fewest == int(fewest) else 1, saves,
                    [(span.tokens, world) for span, world in zip(run.spans, gpus)], len(run.save_steps), exit_stops)
    phases = plan_phases(run, gpus, mp, size)
    schedule, iters, samples = run.batch, run.train_iters, run.train_samples
    gbs, ev = schedule.global_batch_size, exp.logging
    rampup_sizes = [inc.global_batch_size for inc in run.increments] + [gbs]
    valid = (iters // ev.eval_interval + 1) * ev.eval_iters * gbs
    schedule_problems = []
    if run.node_schedule_error is not None:
        schedule_problems = [Finding("slurm.node_schedule", [dataclasses.asdict(p) for p in exp.slurm.node_schedule],
                                     run.node_schedule_error)]
    memory_problems, notes = _check_memory(exp, size.memory), _notes(run)
    budget_problems = _check_budget(exp, _total(ph.days for ph in phases), size.storage)
    return Plan(
        name=exp.name,
        params=size.params,
        dp=exp.world_size / mp,
        world_size=exp.world_size,
        memory=size.memory,
        storage=size.storage,
        increments=list(run.increments),
        rampup_steps=schedule.rampup_steps,
        rampup_samples_consumed=run.rampup_consumed,
        train_iters=iters,
        train_samples=samples,
        tokens=run.tokens_trained,
        full_length_tokens=samples * exp.model.seq_length,
        curriculum_steps=run.tokens.ramp_steps if run.tokens is not None else None,
        warmup_samples=run.warmup_samples,
        warmup_steps=run.warmup_steps,
        decay_samples=run.decay_samples,
        decay_steps=run.decay_steps,
        days=_total(ph.days for ph in phases),
        days_seed_rounded=_total(ph.days_seed_rounded for ph in phases),
        phases=phases,
        nodes_during_rampup=valid_node_counts(exp, rampup_sizes) if schedule.has_rampup else [],
        nodes_after_rampup=valid_node_counts(exp, [gbs]),
        # Megatron's dataset targets: train.samples as written (or iters x GBS), then eval and test.
        dataset_sizes=(exp.train.samples or iters * gbs, valid, ev.eval_iters * gbs),
        exit_duration_in_mins=exp.checkpoint.exit_duration_in_mins,
        exit_margin_mins=exp.checkpoint.exit_margin_mins,
        skips=list(run.skip_spans),
        problems=schedule_problems + _check(exp, run, size, phases) + memory_problems + budget_problems,
        notes=notes,
    )
