"""Slurm commands run with a pinned environment, and group members come from NSS one group at a time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bigscience_ops import slurm
from tests.fixtures_slurm import SlurmCluster, wait_until

# Recorded from `getent group six` and `getent passwd` on a site whose SSSD does not enumerate:
# passwd lists the local users only, the group's members come from the directory.
GETENT = """#!/bin/bash
case "$1 ${2-}" in
  "group six") echo "six:*:1234:alice,bob" ;;
  "group ") printf 'root:x:0:\\n' ;;
  "passwd ") printf 'root:x:0:0:root:/root:/bin/bash\\ncarol:x:1001:1234:Carol:/home/carol:/bin/bash\\n' ;;
  group*) exit 2 ;;
  *) exit 1 ;;
esac
"""


@pytest.fixture
def getent_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shim = tmp_path / "bin" / "getent"
    shim.parent.mkdir()
    shim.write_text(GETENT)
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    return shim


def test_group_members_come_from_getent_group(getent_shim: Path) -> None:
    assert slurm.group_users("six") == ["alice", "bob", "carol"]


def test_an_unknown_group_is_named(getent_shim: Path) -> None:
    with pytest.raises(slurm.SlurmError, match="'nobody-here'"):
        slurm.group_users("nobody-here")


def test_pinned_env_drops_user_formats_and_pins_the_time_format() -> None:
    env = slurm.pinned_env({"PATH": "/bin", "SLURM_CONF": "/x.conf", "SLURM_TIME_FORMAT": "relative",
                            "SQUEUE_FORMAT": "%i", "SQUEUE_FORMAT2": "jobid", "SQUEUE_SORT": "-t",
                            "SACCT_FORMAT": "jobid", "SINFO_FORMAT": "%N", "SCANCEL_INTERACTIVE": "1"})
    assert env == {"PATH": "/bin", "SLURM_CONF": "/x.conf", "SLURM_TIME_FORMAT": "standard"}


@pytest.mark.slurm
def test_queries_ignore_the_callers_slurm_settings(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sleeper = slurm_cluster.script(tmp_path, "sleep.sh", "sleep 60")
    job_id = slurm_cluster.submit(sleeper, name=f"{slurm_cluster.prefix}-env")
    wait_until("the job running", lambda: [j for j in slurm_cluster.jobs(job_id) if j.state == "RUNNING"])
    # A user's shell settings that change what squeue and scontrol print or select.
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    monkeypatch.setenv("SQUEUE_FORMAT", "%i %j")
    monkeypatch.setenv("SQUEUE_FORMAT2", "jobid,name")
    monkeypatch.setenv("SQUEUE_STATES", "PENDING")
    monkeypatch.setenv("SQUEUE_SORT", "-i")
    [job] = [j for j in slurm.query_jobs(timeout=30) if j.array_job_id == job_id]
    assert job.state == "RUNNING" and job.start_time is not None and job.submit_time is not None
    [shown] = slurm.show_job(job_id, timeout=30)
    assert slurm.parse_timestamp(shown["StartTime"]) == job.start_time
    slurm.cancel([job_id], timeout=30)
