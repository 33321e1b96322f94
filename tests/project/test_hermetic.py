"""The suite does not depend on what a user keeps in the checkout: a run of a bundled experiment under runs/
(rolled back, stopped by its kill switch), an experiment of their own in trainings/, a job in the cron folders.

tests/conftest.py gives every test (and every command a test starts) bsops' bundled folders as the repository
holds them (BSOPS_DATA_DIR) and an empty current folder. Shown here on a copy of the checkout that holds all of
the above: the tests that read the bundled experiments' run folders and the experiment list pass in it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a second pytest over a copy of the checkout

REPO = Path(__file__).resolve().parents[2]
# Tests that read tiny's default run folder (plan, render, dry-run launch) and the experiment list.
SENSITIVE = ["tests/cli/test_cli.py", "tests/launch/test_launch_plan.py"]


def _copy_of_the_checkout(dest: Path) -> None:
    """The tracked files as they are in the work tree, and the compiled shuffle helper beside its source."""
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True, timeout=60,
                             check=True).stdout.split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    for built in (REPO / "bigscience_ops" / "data").glob("_shuffle*.so"):
        shutil.copy2(built, dest / "bigscience_ops" / "data" / built.name)


def _what_a_user_keeps(checkout: Path) -> None:
    run = checkout / "runs" / "tiny"
    (run / "checkpoints" / "global_step150").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("global_step150")
    (run / "rollbacks.jsonl").write_text(json.dumps({"time": 0.0, "from_step": 200, "to_step": 150,
                                                      "skip": "151-160", "set_aside": ""}) + "\n")
    (run / "kill-switch").touch()
    (checkout / "trainings" / "mine.yaml").write_text("base: tiny\ndescription: a user's own\n")
    (checkout / "cron" / "cron.hourly").mkdir(parents=True)  # a cron folder of their own beside the code
    (checkout / "cron" / "cron.hourly" / "mine-slurm-status.slurm").write_text("#!/bin/bash\ntrue\n")


def test_the_suite_passes_whatever_the_user_keeps_in_the_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    _copy_of_the_checkout(checkout)
    _what_a_user_keeps(checkout)
    env = {k: v for k, v in os.environ.items() if k not in ("BSOPS_DATA_DIR", "BSOPS_TRAININGS", "BSOPS_CRON_DIR",
                                                            "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")}
    env["PYTHONPATH"] = str(checkout)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                             "-m", "not slow and not slurm", *SENSITIVE], cwd=checkout, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
