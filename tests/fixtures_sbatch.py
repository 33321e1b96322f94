"""sbatch's own #SBATCH parser, without a cluster: `sbatch -vv SCRIPT` prints the options it parsed before it
tries the controller, which a dummy slurm.conf points at an unused port (FACTS.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures_slurm import REPO, _skip_reason

DUMMY_CONF = """ClusterName=parser
SlurmctldHost=localhost
SlurmctldPort=9
NodeName=localhost CPUs=1 State=UNKNOWN
PartitionName=parser Nodes=localhost Default=YES
"""


@pytest.fixture
def sbatch_options(tmp_path: Path) -> Callable[[Path], list[tuple[str, str]]]:
    """A function: job script -> the (option, value) pairs sbatch parsed from its #SBATCH lines, in its order."""
    if shutil.which("sbatch") is None:
        reason = _skip_reason()
        if reason:
            pytest.skip(reason)
        subprocess.run(["bash", str(REPO / "scripts" / "slurm-up.sh")], capture_output=True, timeout=900, check=True)
    conf = tmp_path / "parser-slurm.conf"
    conf.write_text(DUMMY_CONF)

    def parse(script: Path) -> list[tuple[str, str]]:
        # sbatch then retries the absent controller for seconds: stop it once it has printed the options.
        proc = subprocess.Popen(["sbatch", "-vv", str(script)], env={**os.environ, "SLURM_CONF": str(conf)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        lines = []
        try:
            for raw in proc.stderr:  # type: ignore[union-attr]
                lines.append(raw.decode("utf-8", errors="surrogateescape").removesuffix("\n"))
                if lines[-1] == "sbatch: end of defined options":
                    break
        finally:
            proc.kill()
            proc.wait(timeout=30)
            proc.stderr.close()  # type: ignore[union-attr]
        assert "sbatch: end of defined options" in lines, f"sbatch printed no options: {lines[-5:]}"
        start = lines.index("sbatch: defined options") + 2
        pairs = []
        for line in lines[start:-2]:
            name, _, value = line.removeprefix("sbatch: ").partition(" : ")
            pairs.append((name.strip(), value))
        return [(n, v) for n, v in pairs if n != "verbose"]

    return parse
