"""Evaluate: downstream evaluation of a run's checkpoints (`bsops eval`), as Megatron-DeepSpeed's
tasks/eval_harness did, in the checkpoint's own TP/PP layout (or another one asked for):

- scorer.py: this rank's part of the model, weights from a checkpoint folder; rank 0 asks for
  log-probabilities, the other ranks follow (torch);
- worker.py: the rank entry `python -m bigscience_ops.ops.evaluate.worker`, started by torchrun (torch);
- launcher.py: the checks before any rank starts, and the torchrun argv (no torch);
- harness.py, bpb.py, driver.py: rank 0's lm-eval tasks and bits per byte over the Scorer (torch, lm_eval);
- results.py, schedule.py: result files, tables, alerts, and the hourly job's choice (no torch).
- commands.py: what each `bsops eval` subcommand (run, next, prefetch, table) does, below the CLI (no torch).

Importing this package imports nothing heavy: `bsops --help`, plan, status and the cron jobs import it.
"""

from __future__ import annotations

from bigscience_ops.errors import BsopsError


class EvalError(BsopsError):
    """An evaluation cannot run: names the checkpoint or value that is wrong, and what is allowed."""
