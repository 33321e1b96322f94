"""The bundled seeds are records: trying one mails nobody, pushes nothing and writes only under the current folder.

Run as a newcomer would (`bsops status tr8-104B`, `bsops cron add tr8-104B`), with a mail server listening where
the seeds' alerts section points (localhost:25) and the seeds' scratch path watched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_smtp import Inbox, serving

BSOPS = str(Path(sys.executable).parent / "bsops")
SEEDS_SCRATCH = Path("/gpfsscratch")


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


@pytest.mark.parametrize("seed", ["tr8-104B", "tr1-13B", "megatron-7.5B", "gpt-760M"])
def test_trying_a_seed_mails_nobody_and_writes_only_here(tmp_path: Path, seed: str) -> None:
    inbox = Inbox()
    here = tmp_path / "here"
    here.mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "BSOPS_CRON_DIR": str(here / "cron"),
           "SLURM_CONF": str(tmp_path / "no-slurm.conf")}
    scratch_before = SEEDS_SCRATCH.exists()
    try:
        with serving(inbox, 25):  # the seeds' alerts go to localhost:25 (smtp_host, smtp_port defaults)
            status = subprocess.run([BSOPS, "status", seed], cwd=here, env=env, capture_output=True, text=True,
                                    timeout=120)
            added = subprocess.run([BSOPS, "cron", "add", seed], cwd=here, env=env, capture_output=True, text=True,
                                   timeout=120)
    except OSError as exc:  # port 25 taken by a real mail server, or not root
        pytest.skip(f"cannot listen on port 25 here: {exc}")
    assert status.returncode == 2 and "Traceback" not in status.stderr  # Slurm cannot be asked: said, not mailed
    assert added.returncode == 0, added.stdout + added.stderr
    assert inbox.messages == [] and inbox.envelopes == []
    assert SEEDS_SCRATCH.exists() == scratch_before and not (tmp_path / "home").exists()
    written = _files(here)
    assert written and all(p.is_relative_to(here) for p in written)
    jobs = "".join(p.read_text() for p in (here / "cron").rglob("*.slurm"))
    assert "/gpfsscratch" not in jobs and "/fsx" not in jobs and "bigscience-jean-zay" not in jobs
    assert "hub-sync" not in jobs  # a record pushes nowhere: no Hub repo is left to sync to
