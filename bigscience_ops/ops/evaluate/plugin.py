"""bsops' scorer as lm-eval's model `bsops`: lm-eval's whole command line over a checkpoint in its TP/PP layout.

    torchrun --standalone --nproc-per-node TPxPP $(which lm_eval) run --model bsops \\
        --model_args run=RUN,step=N[,tensor=T,pipeline=P,dtype=fp32] --tasks lambada_openai --num_fewshot 3 \\
        --limit 20 --log_samples --output_path out/ [--use_cache out/requests] [every other lm-eval option]

(one process, for a TP=1 PP=1 layout: `lm_eval run --model bsops ...`.) RUN is an experiment name or YAML file, or
a run folder (its experiment.json); step a checkpoint step or `latest`. Every rank builds its part of the model
(scorer.py, as `bsops eval`'s worker does); rank 0 runs lm-eval with BsopsLM (harness.py: the same scorer and
tokenizer `bsops eval` uses, so the numbers are the same), the others serve its forward passes and exit when it is
done. `--use_cache PATH` keeps lm-eval's request cache (PATH_rank0.db, rank 0 being the one that asks).

How lm-eval finds `bsops`: lm-eval 0.4.13 knows the models of its own MODEL_MAPPING (lm_eval/models/__init__.py)
and whatever a module imported before the run registered; nothing in it scans an entry-point group. An installed
bsops (wheel or editable) carries a .pth line that registers `bsops` as a lazy placeholder (lm_eval_hook.Entry, which
builds this module's BsopsModel) when lm_eval.models is imported, so the plain `lm_eval` command finds it. Where bsops
runs from a source tree without being installed (PYTHONPATH), this module does the same when imported, and run as
a module hands its arguments to lm-eval's own command line: `torchrun ... -m bigscience_ops.ops.evaluate.plugin run
--model bsops ...`. In Python, `import bigscience_ops.ops.evaluate.plugin` then `lm_eval.simple_evaluate(model="bsops",
model_args=...)` works either way.

Every value of `--model_args` is checked before torch is imported: a run that cannot be read, a step or layout that
is no whole number, an unknown key, a checkpoint of another run (launcher.checkpoint compares the run ids) is one
EvalError naming it, which lm-eval's command line prints as one `error: ...` line (lm_eval_hook.Entry).

lm-eval names its results (`model_name`) and `--output_path DIR`'s folder after the model: for `--model bsops`, after
the checkpoint scored, `<experiment>/global_stepN` and DIR/<experiment>__global_stepN (named_after_the_checkpoint).
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401 - lm-eval's own models first: get_model imports them only into an empty registry
from lm_eval.api.registry import model_registry

from bigscience_ops.ops.evaluate import EvalError, results
from bigscience_ops.ops.evaluate.harness import BsopsLM, experiment_tokenizer
from bigscience_ops.ops.evaluate.lm_eval_hook import NAME, TARGET


def load_run(run: str, trainings_dir: str | None = None) -> Any:
    """The experiment of `run` as `bsops eval` reads it: a run folder or an experiment name or YAML file (the run
    as recorded, with today's eval: settings), or a resolved experiment .json (what the eval job's ranks read)."""
    from bigscience_ops import run as runs
    from bigscience_ops.ops.evaluate.worker import load

    if run.endswith(".json") and Path(run).is_file():
        return load(run)
    return runs.open(run, Path(trainings_dir) if trainings_dir else None).configured()


def _step(exp: Any, step: Any) -> int:
    from bigscience_ops.checkpoints import layout

    if step in (None, "latest"):
        found = layout.resume_step(Path(exp.paths.checkpoints))  # what `latest` names when it is complete
        if found is None:
            raise EvalError(f"--model_args step=latest: {exp.paths.checkpoints} has no complete checkpoint; allowed: "
                            "step=N once the run has saved")
        return found
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise EvalError(f"step={step!r}: allowed: a checkpoint step (a whole number >= 0) or latest")
    return step


def _layout_arg(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EvalError(f"--model_args {name}={value!r}: allowed: a whole number >= 1 (default: the checkpoint's own)")
    return value


LM_EVAL_DTYPES = {"auto": "training", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
"""lm-eval's dtype names (its hf model's) and bsops' own: auto is the training precision."""


def dtype_choice(exp: Any, dtype: Any) -> str | None:
    """eval.dtype's value for `--model_args dtype=` (None: eval.dtype). bsops scores in the training precision or in
    fp32: lm-eval's bfloat16 or float16 is the training precision when the run trained in it, and refused otherwise."""
    if dtype in (None, "training", "fp32"):
        return dtype
    named = LM_EVAL_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if named in ("training", "fp32"):
        return named
    trained = exp.train.precision
    if named is not None and named == trained:
        return "training"
    own = {"bf16": ", bfloat16", "fp16": ", float16"}.get(trained, "")
    raise EvalError(f"--model_args dtype={dtype!r}: allowed: auto (the training precision, {trained}), float32{own}; "
                    "bsops' own names: training, fp32")


def batch_size_choice(batch_size: Any, default: int) -> int:
    """The batch size of `--batch_size`: a whole number; nothing given is eval.batch_size (`default`). lm-eval's
    `auto` searches the largest size that fits, which bsops does not: it is refused rather than silently `default`."""
    if batch_size is None:
        return default
    if isinstance(batch_size, str) and batch_size.isdigit():
        batch_size = int(batch_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise EvalError(f"--batch_size {batch_size}: bsops does not search a batch size; allowed: a whole number >= 1 "
                        f"(left out: eval.batch_size, {default})")
    return batch_size


LM_EVAL_DEFAULT_DEVICE = "cuda:0"
"""What lm-eval 0.4.13 hands a model as its device when --device is left out (its EvaluatorConfig's default), and
writes into the results whatever the model used: bsops cannot tell it from a --device cuda:0 given, so it is taken
as none given. The results' `bsops_device` says where the ranks scored."""


def device_check(device: Any, actual: str) -> None:
    """`--device` must name where the ranks score (`actual`: cpu, or cuda for the local rank's GPU): bsops places
    each rank itself, so another device is refused rather than ignored."""
    if device is None or device == LM_EVAL_DEFAULT_DEVICE:
        return
    kind = str(device).split(":", 1)[0]
    if kind != actual:
        raise EvalError(f"--device {device}: this run scores on {actual} (each rank on its local GPU when the run's "
                        f"slurm.device is gpu and one is visible, else the CPU); allowed: {actual}, or leave it out")


def _request(run: Any, step: Any, tensor: Any, pipeline: Any, dtype: Any, trainings_dir: Any) -> tuple[Any, Any, Any]:
    """(the run's experiment, the checkpoint to score, eval.dtype's value) of `--model_args`, every value checked
    before torch is imported; anything wrong is one EvalError naming the argument, its value and what is allowed."""
    from bigscience_ops.errors import BsopsError
    from bigscience_ops.ops.evaluate import launcher

    if not isinstance(run, str) or not run.strip():
        raise EvalError(f"--model_args run={run!r}: allowed: an experiment name or YAML file, or a run folder")
    tensor, pipeline = _layout_arg("tensor", tensor), _layout_arg("pipeline", pipeline)
    if isinstance(step, str) and step.isdigit():
        step = int(step)
    try:
        exp = load_run(run, None if trainings_dir is None else str(trainings_dir))
        chosen = dtype_choice(exp, dtype)
        return exp, launcher.checkpoint(exp, _step(exp, step), tensor, pipeline), chosen
    except EvalError:
        raise
    except BsopsError as exc:
        allowed = "" if "allowed" in str(exc) else "; allowed: an experiment name or YAML file, or a run folder"
        raise EvalError(f"--model_args run={run}: {exc}{allowed}") from None
    except (OSError, ValueError, TypeError) as exc:  # a folder or file that cannot be read, a value of another type
        raise EvalError(f"--model_args run={run}: cannot be read ({type(exc).__name__}: {exc}); allowed: an "
                        "experiment name or YAML file, or a run folder holding experiment.json") from None


def _standalone() -> None:
    """A process group of one when started without torchrun."""
    if "RANK" in os.environ:
        return
    from bigscience_ops.launch.local import free_port

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))


class BsopsModel(BsopsLM):
    """lm-eval's `--model bsops`: model_args run=RUN, step=N|latest, tensor, pipeline (another layout), dtype
    (lm-eval's auto|float32|bfloat16|float16, or training|fp32: eval.dtype), trainings_dir; batch_size (a whole
    number; default eval.batch_size); device (checked: where the ranks score)."""

    last_name: str | None = None
    """The model name (results.model_name: the run and the step) of the model built last in this process: what
    lm-eval's results and its --output_path folder are named after (named_after_the_checkpoint)."""

    def __init__(self, run: str, step: Any = "latest", tensor: int | None = None, pipeline: int | None = None,
                 dtype: str | None = None, trainings_dir: str | None = None, batch_size: Any = None,
                 max_batch_size: Any = None, device: Any = None, **unknown: Any) -> None:
        if unknown:
            raise EvalError(f"--model_args {', '.join(sorted(unknown))}: not known to --model {NAME}; allowed: run, "
                            "step, tensor, pipeline, dtype, trainings_dir")
        exp, target, dtype = _request(run, step, tensor, pipeline, dtype, trainings_dir)
        size = batch_size_choice(batch_size, exp.eval.batch_size)
        import torch  # torch only once the request is known to be sound
        import torch.distributed as dist

        from bigscience_ops.ops.evaluate import scorer as scoring

        scored_on = "cuda" if exp.slurm.device == "gpu" and torch.cuda.is_available() else "cpu"
        device_check(device, scored_on)
        _standalone()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != target.world_size:
            raise EvalError(f"{world} processes started for TP={target.tensor} x PP={target.pipeline}; allowed: "
                            f"{target.world_size} (torchrun --nproc-per-node {target.world_size})")
        device_ = scoring.init_distributed(exp) if not dist.is_initialized() else None
        built = scoring.Scorer(exp, target, device_, dtype=scoring.compute_dtype(exp, device_ or torch.device("cpu"),
                                                                                   dtype))
        if dist.get_rank() != 0:  # a follower: serve rank 0's forward passes, then leave lm-eval's command line
            built.follow()
            dist.destroy_process_group()
            sys.stdout.flush()
            os._exit(0)
        super().__init__(built, experiment_tokenizer(exp), batch_size=size, log=lambda line: print(line, flush=True))
        self.experiment, self.target, self.scored_on = exp, target, scored_on
        BsopsModel.last_name = results.model_name(exp.name, target.tag)
        atexit.register(self.close)

    def close(self) -> None:
        """Tell the followers to stop (once), and leave the process group."""
        import torch.distributed as dist

        self.scorer.close()
        if dist.is_initialized():
            dist.destroy_process_group()

    def get_model_info(self) -> dict:
        return {**super().get_model_info(), "bsops_run": str(self.target.path.parent), "bsops_tag": self.target.tag,
                "bsops_layout": {"tensor": self.target.tensor, "pipeline": self.target.pipeline},
                "bsops_dtype": str(self.scorer.dtype).removeprefix("torch."), "bsops_device": self.scored_on}


def named_after_the_checkpoint() -> None:
    """lm-eval names its results (`model_name`) and its `--output_path` folder (`model_name_sanitized`) after
    model_args' pretrained=/model=/path= value, else a random word (GeneralConfigTracker.log_experiment_args, lm-eval
    0.4.13): for `--model bsops` they are named after the checkpoint scored instead, the run and the step
    (results.model_name: `tiny/global_step221`, the folder `tiny__global_step221`). Every other model is named as
    lm-eval names it."""
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker
    from lm_eval.utils import sanitize_model_name

    original = GeneralConfigTracker.log_experiment_args
    if getattr(original, "bsops_named", False):
        return

    def log_experiment_args(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        source = kwargs.get("model_source", args[0] if args else None)
        if source == NAME and BsopsModel.last_name is not None:
            self.model_name = BsopsModel.last_name
            self.model_name_sanitized = sanitize_model_name(self.model_name)

    log_experiment_args.bsops_named = True  # type: ignore[attr-defined]
    GeneralConfigTracker.log_experiment_args = log_experiment_args  # type: ignore[method-assign]


named_after_the_checkpoint()

if NAME not in model_registry:  # (the .pth hook registered the same placeholder when lm_eval.models was imported)
    model_registry.register(NAME, target=TARGET)  # by name, so that `python -m` of this file registers no copy


def main() -> None:
    """lm-eval's command line with `--model bsops` registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "lm-eval"
    cli_evaluate()


if __name__ == "__main__":
    main()
