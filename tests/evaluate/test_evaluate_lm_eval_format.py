"""What `bsops eval` writes is what lm-eval's own command line writes (issue 49): the per-sample files of
`--log-samples` in lm-eval's file names and records, the result file with the keys lm-eval's saved results have
(model_name, model_args, batch_size, task_hashes, ...), eval.num_fewshot and eval.num_fewshot_per_task passed to
lm-eval and recorded; and offline, a task whose dataset is not in the cache is missing at once, `datasets` never
asked. lm-eval's side of each comparison is lm-eval's own code (EvaluationTracker) run here on the same output."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest

from bigscience_ops.config.loading import load_experiment
from bigscience_ops.ops.evaluate import EvalError, driver, prefetch, results
from tests.evaluate.test_eval_lm_eval_cli import TASK
from tests.evaluate.test_evaluate_bpb import WindowScorer, _lm

ASSET = Path(__file__).resolve().parents[1] / "assets" / "eval" / "lm_eval_0.4.13_output.json"


def _task(folder: Path, name: str = "t", extra: str = "") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in (
        "in the beginning god created", "and the earth was without form", "and darkness was upon the face")))
    (folder / f"{name}.yaml").write_text(TASK.replace("t_cached", f"t_{name}") + extra)
    return str(folder / f"{name}.yaml")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> dict:
    """driver.evaluate of tiny (a Scorer of fixed answers, no checkpoint) on two task files, one of them asking
    2 few-shot examples of eval.num_fewshot_per_task, eval.num_fewshot 1 for the other, with --log-samples."""
    tmp = tmp_path_factory.mktemp("format")
    tasks = [_task(tmp / "tasks", "one"), _task(tmp / "tasks", "two")]
    exp = load_experiment("tiny")
    exp = dataclasses.replace(
        exp, paths=dataclasses.replace(exp.paths, output=str(tmp / "run"), tensorboard=None),
        logging=dataclasses.replace(exp.logging, tensorboard=False),
        eval=dataclasses.replace(exp.eval, tasks=tasks, sources={}, bootstrap_iters=10, batch_size=2, limit=None,
                                 num_fewshot=1, num_fewshot_per_task={tasks[1]: 2}))
    scorer = WindowScorer()
    scorer.layout = {"tensor": 1, "pipeline": 1}
    path = driver.evaluate(exp, tmp / "run" / "checkpoints" / "global_step4", {"iteration": 4}, scorer,
                           log_samples=True)
    return {"exp": exp, "path": path, "result": json.loads(path.read_text()), "tmp": tmp}


def test_the_result_holds_the_keys_of_lm_evals_saved_results_filled(evaluated, tmp_path):
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(tmp_path / "lm-eval"))  # lm-eval's own results file of its output
    tracker.general_config_tracker.log_experiment_args(model_source="hf", model_args={"pretrained": "org/m"},
                                                       system_instruction=None, chat_template=None,
                                                       fewshot_as_multiturn=False)
    tracker.save_results_aggregated(results=json.loads(ASSET.read_text()), samples=None)
    [saved] = (tmp_path / "lm-eval").rglob("results_*.json")
    theirs, ours = json.loads(saved.read_text()), evaluated["result"]
    assert set(theirs) - set(ours) == set() and set(theirs["config"]) - set(ours["config"]) == set()
    exp = evaluated["exp"]
    assert ours["model_name"] == "tiny/global_step4" == results.model_name(exp.name, "global_step4")
    assert ours["model_name_sanitized"] == "tiny__global_step4" and ours["model_source"] == "bsops"
    assert ours["config"]["model"] == "bsops" and ours["config"]["batch_size"] == 2
    assert ours["config"]["model_args"] == {"run": exp.paths.output, "step": 4, "tensor": 1, "pipeline": 1,
                                            "dtype": "training"}
    assert sorted(ours["task_hashes"]) == ["t_one", "t_two"]
    assert all(re.fullmatch("[0-9a-f]{64}", h) for h in ours["task_hashes"].values())


def test_few_shot_of_the_experiment_reaches_lm_eval_and_is_recorded(evaluated):
    result = evaluated["result"]
    assert result["n-shot"] == {"t_one": 1, "t_two": 2}  # lm-eval's own record of what each task was asked
    tasks = evaluated["exp"].eval.tasks
    assert result["bsops"]["num_fewshot"] == 1 and result["bsops"]["num_fewshot_per_task"] == {tasks[1]: 2}


def test_samples_are_written_as_lm_evals_log_samples_writes_them(evaluated, tmp_path):
    """The same samples through lm-eval's EvaluationTracker.save_results_samples and through bsops: the same file
    name but for the date id, the same records."""
    from lm_eval.loggers import EvaluationTracker

    folder = evaluated["path"].with_name("global_step4.samples")
    ours = {re.sub(r"_[0-9T.-]+\.jsonl$", "", p.name): p for p in folder.iterdir()}
    assert sorted(ours) == ["samples_t_one", "samples_t_two"]
    assert all(re.fullmatch(r"samples_t_(one|two)_\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(\.\d+)?\.jsonl", p.name)
               for p in ours.values())
    samples = driver.run_tasks(_lm(WindowScorer()), [_task(tmp_path / "tasks", "one")], bootstrap_iters=10,
                               log_samples=True, num_fewshot=1)["samples"]
    kept = copy.deepcopy(samples)
    written = driver.write_samples(tmp_path / "eval" / "global_step4.json", samples)
    assert samples == kept  # bsops' rows as lm-eval returned them
    tracker = EvaluationTracker(output_path=str(tmp_path / "lm-eval" / "results.json"))
    tracker.date_id = "2026-11-29T19-00-00.000001"
    tracker.save_results_samples(task_name="t_one", samples=copy.deepcopy(samples["t_one"]))
    [theirs] = (tmp_path / "lm-eval").glob("samples_*.jsonl")
    [mine] = written.glob("samples_*.jsonl")
    assert theirs.name == f"samples_t_one_{tracker.date_id}.jsonl" and mine.name.startswith("samples_t_one_")
    records = [json.loads(line) for line in mine.read_text().splitlines()]
    assert records == [json.loads(line) for line in theirs.read_text().splitlines()] and len(records) == 3
    assert {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics", "doc_hash",
            "prompt_hash", "target_hash"} <= set(records[0])
    assert set(records[0]["arguments"]) == {"gen_args_0"} and set(records[0]["arguments"]["gen_args_0"]) == {
        "arg_0", "arg_1"}


def test_num_fewshot_per_task_names_an_entry_of_eval_tasks(tmp_path):
    from bigscience_ops.errors import ConfigError

    with pytest.raises(EvalError, match=r"num_fewshot_per_task: piqa: not an entry of eval.tasks; allowed: t.yaml"):
        driver.fewshot_choice({"piqa": 3}, ["t.yaml"])
    with pytest.raises(EvalError, match=r"num_fewshot_per_task: t.yaml: -1; allowed: a whole number >= 0"):
        driver.fewshot_choice({"t.yaml": -1}, ["t.yaml"])
    (tmp_path / "fs.yaml").write_text("base: tiny\neval: {tasks: [piqa], num_fewshot_per_task: {hellaswag: 3}}\n")
    with pytest.raises(ConfigError, match=r"eval.num_fewshot_per_task.hellaswag: got 'hellaswag'; an entry of "
                                          r"eval.tasks, as written there: piqa"):
        load_experiment(str(tmp_path / "fs.yaml"))
    (tmp_path / "many.yaml").write_text("base: tiny\neval: {num_fewshot: 1001}\n")
    with pytest.raises(ConfigError, match=r"eval.num_fewshot: got 1001; must be in \[0, 1,000\]"):
        load_experiment(str(tmp_path / "many.yaml"))


def test_offline_a_dataset_not_in_the_cache_is_missing_at_once_and_datasets_is_never_asked(tmp_path, monkeypatch):
    import datasets

    from tests.hostile.test_hostile_tasks import GOOD, offline

    cache = tmp_path / "hf"
    offline(monkeypatch, cache)
    asked = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: asked.append(a) or pytest.fail("asked datasets"))
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "hub.yaml").write_text("task: t_hub\n" + GOOD.replace(
        "dataset_path: json\ndataset_kwargs: {data_files: {test: d.jsonl}}", "dataset_path: bsops-test/LastWord"))
    missing: dict[str, str] = {}
    out = driver.run_tasks(_lm(), [str(folder / "hub.yaml")], missing=missing, prefetch="bsops eval prefetch ev")
    assert out == {} and asked == []
    why = missing[str(folder / "hub.yaml")]
    assert "its dataset bsops-test/LastWord is not in the datasets cache" in why
    # the command before the cache's path, which may be cut with the rest of a long one-line reason
    assert "fetch it on a machine with network: bsops eval prefetch ev (the cache: " in why
    assert str(cache / "datasets")[:20] in why
    # the cache as datasets keeps a dataset it built (<org>___<name in snake case>/<config>/<version>/<hash>): found
    assert prefetch.not_cached("bsops-test/LastWord") == cache / "datasets"
    (cache / "datasets" / "bsops-test___last_word" / "default" / "0.0.0" / "abc").mkdir(parents=True)
    assert prefetch.not_cached("bsops-test/LastWord") is None
    assert prefetch.not_cached("bsops-test/other", str(tmp_path / "elsewhere")) == tmp_path / "elsewhere"
