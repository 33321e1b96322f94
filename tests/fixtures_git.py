"""Fixtures for the Hub-sync tests: real git and git-lfs, local bare remotes, an experiment that pushes to them.

git-lfs is installed from Debian's packages when missing (as the Slurm fixture installs Slurm);
where that is impossible the tests are skipped with the reason. `https_recorder` and `http_recorder`
are git servers that ask for credentials and keep what each request offered (the Authorization
headers), so a test sees whether a real git push handed over the token.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bigscience_ops.config.loading import load_experiment

from bigscience_ops.schema import Experiment
from tests.fixtures_smtp import server_tls

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


@dataclasses.dataclass
class Recorder:
    """A git server on 127.0.0.1 that answers every request 401 (Basic) and records what each one offered."""

    url: str
    host: str  # what git hands a credential helper as host=: 127.0.0.1:PORT
    paths: list[str] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)

    def passwords(self) -> list[str]:
        """The passwords of the Basic Authorization headers received."""
        out = []
        for header in self.authorizations:
            kind, _, value = header.partition(" ")
            if kind.lower() == "basic":
                out.append(base64.b64decode(value).decode(errors="replace").partition(":")[2])
        return out


@contextmanager
def recording_server(tls_cert: tuple[str, str] | None) -> Iterator[Recorder]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's hook names)
            recorder.paths.append(self.path)
            if self.headers.get("Authorization"):
                recorder.authorizations.append(self.headers["Authorization"])
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="hub"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls_cert is not None:
        server.socket = server_tls(tls_cert).wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    recorder = Recorder(f"{'https' if tls_cert else 'http'}://127.0.0.1:{port}", f"127.0.0.1:{port}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def https_recorder(cert: tuple[str, str]) -> Iterator[Recorder]:
    """An https git server with the test certificate (trust it with GIT_SSL_CAINFO=cert[0])."""
    with recording_server(cert) as recorder:
        yield recorder


@pytest.fixture
def http_recorder() -> Iterator[Recorder]:
    with recording_server(None) as recorder:
        yield recorder


def commit_tree(work: Path, files: dict[str, str | bytes], links: dict[str, str] | None = None) -> None:
    """Commit `files` (path -> content) and `links` (path -> link target) in a new repository at `work`."""
    git("init", "--quiet", "--initial-branch=main", str(work))
    for rel, content in files.items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for rel, target in (links or {}).items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).symlink_to(target)
    git("add", "--all", cwd=work)
    git("-c", "user.name=them", "-c", "user.email=them@example.org", "commit", "--quiet", "-m", "theirs", cwd=work)


def remote_holding(root: Path, repo: str, files: dict[str, str | bytes], links: dict[str, str] | None = None) -> Path:
    """A bare remote at <root>/<repo>.git whose main branch holds `files` and `links`."""
    bare = bare_remote(root, repo)
    work = root / f"{repo}.work"
    commit_tree(work, files, links)
    git("push", "--quiet", str(bare), "main", cwd=work)
    return bare


def tree_snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under root: a file's bytes, a link's target, a folder as 'dir'."""
    out: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out
