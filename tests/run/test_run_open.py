"""run.open is the one way a command reads a run, and a command reads its experiment file once.

Every read of a YAML file goes through typedyaml.read_yaml (an experiment file, then each base it names); the test
counts the reads of the experiment's own file while each command runs in this process (click's CliRunner).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops import run as runs
from bigscience_ops import typedyaml
from bigscience_ops.cli import main
from bigscience_ops.run.opening import open_run


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An experiment `watched` (on tiny) in its own trainings folder, and the reads of each YAML file by name."""
    trainings = tmp_path / "trainings"
    trainings.mkdir()
    (trainings / "watched.yaml").write_text(f"base: tiny\npaths: {{output: {tmp_path / 'run'}}}\n")
    reads: Counter[str] = Counter()
    real = typedyaml.read_yaml

    def read_yaml(path, *args, **kwargs):
        reads[Path(path).name] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(typedyaml, "read_yaml", read_yaml)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # status: Slurm unreachable, said in a line
    monkeypatch.chdir(tmp_path)
    return trainings, reads


COMMANDS = [
    ["plan", "watched", "train.seed=7"],
    ["show", "watched"],
    ["launch", "watched", "--dry-run", "train.seed=7"],
    ["render", "watched", "--out", "rendered"],
    ["status", "watched", "--timeout", "1", "--no-email", "alerts.stall_minutes=30"],
    ["hub-sync", "watched"],
    ["backup", "watched", "--dry-run"],
    ["eval", "next", "watched"],
    ["eval", "prefetch", "watched"],
    ["info", "watched"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:3]) for a in COMMANDS])
def test_each_command_reads_the_experiment_file_once(counted, argv: list[str]) -> None:
    trainings, reads = counted
    result = CliRunner().invoke(main, [*argv, "--trainings-dir", str(trainings)])
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError), result.output
    assert reads["watched.yaml"] == 1, (reads, result.output)


def test_run_open_is_the_package_face_and_reads_once(counted, tmp_path: Path) -> None:
    trainings, reads = counted
    assert runs.open is open_run
    opened = runs.open("watched", trainings, overrides=("alerts.stall_minutes=30",))
    assert reads["watched.yaml"] == 1
    assert opened.experiment.alerts.stall_minutes == 30 and opened.record is None
    assert opened.origins["alerts.stall_minutes"] == "command line" and opened.settings_problem is None
    assert opened.origins["paths.output"] == str(trainings / "watched.yaml")


def test_lm_evals_bsops_model_opens_a_run_as_bsops_eval_does(counted) -> None:
    """`--model_args run=NAME` (a name, a YAML file or a run folder) reads the run through run.open, with today's
    eval: settings, and the experiment file once."""
    from bigscience_ops.ops.evaluate.plugin import load_run

    trainings, reads = counted
    exp = load_run("watched", str(trainings))
    assert reads["watched.yaml"] == 1
    assert exp == open_run("watched", trainings).configured()
