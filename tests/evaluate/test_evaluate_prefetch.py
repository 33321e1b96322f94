"""Offline standard tasks (ops/evaluate/prefetch.py): `bsops eval prefetch --mirror MIRROR` builds eval.tasks' datasets
into eval.hf_cache from a local source (no network), checks they load offline and records them; before it, the task
is missing offline with one line naming it and the prefetch command; after it, the task runs offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.checkpoints import layout
from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.evaluate import driver, jobscript, prefetch
from tests.fixtures_experiments import tiny_yaml
from tests.hostile.test_hostile_tasks import GOOD, offline

ROWS = [{"text": "in the beginning god created"}, {"text": "and the earth was without form"},
        {"text": "and god said let there be light"}]


def _mirror(root: Path, path: str, name: str | None = None) -> Path:
    folder = root / path / (name or "")
    folder.mkdir(parents=True)
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return root


def _setup(trainings: Path, tmp_path: Path, tasks: list[str]) -> None:
    (trainings / "ev.yaml").write_text(tiny_yaml(tmp_path / "run", "eval: {tasks: " + json.dumps(tasks) + ", hf_cache: "
                                                 + json.dumps(str(tmp_path / "hf")) + ", bootstrap_iters: 10}\n"))


@pytest.mark.slow  # two fresh interpreters of the prefetch (datasets, lm-eval), and lm-eval here (about 12 s)
def test_prefetch_from_a_local_source_then_the_task_runs_offline(trainings, tmp_path, monkeypatch):
    from tests.evaluate.test_evaluate_bpb import _lm

    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "hub.yaml").write_text("task: t_hub\n" + GOOD.replace(
        "dataset_path: json\ndataset_kwargs: {data_files: {test: d.jsonl}}", "dataset_path: bsops-test/last_word"))
    _setup(trainings, tmp_path, [str(folder / "hub.yaml")])
    exp = load_experiment("ev", trainings)
    wanted = prefetch.Wanted(exp.name, exp.eval.tasks, exp.eval.trust_task_code)
    assert prefetch.needs(wanted) == [(str(folder / "hub.yaml"), "bsops-test/last_word", None)]
    offline(monkeypatch, tmp_path / "hf")
    missing: dict[str, str] = {}
    assert driver.run_tasks(_lm(), list(exp.eval.tasks), missing=missing, prefetch=prefetch.command("ev")) == {}
    [(task, why)] = missing.items()
    assert task == str(folder / "hub.yaml") and "bsops eval prefetch ev" in why and "\n" not in why

    fetched = CliRunner().invoke(main, ["eval", "prefetch", "ev", "--mirror", str(_mirror(tmp_path / "mirror",
                                                                                          "bsops-test/last_word")),
                                        "--trainings-dir", str(trainings)])
    assert fetched.exit_code == 0, fetched.output
    manifest = json.loads((tmp_path / "hf" / prefetch.MANIFEST).read_text())
    assert manifest["tasks"] == {str(folder / "hub.yaml"): {"dataset_path": "bsops-test/last_word",
                                                            "dataset_name": None, "rows": {"test": 3}}}
    out = driver.run_tasks(_lm(), list(exp.eval.tasks), missing=missing.clear() or missing, bootstrap_iters=10)
    assert missing == {} and out["results"]["t_hub"]["sample_len"] == 3


def test_prefetch_needs_a_cache_and_the_job_reads_it_offline(trainings, tmp_path):
    (trainings / "ev.yaml").write_text(tiny_yaml(tmp_path / "run", "eval: {tasks: [lambada_openai]}\n"))
    refused = CliRunner().invoke(main, ["eval", "prefetch", "ev", "--trainings-dir", str(trainings)])
    assert refused.exit_code == 2 and "eval.hf_cache" in refused.output
    assert prefetch.cache_env(None, offline=True) == {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    env = prefetch.cache_env(tmp_path / "hf", offline=True)
    assert env["HF_DATASETS_CACHE"] == str(tmp_path / "hf" / "datasets") and env["HF_HOME"] == str(tmp_path / "hf")
    _setup(trainings, tmp_path, ["lambada_openai"])
    exp = load_experiment("ev", trainings)
    checkpoint = layout.Checkpoint("global_step10", 10, tmp_path / "run" / "checkpoints" / "global_step10")
    script = jobscript.render(exp, checkpoint, tmp_path / "run" / "eval", workdir=tmp_path).text
    exported = dict(line.removeprefix("export ").split("=", 1) for line in script.splitlines()
                    if line.startswith("export HF_"))
    assert exported == {**env, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}  # the job: that cache, offline


@pytest.mark.slow  # lm-eval's task index, twice in the prefetch's processes and once here (about 25 s)
def test_prefetch_of_a_registered_task_from_a_local_mirror_then_lm_evals_lambada_runs_offline(trainings, tmp_path,
                                                                                               monkeypatch):
    from tests.evaluate.test_evaluate_bpb import _lm

    _setup(trainings, tmp_path, ["lambada_openai"])
    mirror = _mirror(tmp_path / "mirror", "EleutherAI/lambada_openai", "default")
    fetched = CliRunner().invoke(main, ["eval", "prefetch", "ev", "--mirror", str(mirror),
                                        "--trainings-dir", str(trainings)])
    assert fetched.exit_code == 0, fetched.output
    manifest = json.loads((tmp_path / "hf" / prefetch.MANIFEST).read_text())
    assert manifest["tasks"]["lambada_openai"] == {"dataset_path": "EleutherAI/lambada_openai",
                                                   "dataset_name": "default", "rows": {"test": 3}}
    offline(monkeypatch, tmp_path / "hf")
    missing: dict[str, str] = {}
    out = driver.run_tasks(_lm(), ["lambada_openai"], missing=missing, bootstrap_iters=10)
    assert missing == {} and out["results"]["lambada_openai"]["sample_len"] == 3


def test_a_relative_cache_resolves_against_the_project_folder(trainings: Path, tmp_path: Path, monkeypatch) -> None:
    """As every other output path: not against the folder a command (the hourly job, a login shell) runs in."""
    from bigscience_ops.config.loading import load_experiment

    (trainings / "rel.yaml").write_text("base: tiny\neval: {hf_cache: shared/hf-cache}\n")
    monkeypatch.chdir(tmp_path)
    exp = load_experiment("rel", trainings)
    assert exp.eval.hf_cache == str(trainings.parent / "shared" / "hf-cache")


def test_a_long_copy_says_how_far_it_has_come(tmp_path: Path, monkeypatch, capsys) -> None:
    """While one dataset is copied (a 2 GiB mirror file takes minutes), a line every PROGRESS_S seconds saying how
    much the cache holds."""
    import threading

    monkeypatch.setattr(prefetch, "PROGRESS_S", 0.01)
    (tmp_path / "part.arrow").write_bytes(b"x" * (1 << 20))
    seen, pause = "", threading.Event()
    with prefetch._progress("t: org/big", tmp_path):
        for _ in range(500):  # at most 5 s
            seen += capsys.readouterr().out
            if "MiB" in seen or pause.wait(0.01):
                break
    first = seen.splitlines()[0]
    assert first.startswith("t: org/big: still copying") and first.endswith("the cache holds 1.0 MiB")
