"""Which evaluation results count: those of checkpoints the run has.

A result file (eval/global_stepN.json, ops/evaluate/results.py) is written by `bsops eval` for a checkpoint it
read, but the file itself is only a claim: anyone who can write the run folder can leave a
`global_step84.json` for a step that was never saved, and a table, a plot or an eval-drop alert would
take it for the run's. So a result counts only for a step the run has a checkpoint of: a global_stepN folder
of its checkpoints with the bsops.json a finished save writes (never a link: layout.saved_checkpoints), or
a copy of it in the backup store that the experiment's backup.dest names (retention deletes a checkpoint
from scratch only once such a copy is verified, so an evaluated step stays counted after its folder goes).
Every other result is a Problem naming its file, left out of what is shown and alerted on; so is a result made
for another run (its bsops.run_id is not the run's: results.belonging), whatever its step.

`counted` is the one call: the views (`bsops info`, `bsops chronicle`) use it, and the watchdog's eval-drop
check and `bsops eval`'s table can call it the same way on what results.read_all returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bigscience_ops.checkpoints import layout
from bigscience_ops.errors import BsopsError
from bigscience_ops.ops.evaluate import results as eval_results
from bigscience_ops.ops.evaluate.results import Result
from bigscience_ops.ops.keep import store as backup_store
from bigscience_ops.untrusted import Problem
from bigscience_ops.schema import Experiment


def saved_steps(exp: Experiment) -> set[int]:
    """The steps `exp`'s run has a checkpoint of: its finished saves on scratch (links left out) and the copies in the
    backup store backup.dest names (as `exp` says: pass the experiment file's settings, never a record's)."""
    checkpoints = Path(exp.paths.checkpoints)
    try:
        steps = {c.step for c in layout.saved_checkpoints(checkpoints)}
    except OSError:
        steps = set()
    if exp.backup.dest:
        try:
            run_id = layout.run_id(checkpoints)
            if run_id is not None:
                store = backup_store.run_store(Path(exp.backup.dest), exp.name, run_id)
                steps |= {manifest["step"] for _, manifest in backup_store.manifests(store).records}
        except (BsopsError, OSError):
            pass  # an unreadable run id or store: the views and the watchdog report it where they read the backup
    return steps


def counted(results: Sequence[Result], exp: Experiment) -> tuple[list[Result], list[Problem]]:
    """(the results of this run of steps it has a checkpoint of, a problem for each other result file): left out,
    named."""
    if not results:
        return [], []
    try:
        run_id = eval_results.run_id_of(exp.paths.output, exp.paths.checkpoints)
    except BsopsError:
        run_id = None  # read_all reported the unreadable id file
    mine, problems = eval_results.belonging(results, run_id)
    steps = saved_steps(exp)
    kept = []
    for result in mine:
        if result.step in steps:
            kept.append(result)
        else:
            where = f"none in {exp.paths.checkpoints}" + (" or the backup store" if exp.backup.dest else "")
            problems.append(Problem(str(result.path or result.tag), 0, f"a result of step {result.step}, which the run "
                                                                       f"has no checkpoint of ({where}): not counted"))
    return kept, problems
