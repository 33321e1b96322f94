"""Derivation: every value an experiment leaves out that follows from others, filled once and recorded.

The ffn size (4 x hidden), max positions (the sequence length), the paths (under paths.output, default
runs/NAME), the job name, the node count (the node schedule's first phase), the exit margin (from the
model's size), the exit duration (the time limit less the margin), the kill switch and the warning
signal. Each filled field is listed in `Experiment.derived`, so nothing derived is typed twice.

Where relative paths resolve, for every command and every install kind: against the experiment
file's project folder, the folder that holds its trainings/ folder, wherever the command runs from.
That holds for inputs (data.blend prefixes, tokenizer files) and outputs (paths.*, the kill switch,
backup.dest, data.cache_dir, eval.hf_cache) alike, so a cron job or an on-call check finds the run the launch
made. An input under corpus/ that the project folder does not have is the bundled corpus's file (an
experiment copied from `tiny` trains on it and converts with its tokenizer). bsops' own experiments
write their outputs under the current folder (config.files.outputs_folder). Every path comes
out absolute, so job scripts and experiment.json never depend on the folder a job runs in.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from bigscience_ops import sizing
from bigscience_ops.resources import ResourceError, bundled
from bigscience_ops.schema import Experiment
from bigscience_ops.slurm import parse_time_limit
from bigscience_ops.config.validation import SIGNAL_SECONDS_MAX, is_task_file


def exit_margin_minutes(num_params: float) -> int:
    """Minutes kept free before the time limit to finish an iteration and write a checkpoint.

    The tr1-13B notes kept 10 minutes for 13B and warned that bigger models need more; the margin grows
    with the square root of the size (about 29 minutes at 104B) and is never below 5 minutes.
    """
    return max(5, math.ceil(10 * math.sqrt(num_params / 13e9)))


def _resolve_path(value: str, root: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else root / path)


def _resolve_input(value: str, root: Path, prefix: bool = False) -> str:
    """An input path: against `root`, unless it is under corpus/ and `root` lacks it, then the bundled corpus's.

    `prefix` is a dataset prefix, there when its .bin or .idx is (or, before a first build, nowhere).
    """
    path = Path(value).expanduser()
    here = Path(_resolve_path(value, root))
    if path.is_absolute() or path.parts[:1] != ("corpus",):
        return str(here)
    if here.exists() or prefix and any(Path(f"{here}{ext}").exists() for ext in (".bin", ".idx")):
        return str(here)
    try:
        corpus = bundled("corpus").resolve()
    except ResourceError:
        return str(here)
    return str(corpus.joinpath(*path.parts[1:]))


RECORD_SET_ASIDE = ("paths.output", "paths.checkpoints", "paths.tensorboard", "paths.logs", "paths.codecarbon",
                    "checkpoint.kill_switch_path", "backup.dest", "data.cache_dir", "eval.hf_cache", "alerts.email_to",
                    "alerts.webhook_url_env", "hub.logs_repo", "hub.tensorboard_repo", "hub.codecarbon_repo",
                    "hub.checkpoints_repo", "hub.remote_template")
"""What a record (`record: true`, a seed's run) keeps only to show: where its run wrote, whom it told, where it pushed."""


def _set_aside(exp: Experiment) -> Experiment:
    """A record with its site values set aside (recorded), each back to its default: derived under the current
    folder, nobody told, nothing pushed."""
    recorded, sections = [], {}
    for dotted in RECORD_SET_ASIDE:
        section, name = dotted.split(".")
        value = getattr(getattr(exp, section), name)
        default = next(f for f in dataclasses.fields(getattr(exp, section)) if f.name == name)
        empty = default.default_factory() if default.default_factory is not dataclasses.MISSING else default.default
        if value != empty:
            recorded.append((dotted, value))
            sections.setdefault(section, {})[name] = empty
    replaced = {section: dataclasses.replace(getattr(exp, section), **values) for section, values in sections.items()}
    return dataclasses.replace(exp, **replaced, recorded=tuple(recorded))


def derive(exp: Experiment, root: Path, output_root: Path | None = None) -> Experiment:
    """Fill every field left out that follows from others, and record which were filled.

    Relative inputs resolve against `root` (the project folder, holding trainings/; see the module's
    docstring for corpus/), those of outputs (paths.*, the kill switch, the backup and index cache
    folders) against `output_root` (`root` when not given).
    """
    out_root = output_root or root
    if exp.record:
        exp = _set_aside(exp)
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
        blend=[dataclasses.replace(d, prefix=_resolve_input(d.prefix, root, prefix=True)) for d in exp.data.blend],
        tokenizer=dataclasses.replace(exp.data.tokenizer, **{
            k: _resolve_input(v, root) for k in ("vocab_file", "merges_file", "json_file")
            if (v := getattr(exp.data.tokenizer, k)) is not None}),
        cache_dir=None if exp.data.cache_dir is None else _resolve_path(exp.data.cache_dir, out_root),
    )
    slurm = fill(exp.slurm, "slurm", job_name=exp.name,
                 nodes=exp.slurm.node_schedule[0].nodes if exp.slurm.node_schedule else 1)
    limit = parse_time_limit(slurm.time)  # validation.check_time_limit has parsed it
    backup = exp.backup
    if backup.dest is not None:
        backup = dataclasses.replace(backup, dest=_resolve_path(backup.dest, out_root))
    evaluation = dataclasses.replace(
        exp.eval, tasks=[_resolve_input(t, root) if is_task_file(t) else t for t in exp.eval.tasks],
        sources={name: _resolve_input(path, root) for name, path in exp.eval.sources.items()},
        hf_cache=None if exp.eval.hf_cache is None else _resolve_path(exp.eval.hf_cache, out_root))
    evaluation = fill(evaluation, "eval", nodes=math.ceil(exp.parallel.tensor * exp.parallel.pipeline / slurm.gpus_per_node))
    exp = dataclasses.replace(exp, model=m, paths=paths, data=data, slurm=slurm, backup=backup, eval=evaluation)
    params = sizing.count_parameters(exp.model, exp.parallel.tensor).total
    ck = fill(exp.checkpoint, "checkpoint", exit_margin_mins=exit_margin_minutes(params),
              kill_switch_path=f"{output}/kill-switch")
    # Not positive when the time limit is shorter than the margin: validation.check_exit_duration refuses that.
    ck = fill(ck, "checkpoint", exit_duration_in_mins=limit - ck.exit_margin_mins)
    ck = dataclasses.replace(ck, kill_switch_path=_resolve_path(ck.kill_switch_path, out_root))
    slurm = fill(exp.slurm, "slurm", signal_seconds=min(SIGNAL_SECONDS_MAX, ck.exit_margin_mins * 60))
    return dataclasses.replace(exp, checkpoint=ck, slurm=slurm, derived=tuple(exp.derived) + tuple(derived))
