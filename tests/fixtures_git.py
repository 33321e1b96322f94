"""Fixtures for the Hub-sync tests: real git and git-lfs, local bare remotes, an experiment that pushes to them.

git-lfs is installed from Debian's packages when missing (as the Slurm fixture installs Slurm);
where that is impossible the tests are skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bigscience_ops.config import load_experiment

from bigscience_ops.schema import Experiment

REPO = Path(__file__).resolve().parents[1]


def _have_lfs() -> bool:
    return shutil.which("git") is not None and subprocess.run(
        ["git", "lfs", "version"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="session")
def git_lfs() -> None:
    if _have_lfs():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("git-lfs is missing and cannot be installed here (needs root and apt-get): apt-get install git-lfs")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "git-lfs"]
    if subprocess.run(argv, capture_output=True, timeout=600, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0:
            pytest.skip(f"apt-get install git-lfs failed: {proc.stderr[-500:]}")
    assert _have_lfs()


def git(*args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def bare_remote(root: Path, repo: str) -> Path:
    """An empty bare repository at <root>/<repo>.git (what hub.remote_template file://<root>/{repo}.git names)."""
    path = root / f"{repo}.git"
    path.parent.mkdir(parents=True, exist_ok=True)
    git("init", "--quiet", "--bare", "--initial-branch=main", str(path))
    return path


def hub_experiment(run: Path, remotes: Path, **hub: object) -> Experiment:
    """tiny with its run folder at `run` and every Hub repo pushed to a bare repo under `remotes`."""
    exp = load_experiment("tiny", REPO / "trainings")
    paths = dataclasses.replace(exp.paths, output=str(run), logs=str(run / "logs"), tensorboard=str(run / "tensorboard"),
                                codecarbon=str(run / "codecarbon"), checkpoints=str(run / "checkpoints"))
    settings = dict(logs_repo="bs/tiny-logs", tensorboard_repo="bs/tiny-tensorboard", codecarbon_repo=None,
                    checkpoints_repo="bs/tiny-checkpoints", remote_template=f"file://{remotes}/{{repo}}.git",
                    lfs_size_mb=0.01, push_attempts=2)
    settings.update(hub)
    return dataclasses.replace(exp, paths=paths, hub=dataclasses.replace(exp.hub, **settings))


def blob_at(bare: Path, path: str, rev: str = "main") -> bytes:
    return subprocess.run(["git", "--git-dir", str(bare), "show", f"{rev}:{path}"], capture_output=True,
                          timeout=60, check=True).stdout


def lfs_oid(pointer: bytes) -> str | None:
    """The sha256 of an LFS pointer file, None when `pointer` is not one."""
    lines = pointer.decode(errors="replace").splitlines()
    if not lines or lines[0] != "version https://git-lfs.github.com/spec/v1":
        return None
    return next(line.split(":", 1)[1] for line in lines if line.startswith("oid sha256:"))


def lfs_object(bare: Path, oid: str) -> Path:
    return bare / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
