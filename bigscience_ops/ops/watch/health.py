"""Training health moved to ops/health.py (below watch/ and keep/: the watchdog and the chronicle both read it).

This name stays importable for callers not yet switched; new code imports bigscience_ops.ops.health.
"""

from bigscience_ops.ops.health import (  # noqa: F401
    ROLLBACK_KINDS, Entry, Finding, advise, check, entries, eval_drop, rollback_target,
)
