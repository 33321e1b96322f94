"""The evaluation result files (ops/evaluate/results.py): written atomically, read back as untrusted input, mapped
to "task/metric" values, tabled by step beside the references, and a metric's drop against the run's best found.

The lm-eval structure is lm-eval 0.4.13's real output (tests/assets/eval/lm_eval_0.4.13_output.json; its script
beside it regenerates it); `eval_result` and `write_results` make result files of it for the views' tests too.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest

from bigscience_ops.ops.evaluate import results
from bigscience_ops.run.rollbacks import Rollback

LM_EVAL = json.loads((Path(__file__).parents[1] / "assets" / "eval" / "lm_eval_0.4.13_output.json").read_text())
"""smoke_choice (acc, acc_norm), smoke_lastword (perplexity, acc), smoke_ppl (word/byte perplexity, bits_per_byte)."""


def eval_result(step: int, values: dict[str, float] | None = None, bpb: dict[str, float] | None = None,
                iteration: int | None = None, finished: str = "2026-11-27T09:00:00Z") -> dict:
    """A result file's content for checkpoint `step`: lm-eval's real output with `values` ("task/metric" -> value,
    lm-eval's ",none" filter) set in it, and bits per byte per source in the bsops section."""
    out = copy.deepcopy(LM_EVAL)
    for key, value in (values or {}).items():
        task, metric = key.split("/")
        out["results"].setdefault(task, {"name": task, "alias": task, "sample_len": 3})[f"{metric},none"] = value
    out["bsops"] = {"format": 1, "experiment": "tiny", "tag": f"global_step{step}", "step": step,
                    "iteration": step if iteration is None else iteration, "consumed_samples": step * 8,
                    "consumed_tokens": step * 8 * 64, "layout": {"tensor": 1, "pipeline": 2},
                    "bits_per_byte": {s: {"bits_per_byte": v, "bytes": 1000, "tokens": 300, "documents": 3,
                                          "nats": v * 1000 * math.log(2), "path": f"/data/{s}.jsonl"}
                                      for s, v in (bpb or {}).items()},
                    "seconds": 1.5, "finished": finished}
    return out


def write_results(output: Path, by_step: dict[int, dict[str, float]], bpb: dict[int, dict[str, float]] | None = None
                  ) -> None:
    """A result file in `output`/eval per step, written as `bsops eval` writes them."""
    for step, values in by_step.items():
        results.write(results.result_path(output, f"global_step{step}"),
                      eval_result(step, values, (bpb or {}).get(step)))


def test_metrics_of_lm_evals_real_output():
    values, higher = results.metrics_and_directions(eval_result(200, bpb={"pile_cc": 1.25}))
    assert values == pytest.approx({
        "smoke_choice/acc": 2 / 3, "smoke_choice/acc_norm": 2 / 3, "smoke_lastword/perplexity": 55.69656412420309,
        "smoke_lastword/acc": 1 / 3, "smoke_ppl/word_perplexity": 59881.78966457522,
        "smoke_ppl/byte_perplexity": 20.086236600106652, "smoke_ppl/bits_per_byte": 4.328135377875103,
        "pile_cc/bits_per_byte": 1.25})  # no stderr, no "N/A", no name/alias/sample_len
    assert {m for m, h in higher.items() if not h} == {
        "smoke_lastword/perplexity", "smoke_ppl/word_perplexity", "smoke_ppl/byte_perplexity",
        "smoke_ppl/bits_per_byte", "pile_cc/bits_per_byte"}


def test_a_filter_other_than_none_stays_in_the_name_and_the_direction_defaults_by_name():
    out = {"results": {"gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.25, "exact_match,none": 0.5,
                                 "exact_match_stderr,strict-match": 0.1, "ppl": 3.0, "flag": True, "none": None}}}
    values, higher = results.metrics_and_directions(out)
    assert values == {"gsm8k/exact_match,strict-match": 0.25, "gsm8k/exact_match": 0.5, "gsm8k/ppl": 3.0}
    assert higher == {"gsm8k/exact_match,strict-match": True, "gsm8k/exact_match": True, "gsm8k/ppl": False}


def test_written_files_read_back_by_step(tmp_path: Path):
    write_results(tmp_path, {400: {"smoke_choice/acc": 0.5}, 200: {"smoke_choice/acc": 0.75}},
                  bpb={200: {"pile_cc": 1.5}})
    path = results.result_path(tmp_path, "global_step200")
    assert path == tmp_path / "eval" / "global_step200.json"
    assert "samples" not in json.loads(path.read_text())
    found, problems = results.read_all(tmp_path)
    assert problems == []
    assert [(r.tag, r.step, r.iteration, r.consumed_tokens) for r in found] == [
        ("global_step200", 200, 200, 200 * 8 * 64), ("global_step400", 400, 400, 400 * 8 * 64)]
    assert found[0].metrics["smoke_choice/acc"] == 0.75 and found[0].metrics["pile_cc/bits_per_byte"] == 1.5
    assert "pile_cc/bits_per_byte" not in found[1].metrics
    assert found[0].finished == pytest.approx(1795770000.0)  # 2026-11-27T09:00:00Z
    assert sorted(os.listdir(tmp_path / "eval")) == ["global_step200.json", "global_step400.json"]  # no temporary
    assert results.read_all(tmp_path / "nothing") == ([], [])


@pytest.mark.parametrize("bad", ["torn", "not-utf8", "list", "no-bsops", "format", "step", "iteration", "results",
                                 "task", "name", "bpb", "huge", "link", "folder", "deep", "run-id", "limit",
                                 "corrupt"])
def test_a_bad_file_is_a_problem_naming_it_and_the_others_are_read(tmp_path: Path, bad: str):
    write_results(tmp_path, {100: {"smoke_choice/acc": 0.5}, 300: {"smoke_choice/acc": 0.6}})
    path = tmp_path / "eval" / "global_step200.json"
    good = eval_result(200)
    content = {
        "torn": json.dumps(good)[:500].encode(), "not-utf8": b"\xff\xfe{}", "list": b"[1, 2]",
        "no-bsops": json.dumps({**good, "bsops": None}).encode(),
        "format": json.dumps({**good, "bsops": {**good["bsops"], "format": True}}).encode(),
        "step": json.dumps({**good, "bsops": {**good["bsops"], "step": 201}}).encode(),
        "iteration": json.dumps({**good, "bsops": {**good["bsops"], "iteration": "200"}}).encode(),
        "results": json.dumps({**good, "results": [1]}).encode(),
        "task": json.dumps({**good, "results": {"t": 0.5}}).encode(),
        "name": json.dumps({**good, "results": {"t\n*evil*": {"acc,none": 0.5}}}).encode(),
        "bpb": json.dumps({**good, "bsops": {**good["bsops"],
                                             "bits_per_byte": {"cc": {"bits_per_byte": "1"}}}}).encode(),
        "huge": b" " * (results.MAX_RESULT + 1),
        "deep": b"[" * 100000 + b"]" * 100000,
        "run-id": json.dumps({**good, "bsops": {**good["bsops"], "run_id": "../../other"}}).encode(),
        "limit": json.dumps({**good, "bsops": {**good["bsops"], "limit": 0}}).encode(),
        "corrupt": json.dumps({**good, "bsops": {**good["bsops"], "corrupt": "src"}}).encode(),
    }.get(bad)
    if bad == "link":
        os.symlink(tmp_path / "eval" / "global_step100.json", path)
    elif bad == "folder":
        path.mkdir()
    else:
        path.write_bytes(content)
    found, problems = results.read_all(tmp_path)
    assert [r.step for r in found] == [100, 300]
    assert [(p.file, p.line) for p in problems] == [(str(path), 0)]
    assert len(str(problems[0])) < 400  # what was wrong, never the file's content


def test_results_of_another_run_and_limited_ones_are_read_apart(tmp_path: Path):
    """A result made for another run id is a problem, never counted; a limited one (eval/limited/, or lm-eval's config
    saying so) is read only when asked, and a step's full result is the one tabled."""
    from bigscience_ops.checkpoints import layout

    mine = layout.new_run_id(tmp_path)
    write_results(tmp_path, {100: {"t/acc": 0.5}, 200: {"t/acc": 0.6}, 300: {"t/acc": 0.7}})
    for step, run_id in ((100, mine), (200, "a" * 32)):
        data = json.loads(results.result_path(tmp_path, f"global_step{step}").read_text())
        data["bsops"]["run_id"] = run_id
        results.write(results.result_path(tmp_path, f"global_step{step}"), data)
    limited = eval_result(100, {"t/acc": 0.9})
    limited["bsops"]["limit"] = 7
    results.write(results.result_path(tmp_path, "global_step100", limited=True), limited)
    found, problems = results.read_all(tmp_path)
    assert [(r.step, r.run_id, r.limit) for r in found] == [(100, mine, None), (300, None, None)]
    assert [Path(p.file).name for p in problems] == ["global_step200.json"] and "a" * 32 in problems[0].what
    both, _ = results.read_all(tmp_path, limited=True)
    assert [(r.step, r.limit) for r in both] == [(100, None), (100, 7), (300, None)]
    table = results.table(both)
    [row] = [r for r in table.rows if r.metric == "t/acc"]
    assert table.steps == [100, 300] and table.limits == (None, None) and row.values == [0.5, 0.7]
    alone = results.table([r for r in both if r.limited])
    assert alone.columns == ["step 100 (limit 7)"]


def test_write_refuses_a_result_no_reader_would_read(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(results, "MAX_RESULT", 1000)
    with pytest.raises(results.ResultError):
        results.write(tmp_path / "eval" / "global_step1.json", {"results": {}, "configs": "x" * 1000})
    with pytest.raises(results.ResultError):
        results.result_path(tmp_path, "global_step1/../../x")
    assert not (tmp_path / "eval" / "global_step1.json").exists()


def _result(step: int, values: dict[str, float], higher: dict[str, bool] | None = None) -> results.Result:
    return results.Result(f"global_step{step}", step, step, None, values,
                          {m: (higher or {}).get(m, True) for m in values})


def test_table_steps_ascending_then_references():
    found = [_result(400, {"t/acc": 0.5, "c/bits_per_byte": 1.2}, {"c/bits_per_byte": False}),
             _result(200, {"t/acc": 0.4})]
    refs = {"GPT2-Large": {"t/acc": 0.476, "u/acc": 0.7}, "GPT2-XL": {"c/bits_per_byte": 1.1}}
    table = results.table(found, refs)
    assert table.steps == [200, 400] and table.references == ["GPT2-Large", "GPT2-XL"]
    assert table.columns == ["step 200", "step 400", "GPT2-Large", "GPT2-XL"]
    assert [(r.metric, r.higher_is_better, r.values) for r in table.rows] == [
        ("c/bits_per_byte", False, [None, 1.2, None, 1.1]),
        ("t/acc", True, [0.4, 0.5, 0.476, None]),
        ("u/acc", True, [None, None, 0.7, None])]
    newest = results.table(found, refs, max_steps=1)
    assert newest.steps == [400] and newest.left_out == 1 and newest.rows[1].values == [0.5, 0.476, None]
    lines = table.text().splitlines()
    assert len(lines) == 4 and lines[2].split() == ["t/acc", "0.4000", "0.5000", "0.4760", "-"]


def test_drops_against_the_best_of_the_earlier_results():
    found = [_result(100, {"t/acc": 0.40, "t/ppl": 20.0}, {"t/ppl": False}),
             _result(200, {"t/acc": 0.50, "t/ppl": 12.0}, {"t/ppl": False}),
             _result(300, {"t/acc": 0.45, "t/ppl": 14.0}, {"t/ppl": False})]
    out = results.drops(found, {"t/acc": 0.04, "t/ppl": 1.0, "u/acc": 0.01})
    assert [(d.step, d.metric, d.value, d.best, d.best_step, d.margin) for d in out] == [
        (300, "t/acc", 0.45, 0.50, 200, 0.04), (300, "t/ppl", 14.0, 12.0, 200, 1.0)]
    assert out[0].by == pytest.approx(0.05) and out[1].by == pytest.approx(2.0)
    assert results.drops(found, {"t/acc": 0.06, "t/ppl": 2.5}) == []  # within the margins
    recovered = [*found, _result(400, {"t/acc": 0.49, "t/ppl": 12.5}, {"t/ppl": False})]
    assert results.drops(recovered, {"t/acc": 0.04, "t/ppl": 1.0}) == []  # only the newest result counts
    broken = [*found, _result(400, {"t/acc": math.nan, "t/ppl": math.inf}, {"t/ppl": False})]
    assert [(d.metric, d.best_step) for d in results.drops(broken, {"t/acc": 0.5, "t/ppl": 100.0})] == [
        ("t/acc", 200), ("t/ppl", 200)]  # no finite number is worse than any
    assert results.drops(found[:1], {"t/acc": 0.0001}) == []  # nothing earlier to fall from


def test_results_of_an_abandoned_branch_are_not_live():
    found = [results.Result(f"global_step{s}", s, s, None, {}, {}, finished=t)
             for s, t in ((100, 1000.0), (200, 2000.0), (300, 3000.0), (300 + 1, 5000.0))]
    rollback = Rollback(time=4000.0, from_step=300, to_step=100, skip=None, set_aside="")
    assert [r.step for r in results.live(found, [rollback])] == [100, 301]
