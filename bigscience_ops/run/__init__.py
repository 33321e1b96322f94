"""A run's folder and what it holds, read and written in one place.

- opening.py: `run.open` (open_run): a run named on the command line (experiment, folder or both), read as it
  recorded itself with its experiment file's settings today; the one way every command reads a run.
- records.py: the three facts a launch obeys (latest iteration, kill switch, recorded skips).
- lock.py: one launch per run folder.
- index.py: the user's index of the runs they launched.
- files.py: a run's own files opened as untrusted input (bounded, no links, plain files only).
- log.py: the tail of a training log, read backwards and bounded.
- iterations.py: Megatron's per-iteration line, written by the trainer and parsed by the readers.
- ledger.py: the task ledger (what each array task did).
- rollbacks.py: the rollbacks a run recorded (rollbacks.jsonl) and the skip ranges they add.
"""


def __getattr__(name: str):
    """`run.open`: opening.open_run, imported when first asked for (the package's other modules stay light)."""
    if name == "open":
        from bigscience_ops.run.opening import open_run

        return open_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
