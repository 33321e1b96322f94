"""One evaluation rank: `python -m bigscience_ops.ops.evaluate.worker --experiment NAME_OR_FILE --step N
[--tensor T] [--pipeline P] [--trainings-dir DIR] [--cwd DIR] [--log-samples] [--keep-cache]`, started by torchrun
(locally, launcher.run_local) or by srun + torchrun (the Slurm eval job), TP x PP ranks.

Every rank loads the experiment (a name or YAML file through load_experiment; a `.json` is a resolved experiment
as the trainer reads its run's), checks the checkpoint (launcher.checkpoint: complete, not newer than `latest`,
its layer files readable), joins the process group and builds its part of the model (scorer.py). The ranks then
agree on whether every one of them loaded: an error on any rank (a torn layer file, another model) is printed
once, by rank 0, as one line `error: ...` on stderr, and every rank exits 2. Then rank 0 runs
`driver.evaluate(exp, checkpoint, meta, scorer, log)` (lm-eval tasks and bits per byte, the result file) and
closes the scorer; the other ranks follow its forward passes. Exit 0 on success, 2 on a BsopsError (one line),
1 on anything else (with its traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bigscience_ops.errors import BsopsError

EXIT_ERROR, EXIT_CRASH = 2, 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bigscience_ops.ops.evaluate.worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", required=True,
                        help="experiment name, YAML file, or a resolved experiment.json")
    parser.add_argument("--trainings-dir", type=Path, default=None, help="where experiment names are looked up")
    parser.add_argument("--step", required=True, type=int, help="the checkpoint global_stepN to evaluate")
    parser.add_argument("--tensor", type=int, default=None, help="TP of the evaluation (default: the checkpoint's)")
    parser.add_argument("--pipeline", type=int, default=None, help="PP of the evaluation (default: the checkpoint's)")
    parser.add_argument("--cwd", type=Path, default=None, help="folder relative paths are resolved in")
    parser.add_argument("--log-samples", action="store_true",
                        help="keep lm-eval's per-sample output beside the result (<tag>.samples/"
                             "samples_<task>_<date>.jsonl, as lm-eval's --log_samples writes them)")
    parser.add_argument("--keep-cache", action="store_true",
                        help="keep lm-eval's request cache beside the result (<tag>.requests/<dtype>_rank0.db) and "
                             "answer the requests it holds from it")
    return parser.parse_args(argv)


def load(experiment: str, trainings_dir: Path | None = None):
    """The experiment: a resolved experiment.json (from_dict), or a name or YAML file (load_experiment)."""
    from bigscience_ops.config.loading import from_dict, load_experiment

    if experiment.endswith(".json"):
        path = Path(experiment)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise WorkerError(f"--experiment {experiment}: unreadable ({type(exc).__name__}: {exc})") from None
        return from_dict(data, str(path))
    return load_experiment(experiment, trainings_dir)


class WorkerError(BsopsError):
    """The worker's arguments name something that cannot be read."""


def _print_error(message: str) -> None:
    sys.stdout.flush()
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)


def _log(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None, evaluate: Callable | None = None) -> int:
    """Run this rank; `evaluate` replaces driver.evaluate (tests)."""
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    if args.cwd is not None:
        os.chdir(args.cwd)
    from bigscience_ops.ops.evaluate import launcher

    try:  # the same on every rank: each fails alike, rank 0 says why
        exp = load(args.experiment, args.trainings_dir)
        target = launcher.checkpoint(exp, args.step, args.tensor, args.pipeline)
    except BsopsError as exc:
        if rank == 0:
            _print_error(str(exc))
        return EXIT_ERROR
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != target.world_size:
        if rank == 0:
            _print_error(f"{world} ranks started for TP={target.tensor} x PP={target.pipeline}; allowed: "
                         f"{target.world_size} processes in all (TP x PP; torchrun's --nproc-per-node times the nodes)")
        return EXIT_ERROR

    import torch.distributed as dist

    from bigscience_ops.ops.evaluate import scorer as scoring

    device = scoring.init_distributed(exp)
    code = run(exp, target, device, evaluate, args.log_samples, args.keep_cache)
    if code == 0:
        dist.destroy_process_group()
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.get_world_size() > 1:
        os._exit(code)  # peers of a failed rank may never reach a barrier; torchrun ends them
    return code


def run(exp, target, device, evaluate: Callable | None = None, log_samples: bool = False,
        keep_cache: bool = False) -> int:
    """Build this rank's scorer, agree with the others that all loaded, then drive (rank 0) or follow."""
    import torch.distributed as dist

    from bigscience_ops.ops.evaluate.scorer import Scorer

    rank = dist.get_rank()
    built, error = None, None
    started = time.monotonic()
    try:
        built = Scorer(exp, target, device)
    except BsopsError as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported by rank 0 for every rank, never a hang
        error = f"rank {rank}: {type(exc).__name__}: {exc}"
        traceback.print_exc()
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first is not None:
        if rank == 0:
            _print_error(first)
        return EXIT_ERROR
    assert built is not None
    if rank == 0:
        _log(f"loaded {target.tag} of {target.path.parent} in TP={target.tensor} x PP={target.pipeline} "
             f"({target.world_size} ranks) in {time.monotonic() - started:.1f} s")
    if rank != 0:
        built.follow()
        return 0
    try:
        if evaluate is None:
            from bigscience_ops.ops.evaluate import driver

            evaluate = driver.evaluate
        asked = {name: True for name, on in (("log_samples", log_samples), ("keep_cache", keep_cache)) if on}
        path = evaluate(exp, target.path, target.meta, built, _log, **asked)
        _log(f"evaluated {target.tag} (TP={target.tensor} PP={target.pipeline}): {path}")
        return 0
    except BsopsError as exc:
        _print_error(str(exc))
        return EXIT_ERROR
    except BaseException:  # noqa: BLE001 - the followers are told to stop first, then this rank exits
        traceback.print_exc()
        return EXIT_CRASH
    finally:
        built.close()


if __name__ == "__main__":
    sys.exit(main())
