"""bsops' model as an lm-eval LM (harness.py) agrees with lm-eval's own `hf` model on `bsops convert`'s export.

One trained run (the session's spiked_run: PP=2, the bundled tokenizer's 8192 tokens, sequences of 32 tokens)
is scored two ways on the same three small lm-eval tasks the test writes (YAML over a few held-out KJV lines):
lm-eval's HFLM on the converted folder, and BsopsLM over scorer.py's Scorer holding the checkpoint in this
process (TP=1 PP=1, a world of one). The tasks cover each request type lm-eval scores: a last-word
loglikelihood task (acc, perplexity; contexts longer than 32 tokens, so HFLM's left truncation is used), a
two-choice multiple_choice task (acc, acc_norm), a loglikelihood_rolling task over whole chapters (several
windows each; bits_per_byte, word and byte perplexity). Per request the log-likelihoods agree within 1e-4
relative, and every metric (accuracies exactly).
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import math
import random
from pathlib import Path

import pytest

from bigscience_ops.checkpoints import layout
from bigscience_ops.data.corpus import CORPUS_FILE
from bigscience_ops.ops.evaluate import EvalError, driver, harness
from bigscience_ops.schema import EvalConfig
from tests.fixtures_trainer import scalars

REL = 1e-4

LAST_WORD = """task: t_last_word
dataset_path: json
dataset_kwargs: {data_files: {test: data/last_word.jsonl}}
output_type: loglikelihood
test_split: test
doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_target: "{{' '+text.split(' ')[-1]}}"
metric_list:
  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}
  - {metric: acc, aggregation: mean, higher_is_better: true}
"""
TWO_CHOICE = """task: t_two_choice
dataset_path: json
dataset_kwargs: {data_files: {test: data/two_choice.jsonl}}
output_type: multiple_choice
test_split: test
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list: [{metric: acc, aggregation: mean, higher_is_better: true},
              {metric: acc_norm, aggregation: mean, higher_is_better: true}]
"""
ROLLING = """task: t_rolling
dataset_path: json
dataset_kwargs: {data_files: {test: data/rolling.jsonl}}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list: [{metric: word_perplexity}, {metric: byte_perplexity}, {metric: bits_per_byte}]
"""


def write_tasks(folder: Path) -> list[str]:
    """The three task YAMLs (data_files relative to their folder) over held-out KJV text; their paths."""
    with lzma.open(CORPUS_FILE, "rt", encoding="utf-8") as f:
        chapters = [json.loads(line) for line in f][-4:]
    verses = [v.split(" ", 1)[1] for ch in chapters[:2] for v in ch["text"].split("\n")[2:] if " " in v][:14]
    rng = random.Random(0)
    choices = []
    for i in range(10):
        true, other = (" ".join(v.split()[:6]) for v in (verses[i + 1], verses[(i + 5) % len(verses)]))
        label = rng.randrange(2)
        pair = [true, other] if label == 0 else [other, true]
        choices.append({"context": verses[i], "choices": pair, "label": label})
    rolling = [{"text": ch["text"][:1200]} for ch in chapters[2:]] + [{"text": "Amen."}]
    data = folder / "data"
    data.mkdir(parents=True)
    for name, rows in (("last_word", [{"text": v} for v in verses]), ("two_choice", choices), ("rolling", rolling)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    paths = []
    for name, text in (("last_word", LAST_WORD), ("two_choice", TWO_CHOICE), ("rolling", ROLLING)):
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
        paths.append(str(folder / f"{name}.yaml"))
    return paths


@pytest.fixture(scope="module")
def model(spiked_run, tmp_path_factory):
    """(experiment, its last checkpoint's Target, the export folder, a Scorer in this process over it)."""
    import torch

    from bigscience_ops.checkpoints import convert, layout
    from bigscience_ops.ops.evaluate import launcher
    from bigscience_ops.ops.evaluate.scorer import Scorer

    exp, _, _ = spiked_run
    step = layout.latest_step(Path(exp.paths.checkpoints))
    folder = tmp_path_factory.mktemp("export") / "hf"
    convert.convert(exp, folder, step=step)
    target = launcher.checkpoint(exp, step, 1, 1)
    return exp, target, folder, Scorer(exp, target, torch.device("cpu"))


@pytest.fixture(scope="module")
def hf(model):
    """lm-eval's own `hf` model on the export."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(model[2]), batch_size=4, device="cpu")


@pytest.fixture(scope="module")
def runs(model, hf, tmp_path_factory) -> dict:
    """backend -> lm-eval's output (samples kept) of the three tasks: "hf" (HFLM on the export), "bsops"."""
    exp, _, folder, scorer = model
    tasks = write_tasks(tmp_path_factory.mktemp("tasks"))
    lines: list[str] = []
    ours = harness.build_lm(dataclasses.replace(exp, eval=EvalConfig(batch_size=4)), scorer, lines.append)
    out = {"hf": driver.run_tasks(hf, tasks, log_samples=True),
           "bsops": driver.run_tasks(ours, tasks, log=lines.append, log_samples=True), "lines": lines, "tasks": tasks}
    return out


def _loglikelihoods(samples: list[dict]) -> list[float]:
    """Every request's log-likelihood, in document order."""
    out = []
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        for resp in sample["resps"]:
            value = resp[0]
            out.append(float(value[0] if isinstance(value, (list, tuple)) else value))
    return out


@pytest.mark.slow  # the session's trained run, transformers and lm-eval
def test_log_likelihoods_and_metrics_equal_lm_evals_hf_model(runs):
    hf, ours = runs["hf"], runs["bsops"]
    assert sorted(hf["results"]) == sorted(ours["results"]) == ["t_last_word", "t_rolling", "t_two_choice"]
    counts = {"t_last_word": 14, "t_two_choice": 20, "t_rolling": 3}  # requests per task
    for task, count in counts.items():
        a, b = _loglikelihoods(hf["samples"][task]), _loglikelihoods(ours["samples"][task])
        assert len(a) == len(b) == count, task
        for x, y in zip(a, b):
            assert math.isfinite(x) and abs(x - y) <= REL * abs(x), (task, x, y)
    for task, metrics in hf["results"].items():
        for key, value in metrics.items():
            theirs = ours["results"][task][key]
            if key.startswith(("acc,", "acc_norm,")):
                assert theirs == value, (task, key)
            elif isinstance(value, float) and "stderr" not in key:
                assert abs(theirs - value) <= REL * abs(value), (task, key, value, theirs)
    # the greedy answers too (acc of the last-word task is "the word is the greedy continuation")
    greedy = [[r[0][1] for r in s["resps"]] for task in ("t_last_word",) for s in hf["samples"][task]]
    assert greedy == [[r[0][1] for r in s["resps"]] for s in ours["samples"]["t_last_word"]]
    assert any(line.startswith("loglikelihood_rolling") for line in runs["lines"])


@pytest.mark.slow  # the session's trained run, transformers and lm-eval
def test_bits_per_byte_equals_lm_evals_rolling_task(runs, model):
    """bpb.py over the rolling task's documents gives lm-eval's bits_per_byte of that task (hf backend)."""
    from bigscience_ops.ops.evaluate.bpb import bits_per_byte

    source = Path(runs["tasks"][2]).parent / "data" / "rolling.jsonl"
    got = bits_per_byte(source, harness.build_lm(model[0], model[3]), docs=100)
    expected = runs["hf"]["results"]["t_rolling"]["bits_per_byte,none"]
    assert got.documents == 3 and got.skipped == 0
    assert abs(got.bits_per_byte - expected) <= REL * expected, (got.bits_per_byte, expected)
    assert got.nats == pytest.approx(-sum(_loglikelihoods(runs["hf"]["samples"]["t_rolling"])), rel=REL)


@pytest.mark.slow  # the session's trained run, transformers and lm-eval
def test_truncation_and_windows_are_exercised(runs, model):
    """The tasks reach what they are meant to test: contexts cut from the left, documents over several windows."""
    scorer = model[3]
    contexts = [s["arguments"][0][0] for s in runs["bsops"]["samples"]["t_last_word"]]
    lm = harness.build_lm(model[0], scorer)
    assert max(len(lm.tok_encode(c)) for c in contexts) > scorer.max_length
    docs = [s["arguments"][0][0] for s in runs["bsops"]["samples"]["t_rolling"]]
    windows = [harness.rolling_windows(lm.tok_encode(d), lm.eot_token_id, scorer.max_length) for d in docs]
    assert max(map(len, windows)) >= 5 and min(map(len, windows)) == 1


@pytest.mark.slow  # the session's trained run, transformers and lm-eval
def test_generate_until_equals_hf_greedy_generation(model, hf):
    from lm_eval.api.instance import Instance

    exp, _, folder, scorer = model
    kwargs = [{"until": ["\n"], "max_gen_toks": 6, "do_sample": False}, {"until": [" the"], "max_gen_toks": 4}]
    requests = [Instance("generate_until", {}, (text, kw), i) for i, (text, kw) in enumerate(
        [("And I saw", kwargs[0]), ("In the beginning God created the heaven and", kwargs[1]),
         ("And he said unto them,", kwargs[0])])]
    theirs = hf.generate_until(requests, disable_tqdm=True)
    ours = harness.build_lm(exp, scorer).generate_until(requests)
    assert ours == theirs and all(isinstance(t, str) for t in ours)
    with pytest.raises(EvalError, match="greedily"):
        harness.build_lm(exp, scorer).generate_until(
            [Instance("generate_until", {}, ("And", {"do_sample": True, "temperature": 0.7}), 0)])


@pytest.mark.slow  # the session's trained run, transformers and lm-eval
def test_evaluate_writes_the_result_file_and_tensorboard_scalars(model, runs, tmp_path):
    exp, target, _, scorer = model
    source = tmp_path / "held_out.jsonl"
    source.write_text("".join(json.dumps({"body": t}) + "\n" for t in ("Grace be with you all. Amen.", "Selah.")))
    out = tmp_path / "run"
    exp = dataclasses.replace(
        exp, paths=dataclasses.replace(exp.paths, output=str(out), tensorboard=str(out / "tensorboard")),
        eval=EvalConfig(tasks=[runs["tasks"][1], str(tmp_path / "missing.yaml")],
                        sources={"psalms": str(source), "gone": str(tmp_path / "nope")},
                        text_key="body", limit=4, batch_size=4))
    lines: list[str] = []
    with pytest.raises(driver.MissingTasks, match="missing.yaml"):  # the others' result written first
        driver.evaluate(exp, target.path, target.meta, scorer, lines.append, log_samples=True, keep_cache=True)
    # eval.limit 4: a limited result, kept apart (eval/limited/), lm-eval's per-sample output beside it; the request
    # cache (4 docs x 2 choices) beside where the full result goes, which the same requests answer
    [kept] = (out / "eval" / "limited" / f"{target.tag}.samples").glob("samples_t_two_choice_*.jsonl")  # lm-eval's name
    cache = out / "eval" / f"{target.tag}.requests" / "float32_rank0.db"
    from sqlitedict import SqliteDict

    with SqliteDict(str(cache), flag="r") as entries:
        assert len(entries) == 8 and f"lm-eval's request cache: {cache.with_name('float32')}_rank0.db" in lines
    assert [json.loads(line)["doc_id"] for line in kept.read_text().splitlines()] == [0, 1, 2, 3]
    path = out / "eval" / "limited" / f"{target.tag}.json"
    result = json.loads(path.read_text(encoding="utf-8"))
    section = result["bsops"]
    assert not (out / "eval" / f"{target.tag}.json").exists() and section["limit"] == 4
    assert section["run_id"] == layout.run_id(target.path.parent) and section["overrides"] == []
    assert section["step"] == target.step and section["iteration"] == target.meta["iteration"]
    assert section["consumed_tokens"] == target.meta["consumed_tokens"] > 0
    assert section["layout"] == {"tensor": 1, "pipeline": 1}
    assert result["results"]["t_two_choice"]["sample_len"] == 4 and "samples" not in result
    assert sorted(section["bits_per_byte"]) == ["psalms"] and section["bits_per_byte"]["psalms"]["documents"] == 2
    assert sorted(section["missing"]) == sorted([str(tmp_path / "missing.yaml"), "gone"])
    assert "does not exist" in section["missing"][str(tmp_path / "missing.yaml")]
    assert section["bootstrap_iters"] == 100000 and section["dtype"] == "float32"
    acc = result["results"]["t_two_choice"]["acc,none"]
    bpb = section["bits_per_byte"]["psalms"]["bits_per_byte"]
    board = out / "tensorboard"
    assert scalars(board, "eval-limited/t_two_choice/acc") == {target.meta["iteration"]: pytest.approx(acc)}
    assert scalars(board, "eval-limited/psalms/bits_per_byte vs tokens") == {
        target.meta["consumed_tokens"]: pytest.approx(bpb)}
    nothing = dataclasses.replace(exp, eval=EvalConfig(sources={"gone": str(tmp_path / "nope")}))
    with pytest.raises(EvalError, match="nothing of"):
        driver.evaluate(nothing, target.path, target.meta, scorer)


def test_task_files_data_files_made_absolute(tmp_path):
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "base.yaml").write_text("output_type: loglikelihood\ntest_split: test\n")
    (folder / "t.yaml").write_text("include: base.yaml\ntask: t\ndataset_path: json\ndataset_kwargs:\n"
                                   "  data_files: {test: [a.jsonl, /abs/b.jsonl, 'hf://x/c.jsonl'], train: d.jsonl}\n")
    config = driver.task_config(folder / "t.yaml", cache_dir=str(tmp_path / "cache"))
    assert config["output_type"] == "loglikelihood"  # include followed by lm-eval's own loader
    assert config["dataset_kwargs"]["data_files"] == {
        "test": [str(folder / "a.jsonl"), "/abs/b.jsonl", "hf://x/c.jsonl"], "train": str(folder / "d.jsonl")}
    assert config["dataset_kwargs"]["cache_dir"] == str(tmp_path / "cache")
    with pytest.raises(EvalError, match="does not exist"):
        driver.task_config(folder / "missing.yaml")
    (folder / "bad.yaml").write_text("task: [unclosed\n")
    with pytest.raises(EvalError, match="bad.yaml"):
        driver.task_config(folder / "bad.yaml")


def test_requests_are_cut_as_hflm_cuts_them_and_scored_longest_first_once():
    """HFLM's left truncation to max_length + 1 tokens, each distinct pair scored once, longest first, answers in
    the order asked; a continuation longer than the model's sequence is refused by name."""
    from lm_eval.api.instance import Instance

    from tests.evaluate.test_evaluate_bpb import WindowScorer, _lm

    assert harness.fit(list(range(10)), [1, 2, 3], 8) == ([4, 5, 6, 7, 8, 9], [1, 2, 3])
    assert harness.fit([5], [1] * 8, 8) == ([5], [1] * 8)
    with pytest.raises(EvalError, match="continuation of 9 tokens"):
        harness.fit([5], [1] * 9, 8)
    lm = _lm()
    pairs = [([1], [2]), (list(range(20)), [3, 4]), ([1], [2]), ([7, 8], [9])]
    got = lm.score(pairs, "test")
    seen = lm.scorer.windows
    assert seen == [(list(range(13, 20)), [3, 4]), ([7, 8], [9]), ([1], [2])]
    assert got[0] == got[2] and len(got) == 4
    assert got == [WindowScorer().score([harness.fit(c, x, 8)])[0] for c, x in pairs]
    small = WindowScorer()
    small.vocab_size = 300
    with pytest.raises(EvalError, match="8192 tokens"):
        _lm(small)
    long = Instance("loglikelihood", {}, ("And it came to pass", " that" * 12), 0)
    with pytest.raises(EvalError, match="continuation of 12 tokens"):
        lm.loglikelihood([long])


def test_generate_until_stops_at_a_stop_string_the_end_of_document_or_max_gen_toks():
    from lm_eval.api.instance import Instance

    from tests.evaluate.test_evaluate_bpb import WindowScorer, _lm

    lm = _lm()
    script = lm.tok_encode(" it came to pass\n that") + [lm.eot_token_id]
    base = len(lm.tok_encode("And"))

    class Scripted(WindowScorer):
        max_length = 64

        def next_tokens(self, contexts):
            return [script[min(len(c) - base, len(script) - 1)] for c in contexts]

    lm.scorer = Scripted()
    asks = [{"until": ["\n"], "max_gen_toks": 20}, {"until": [" came"], "max_gen_toks": 9},
            {"until": "zzz", "max_gen_toks": 2}, {"until": ["zzz"], "max_gen_toks": 40}]
    got = lm.generate_until([Instance("generate_until", {}, ("And", kw), i) for i, kw in enumerate(asks)])
    assert got == [" it came to pass", " it", lm.tok_decode(script[:2]), " it came to pass\n that"]
    empty = Instance("generate_until", {}, ("", {"until": ["\n"], "max_gen_toks": 3}), 0)
    assert _lm().generate_until([empty]) == [""]  # the end-of-document token as context; it answers that token


@pytest.mark.slow  # the session's trained run, a torchrun launch of two ranks, lm-eval
def test_bsops_eval_in_the_checkpoints_pp2_layout_gives_lm_evals_hf_metrics(runs, model, tmp_path):
    """The whole path: `bsops eval`'s launcher starts the checkpoint's own two pipeline ranks under torchrun, rank 0
    runs the same three tasks and bits per byte of the rolling task's documents through the driver, and the result
    file it writes holds lm-eval hf's metrics on the export: accuracies equal, the rest within 1e-4 relative."""
    from bigscience_ops.checkpoints import layout
    from bigscience_ops.ops.evaluate import launcher, results

    exp, target, _, _ = model
    assert (exp.parallel.tensor, exp.parallel.pipeline) == (1, 2)
    rolling = Path(runs["tasks"][2]).parent / "data" / "rolling.jsonl"
    evaluated = dataclasses.replace(
        exp, eval=EvalConfig(tasks=runs["tasks"], sources={"held": str(rolling)}, batch_size=4),
        paths=dataclasses.replace(exp.paths, output=str(tmp_path / "run"), tensorboard=str(tmp_path / "tb")))
    step = layout.latest_step(Path(exp.paths.checkpoints))
    assert launcher.run_local(evaluated, step) == 0
    written = json.loads(results.result_path(evaluated, f"global_step{step}").read_text())
    assert written["bsops"]["layout"] == {"tensor": 1, "pipeline": 2} and written["bsops"]["step"] == step
    hf = runs["hf"]["results"]
    for task, metrics in hf.items():
        for key, value in metrics.items():
            if key.startswith(("acc,", "acc_norm,")):
                assert written["results"][task][key] == value, (task, key)
            elif isinstance(value, float) and "stderr" not in key:
                assert abs(written["results"][task][key] - value) <= REL * abs(value), (task, key, value)
    bpb = written["bsops"]["bits_per_byte"]["held"]["bits_per_byte"]
    assert abs(bpb - hf["t_rolling"]["bits_per_byte,none"]) <= REL * bpb


@pytest.mark.slow  # the session's trained run
def test_bits_per_byte_is_the_trainers_loss_on_the_same_text_converted_by_tokens_per_byte(runs, model):
    """The trainer's own model and loss (trainer/model.py's layers and lm_loss, what its validation reports as "lm
    loss value", in nats per token) over the same documents, fed in the windows bits per byte scores them in,
    converted by tokens per byte: the source's bits per byte. The windows are lm-eval's: each document whole, its
    first token predicted from the end-of-document token (the trainer's validation samples run across document
    boundaries instead, so its logged value over another cut of the text differs by that context)."""
    import torch

    from bigscience_ops.ops.evaluate.bpb import bits_per_byte
    from bigscience_ops.ops.evaluate.scorer import eval_shape
    from bigscience_ops.trainer.model import build_sequential, lm_loss

    exp, target, _, scorer = model
    gpt = build_sequential(eval_shape(target), exp.train.seed, kernels="torch").eval()
    layers = [gpt.embedding, *gpt.blocks, gpt.final_norm]
    for index, layer in enumerate(layers):  # the checkpoint's layer files, as DeepSpeed saved them (TP=1)
        layer.load_state_dict(torch.load(target.path / f"layer_{index:02d}-model_states.pt", weights_only=True))
    source = Path(runs["tasks"][2]).parent / "data" / "rolling.jsonl"
    docs = [json.loads(line)["text"] for line in source.read_text(encoding="utf-8").splitlines()]
    lm = harness.build_lm(exp, scorer)
    weighted, tokens = 0.0, 0
    for doc in docs:
        for context, continuation in harness.rolling_windows(lm.tok_encode(doc), lm.eot_token_id, scorer.max_length):
            window = context + continuation
            mask = [0] * (len(context) - 1) + [1] * len(continuation)
            with torch.no_grad():
                logits = gpt(torch.tensor([window[:-1]]))
                loss = lm_loss(logits, (torch.tensor([window[1:]]), torch.tensor([mask])), "torch")
            weighted += float(loss) * len(continuation)
            tokens += len(continuation)
    validation_loss = weighted / tokens  # nats per token over the whole text
    n_bytes = sum(len(doc.encode("utf-8")) for doc in docs)
    got = bits_per_byte(source, lm, docs=100)
    assert (got.tokens, got.bytes) == (tokens, n_bytes) and tokens > 3 * scorer.max_length
    converted = validation_loss * (tokens / n_bytes) / math.log(2)
    assert abs(got.bits_per_byte - converted) <= REL * converted, (got.bits_per_byte, converted)


@pytest.mark.slow  # the session's trained run, lm-eval's command line under torchrun (two ranks), transformers
def test_lm_eval_model_bsops_gives_the_numbers_of_bsops_eval_and_of_hf(runs, model, hf, tmp_path):
    """`lm_eval run --model bsops` (this venv's own lm_eval script: the installed hook registers plugin.py's model)
    in the checkpoint's PP=2 layout under torchrun, on tiny's bundled last-word task (eval.tasks: corpus/eval/) and
    the two-choice task here (tiny's own two-choice verses are longer than this run's 32-token sequences), with
    --num_fewshot 3 --limit 20 --log_samples --use_cache: its results file holds the metrics of bsops' own path and
    of lm-eval's hf model on the export (accuracies equal, the rest within 1e-4 relative), the samples it logged,
    and lm-eval's request cache of rank 0's requests."""
    import glob
    import os
    import subprocess
    import sys

    from sqlitedict import SqliteDict

    from bigscience_ops import resources
    from bigscience_ops.config.loading import to_dict
    from bigscience_ops.ops.evaluate import launcher

    exp, target, _, scorer = model
    bundled = resources.bundled("corpus") / "eval"
    two_choice = tmp_path / "two_choice.yaml"
    two_choice.write_text(TWO_CHOICE.replace("data/", f"{Path(runs['tasks'][1]).parent / 'data'}/"), encoding="utf-8")
    tasks = [str(bundled / "kjv_last_word.yaml"), str(two_choice)]
    ours = driver.run_tasks(harness.build_lm(dataclasses.replace(exp, eval=EvalConfig(batch_size=4)), scorer), tasks,
                            limit=20, num_fewshot=3)
    theirs = driver.run_tasks(hf, tasks, limit=20, num_fewshot=3)
    record = tmp_path / "experiment.json"
    record.write_text(json.dumps(to_dict(exp)))
    out = tmp_path / "out"
    lm_eval_script = Path(sys.executable).with_name("lm_eval")  # not `-m bigscience_ops...`: lm-eval's own command
    argv = launcher.torchrun_argv(2, [str(lm_eval_script), "run", "--model", "bsops",
                                      "--model_args", f"run={record},step={target.step}",
                                      "--include_path", str(bundled), "--tasks", "kjv_last_word", str(two_choice),
                                      "--num_fewshot", "3", "--limit", "20", "--batch_size", "4", "--log_samples",
                                      "--output_path", str(out), "--use_cache", str(out / "requests")])
    elsewhere = tmp_path / "elsewhere"  # a bundled task by its name, from a folder that is not its own
    elsewhere.mkdir()
    done = subprocess.run(argv, cwd=elsewhere, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1",
                               "HF_DATASETS_CACHE": str(tmp_path / "datasets")})
    assert done.returncode == 0, done.stderr[-3000:]
    [written] = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    named = f"{exp.name}__global_step{target.step}"  # --output_path's folder: the run and the step, as lm-eval names
    assert Path(written).parent == out / named, written  # a Hub model's org__name
    plugin = json.loads(Path(written).read_text())
    assert plugin["model_name"] == f"{exp.name}/global_step{target.step}" and plugin["model_name_sanitized"] == named
    assert plugin["config"]["bsops_layout"] == {"tensor": 1, "pipeline": 2} and plugin["config"]["bsops_device"] == "cpu"
    assert plugin["n-shot"] == {"kjv_last_word": 3, "t_two_choice": 3}
    for task, metrics in theirs["results"].items():
        for key, value in metrics.items():
            if not isinstance(value, float) or "stderr" in key:
                continue
            for got in (ours["results"][task][key], plugin["results"][task][key]):
                if key.startswith(("acc,", "acc_norm,")):
                    assert got == value, (task, key, got, value)
                else:
                    assert abs(got - value) <= REL * abs(value), (task, key, got, value)
    samples = glob.glob(str(out / "**" / "samples_kjv_last_word_*.jsonl"), recursive=True)
    assert len(samples) == 1 and len(Path(samples[0]).read_text().splitlines()) == 20  # --limit 20 of 200
    asked = set()  # every distinct (context, continuation) lm-eval asked of the model, from the samples it logged
    for logged in glob.glob(str(out / "**" / "samples_*.jsonl"), recursive=True):
        for sample in map(json.loads, Path(logged).read_text().splitlines()):
            asked.update((a["arg_0"], a["arg_1"]) for a in sample["arguments"].values())
    with SqliteDict(str(out / "requests_rank0.db"), flag="r") as cache:  # lm-eval's cache: one entry per request
        assert len(asked) == 20 + 2 * 10 and len(cache) == len(asked)  # two choices for each of t_two_choice's 10


@pytest.mark.slow  # the session's trained run, transformers and lm-eval, in bf16 on the CPU (about 3x fp32's time)
def test_bf16_scoring_agrees_with_lm_evals_hf_model_in_bf16(model, runs, tmp_path):
    """The training precision as a GPU scores in it (eval.dtype: training, bf16 here): the Scorer's layers in bf16
    against lm-eval's hf model loading the export in bf16, on the last-word and two-choice tasks. The two compute
    in another order (fused QKV, the trainer's kernels), so bf16's 8 bits of mantissa leave per-request
    differences: within BF16_REL of the log-likelihood, and the accuracies within one request of each other."""
    import torch
    from lm_eval.models.huggingface import HFLM

    from bigscience_ops.ops.evaluate.scorer import Scorer

    exp, target, folder, _ = model
    tasks = runs["tasks"][:2]
    bf16 = Scorer(exp, target, torch.device("cpu"), dtype=torch.bfloat16)
    ours = driver.run_tasks(harness.build_lm(dataclasses.replace(exp, eval=EvalConfig(batch_size=4)), bf16), tasks,
                            log_samples=True, bootstrap_iters=10)
    theirs = driver.run_tasks(HFLM(pretrained=str(folder), batch_size=4, device="cpu", dtype="bfloat16"), tasks,
                              log_samples=True, bootstrap_iters=10)
    worst = 0.0
    for task in ("t_last_word", "t_two_choice"):
        a, b = _loglikelihoods(theirs["samples"][task]), _loglikelihoods(ours["samples"][task])
        worst = max(worst, *(abs(x - y) / abs(x) for x, y in zip(a, b)))
        n = len(theirs["samples"][task])
        for key in ("acc,none", "acc_norm,none"):
            if key in theirs["results"][task]:
                assert abs(ours["results"][task][key] - theirs["results"][task][key]) <= 1 / n + 1e-9, (task, key)
    print(f"bf16: worst relative log-likelihood difference {worst:.2e}")
    assert worst <= BF16_REL, worst


BF16_REL = 0.02
"""Relative difference of a request's log-likelihood between two bf16 implementations of one model."""
