"""lm-eval's own command line finds `--model bsops` (ops/evaluate/lm_eval_hook.py, the .pth line setup.py installs),
and lm-eval's request cache is kept when asked (driver.run_tasks' use_cache, driver.evaluate's keep_cache).

The hook is checked in this checkout's venv (scripts/setup.sh's editable install: nothing of torch, lm_eval or
bsops at start, `bsops` beside lm-eval's own models once lm_eval.models is imported, plugin.py only when asked
for), and, slow, in a fresh venv after a wheel install and after an editable install of a copy of the source:
found there, start-up time with and without the line, gone after `pip uninstall`. The run of `lm_eval --model
bsops` under torchrun against `bsops eval`'s and the hf model's numbers is tests/evaluate/test_evaluate_harness.py's (the
session's trained run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bigscience_ops.ops.evaluate import EvalError, driver, lm_eval_hook
from tests.evaluate.test_evaluate_bpb import WindowScorer, _lm
from tests.project.test_install import copy_source

REPO = Path(__file__).resolve().parents[2]
SITE = Path(sysconfig.get_paths()["purelib"])
HEAVY = ("torch", "lm_eval", "bigscience_ops")

PROBE = """
import json, sys
heavy = lambda: sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in %r})
at_start, finders = heavy(), [type(f).__name__ for f in sys.meta_path]
import lm_eval.models
from lm_eval.api.registry import model_registry
objs = dict(model_registry.items())
print(json.dumps({"at_start": at_start, "finders": finders, "bsops": str(objs.get("bsops")),
                  "own": sorted(set(objs) & {"hf", "vllm", "dummy"}), "after": heavy(),
                  "plugin_imported": "bigscience_ops.ops.evaluate.plugin" in sys.modules,
                  "loader": type(lm_eval.models.__loader__).__name__}))
""" % (HEAVY,)


def _probe(python: str | Path, cwd: Path, env: dict | None = None) -> dict:
    done = subprocess.run([str(python), "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _check_probe(seen: dict) -> None:
    assert seen["at_start"] == [] and seen["finders"][0] == "BsopsLmEvalFinder", seen  # inert at start
    assert seen["bsops"] == lm_eval_hook.TARGET and seen["own"] == ["dummy", "hf", "vllm"], seen
    assert "torch" not in seen["after"] and not seen["plugin_imported"], seen  # the model's module only when asked
    assert seen["loader"] == "SourceFileLoader", seen  # lm_eval.models as lm-eval's own loader leaves it


def test_this_venv_starts_the_hook_inert_and_lm_eval_finds_bsops_beside_its_own_models(tmp_path):
    pth = SITE / lm_eval_hook.PTH_NAME
    assert pth.is_file() and pth.read_text(encoding="utf-8") == lm_eval_hook.PTH_LINE, (
        f"{pth}: missing or stale; run bash scripts/setup.sh (pip install -e . writes it)")
    _check_probe(_probe(sys.executable, tmp_path))


def test_a_registration_that_fails_is_a_warning_and_lm_eval_still_imports(monkeypatch):
    import lm_eval.api.registry as registry

    class Frozen:
        def __contains__(self, name):
            return False

        def register(self, *args, **kwargs):
            raise TypeError("'mappingproxy' object does not support item assignment")

    monkeypatch.setattr(registry, "model_registry", Frozen())
    with pytest.warns(RuntimeWarning, match="--model bsops not registered"):
        lm_eval_hook.register()
    assert lm_eval_hook.find_spec("json.decoder") is None  # any other module: not the hook's


TASK = """task: t_cached
dataset_path: json
dataset_kwargs: {data_files: {test: d.jsonl}}
output_type: loglikelihood
test_split: test
doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_target: "{{' '+text.split(' ')[-1]}}"
metric_list: [{metric: perplexity, aggregation: perplexity, higher_is_better: false},
              {metric: acc, aggregation: mean, higher_is_better: true}]
"""


class Refusing(WindowScorer):
    """A Scorer that must not be asked: every request is in the cache."""

    def score(self, items):
        raise AssertionError(f"scored {len(items)} request(s) the cache holds")


@pytest.mark.slow  # three lm-eval runs of a local task (about 7 s)
def test_a_second_run_answers_from_lm_evals_request_cache(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in (
        "in the beginning god created", "and the earth was without form", "and darkness was upon the face")))
    (tmp_path / "t.yaml").write_text(TASK)
    cache = tmp_path / "eval" / "global_step4.requests" / "float32"
    first = driver.run_tasks(_lm(WindowScorer()), [str(tmp_path / "t.yaml")], bootstrap_iters=10, use_cache=cache)
    db = cache.with_name("float32_rank0.db")
    size = db.stat().st_size
    assert size > 0 and first["results"]["t_cached"]["sample_len"] == 3
    again = driver.run_tasks(_lm(Refusing()), [str(tmp_path / "t.yaml")], bootstrap_iters=10, use_cache=cache)
    assert again["results"] == first["results"] and db.stat().st_size == size
    with pytest.raises(AssertionError, match="scored 3"):  # without the cache the refusing scorer is asked
        driver.run_tasks(_lm(Refusing()), [str(tmp_path / "t.yaml")], bootstrap_iters=10)


def test_run_tasks_passes_on_only_the_options_it_names(tmp_path):
    with pytest.raises(TypeError, match="fewshot.*allowed: num_fewshot, use_cache"):
        driver.run_tasks(_lm(), ["t"], fewshot=3)
    with pytest.raises(EvalError, match="num_fewshot=-1"):
        driver.run_tasks(_lm(), ["t"], num_fewshot=-1)
    chosen = driver.lm_eval_options({"use_cache": tmp_path / "c"})
    assert chosen == {"num_fewshot": None, "use_cache": str(tmp_path / "c"), "num_fewshot_per_task": None,
                      "model_name": None, "model_args": None}


def test_the_request_cache_lives_beside_the_result_per_precision(tmp_path):
    import torch

    result = tmp_path / "eval" / "global_step8.json"
    scorer = WindowScorer()
    scorer.dtype = torch.bfloat16
    assert driver.request_cache(result, scorer) == tmp_path / "eval" / "global_step8.requests" / "bfloat16"


def test_plugin_run_as_a_module_registers_no_second_copy(tmp_path):
    """`python -m bigscience_ops.ops.evaluate.plugin run ...` (a source tree) executes the module once more as
    __main__ after the hook has registered `bsops`: it registers the same placeholder, and lm-eval's registry still
    gives the hook's Entry, which builds the importable module's class."""
    code = ("import runpy, lm_eval.models; from bigscience_ops.ops.evaluate import plugin, lm_eval_hook; "
            "runpy.run_path(plugin.__file__, run_name='__not_main__'); "
            "from lm_eval.api.registry import get_model; model = get_model('bsops'); "
            "print(model.__module__, model is lm_eval_hook.Entry and model.model() is plugin.BsopsModel)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["bigscience_ops.ops.evaluate.lm_eval_hook", "True"]


# --- installs (slow) -----------------------------------------------------------------------------------------------



def _run(argv: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def _fresh_venv(where: Path, env: dict) -> tuple[Path, Path]:
    """(python, its site-packages): a venv that borrows this venv's site-packages for the dependencies (a path in
    a .pth file: the .pth files there, this checkout's editable install and its hook among them, are not run)."""
    _run([sys.executable, "-m", "venv", "--without-pip", where], where.parent, env)
    python = where / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], where.parent,
                        env).stdout.strip())
    (purelib / "zz_borrowed_deps.pth").write_text(str(SITE) + "\n")
    return python, purelib


@pytest.fixture(scope="module")
def installs(tmp_path_factory) -> dict:
    """kind -> (python, site-packages) of a fresh venv after `pip install` of a wheel ("wheel") and after
    `pip install -e` ("editable") of a copy of the source; the environment without the checkout."""
    tmp = tmp_path_factory.mktemp("hook")
    source = copy_source(tmp)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "BSOPS_TRAININGS")}
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", source], tmp, env)
    [wheel] = (tmp / "dist").glob("bigscience_ops-*.whl")
    out = {}
    for kind, what in (("wheel", [wheel]), ("editable", ["-e", source])):
        python, purelib = _fresh_venv(tmp / kind, env)
        _run(pip + ["--python", python, "install", "--no-deps", "--no-build-isolation", "--no-index", *what], tmp, env)
        out[kind] = (python, purelib)
    return {"venvs": out, "env": env, "source": source}


def _imported_at_start(python: Path, cwd: Path, env: dict) -> set[str]:
    """The modules `python -c pass` imports while it starts, by name (-X importtime)."""
    lines = _run([python, "-X", "importtime", "-c", "pass"], cwd, env).stderr.splitlines()
    return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")} - {"imported package"}


@pytest.mark.slow  # builds a wheel, installs it and an editable copy into two fresh venvs
@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_an_installed_bsops_is_found_by_lm_eval_and_costs_its_start_up_almost_nothing(installs, kind, tmp_path):
    python, purelib = installs["venvs"][kind]
    env = installs["env"]
    pth = purelib / lm_eval_hook.PTH_NAME
    assert pth.read_text(encoding="utf-8") == lm_eval_hook.PTH_LINE
    [record] = purelib.glob("bigscience_ops-*.dist-info/RECORD")
    assert any(line.startswith(lm_eval_hook.PTH_NAME + ",") for line in record.read_text().splitlines())
    _check_probe(_probe(python, tmp_path, env))
    code = ("import json, sys; from lm_eval.api.registry import get_model; model = get_model('bsops'); "
            "print(json.dumps([model.__name__, sys.modules[model.__module__].__file__]))")
    name, path = json.loads(_run([python, "-c", code], tmp_path, env).stdout)
    home = installs["source"] if kind == "editable" else purelib
    assert name == "Entry" and path.startswith(str(home)), path
    # What the hook costs every interpreter's start: no module of its own or anyone's (it runs one compiled line
    # and defines one class); its time is not asserted here (timings live in benchmarks/).
    with_hook = _imported_at_start(python, tmp_path, env)
    assert not {name for name in with_hook if name.split(".")[0] in HEAVY}
    pth.rename(pth.with_suffix(".off"))
    try:
        without = _imported_at_start(python, tmp_path, env)
    finally:
        pth.with_suffix(".off").rename(pth)
    assert with_hook == without, sorted(with_hook ^ without)


@pytest.mark.slow  # builds a wheel and installs it into a fresh venv
def test_uninstalling_bsops_removes_the_hook(installs, tmp_path):
    python, purelib = installs["venvs"]["wheel"]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--python", python]
    _run(pip + ["uninstall", "--yes", "bigscience-ops"], tmp_path, installs["env"])
    assert not (purelib / lm_eval_hook.PTH_NAME).exists()
    seen = _probe(python, tmp_path, installs["env"])  # lm-eval as without bsops: no finder, no model `bsops`
    assert "BsopsLmEvalFinder" not in seen["finders"] and seen["bsops"] == "None" and "hf" in seen["own"]


def test_the_worker_keeps_the_cache_when_asked():
    from bigscience_ops.ops.evaluate import worker

    base = ["--experiment", "tiny", "--step", "4"]
    assert worker.parse_args([*base, "--keep-cache"]).keep_cache and not worker.parse_args(base).keep_cache
