"""Hostile inputs to the evaluation (issue 48), each row through the public CLI (`bsops eval`, `bsops info`,
`lm_eval`), lm-eval's own Python API in a real process, or real files a run or a teammate controls:

- lm-eval is never broken by bsops: with bigscience_ops unimportable, lm-eval's own models work and `--model bsops`
  says why in one line; every `--model_args` error is one line, no traceback (BROKEN_BSOPS, MODEL_ARGS);
- a run's files never point elsewhere: checkpoints of another run id are refused naming both ids, results and
  request caches of another run are reported and never counted, and `eval prefetch --mirror DIR` reads nothing outside
  DIR and leaves nothing in the shared cache when it refuses (RUN_IDS, MIRRORS);
- values as typed: eval's overrides of what the run recorded are refused, the others recorded (OVERRIDES);
- never silent: corrupt source lines fail the source and alert, each kind of eval failure has its own cooldown,
  limited results are kept apart and marked (SILENT).

lm-eval's command line costs about 9 s a process (its task index): the two real `lm_eval run` rows share one slow
test and run at once; the `--model_args` rows share one process of lm-eval's simple_evaluate (what its command line
calls), whose last row is left uncaught to show the one line the interpreter ends with.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.checkpoints import layout, manifest
from bigscience_ops.cli import EXIT_ERROR, main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.evaluate import EvalError, driver, launcher, prefetch, results, next_eval
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_runs import LAYOUT
from tests.fixtures_slurm import recorded_sbatch_ids, replay_sbatch, replay_squeue, sbatch_calls
from tests.fixtures_smtp import alerts_yaml
from tests.hostile.test_hostile_tasks import GOOD
from tests.evaluate.test_ops_evaluate_results import eval_result

LM_EVAL = Path(sys.executable).with_name("lm_eval")
REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- a run, its checkpoints and records

def _experiment(trainings: Path, run: Path, evaluation: str = "sources: {held: HELD}", *extra: str) -> str:
    held = run.parent / "held.jsonl"
    held.write_text('{"text": "held out"}\n')
    section = f"eval: {{{evaluation.replace('HELD', json.dumps(str(held)))}}}\n"
    (trainings / "ev.yaml").write_text(tiny_yaml(run, section, *extra))
    return "ev"


def _checkpoint(checkpoints: Path, step: int, run_id: str = "") -> Path:
    """A committed checkpoint folder (bsops.json and a manifest naming `run_id`), `latest` naming it."""
    folder = checkpoints / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "bsops.json").write_text(json.dumps({"iteration": step}))
    files = {rel: manifest.record_file(folder / rel) for rel in manifest.files_on_disk(folder)}
    manifest.commit(folder, manifest.Manifest(folder.name, step, run_id, "ev", dict(LAYOUT), True, files, time.time()))
    (checkpoints / "latest").write_text(folder.name)
    return folder


def _record(trainings: Path, run: Path, checkpoints: Path) -> None:
    """The run's experiment.json as a launch writes it, its paths.checkpoints naming `checkpoints`."""
    exp = load_experiment("ev", trainings)
    recorded = dataclasses.replace(exp, paths=dataclasses.replace(exp.paths, checkpoints=str(checkpoints)))
    run.mkdir(parents=True, exist_ok=True)
    (run / "experiment.json").write_text(launcher.experiment_record(recorded))


def _eval(trainings: Path, subcommand: str, *args: str):
    return CliRunner().invoke(main, ["eval", subcommand, "ev", *args, "--trainings-dir", str(trainings)])


def _one_error(result) -> str:
    assert result.exit_code == EXIT_ERROR, result.output
    assert "Traceback" not in result.output
    [line] = [line for line in result.output.split("\n") if line.startswith("error: ")]
    return line


@pytest.fixture
def elsewhere(trainings: Path, tmp_path: Path) -> dict:
    """Run `mine` (its folder's id A) whose record's paths.checkpoints names run `other`'s checkpoints (id B)."""
    mine, other = tmp_path / "run", tmp_path / "other"
    _experiment(trainings, mine)
    _checkpoint(other / "checkpoints", 50)
    _record(trainings, mine, other / "checkpoints")
    return {"mine": mine, "other": other, "a": layout.new_run_id(mine), "b": layout.new_run_id(other / "checkpoints")}


# ----------------------------------------------------------------------------- lm-eval never broken by bsops

def _broken(tmp_path: Path, kind: str) -> dict:
    """An environment whose bigscience_ops cannot be imported: a half-upgraded install (its __init__ fails), or this
    venv's editable install after its checkout moved away (its finder, which the venv's .pth imports from the path,
    naming a folder that is gone)."""
    site = tmp_path / kind
    site.mkdir()
    if kind == "half-upgraded":
        (site / "bigscience_ops").mkdir()
        (site / "bigscience_ops" / "__init__.py").write_text("raise ImportError('a half-upgraded install')\n")
    else:
        [finder] = Path(sysconfig.get_paths()["purelib"]).glob("__editable___bigscience_ops_*_finder.py") or [None]
        if finder is None:
            pytest.skip("this venv's bsops is no editable install (scripts/setup.sh makes one)")
        text = finder.read_text(encoding="utf-8")
        moved = text.replace(repr(str(REPO / "bigscience_ops")), repr(str(tmp_path / "moved-away" / "bigscience_ops")))
        assert moved != text
        (site / finder.name).write_text(moved, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    env.pop("BSOPS_DATA_DIR", None)
    return env


PROBE = """
import json
import lm_eval.models
from lm_eval.api.registry import get_model, model_registry
out = {"dummy": get_model("dummy").__name__, "own": sorted(set(model_registry.keys()) & {"hf", "vllm", "dummy"})}
try:
    get_model("bsops").create_from_arg_string("run=tiny", {})
except SystemExit as exc:
    out["bsops"] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", ["half-upgraded", "moved-checkout"])
def test_lm_eval_imports_its_own_models_whatever_became_of_bsops(kind: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=_broken(tmp_path, kind),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    assert seen["dummy"] == "DummyLM" and seen["own"] == ["dummy", "hf", "vllm"]
    assert seen["bsops"].startswith("error: --model bsops: bigscience_ops cannot be imported") and "\n" not in seen["bsops"]


@pytest.mark.slow  # two real `lm_eval run` processes at once (lm-eval's task index: about 9 s each)
def test_lm_evals_command_line_runs_its_models_and_says_in_one_line_why_bsops_cannot(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"text": "in the beginning god created"}\n{"text": "and the earth was"}\n')
    (tmp_path / "t.yaml").write_text("task: t_dummy\n" + GOOD.replace("d.jsonl", str(tmp_path / "d.jsonl")))
    env = _broken(tmp_path, "half-upgraded")
    runs = {model: subprocess.Popen([str(LM_EVAL), "run", "--model", model, "--model_args", "run=tiny", "--tasks",
                                     str(tmp_path / "t.yaml")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            for model in ("dummy", "bsops")}
    done = {model: (proc.communicate(timeout=300), proc.returncode) for model, proc in runs.items()}
    (out, err), code = done["dummy"]
    assert code == 0 and "t_dummy" in out, err[-2000:]  # lm-eval works as if bsops were not there
    (out, err), code = done["bsops"]
    assert code != 0 and "Traceback" not in err, err[-3000:]
    [line] = [x for x in err.splitlines() if x.startswith("error: ")]
    assert "--model bsops" in line and "half-upgraded" in line and "allowed:" in line


DRIVE = """
import json, sys
import lm_eval
from bigscience_ops.errors import BsopsError
rows, last = json.loads(sys.argv[1]), sys.argv[2]
out = {}
for name, args in rows.items():
    try:
        lm_eval.simple_evaluate(model="bsops", model_args=args, tasks=["never_loaded"])
        out[name] = ["none", ""]
    except BsopsError as exc:
        out[name] = ["BsopsError", str(exc)]
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out), flush=True)
lm_eval.simple_evaluate(model="bsops", model_args=last, tasks=["never_loaded"])
"""
MODEL_ARGS = {  # row -> (model_args, what the one line must name)
    "run-dot-dot": ("run=../..", ".."),
    "step-negative": ("run=RUN,step=-1", "step=-1"),
    "step-text": ("run=RUN,step=abc", "step='abc'"),
    "unknown-run": ("run=no-such-experiment", "no-such-experiment"),
    "empty-run": ("run=", "run="),
    "tensor-zero": ("run=RUN,tensor=0", "tensor=0"),
    "unknown-key": ("run=RUN,pretrained=gpt2", "pretrained"),
    "dtype": ("run=RUN,dtype=float16", "dtype='float16'"),
    "another-runs-checkpoints": ("run=RUN", "B"),
}


@pytest.fixture
def lm_eval_rows(trainings: Path, tmp_path: Path, elsewhere: dict) -> dict:
    """Each MODEL_ARGS row through lm-eval's simple_evaluate (what `lm_eval run` calls) in one real process, the run
    being `elsewhere`'s (its record naming another run's checkpoints); the last row left uncaught."""
    run = str(elsewhere["mine"])
    rows = {name: args.replace("RUN", run) for name, (args, _) in MODEL_ARGS.items()}
    env = {**os.environ, "BSOPS_TRAININGS": str(trainings)}
    done = subprocess.run([sys.executable, "-c", DRIVE, json.dumps(rows), f"run={run},step=-1"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)
    return {"rows": json.loads(done.stdout.splitlines()[-1]), "code": done.returncode, "stderr": done.stderr,
            "ids": elsewhere}


def test_every_model_args_error_is_one_line_naming_the_value(lm_eval_rows: dict) -> None:
    ids = lm_eval_rows["ids"]
    for name, (_, named) in MODEL_ARGS.items():
        kind, message = lm_eval_rows["rows"][name]
        named = ids["b"] if named == "B" else named
        assert kind == "BsopsError" and named in message and "allowed" in message and "\n" not in message, (name,
                                                                                                             message)
    [kind, message] = lm_eval_rows["rows"]["another-runs-checkpoints"]
    assert ids["a"] in message and str(ids["other"] / "checkpoints") in message  # both ids, both folders
    # uncaught, the interpreter ends with that one line: no traceback
    assert lm_eval_rows["code"] == 1 and "Traceback" not in lm_eval_rows["stderr"], lm_eval_rows["stderr"][-2000:]
    [line] = [x for x in lm_eval_rows["stderr"].splitlines() if x.startswith("error: ")]
    assert "step=-1" in line


# ----------------------------------------------------------------------------- a run's files never point elsewhere

def test_bsops_eval_refuses_another_runs_checkpoints_naming_both_ids(trainings: Path, elsewhere: dict) -> None:
    for args in (["--step", "50"], ["--latest"]):
        line = _one_error(_eval(trainings, "run", *args))
        assert elsewhere["a"] in line and elsewhere["b"] in line and str(elsewhere["other"] / "checkpoints") in line
    assert not (elsewhere["mine"] / "eval").exists()  # nothing evaluated, nothing filed as this run's


def test_the_hourly_pass_submits_nothing_for_another_runs_checkpoints(trainings: Path, elsewhere: dict,
                                                                      tmp_path: Path, monkeypatch) -> None:
    stand_ins = _recorded_slurm(tmp_path, monkeypatch)
    line = _one_error(_eval(trainings, "next"))
    assert elsewhere["b"] in line and sbatch_calls(stand_ins) == []


def test_a_checkpoint_whose_manifest_names_another_run_is_refused(trainings: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _experiment(trainings, run)
    mine = layout.new_run_id(run)
    layout.write_run_id(run / "checkpoints", mine)
    _checkpoint(run / "checkpoints", 50, run_id="f" * 32)  # copied in from another run, manifest and all
    line = _one_error(_eval(trainings, "run", "--step", "50"))
    assert "f" * 32 in line and mine in line


def test_a_result_of_another_run_is_named_and_never_counted(trainings: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _experiment(trainings, run)
    mine = layout.new_run_id(run)
    _checkpoint(run / "checkpoints", 50, mine)
    _checkpoint(run / "checkpoints", 100, mine)
    for step, run_id, value in ((50, mine, 0.4), (100, "e" * 32, 0.9)):  # 100: copied from another run's folder
        data = eval_result(step, {"lambada/acc": value})
        data["bsops"]["run_id"] = run_id
        results.write(results.result_path(run, f"global_step{step}"), data)
    shown = CliRunner().invoke(main, ["info", "ev", "--json", "--trainings-dir", str(trainings)])
    assert shown.exit_code == 0, shown.output
    info = json.loads(shown.stdout)
    assert info["evaluation"]["steps"] == [50]
    [problem] = [p for p in info["problems"] if "global_step100" in p]
    assert "e" * 32 in problem and mine in problem
    run_id = results.run_id_of(run)
    assert next_eval.has_result(run, "global_step50", (), run_id) and not next_eval.has_result(run, "global_step100",
                                                                                             (), run_id)


def test_another_runs_request_cache_is_refused_before_any_rank_starts(trainings: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    run = tmp_path / "run"
    _experiment(trainings, run)
    mine = layout.new_run_id(run)
    _checkpoint(run / "checkpoints", 50, mine)
    cache = run / "eval" / "global_step50.requests"
    layout.write_run_id(cache, "d" * 32)  # an earlier run's answers, left in the folder
    started = []
    monkeypatch.setattr(launcher, "run_local", lambda *a, **k: started.append(a) or 0)
    line = _one_error(_eval(trainings, "run", "--step", "50", "--keep-cache"))
    assert "d" * 32 in line and mine in line and started == []
    with pytest.raises(EvalError, match="d" * 32):  # and the ranks' own check
        driver.cache_of_run(cache, mine)


MIRRORS = {  # task -> (its dataset_path, dataset_name, what to plant in the mirror or beside it)
    "dot-dot": ("../outside", None),
    "linked-folder": ("org/linked", None),
    "linked-file": ("org/files", None),
    "fifo": ("org/fifo", None),
    "config-dot-dot": ("org/plain", "../../../outside"),
}


@pytest.fixture(scope="module")
def refused_prefetch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One `bsops eval prefetch --mirror DIR` over a task file per MIRRORS row, each leading out of DIR its own way,
    into a shared cache that holds another team's dataset already (one child process for all the rows)."""
    tmp_path = tmp_path_factory.mktemp("prefetch")
    trainings = tmp_path / "trainings"
    shutil.copytree(REPO / "trainings", trainings)
    mirror, outside, tasks = tmp_path / "mirror", tmp_path / "outside", tmp_path / "tasks"
    for folder in (mirror / "org" / "files", mirror / "org" / "fifo", mirror / "org" / "plain", outside, tasks):
        folder.mkdir(parents=True)
    (outside / "test.jsonl").write_text('{"text": "not for this cache"}\n')
    (mirror / "org" / "linked").symlink_to(outside)
    (mirror / "org" / "files" / "test.jsonl").symlink_to(outside / "test.jsonl")
    os.mkfifo(mirror / "org" / "fifo" / "test.jsonl")
    (mirror / "org" / "plain" / "test.jsonl").write_text('{"text": "fine"}\n')
    names = []
    for row, (path, name) in MIRRORS.items():
        body = GOOD.replace("dataset_path: json\ndataset_kwargs: {data_files: {test: d.jsonl}}",
                            f"dataset_path: {path}" + (f"\ndataset_name: {json.dumps(name)}" if name else ""))
        (tasks / f"{row}.yaml").write_text(f"task: t_{row.replace('-', '_')}\n{body}")
        names.append(str(tasks / f"{row}.yaml"))
    cache = tmp_path / "shared-hf"
    (cache / "datasets" / "team").mkdir(parents=True)
    (cache / "datasets" / "team" / "kept.arrow").write_text("another team's")
    before = sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))
    _experiment(trainings, tmp_path / "run", f"tasks: {json.dumps(names)}, hf_cache: {json.dumps(str(cache))}")
    done = _eval(trainings, "prefetch", "--mirror", str(mirror))
    return {"done": done, "cache": cache, "before": before, "outside": outside}


@pytest.mark.parametrize("row", list(MIRRORS))
def test_prefetch_from_a_mirror_never_reads_outside_it(row: str, refused_prefetch: dict) -> None:
    line = _one_error(refused_prefetch["done"])
    assert f"{row}.yaml" in line and f"{len(MIRRORS)} task(s) refused" in line


def test_a_refused_prefetch_leaves_the_shared_cache_as_it_was(refused_prefetch: dict) -> None:
    cache = refused_prefetch["cache"]
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) == refused_prefetch["before"]
    assert not list(cache.rglob("*outside*")) and not list(cache.rglob("*.arrow"))[1:]


# ----------------------------------------------------------------------------- values as typed

@pytest.mark.parametrize("override", ["model.hidden_size=512", "paths.checkpoints=/elsewhere", "train.seed=7",
                                      "slurm.partition=other"])
def test_an_override_of_what_the_run_recorded_is_refused(override: str, trainings: Path, tmp_path: Path,
                                                         monkeypatch) -> None:
    _experiment(trainings, tmp_path / "run")
    _checkpoint(tmp_path / "run" / "checkpoints", 50)
    started = []
    monkeypatch.setattr(launcher, "run_local", lambda *a, **k: started.append(a) or 0)
    line = _one_error(_eval(trainings, "run", "--step", "50", override))
    assert override.partition("=")[0] in line and "allowed" in line and started == []


@pytest.mark.parametrize("override", ["eval.prefetch_minutes=0", "eval.prefetch_minutes=100000",
                                      "eval.max_bad_lines=-1"])
def test_the_new_eval_fields_are_bounded(override: str, trainings: Path, tmp_path: Path) -> None:
    _experiment(trainings, tmp_path / "run")
    assert override.partition("=")[0].partition(".")[2] in _one_error(_eval(trainings, "run", "--step", "50", override))


def test_the_hourly_passs_overrides_are_recorded_with_the_job(trainings: Path, tmp_path: Path, monkeypatch) -> None:
    _experiment(trainings, tmp_path / "run")
    _checkpoint(tmp_path / "run" / "checkpoints", 50)
    _recorded_slurm(tmp_path, monkeypatch)
    done = _eval(trainings, "next", "eval.limit=5", "eval.docs_per_source=10")
    assert done.exit_code == 0, done.output
    [record] = next_eval.read_ledger(tmp_path / "run" / "eval" / "jobs.jsonl").records
    assert record.overrides == ["eval.limit=5", "eval.docs_per_source=10"]
    ranks = json.loads((tmp_path / "run" / "eval" / "jobs" / "global_step50.experiment.json").read_text())
    assert ranks["overrides"] == record.overrides and ranks["eval"]["limit"] == 5  # what the ranks read, and record


# ----------------------------------------------------------------------------- never silent

def _hourly(trainings: Path):
    return _eval(trainings, "next", "--alert")


def _recorded_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """squeue and sbatch on PATH answering with their recorded real output (tests/fixtures_slurm.py): a queue of
    other jobs, in which the run's eval jobs never show (they left it), and real job ids in turn; the folder."""
    stand_ins = replay_sbatch(replay_squeue(tmp_path / "bin", "squeue.txt"))
    monkeypatch.setenv("PATH", f"{stand_ins}:{os.environ['PATH']}")
    return stand_ins


def test_each_kind_of_eval_failure_has_its_own_cooldown(trainings: Path, tmp_path: Path, monkeypatch,
                                                        plain_server) -> None:
    inbox, port = plain_server
    run = tmp_path / "run"
    _experiment(trainings, run, "tasks: [lambada_openai]", alerts_yaml(port, cooldown_minutes=240))
    _checkpoint(run / "checkpoints", 50)
    first, second = recorded_sbatch_ids()[:2]
    _recorded_slurm(tmp_path, monkeypatch)
    assert _hourly(trainings).exit_code == 0  # the first job submitted
    assert _hourly(trainings).exit_code == EXIT_ERROR  # it left the queue without its result: eval-job; the 2nd sent
    assert [(r.event, r.job_id) for r in next_eval.read_ledger(run / "eval" / "jobs.jsonl").records] == [
        ("submitted", first), ("failed", first), ("submitted", second)]
    data = eval_result(50, {"other/acc": 0.5})  # the 2nd wrote a result that left a task out: a new kind, told at once
    data["bsops"]["missing"] = {"lambada_openai": "eval.tasks: lambada_openai: not in the cache offline"}
    results.write(results.result_path(run, "global_step50"), data)
    assert _hourly(trainings).exit_code == EXIT_ERROR
    subjects = [m["Subject"] for m in inbox.messages]
    assert [s for s in subjects if "eval-job" in s and "RECOVERED" not in s] != []
    assert [s for s in subjects if "eval-tasks" in s] != []  # not held back by eval-job's 240 minutes
    assert [s for s in subjects if "eval-job" in s and "RECOVERED" in s] != []  # the job kind stopped failing
    assert len(inbox.messages) == 3


def test_a_source_with_corrupt_lines_fails_it_and_alerts_as_its_own_kind(trainings: Path, tmp_path: Path,
                                                                          monkeypatch, plain_server) -> None:
    from tests.evaluate.test_evaluate_bpb import _lm

    inbox, port = plain_server
    run = tmp_path / "run"
    source = tmp_path / "src.jsonl"  # 2 lines of 5 are not documents
    source.write_text('{"text": "one"}\n{"text": "two"}\n{"te\n{"text": "three"}\nnot json\n')
    _experiment(trainings, run, f"sources: {{src: {json.dumps(str(source))}}}", alerts_yaml(port))
    exp = load_experiment("ev", trainings)
    scored, missing, corrupt = driver.source_bits_per_byte(exp, _lm(), lambda line: None)
    assert scored == {} and corrupt == ["src"] and "2 line(s)" in missing["src"] and f"{source}:3" in missing["src"]
    assert f"{source}:5" in missing["src"]  # each named, by file and line
    tolerant = dataclasses.replace(exp, eval=dataclasses.replace(exp.eval, max_bad_lines=2))
    assert driver.source_bits_per_byte(tolerant, _lm(), lambda line: None)[0]["src"]["skipped"] == 2
    _checkpoint(run / "checkpoints", 50)
    data = eval_result(50, {"other/acc": 0.5})
    data["bsops"].update(missing=missing, corrupt=corrupt)  # what the worker writes (and it exits 2)
    results.write(results.result_path(run, "global_step50"), data)
    _recorded_slurm(tmp_path, monkeypatch)
    assert _hourly(trainings).exit_code == EXIT_ERROR
    [message] = inbox.messages
    assert "eval-sources" in message["Subject"] and "src" in message.get_body(("plain",)).get_content()


def _limited_and_full(trainings: Path, tmp_path: Path) -> Path:
    """Step 50 with a full result and a limited one beside it; step 100 with a limited one written where full ones
    go (before they were kept apart: lm-eval's config says it was limited)."""
    run = tmp_path / "run"
    _experiment(trainings, run, "tasks: [lambada_openai]")
    for step in (50, 100):
        _checkpoint(run / "checkpoints", step)
    full, limited = eval_result(50, {"lambada/acc": 0.4}), eval_result(50, {"lambada/acc": 0.9})
    limited["bsops"]["limit"] = 5
    results.write(results.result_path(run, "global_step50"), full)
    results.write(results.result_path(run, "global_step50", limited=True), limited)  # never over the full one
    old_style = eval_result(100, {"lambada/acc": 0.1})  # limited, written where full ones go: lm-eval says so
    old_style["config"]["limit"] = 20
    results.write(results.result_path(run, "global_step100"), old_style)
    return run


def test_limited_results_are_kept_apart_and_marked_in_the_table_and_info(trainings: Path, tmp_path: Path) -> None:
    run = _limited_and_full(trainings, tmp_path)
    shown = CliRunner().invoke(main, ["info", "ev", "--json", "--trainings-dir", str(trainings)])
    table = json.loads(shown.stdout)["evaluation"]
    assert table["steps"] == [50, 100] and table["limits"] == [None, 20]
    [row] = [r for r in table["rows"] if r["metric"] == "lambada/acc"]
    assert row["values"] == [0.4, 0.1]  # step 50: its full result, never the limited one
    text = CliRunner().invoke(main, ["info", "ev", "--trainings-dir", str(trainings)]).output
    assert "step 100 (limit 20)" in text
    found, _ = results.read_live(run)  # the watchdog's reading: full results only, so no drop from 0.4 to 0.1
    assert [r.step for r in found] == [50] and results.drops(found, {"lambada/acc": 0.05}) == []


def test_prefetch_streams_the_childs_lines_and_stops_it_at_the_deadline(tmp_path: Path) -> None:
    from bigscience_ops.launch.processes import alive

    seen: list[tuple[str, bool]] = []
    pid = tmp_path / "pid"
    child = [sys.executable, "-c", f"import os, pathlib, time; pathlib.Path({str(pid)!r}).write_text(str(os.getpid()));"
             " print('copying', flush=True); time.sleep(120)"]
    code, _ = prefetch.run_streamed(child, dict(os.environ), time.monotonic() + 1,
                                    lambda line: seen.append((line, alive(int(pid.read_text())))))
    assert code is None and seen == [("copying", True)]  # told while the child ran, then stopped at the deadline
    assert not alive(int(pid.read_text()))


@pytest.mark.slow  # matplotlib and a TensorBoard event file (about 3 s)
def test_the_plot_draws_a_limited_result_apart(trainings: Path, tmp_path: Path) -> None:
    from bigscience_ops.views import plot
    from tests.views.test_views import _write_events

    _limited_and_full(trainings, tmp_path)
    exp = load_experiment("ev", trainings)
    _write_events(Path(exp.paths.tensorboard), {"lm loss": [(8, 9.0), (16, 8.5)]})
    drawn = plot.plot(exp, tmp_path / "plot.png").evaluation
    assert drawn["lambada/acc"] == [(50 * 8 * 64.0, 0.4)]
    assert drawn[f"lambada/acc {plot.LIMITED_MARK}"] == [(100 * 8 * 64.0, 0.1)]  # hollow points, apart
