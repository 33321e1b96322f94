"""Experiment -> the Slurm job script (Jinja) and the DeepSpeed JSON, written into one folder.

Every `{{ value }}` in a template is shell-quoted by the environment itself (its `finalize`), so
a template cannot forget to quote; only values wrapped with the `raw` filter (the experiment's
own env_setup shell lines, and `#`-comment text) go through unquoted. Quoting cannot save an
`#SBATCH` line from a newline, so `finalize` also refuses every control character (a raw shell
line may hold a tab): the second wall behind the config loader's check.

`#SBATCH` lines are read by sbatch's own parser, not bash: their values go through the `sbatch`
filter (slurm.sbatch_quote), and Slurm names are checked against their field's character set
(`slurm_options`) even when a config was built in code and bypassed the loader.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from bigscience_ops import __version__, slurm
from bigscience_ops.config.loading import to_dict
from bigscience_ops.schema import PORT_SPREAD, SLURM_CONSTRAINT, SLURM_NAME, SLURM_NAMES, SLURM_NODES, Experiment
from bigscience_ops.errors import BsopsError, PlanError
from bigscience_ops.plan import Plan
from bigscience_ops.resources import bundled
from bigscience_ops.run.lock import HELD_ENV, LOCK_NAME
from bigscience_ops.run.log import main_log
from bigscience_ops.run.records import EXIT_NOT_TRAINING
from bigscience_ops.typedyaml import PLAIN, SHELL_LINE, Charset, check_charset, control_allowed, control_character
from bigscience_ops.run.records import EXPERIMENT_JSON

TEMPLATES = bundled("templates")
DEEPSPEED_JSON = "ds_config.json"


class RenderError(BsopsError):
    """A value cannot go into a job script: names the value, what is wrong and what is allowed."""


class Raw(str):
    """Text a template may emit unquoted: trusted shell code or comment text."""


def _refuse_control(text: str, kind: str) -> None:
    bad = control_character(text, kind)
    if bad is not None:
        raise RenderError(f"refusing to render {text!r} into a job script: {bad}; {control_allowed(kind)}")


def _finalize(value: object) -> str:
    if isinstance(value, Raw):
        _refuse_control(str(value), SHELL_LINE)
        return str(value)
    if isinstance(value, bool) or value is None:
        raise TypeError(f"refusing to render {value!r} into a shell script: convert it explicitly")
    _refuse_control(str(value), PLAIN)
    return shlex.quote(str(value))


def _comment(value: object) -> Raw:
    """One-line text safe inside a `#` comment (a control character is refused, not hidden)."""
    _refuse_control(str(value), PLAIN)
    return Raw(" ".join(str(value).split()))


def _sbatch(value: object) -> Raw:
    """A value for an `#SBATCH --opt=VALUE` line, written for sbatch's parser (slurm.sbatch_quote)."""
    try:
        return Raw(slurm.sbatch_quote(value))
    except ValueError as exc:
        raise RenderError(f"refusing to render an #SBATCH value: {exc}") from None


# The Slurm names an #SBATCH (or #SCRON) line may carry, each with its field's character set.
NAME_OPTIONS: dict[str, Charset] = {"job-name": SLURM_NAME, "partition": SLURM_NAMES, "account": SLURM_NAME,
                                    "qos": SLURM_NAME, "constraint": SLURM_CONSTRAINT, "exclude": SLURM_NODES}


def slurm_options(where: str, values: dict[str, str | None]) -> list[tuple[str, str]]:
    """(option, value) for each option set in `values` (an option of NAME_OPTIONS -> its value), each
    checked against its character set; `where` names the values' origin in the error."""
    options = []
    for option, value in values.items():
        if value is None:
            continue
        refused = check_charset(NAME_OPTIONS[option], value)
        if refused is not None:
            raise RenderError(f"refusing to render --{option}={value!r} of {where} into a job script: {refused}")
        options.append((option, value))
    return options


def output_option(folder: str | Path, pattern: str) -> str:
    """The --output value for a log `pattern` (`%x-%j.out`) in `folder` (slurm.output_path)."""
    try:
        return slurm.output_path(folder, pattern)
    except ValueError as exc:
        raise RenderError(f"refusing to render --output: {exc}") from None


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["raw"] = Raw
    env.filters["comment"] = _comment
    env.filters["sbatch"] = _sbatch
    return env


def deepspeed_config(exp: Experiment) -> dict:
    """The DeepSpeed JSON, generated from the config (the optimizer and schedules live in the trainer)."""
    precision = exp.train.precision
    config: dict = {
        "train_micro_batch_size_per_gpu": exp.batch.micro_batch_size,
        "train_batch_size": exp.batch.global_batch_size,
        "gradient_clipping": exp.optimizer.clip_grad,
        "zero_optimization": {"stage": exp.parallel.zero_stage},
        "fp16": {"enabled": precision == "fp16"},
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": 2**31 - 1,  # the trainer prints Megatron's iteration lines itself
        "wall_clock_breakdown": False,
    }
    if precision == "fp16":
        # Dynamic loss scaling as in the tr1-13B DeepSpeed config.
        config["fp16"].update(loss_scale=0, loss_scale_window=500, hysteresis=2, min_loss_scale=1,
                              initial_scale_power=12)
    if exp.parallel.activation_checkpointing:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return config


@dataclass(frozen=True)
class Rendered:
    """The files of one rendering: name -> text, and the script's name."""

    files: dict[str, str]
    script: str


def script_name(exp: Experiment) -> str:
    return f"{exp.name}.slurm"


def render(exp: Experiment, out_dir: Path, plan: Plan) -> Rendered:
    """Render the job script for `out_dir`, where it will find experiment.json and ds_config.json.

    `plan` is exp's plan (launch_plan.build_launch_plan makes both); raises PlanError when it holds errors:
    nothing invalid is rendered.
    """
    if plan.errors:
        raise PlanError(plan.errors)
    deepspeed = deepspeed_config(exp)
    out_dir = Path(out_dir).resolve()
    s = exp.slurm
    where = f"experiment {exp.name}"
    [(_, job_name)] = slurm_options(where, {"job-name": s.job_name})
    optional = slurm_options(where, {"partition": s.partition or None, "account": s.account or None,
                                     "constraint": s.constraint or None, "qos": s.qos or None,
                                     "exclude": ",".join(s.exclude) or None})
    context = {
        "version": __version__,
        "exp": exp,
        "plan": plan,
        "gpu": s.device == "gpu",
        "array": f"1-{s.array}%1",
        "job_name": job_name,
        "output_pattern": output_option(exp.paths.logs, "%x-%A_%a.out"),
        "optional": optional,
        "env_setup": [Raw(line) for line in s.env_setup],
        "run_dir": str(out_dir),
        "main_log": str(main_log(exp.paths.logs)),
        "threads_per_process": max(1, s.cpus_per_task // s.gpus_per_node),
        "port_spread": PORT_SPREAD,
        "exit_not_training": EXIT_NOT_TRAINING,
        "run_lock": str(Path(exp.paths.output) / LOCK_NAME),
        "run_lock_held": Raw(HELD_ENV),
        "experiment_json": str(out_dir / EXPERIMENT_JSON),
        "deepspeed_json": str(out_dir / DEEPSPEED_JSON),
    }
    script = environment().get_template("train.slurm.j2").render(context)
    files = {
        script_name(exp): script,
        EXPERIMENT_JSON: json.dumps(to_dict(exp), indent=2) + "\n",
        DEEPSPEED_JSON: json.dumps(deepspeed, indent=2) + "\n",
    }
    return Rendered(files, script_name(exp))


def write(rendered: Rendered, out_dir: Path) -> Path:
    """Write the files; returns the script's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.files.items():
        (out_dir / name).write_text(text, encoding="utf-8")
    script = out_dir / rendered.script
    script.chmod(0o755)
    return script
