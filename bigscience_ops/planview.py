"""Plans and resolved experiments as text and JSON-ready data, for `bsops plan` and `bsops show`."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import yaml

from bigscience_ops.benchmark_results import Measured, measured_tflops, read_results
from bigscience_ops.config.loading import to_dict

from bigscience_ops.data.preflight import DataCheck
from bigscience_ops.schema import Experiment
from bigscience_ops.plan import Plan
from bigscience_ops.sizing import GB, TRAIN_BYTES, gpu_memory_from_constraint, partitioned_optimizer



def _b(n: float) -> str:
    """A count in B(illions) or M(illions), as model sizes are spoken of."""
    return f"{n / GB:,.2f}B" if n >= GB else f"{n / 1e6:,.1f}M"


def _gb(n: float) -> str:
    if n >= 1000 * GB:
        return f"{n / (1000 * GB):,.1f} TB"
    return f"{n / GB:,.1f} GB" if n >= GB else f"{n / 1e6:,.1f} MB"


def _gib(n: float) -> str:
    """GPU memory in GiB, as nvidia-smi and the vendors' "32 GB" mean it."""
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _duration(days: float | None) -> str:
    if days is None:
        return "-"
    for unit, scale in (("days", 1), ("hours", 24), ("minutes", 1440)):
        if days * scale >= 1:
            return f"{days * scale:.2f} {unit}"
    return f"{days * 86400:.2f} seconds"


def plan_data(plan: Plan) -> dict[str, Any]:
    data = dataclasses.asdict(plan)
    data["params"]["max_per_gpu"] = plan.params.max_per_gpu
    data["memory"].update(total_per_stage=list(plan.memory.total_per_stage), largest_stage=plan.memory.largest_stage,
                          largest_total=plan.memory.largest_total)
    data["problems"] = [dataclasses.asdict(p) | {"text": str(p)} for p in plan.problems]
    # DP is world / (TP x PP): a whole number on a valid plan, a fraction only on one the checks refuse.
    data["dp"] = _whole(plan.dp)
    for phase in data["phases"]:
        phase["dp"] = _whole(phase["dp"])
    if plan.skips:
        for skip, shown in zip(plan.skips, data["skips"]):
            shown["iterations"] = skip.iterations
    else:
        del data["skips"]  # a run without skips keeps the plan it always had
    return data


def data_check_data(data: DataCheck) -> dict[str, Any]:
    """The pre-flight checks for `plan --json`: each blend entry, the errors (refusing or not), warnings and notes."""
    entries = []
    for entry in data.entries:
        shown = dataclasses.asdict(entry)
        shown["max_id"] = dataclasses.asdict(entry.max_id) if entry.max_id is not None else None
        entries.append(shown)
    return {"entries": entries, "refused": bool(data.refusing),
            "errors": [{"kind": type(e).__name__, "field": e.field, "path": e.path, "text": str(e)} for e in data.errors],
            "warnings": list(data.warnings), "notes": list(data.notes)}


def _whole(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def plan_text(plan: Plan, exp: Experiment, data: DataCheck | None = None) -> str:
    """The plan as `bsops plan` prints it; `data`: the data's pre-flight checks (a section, and their problems)."""
    m, p, b = exp.model, exp.parallel, exp.batch
    lines = [f"plan for {plan.name}: {exp.description}".rstrip(": "), *overrides_lines(exp), ""]
    add = lines.append
    pc = plan.params
    add("model")
    add(f"  layers {m.num_layers}, hidden {m.hidden_size}, heads {m.num_attention_heads}, ffn {m.ffn_hidden_size}, "
        f"seq {m.seq_length}, vocab {m.vocab_size} padded to {pc.padded_vocab} "
        f"(multiple of {m.make_vocab_size_divisible_by} x TP {p.tensor})")
    rounded = f"{pc.seed_formula / GB:.0f}B" if pc.seed_formula >= GB else _b(pc.seed_formula)
    add(f"  parameters: {pc.total:,} ({_b(pc.total)}); the notes' formula l*(12h^2+13h)+v*h+s*h: "
        f"{pc.seed_formula:,} ({rounded})")
    for stage, count in enumerate(pc.per_stage):
        add(f"  number of parameters on (tensor, pipeline) model parallel rank (0..{p.tensor - 1}, {stage}): {count}")
    add("")
    add("parallelism")
    dp = f"{plan.dp:g}"
    add(f"  {exp.slurm.nodes} nodes x {exp.slurm.gpus_per_node} {'GPUs' if exp.slurm.device == 'gpu' else 'CPU processes'}"
        f" = {plan.world_size}; TP {p.tensor} x PP {p.pipeline} = {exp.model_parallel_size} per replica; DP {dp}; ZeRO {p.zero_stage}")
    if plan.nodes_during_rampup:
        add(f"  valid node counts during the rampup: {_list(plan.nodes_during_rampup)}")
    add(f"  valid node counts{' after the rampup' if plan.nodes_during_rampup else ''}: {_list(plan.nodes_after_rampup)}")
    add("")
    mem = plan.memory
    kind = "fp32" if exp.train.precision == "fp32" else "mixed"
    parts = " + ".join(f"{v} {k}" for k, v in TRAIN_BYTES[kind].items())
    add(f"memory ({exp.train.precision}: {parts} = {mem.bytes_per_param} bytes/param, plus activations)")
    rounded = (f"; {mem.bytes_per_param} x {round(pc.total / GB)}B = {_gb(mem.training_seed_rounded)} with the size "
               "rounded as the training notes write it") if pc.total >= GB else ""
    add(f"  model states, per replica: {_gb(mem.training_total)} exact{rounded}")
    sharding = (f"fp32 weights and optimizer states sharded over DP {mem.sharded_over}"
                + (" by ZeRO-1" if p.zero_stage else " by DeepSpeed's bf16 optimizer")) if mem.sharded_over > 1 else "not sharded"
    recompute = "with activation checkpointing" if p.activation_checkpointing else "no activation checkpointing"
    add(f"  per GPU and stage ({sharding}; activations {recompute}, 1F1B: stage i holds PP - i micro-batches):")
    add(f"   stage   blocks   parameters   model states   in flight   activations      total   ({p.partition_method})")
    for stage, (states, act) in enumerate(zip(mem.model_states_per_stage, mem.activations)):
        add(f"  {stage:>6} {pc.blocks_per_stage[stage]:>8} {_b(pc.per_stage[stage]):>12} {_gib(states):>14} "
            f"{act.in_flight:>11} {_gib(act.total):>13} {_gib(states + act.total):>10}")
    limit = (f" of {_gib(mem.gpu_limit)} ({mem.gpu_limit_source}): {mem.largest_total / mem.gpu_limit:.0%}"
             if mem.gpu_limit else (" (no GPU limit known: set slurm.gpu_memory_gb)" if exp.slurm.device == "gpu" else ""))
    add(f"  largest stage {mem.largest_stage}: {_gib(mem.largest_total)}{limit}")
    add("")
    st, bk = plan.storage, exp.backup
    add("storage over the run")
    lines.extend(_storage_lines(plan, exp))
    if bk.keep_last is not None:
        every = f" and every step multiple of {bk.keep_every}" if bk.keep_every else ""
        add(f"  on scratch, keeping the newest {bk.keep_last}{every}: {st.kept_on_scratch} checkpoints, {_gb(st.scratch)}")
    else:
        add(f"  on scratch: all {st.kept_on_scratch} stay ({_gb(st.scratch)}); backup.keep_last / keep_every would delete old ones")
    if bk.dest is not None:
        add(f"  in the backup ({bk.dest}): {st.total_saves - st.backed_up_whole} weights-only of {_gb(st.weights_bytes)} and "
            f"{st.backed_up_whole} whole: {_gb(st.backup)}")
    else:
        add("  no backup (backup.dest is not set)")
    add("")
    add("batch")
    if b.rampup:
        r = b.rampup
        add(f"  rampup {r.start} {r.increment} {r.samples:_} to {b.global_batch_size}: {len(plan.increments)} increments of "
            f"{r.samples / len(plan.increments):.2f} samples; {plan.rampup_steps} steps, {plan.rampup_samples_consumed:,} samples")
        add("   GBS     first step   steps (exact)   steps (samples/GBS)   samples")
        shown = plan.increments if len(plan.increments) <= 12 else plan.increments[:8] + plan.increments[-2:]
        for i, inc in enumerate(shown):
            if len(plan.increments) > 12 and i == 8:
                add("   ...")
            add(f"  {inc.global_batch_size:>5} {inc.first_step:>12} {inc.steps:>15} {inc.naive_steps:>21} {inc.samples:>10}")
    add(f"  global batch {b.global_batch_size}, micro batch {b.micro_batch_size}, "
        f"{b.global_batch_size // max(1, b.micro_batch_size * int(plan.dp or 1))} micro-batches per step per replica at full size")
    add("")
    add("training")
    given = f"train.samples {exp.train.samples:,}" if exp.train.samples else f"train.iters {exp.train.iters:,}"
    add(f"  {given}: {plan.train_iters:,} iterations, {plan.train_samples:,} samples, {plan.tokens:,} tokens ({_b(plan.tokens)})")
    if plan.curriculum_steps is not None:
        c = exp.curriculum
        add(f"  curriculum ({c.schedule_type}): steps 1-{plan.curriculum_steps:,} train samples cut to "
            f"{c.min_difficulty} growing to {exp.model.seq_length} tokens; {_b(plan.tokens)} tokens trained of "
            f"{_b(plan.full_length_tokens)} at full length ({plan.tokens / plan.full_length_tokens:.1%}); "
            f"time and token-based LR settings count the tokens trained")
    if plan.skips:
        add("  skipped iterations (train.skip_iterations, a rollback's included): data consumed, no update made")
        for sk in plan.skips:
            add(f"    {sk.first}-{sk.last}: {sk.iterations:,} iterations, {sk.samples:,} samples, {sk.tokens:,} tokens "
                f"({_b(sk.tokens)}) consumed without training")
        if len(plan.skips) > 1:
            add(f"    in all: {sum(sk.iterations for sk in plan.skips):,} iterations, "
                f"{sum(sk.samples for sk in plan.skips):,} samples, {sum(sk.tokens for sk in plan.skips):,} tokens")
    add(f"  LR {exp.optimizer.lr:g} -> {exp.optimizer.min_lr:g} ({exp.lr_schedule.style}); "
        f"warmup {plan.warmup_samples:,} samples = {plan.warmup_steps:,} steps; "
        f"decay until {plan.decay_samples:,} samples = step {plan.decay_steps:,}")
    tr, va, te = plan.dataset_sizes
    add(f"  dataset target sizes: train {tr}, validation {va}, test {te}")
    add(f"  exit after {plan.exit_duration_in_mins} min of each {exp.slurm.time} task (margin {plan.exit_margin_mins} min)")
    if plan.days is None:
        add("  no time estimate on CPU (slurm.device: cpu): the TFLOPs assumption is for GPUs")
    else:
        rounded = f" ({_duration(plan.days_seed_rounded)} with the size rounded)" if pc.total >= GB else ""
        gpus = f"on {plan.world_size} GPUs" if len(plan.phases) == 1 else f"over the {len(plan.phases)} node phases"
        add(f"  estimated time at {exp.estimate.tflops_per_gpu:g} TFLOPs/GPU {gpus}: {_duration(plan.days)}"
            f"{rounded}; 8 x tokens x params / (GPUs x FLOPs)")
        measured = measured_on_gpu(exp)
        if measured is not None:
            trained = f" ({measured.model})" if measured.model else ""
            add(f"  measured on {measured.gpu} ({measured.date}, benchmarks/RESULTS.md): {measured.tflops:g} TFLOPs/GPU "
                f"by the trainer{trained}: {_duration(plan.days * exp.estimate.tflops_per_gpu / measured.tflops)} "
                "at that rate")
    if len(plan.phases) > 1:
        add("")
        add("node schedule (each array task trains in one phase; at a boundary it saves, exits and the array "
            "continues at the next size)")
        add("   phase   nodes    GPUs     DP          steps           samples      tokens        time   batch sizes")
        for ph in plan.phases:
            steps = f"{ph.first_step}-{ph.last_step}" if ph.steps else "none"
            sizes = ph.batch_sizes if len(ph.batch_sizes) <= 3 else (ph.batch_sizes[0], "...", ph.batch_sizes[-1])
            add(f"  {ph.phase.index:>6} {ph.phase.nodes:>7} {ph.world_size:>7} {ph.dp:>6g} {steps:>14} "
                f"{ph.samples:>17,} {_b(ph.tokens):>11} {_duration(ph.days):>11}   {', '.join(map(str, sizes))}")
        add(f"  {'total':>6} {'':>7} {'':>7} {'':>6} {plan.train_iters:>14} {plan.train_samples:>17,} "
            f"{_b(plan.tokens):>11} {_duration(plan.days):>11}")
    if data is not None and data.entries:
        add("")
        add("data (pre-flight checks: files, largest token id, tokenizer, epochs)")
        lines.extend(f"  {entry.line(m.seq_length)}" for entry in data.entries)
    notes = plan.notes + (data.notes if data is not None else [])
    if notes:
        add("")
        add("notes")
        lines.extend(f"  - {n}" for n in notes)
    problems = [f"{pr.severity}: {pr}" for pr in plan.problems]
    if data is not None:
        problems += [f"{'error' if data.refusing else 'warning'}: {e}" for e in data.errors]
        problems += [f"warning: {w}" for w in data.warnings]
    if problems:
        add("")
        add("problems")
        lines.extend(f"  - {pr}" for pr in problems)
    return "\n".join(lines) + "\n"


def overrides_lines(exp: Experiment) -> list[str]:
    """`overrides (command line): train.seed=7 ...`: the assignments the experiment was loaded with, each quoted as a
    shell word (the line can be pasted back), or no line."""
    if not exp.overrides:
        return []
    return [f"overrides (command line): {' '.join(shlex.quote(text) for text in exp.overrides)}"]


def measured_on_gpu(exp: Experiment) -> Measured | None:
    """The trainer's TFLOPs measured on the GPU slurm.constraint names, as benchmarks/RESULTS.md has them (a
    source checkout), or None."""
    gpu = gpu_memory_from_constraint(exp.slurm.constraint) if exp.slurm.device == "gpu" else None
    text = read_results() if gpu is not None else None
    return measured_tflops(gpu[0], text) if text else None


def _storage_lines(plan: Plan, exp: Experiment) -> list[str]:
    """What one checkpoint holds and how many the trainer writes (the first lines of "storage over the run")."""
    st, ck = plan.storage, plan.storage.checkpoint
    master = " and fp32 master weights" if exp.train.precision != "fp32" or partitioned_optimizer(exp) else ""
    lines = [f"  one checkpoint: {_gb(ck.total)} in {ck.files} files: weights {_gb(ck.weights)}, optimizer states "
             f"(Adam moments{master}) {_gb(ck.optimizer)}, RNG states and records {_gb(ck.records)}"]
    why = [f"{st.schedule_saves} by the save schedule (the final one included)"]
    if st.exit_saves:
        ends = [f"checkpoint.exit_interval {exp.checkpoint.exit_interval}" if exp.checkpoint.exit_interval else "",
                "node phase boundaries" if len(plan.phases) > 1 else ""]
        why.append(f"{st.exit_saves} where a task ends ({', '.join(e for e in ends if e)})")
    lines.append(f"  the trainer saves {st.saves} checkpoints, {'; '.join(why)}: {_gb(st.saves * st.checkpoint_bytes)}")
    if st.time_exit_saves:
        lines.append(f"  and about {st.time_exit_saves} more where a task reaches checkpoint.exit_duration_in_mins "
                     f"({exp.checkpoint.exit_duration_in_mins} min) at the estimated time: {_gb(st.written)} in all")
    return lines


def _list(nodes: list[int], limit: int = 14) -> str:
    if not nodes:
        return "none"
    shown = ", ".join(str(n) for n in nodes[:limit])
    return shown + (f", ... {nodes[-1]}" if len(nodes) > limit else "")


def show_text(exp: Experiment) -> str:
    """The resolved config as YAML; derived values are marked `# derived`."""
    data = to_dict(exp)
    if not data["overrides"]:
        del data["overrides"]  # loaded without any: nothing to say
    head = {key: data.pop(key) for key in ("name", "description")}
    text = yaml.safe_dump(head | data, sort_keys=False, width=120)
    derived = set(exp.derived)
    out, stack = [], []
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        depth = (len(line) - len(stripped)) // 2
        key = stripped.split(":", 1)[0] if ":" in stripped and not stripped.startswith("- ") else None
        if key is not None:
            stack[depth:] = [key]
            if ".".join(stack) in derived:
                line += "  # derived"
        out.append(line)
    if exp.recorded:
        out.append("# A record of another team's run (record: true): what that run used, set aside and not used here:")
        out += [f"#   {dotted}: {value!r}" for dotted, value in exp.recorded]
    return "\n".join(out) + "\n"
