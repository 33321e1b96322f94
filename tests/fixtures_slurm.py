"""The real single-node Slurm for tests marked `slurm`: started once per session by scripts/slurm-up.sh.

Tests marked `@pytest.mark.slurm` get the `slurm_cluster` fixture automatically. The cluster is left
running after the session (the next session finds it up at once); `bash scripts/slurm-down.sh` stops it.
They are skipped only where starting it is impossible: not root, or no Debian packages and no Slurm.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from bigscience_ops import slurm

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


@dataclass
class SlurmCluster:
    """The running test cluster and helpers to submit and wait; every job it submits is cancelled at the end."""

    conf: Path
    partition: str
    down_partition: str
    prefix: str
    """Unique per session: start job names with it so sessions never see each other's jobs."""
    submitted: list[str] = field(default_factory=list)

    def script(self, folder: Path, name: str, body: str) -> Path:
        path = folder / name
        path.write_text("#!/bin/bash\nset -e\n" + body + "\n")
        return path

    def submit(self, script: Path, *, name: str, time_limit: str = "2", output: str = "/dev/null",
               **options: object) -> str:
        """sbatch through bigscience_ops.slurm, with a --time (the backfill scheduler wants one)."""
        extra = [f"--output={output}", f"--chdir={script.parent}", *options.pop("extra", ())]  # type: ignore[misc]
        argv = slurm.sbatch_argv(script, slurm.SbatchOptions(job_name=name, time_limit=time_limit, extra=extra, **options))  # type: ignore[arg-type]
        job_id = slurm.submit(argv, timeout=30)
        self.submitted.append(job_id)
        return job_id

    def submit_held(self, name: str, *, user: str | None = None) -> str:
        """A held job (it never runs) with any name at all, a newline included, which sbatch_argv refuses;
        as another `user` when given (root may submit for anyone with sbatch --uid)."""
        who = [f"--uid={user}"] if user else []
        argv = ["sbatch", "--parsable", "--hold", *who, f"--job-name={name}", "--time=2", "--output=/dev/null",
                "--chdir=/tmp", "--wrap=true"]
        job_id = slurm.parse_sbatch_parsable(slurm.run(argv, timeout=30).stdout)
        self.submitted.append(job_id)
        return job_id

    def jobs(self, job_id: str | None = None) -> list[slurm.Job]:
        jobs = slurm.query_jobs(timeout=30)
        return [j for j in jobs if job_id is None or j.array_job_id == job_id]

    def cancel_all(self) -> None:
        """Cancel what this session submitted, and any job named with its prefix (submitted by code
        under test, e.g. a launch), so no test job outlives the session."""
        ids = set(self.submitted)
        try:
            ids |= {j.array_job_id for j in slurm.query_jobs(timeout=30) if j.name.startswith(self.prefix)}
            if ids:
                slurm.cancel(sorted(ids), timeout=30)
        except slurm.SlurmError:
            pass  # already gone, or the cluster is down: nothing left to cancel
        self.submitted.clear()


RECORDED = REPO / "tests" / "assets" / "slurm"
"""Real output of Slurm 22.05 (tests/assets/slurm/README.md says how to re-record it)."""


def recorded_terminator() -> str:
    """The record terminator the recordings were made with: the last field of squeue.format."""
    return (RECORDED / "squeue.format").read_text().rsplit(slurm.SQUEUE_DELIMITER, 1)[1]


def recorded_squeue(name: str) -> slurm.Jobs:
    """A recorded squeue output (`squeue.txt`, `squeue-hostile-names.txt`) parsed."""
    return slurm.parse_squeue((RECORDED / name).read_bytes().decode("utf-8"), recorded_terminator())


def replay_squeue(folder: Path, name: str) -> Path:
    """Write `folder/squeue`, a stand-in that prints recording `name` ended with the terminator of the
    query that runs it (from its SQUEUE_FORMAT), as the real squeue would; returns `folder` for PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    stand_in = folder / "squeue"
    stand_in.write_text(f"#!/bin/bash\nexec sed \"s/{recorded_terminator()}/${{SQUEUE_FORMAT##*$'\\x1f'}}/g\" "
                        f"{RECORDED / name}\n")
    stand_in.chmod(0o755)
    return folder


def replay_sbatch(folder: Path) -> Path:
    """Write `folder/sbatch`, a stand-in that prints the recorded answers of `sbatch --parsable`
    (sbatch-parsable.txt: three real job ids, then again from the first) in turn and keeps each call's argv in
    `folder/sbatch-N.argv` (read them with `sbatch_calls`); returns `folder` for PATH. With replay_squeue in the same
    folder: a queue where the jobs submitted never show (they left it), as a real one answers."""
    folder.mkdir(parents=True, exist_ok=True)
    stand_in = folder / "sbatch"
    recorded = RECORDED / "sbatch-parsable.txt"
    stand_in.write_text(  # bash builtins only: one process a call
        "#!/bin/bash\nset -e\n"
        f"count={shlex.quote(str(folder / 'sbatch.count'))}\n"
        'n=0; [[ -f $count ]] && read -r n < "$count"; n=$((n + 1)); echo "$n" > "$count"\n'
        f'printf "%s\\0" "$@" > {shlex.quote(str(folder))}/sbatch-"$n".argv\n'
        f"mapfile -t answers < {shlex.quote(str(recorded))}\n"
        'printf "%s\\n" "${answers[(n - 1) % ${#answers[@]}]}"\n')
    stand_in.chmod(0o755)
    return folder


def sbatch_calls(folder: Path) -> list[list[str]]:
    """The argv of each call of replay_sbatch's stand-in in `folder`, in order."""
    calls = sorted(folder.glob("sbatch-*.argv"), key=lambda p: int(p.stem.split("-")[1]))
    return [p.read_bytes().decode().split("\0")[:-1] for p in calls]


def recorded_sbatch_ids() -> list[str]:
    """The job ids sbatch-parsable.txt holds, in the order replay_sbatch answers them."""
    return [slurm.parse_sbatch_parsable(line + "\n") for line in (RECORDED / "sbatch-parsable.txt").read_text().split()]


def wait_until(what: str, probe: Callable[[], T], timeout: float = 60.0, interval: float = 0.3) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value:
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}; last value: {value!r}")
        time.sleep(interval)
        value = probe()
    return value


def _skip_reason() -> str | None:
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "real-Slurm tests need Linux: scripts/slurm-up.sh installs Debian's slurm packages"
    if os.geteuid() != 0:
        return (f"real-Slurm tests need root to install and start munged/slurmctld/slurmd "
                f"(scripts/slurm-up.sh); running as uid {os.geteuid()}")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "real-Slurm tests need Slurm installed or apt-get to install it (Debian/Ubuntu)"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "scripts" / "slurm-up.sh")], capture_output=True, text=True,
                          timeout=900, check=False)
    if proc.returncode != 0:
        pytest.fail(f"scripts/slurm-up.sh failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}")
    exports = dict(line.removeprefix("export ").split("=", 1) for line in proc.stdout.splitlines()
                   if line.startswith("export "))
    if "SLURM_CONF" not in exports:
        pytest.fail(f"scripts/slurm-up.sh printed no SLURM_CONF: {proc.stdout!r}")
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = exports["SLURM_CONF"]
    partition = os.environ.get("BSOPS_SLURM_PARTITION", "bsops")
    cluster = SlurmCluster(Path(exports["SLURM_CONF"]), partition, f"{partition}-down",
                           prefix=f"t{uuid.uuid4().hex[:6]}")
    print(f"slurm cluster ready in {time.monotonic() - started:.1f} s ({exports['SLURM_CONF']})")
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every test marked `slurm` the cluster, so the marker alone is enough."""
    for item in items:
        if item.get_closest_marker("slurm") and "slurm_cluster" not in getattr(item, "fixturenames", ["x"]):
            item.fixturenames.insert(0, "slurm_cluster")  # type: ignore[attr-defined]
