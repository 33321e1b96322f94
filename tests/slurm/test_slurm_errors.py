"""slurm/errors.py: a Slurm failure reads as one human line; the raw command and stderr stay on the error."""

from __future__ import annotations

import pytest

from bigscience_ops import slurm


def test_a_slurm_error_is_one_human_line_and_keeps_what_slurm_said(monkeypatch: pytest.MonkeyPatch) -> None:
    from bigscience_ops.slurm.errors import said

    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/site.conf")
    down = slurm.SlurmCommandError(["squeue", "--format=%i\x1f%j"], 1, "squeue: error: Unable to contact slurm "
                                   "controller (connect failure)\n", "exited with code 1")
    assert str(down) == "cannot reach the Slurm controller (SLURM_CONF=/etc/slurm/site.conf): is slurmctld running?"
    assert said(down) == f"{down} (squeue said: Unable to contact slurm controller (connect failure))"  # logs, emails
    assert "'--format=%i\\x1f%j'" in down.detail() and "\x1f" not in down.detail()  # what --verbose prints
    refused = slurm.SlurmCommandError(["sbatch", "--parsable", "job.slurm"], 1, "sbatch: error: Batch job submission "
                                      "failed: Invalid account or account/partition combination specified\n",
                                      "exited with code 1")
    assert str(refused) == ("sbatch failed (exited with code 1): Batch job submission failed: Invalid account or "
                            "account/partition combination specified") and said(refused) == str(refused)
