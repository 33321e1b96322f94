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


SEEDS = ["tr8-104B", "tr1-13B", "megatron-7.5B", "gpt-760M"]


def test_trying_a_seed_mails_nobody_and_writes_only_here(tmp_path: Path) -> None:
    """One test for all seeds: one mail server on the port they name (two tests could not both listen on it)."""
    inbox = Inbox()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "SLURM_CONF": str(tmp_path / "no-slurm.conf")}
    scratch_before = SEEDS_SCRATCH.exists()
    ran = {}
    try:
        with serving(inbox, 25):  # the seeds' alerts go to localhost:25 (smtp_host, smtp_port defaults)
            for seed in SEEDS:
                here = tmp_path / seed
                here.mkdir()
                seed_env = {**env, "BSOPS_CRON_DIR": str(here / "cron")}
                ran[seed] = [subprocess.run([BSOPS, *command, seed], cwd=here, env=seed_env, capture_output=True,
                                            text=True, timeout=120) for command in (["status"], ["cron", "add"])]
    except OSError as exc:  # port 25 taken by a real mail server, or not root
        pytest.skip(f"cannot listen on port 25 here: {exc}")
    assert inbox.messages == [] and inbox.envelopes == []
    assert SEEDS_SCRATCH.exists() == scratch_before and not (tmp_path / "home").exists()
    for seed, (status, added) in ran.items():
        assert status.returncode == 2 and "Traceback" not in status.stderr, seed  # Slurm cannot be asked: said
        assert added.returncode == 0, added.stdout + added.stderr
        here = tmp_path / seed
        written = _files(here)
        assert written and all(p.is_relative_to(here) for p in written)
        jobs = "".join(p.read_text() for p in (here / "cron").rglob("*.slurm"))
        assert "/gpfsscratch" not in jobs and "/fsx" not in jobs and "bigscience-jean-zay" not in jobs
        assert "hub-sync" not in jobs  # a record pushes nowhere: no Hub repo is left to sync to
