"""The rules an experiment's fields obey together, one named check per concern.

Each field's own type and bounds are the schema's (typedyaml checks them while building). What is
here holds across fields: a model TP can split, a batch rampup that reaches its size, one way to
give each length, save ranges in order, a time limit longer than the exit margin. config/loading.py calls
`validate` on every experiment it builds (from YAML or from a run record) and `check_derived` once
derivation has filled the values left out; nothing else calls them. Each raises ConfigError naming
the source, the field path, the value and what is allowed; the first broken rule is reported.

What a run breaks on given hardware (memory per GPU, DP, phases against the rampup) is the plan's
to check (plan.py), and whether a job can run at a site (data, partition, addresses) is
config/site_values.py's: both need more than the experiment's own fields.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path
from typing import Any

from bigscience_ops import hub_remote, sizing
from bigscience_ops.errors import ConfigError
from bigscience_ops.schedule.batch_lr import parse_skip_ranges
from bigscience_ops.schema import (
    MAX_STEPS, METRIC_KEY, METRIC_NAME, AlertsConfig, BatchConfig, CheckpointConfig, CurriculumConfig, DataConfig, EvalConfig,
    Experiment, LRScheduleConfig, ModelConfig, OptimizerConfig, ParallelConfig, SlurmConfig, TrainConfig,
)
from bigscience_ops.slurm import parse_time_limit

SIGNAL_SECONDS_MAX = 65535  # Slurm's limit for --signal


def validate(exp: Experiment, source: str) -> None:
    """Every cross-field rule that needs only the fields as written, in a fixed order."""
    check_node_schedule(exp.slurm, source)
    check_model(exp.model, exp.parallel, source)
    check_train_length(exp.train, exp.batch, source)
    check_rampup(exp.batch, exp.train, source)
    check_lr_schedule(exp.lr_schedule, source)
    check_optimizer(exp.optimizer, source)
    check_save_schedule(exp.checkpoint, source)
    check_precision(exp.train, exp.slurm, source)
    check_resumable(exp.train, exp.parallel, exp.slurm, source)
    check_data(exp.data, source)
    hub_remote.check_hub(exp.hub, source)
    check_skips(exp.train, source)
    check_curriculum(exp.curriculum, exp.model, source)
    check_time_limit(exp.slurm, source)
    check_alerts(exp.alerts, source)
    check_eval(exp.eval, source)


def check_derived(exp: Experiment, source: str) -> None:
    """The rules on values derivation fills in (an exit duration from the time limit, the warning signal), and on
    the run's folders once they are absolute."""
    check_run_folders(exp, source)
    check_exit_duration(exp, source)
    check_signal_seconds(exp.slurm, source)
    check_kill_switch(exp, source)


def _check(condition: bool, source: str, dotted: str, value: Any, allowed: str) -> None:
    if not condition:
        raise ConfigError(source, dotted, value, allowed)


def check_node_schedule(slurm: SlurmConfig, source: str) -> None:
    """Each phase's shape; whether the phases start in order (through the rampup) is the plan's check."""
    schedule = slurm.node_schedule
    for i, phase in enumerate(schedule):
        where = f"slurm.node_schedule[{i}]"
        starts = {k: v for k in ("from_samples", "from_iteration") if (v := getattr(phase, k)) is not None}
        if i == 0:
            _check(not starts, source, where, starts,
                   "the first phase starts the run: leave out from_samples and from_iteration")
            continue
        _check(len(starts) == 1, source, where, dataclasses.asdict(phase),
               "set exactly one of from_samples and from_iteration")
        _check(phase.nodes != schedule[i - 1].nodes, source, f"{where}.nodes", phase.nodes,
               f"must differ from the previous phase's {schedule[i - 1].nodes} nodes (or remove the phase)")


def check_model(m: ModelConfig, p: ParallelConfig, source: str) -> None:
    """A shape the heads, the pipeline stages and the tensor-parallel ranks can split."""
    _check(m.hidden_size % m.num_attention_heads == 0, source, "model.hidden_size", m.hidden_size,
           f"must be divisible by model.num_attention_heads ({m.num_attention_heads})")
    _check(m.num_layers >= p.pipeline, source, "model.num_layers", m.num_layers,
           f"must be at least parallel.pipeline ({p.pipeline}): every stage holds blocks")
    try:
        sizing.check_partition_method(p.partition_method)
    except ValueError as exc:
        raise ConfigError(source, "parallel.partition_method", p.partition_method, str(exc)) from None
    _check(m.num_attention_heads % p.tensor == 0, source, "parallel.tensor", p.tensor,
           f"must divide model.num_attention_heads ({m.num_attention_heads})")
    if m.ffn_hidden_size is not None:
        _check(m.ffn_hidden_size % p.tensor == 0, source, "model.ffn_hidden_size", m.ffn_hidden_size,
               f"must be divisible by parallel.tensor ({p.tensor})")
    if m.max_position_embeddings is not None:
        _check(m.max_position_embeddings >= m.seq_length, source, "model.max_position_embeddings",
               m.max_position_embeddings, f"must be at least model.seq_length ({m.seq_length})")


def check_train_length(t: TrainConfig, b: BatchConfig, source: str) -> None:
    """One length, and one no run has (every schedule is walked step by step: plan and trainer)."""
    _check((t.samples is None) != (t.iters is None), source, "train", {"samples": t.samples, "iters": t.iters},
           "set exactly one of train.samples and train.iters")
    if t.samples is not None:
        _check(t.samples // b.global_batch_size <= MAX_STEPS, source, "train.samples", t.samples,
               f"gives more than {MAX_STEPS:,} steps at global batch size {b.global_batch_size}; no run is that long")
    if b.rampup is not None:
        _check(b.rampup.samples // b.rampup.start <= MAX_STEPS, source, "batch.rampup.samples", b.rampup.samples,
               f"ramps up over more than {MAX_STEPS:,} steps from batch size {b.rampup.start}")


def check_rampup(b: BatchConfig, t: TrainConfig, source: str) -> None:
    """A batch-size rampup Megatron accepts: in samples, from below the batch size, in whole increments."""
    r = b.rampup
    if r is None:
        return
    _check(t.iters is None, source, "batch.rampup", dataclasses.asdict(r),
           "a batch-size rampup needs train.samples, not train.iters (Megatron rejects the pair)")
    _check(r.start < b.global_batch_size, source, "batch.rampup.start", r.start,
           f"must be below batch.global_batch_size ({b.global_batch_size})")
    _check((b.global_batch_size - r.start) % r.increment == 0, source, "batch.rampup.increment", r.increment,
           f"must divide global_batch_size - start = {b.global_batch_size} - {r.start} = "
           f"{b.global_batch_size - r.start}")


def check_lr_schedule(lr: LRScheduleConfig, source: str) -> None:
    """Warmup and decay each given in one unit at most."""
    for kind in ("warmup", "decay"):
        given = [u for u in ("samples", "tokens", "iters") if getattr(lr, f"{kind}_{u}") is not None]
        _check(len(given) <= 1, source, f"lr_schedule.{kind}_{given[-1] if given else 'samples'}",
               {f"{kind}_{u}": getattr(lr, f"{kind}_{u}") for u in given},
               f"set at most one of {kind}_samples, {kind}_tokens, {kind}_iters")


def check_optimizer(opt: OptimizerConfig, source: str) -> None:
    _check(0 <= opt.min_lr <= opt.lr, source, "optimizer.min_lr", opt.min_lr,
           f"must be in [0, optimizer.lr = {opt.lr}]")


def check_save_schedule(ck: CheckpointConfig, source: str) -> None:
    """Save-interval ranges that end in increasing order."""
    last = 0
    for i, rng in enumerate(ck.save_schedule):
        _check(rng.until > last, source, f"checkpoint.save_schedule[{i}].until", rng.until,
               f"ranges must end in increasing order (previous ends at {last})")
        last = rng.until


def check_precision(t: TrainConfig, slurm: SlurmConfig, source: str) -> None:
    if slurm.device == "cpu":
        _check(t.precision != "fp16", source, "train.precision", t.precision,
               "fp16 needs a GPU; with slurm.device: cpu use fp32 or bf16")


def check_resumable(t: TrainConfig, p: ParallelConfig, slurm: SlurmConfig, source: str) -> None:
    """Every task resumes the last one's checkpoint (tests/trainer/test_trainer_matrix_*.py launch each precision x ZeRO x
    layout). A node phase changes DP between tasks: without ZeRO, DeepSpeed's bf16 optimizer still keeps its state
    in per-DP-rank partitions, which load only at the DP size that wrote them and which the universal converter
    takes only from ZeRO's optimizer (checkpoints/universal.py), so the first phase change would fail at resume."""
    if t.precision == "bf16" and p.zero_stage == 0 and slurm.node_schedule:
        raise ConfigError(source, "parallel.zero_stage", 0,
                          "must be 1 when train.precision is bf16 and slurm.node_schedule changes the node count: "
                          "a bf16 checkpoint without ZeRO cannot be resumed at another DP size (or drop the "
                          "node_schedule)")


def check_data(data: DataConfig, source: str) -> None:
    """A train/valid/test split of three numbers; a GPT-2 BPE tokenizer's two files given together."""
    split = data.split.split(",")
    _check(len(split) == 3 and all(re.fullmatch(r"\d+(\.\d+)?", s.strip()) for s in split)
           and sum(float(s) for s in split) > 0, source, "data.split", data.split,
           "three non-negative numbers such as '949,50,1' (train,valid,test)")
    tok = data.tokenizer
    # The tokenizer's files are site values: both blank is on plan's to-do list (config/site_values.py); one of two is wrong.
    if tok.kind == "gpt2-bpe":
        _check((tok.vocab_file is None) == (tok.merges_file is None), source, "data.tokenizer",
               dataclasses.asdict(tok),
               "kind gpt2-bpe needs vocab_file and merges_file (both, or neither until you fill them in)")


def check_skips(t: TrainConfig, source: str) -> None:
    try:
        parse_skip_ranges(t.skip_iterations)
    except ValueError as exc:
        raise ConfigError(source, "train.skip_iterations", t.skip_iterations, str(exc)) from None


def check_curriculum(c: CurriculumConfig | None, m: ModelConfig, source: str) -> None:
    """A sequence-length curriculum that starts on a step and reaches model.seq_length."""
    if c is None:
        return
    seq = m.seq_length
    _check(c.min_difficulty % c.difficulty_step == 0, source, "curriculum.min_difficulty", c.min_difficulty,
           f"must be a multiple of curriculum.difficulty_step ({c.difficulty_step})")
    _check(c.min_difficulty <= seq, source, "curriculum.min_difficulty", c.min_difficulty,
           f"must not exceed model.seq_length ({seq}), the curriculum's end")
    _check(seq % c.difficulty_step == 0, source, "model.seq_length", seq,
           f"must be a multiple of curriculum.difficulty_step ({c.difficulty_step}), or the curriculum never "
           "reaches it")


def is_email_address(text: object) -> bool:
    """An email address on one line: an @, no control character, line break or space (nothing that could add a
    header). The email channel checks the addresses it is given on the command line with this too."""
    return isinstance(text, str) and "@" in text and text.isprintable() and " " not in text


def check_alerts(alerts: AlertsConfig, source: str) -> None:
    """Addresses an email can carry, checked when the experiment is read, not when the first alert goes out."""
    for i, address in enumerate(alerts.email_to):
        _check(is_email_address(address), source, f"alerts.email_to[{i}]", address,
               "an email address without spaces, control characters or line breaks")
    if alerts.email_from is not None:
        _check(is_email_address(alerts.email_from), source, "alerts.email_from", alerts.email_from,
               "an email address without spaces, control characters or line breaks")


TASK_FILE_SUFFIXES = (".yaml", ".yml")


def is_task_file(task: str) -> bool:
    """Whether an eval.tasks entry names a task YAML file of the user's own (else an lm-eval registered task)."""
    return task.lower().endswith(TASK_FILE_SUFFIXES)


def eval_task_names(ev: EvalConfig) -> list[str]:
    """The registered task names of eval.tasks (the files' task names are in the files)."""
    return [t for t in ev.tasks if not is_task_file(t)]


def check_eval(ev: EvalConfig, source: str) -> None:
    """Task and source names an lm-eval result and a TensorBoard tag can carry, metrics written task/metric, no
    source named as a task (both give rows of one table), an eval job time Slurm reads."""
    for i, task in enumerate(ev.tasks):
        if not is_task_file(task):
            problem = METRIC_NAME.problem(task)
            _check(problem is None, source, f"eval.tasks[{i}]", task,
                   f"{problem}; allowed: {METRIC_NAME.allowed}, or a task YAML file (a path ending .yaml or .yml)")
    for name in ev.sources:
        problem = METRIC_NAME.problem(name)
        _check(problem is None, source, f"eval.sources.{name}", name, f"source name: {problem}; allowed: {METRIC_NAME.allowed}")
        _check(name not in eval_task_names(ev), source, f"eval.sources.{name}", name,
               "a name no entry of eval.tasks has (a source and a task would share one row of the results)")
    for task in ev.num_fewshot_per_task:
        _check(task in ev.tasks, source, f"eval.num_fewshot_per_task.{task}", task,
               "an entry of eval.tasks, as written there: " + (", ".join(ev.tasks) or "eval.tasks is empty"))
    keyed = [("eval.alert_drop", key) for key in ev.alert_drop]
    keyed += [(f"eval.references.{ref}", key) for ref, values in ev.references.items() for key in values]
    for where, key in keyed:
        problem = METRIC_KEY.problem(key)
        task, slash, metric = key.partition("/")
        _check(problem is None and bool(slash and task and metric) and "/" not in metric, source, f"{where}.{key}", key,
               f"a metric written task/metric (lambada_openai/acc, pile_cc/bits_per_byte): {METRIC_KEY.allowed}")
    for name in ev.references:
        _check(METRIC_NAME.problem(name) is None and len(name) <= 64, source, f"eval.references.{name}", name,
               f"a reference model name of at most 64 characters: {METRIC_NAME.allowed}")
    try:
        parse_time_limit(ev.time)
    except ValueError as exc:
        raise ConfigError(source, "eval.time", ev.time, str(exc)) from None


def check_time_limit(slurm: SlurmConfig, source: str) -> None:
    try:
        parse_time_limit(slurm.time)
    except ValueError as exc:
        raise ConfigError(source, "slurm.time", slurm.time, str(exc)) from None


def check_exit_duration(exp: Experiment, source: str) -> None:
    """A derived exit duration leaves the exit margin before the time limit: the time limit must be longer."""
    ck = exp.checkpoint
    if "checkpoint.exit_duration_in_mins" in exp.derived:
        _check(ck.exit_duration_in_mins is not None and ck.exit_duration_in_mins > 0, source, "slurm.time",
               exp.slurm.time, f"must be longer than the exit margin of {ck.exit_margin_mins} minutes")


RUN_FOLDERS = ("output", "checkpoints", "tensorboard", "logs", "codecarbon")
"""The paths.* fields a run writes into (its records, checkpoints, events, logs)."""
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys",
                "/usr", "/var/lib", "/var/log", "/var/spool", "/var/cache", "/var/run", "/var/lock", "/var/mail",
                "/var/backups")
"""The system's own folders: refused with everything inside them."""
SYSTEM_FOLDERS = ("/", "/home", "/root", "/var", "/tmp", "/var/tmp", "/opt", "/srv", "/mnt", "/media", "/run")
"""Folders a run may write below, never into itself (its checkpoints/ and logs/ would sit among everyone's)."""
RUN_FOLDERS_ALLOWED = ("allowed: a folder of the run's own (default runs/NAME beside the experiment's trainings/, or "
                       "one on scratch), never /, the home folder, a folder of the system ({trees}, and what is "
                       "inside them) or one of {folders} itself: bsops writes the run's records, checkpoints and logs "
                       "there")


def _refused_folder(path: str) -> bool:
    home = os.path.expanduser("~")
    for form in {os.path.normpath(path), os.path.realpath(path)}:
        real = os.path.realpath(form)
        if form in SYSTEM_FOLDERS or form in (home, os.path.realpath(home)) or real in SYSTEM_FOLDERS:
            return True
        if any(form == tree or form.startswith(tree + "/") for tree in SYSTEM_TREES):
            return True
    return False


def check_run_folders(exp: Experiment, source: str) -> None:
    """A run writes into paths.output, checkpoints, tensorboard, logs and codecarbon: none of them may be /, the home
    folder or a system folder (a typo such as `paths.output=/`, or `~`, would scatter a run's files there, and a
    later retention or rollback deletes inside it)."""
    for name in RUN_FOLDERS:
        value = getattr(exp.paths, name)
        if value and _refused_folder(value):
            raise ConfigError(source, f"paths.{name}", value, RUN_FOLDERS_ALLOWED.format(
                trees=", ".join(SYSTEM_TREES[:12]) + "...", folders=", ".join(SYSTEM_FOLDERS[1:])))


KILL_SWITCH_ALLOWED = ("the path of a file (existing or not) that is not a directory, a device, a pipe, the run "
                       "folder, one of its folders or a folder above them, e.g. <output>/kill-switch (the default)")


def check_kill_switch(exp: Experiment, source: str) -> None:
    """The kill switch is a file: one the run or its folders would make exist (the run folder itself, `/`, the
    checkpoints folder) or one that is not a regular file (/dev/null) would stop the run for ever, silently."""
    switch = exp.checkpoint.kill_switch_path
    if not switch:
        return  # not derived yet (a hand-built config): the launch's own checks apply
    path = Path(os.path.normpath(switch))
    folders = [Path(os.path.normpath(f)) for f in (exp.paths.output, exp.paths.checkpoints, exp.paths.tensorboard,
                                                   exp.paths.logs, exp.paths.codecarbon) if f]
    _check(not any(path == folder or path in folder.parents for folder in folders), source,
           "checkpoint.kill_switch_path", switch, KILL_SWITCH_ALLOWED)
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # not there (the usual case) or not reachable: the file a user touches to stop the run
    _check(stat.S_ISREG(mode), source, "checkpoint.kill_switch_path", switch, KILL_SWITCH_ALLOWED)


def check_signal_seconds(slurm: SlurmConfig, source: str) -> None:
    if slurm.signal_seconds is not None:
        _check(1 <= slurm.signal_seconds <= SIGNAL_SECONDS_MAX, source, "slurm.signal_seconds", slurm.signal_seconds,
               f"must be 1 to {SIGNAL_SECONDS_MAX} seconds (Slurm's limit for --signal)")
