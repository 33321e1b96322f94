"""The `bsops` command line: each command parses, calls one library function, prints, exits.

Heavy modules (torch, deepspeed) are never imported here or by the ops commands. One module per
command group; importing them registers their commands on `main`.
"""

from bigscience_ops.cli import cron, data, experiments, status, task  # noqa: F401  (registers the commands)
from bigscience_ops.cli import checkpoints  # noqa: F401  (convert, warm-start, rollback, verify)
from bigscience_ops.cli import ops  # noqa: F401  (hub-sync, backup)
from bigscience_ops.cli import views  # noqa: F401  (logs, plot, info, chronicle)
from bigscience_ops.cli import samples  # noqa: F401  (samples)
from bigscience_ops.cli import runs  # noqa: F401  (runs)
from bigscience_ops.cli import evaluate  # noqa: F401  (eval)
from bigscience_ops.cli import fields  # noqa: F401  (fields)
from bigscience_ops.cli.base import EXIT_ERROR, EXIT_PROBLEMS, main

__all__ = ["main", "EXIT_ERROR", "EXIT_PROBLEMS"]
