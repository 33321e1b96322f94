"""`bsops samples`: an iteration's samples as the trainer reads them, on the bundled corpus (no trainer launch).

The trainer's own feed (trainer/data.step_micro_batches over the datasets build_datasets gives it) is the
reference here; the real runs that record what they fed the model are checked in
tests/checkpoints/test_checkpoints_universal.py (rampup, resume, DP change) and tests/checkpoints/test_checkpoints_rollback.py
(skipped iterations).
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.data.indexed import IndexedDataset
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.schema import CurriculumConfig, DataSource, NodePhase
from bigscience_ops.trainer.sampling import TaskLayout, build_datasets, dataset_sizes
from bigscience_ops.views import samples
from tests.fixtures_data import write_indexed
from tests.fixtures_experiments import SHRUNK_MODEL, tiny_yaml
from tests.fixtures_trainer import small_experiment
from tests.fixtures_runs import complete_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _log(*tasks: tuple[int, int, int, bool]) -> list[str]:
    """main_log.txt lines of tasks (start, DP, micro-batch size, synthetic), with other lines between."""
    lines = ["> no checkpoint: starting from scratch"]
    for start, dp, mbs, synthetic in tasks:
        lines += [TaskLayout("tiny", 1000, 1, 2, dp, mbs, synthetic, 28, start).line(), " iteration 1/ 28 | x: 1 |"]
    return lines


@pytest.fixture
def exp(tmp_path, bundled_corpus):
    return small_experiment(tmp_path / "run", bundled_corpus)


def _fed(exp, iteration: int, dp: int, mbs: int) -> dict[tuple[int, int], np.ndarray]:
    """(dp rank, micro-batch) -> the (tokens, labels) the trainer's feed hands the engine at `iteration`."""
    import torch

    from bigscience_ops.trainer.data import step_micro_batches, truncate

    schedule = run_schedule(exp)
    train, _, _ = build_datasets(exp, dataset_sizes(exp, schedule), synthetic=False)
    consumed = schedule.batch.consumed_after(iteration - 1)
    micro = schedule.batch.batch_size_at(consumed) // (mbs * dp)
    seqlen = exp.curriculum and schedule.curriculum.seqlen_at(iteration)
    out = {}
    for rank in range(dp):
        for k, batch in enumerate(step_micro_batches(train, consumed, micro, mbs, rank, dp)):
            tokens, (labels, _) = truncate(batch, seqlen or None)
            out[rank, k] = torch.cat([tokens, labels[:, -1:]], dim=1).numpy()
    return out


@pytest.mark.parametrize("iteration, dp, mbs", [(1, 1, 2), (7, 2, 1), (7, 1, 2), (12, 2, 2), (28, 4, 1)])
def test_the_samples_are_the_trainers_feed_through_rampup_and_layouts(exp, iteration, dp, mbs):
    result = samples.iteration_samples(exp, iteration, log_lines=_log((0, dp, mbs, False)), text=False)
    fed = _fed(exp, iteration, dp, mbs)
    assert (result.layout.data, result.layout.micro_batch_size) == (dp, mbs)
    assert {(b.dp_rank, b.micro_batch) for b in result.micro_batches} == set(fed)
    for b in result.micro_batches:
        assert np.array_equal(np.array([s.tokens for s in b.samples]), fed[b.dp_rank, b.micro_batch])
    positions = sorted(s.position for b in result.micro_batches for s in b.samples)
    start = run_schedule(exp).batch.consumed_after(iteration - 1)
    assert positions == list(range(start, start + result.global_batch_size)) and not result.skipped


def test_pieces_are_the_documents_and_offsets_of_the_tokens_and_decode_to_the_text(exp):
    result = samples.iteration_samples(exp, 9, log_lines=_log((0, 1, 2, False)))
    indexed = IndexedDataset(exp.data.blend[0].prefix)
    with lzma.open(REPO / "corpus" / "kjv.jsonl.xz", "rt", encoding="utf-8") as f:  # one document a line
        documents = [json.loads(line)["text"] for line in f]
    for s in (s for b in result.micro_batches for s in b.samples):
        parts = [indexed.get(p.document, offset=p.offset, length=p.length) for p in s.pieces]
        assert np.concatenate(parts).tolist() == list(s.tokens) and len(s.tokens) == exp.model.seq_length + 1
        assert (s.source, s.prefix, s.source_sample) == (0, exp.data.blend[0].prefix, s.index)
        assert all(len(p.text) > 10 and p.text.strip() in documents[p.document] for p in s.pieces), s.pieces
    text = "\n".join(samples.samples_text(result, 40))
    assert "iteration 9/28" in text and "samples 38 to 43" in text and "more characters" in text


def test_curriculum_trains_a_prefix_of_each_sample(exp):
    exp = dataclasses.replace(exp, curriculum=CurriculumConfig(min_difficulty=8, difficulty_step=8,
                                                               total_curriculum_step=20))
    result = samples.iteration_samples(exp, 5, log_lines=_log((0, 1, 2, False)))
    assert result.seqlen == run_schedule(exp).curriculum.seqlen_at(5) < exp.model.seq_length
    fed = _fed(exp, 5, 1, 2)
    for b in result.micro_batches:
        assert np.array_equal(np.array([s.tokens for s in b.samples]), fed[0, b.micro_batch])
        for s in b.samples:
            assert len(s.tokens) == result.seqlen + 1 == sum(p.length for p in s.pieces)


def test_a_skipped_iteration_is_marked_and_the_next_reads_on_after_its_data(exp):
    exp = dataclasses.replace(exp, train=dataclasses.replace(exp.train, skip_iterations=["7-8"]))
    log = [*_log((0, 1, 2, False)), " iteration 10/ 28 | lm loss: 9 |"]  # the run trained past them
    skipped = samples.iteration_samples(exp, 8, log_lines=log, text=False)
    after = samples.iteration_samples(exp, 9, log_lines=log, text=False)
    assert skipped.skipped and not after.skipped
    assert after.consumed_before == skipped.consumed_before + skipped.global_batch_size
    assert "skipped (train.skip_iterations)" in "\n".join(samples.samples_text(skipped))


def test_the_layout_is_the_task_that_trained_the_iteration_else_the_node_phase(exp):
    schedule = run_schedule(exp)
    # a DP change at 10, then a rollback relaunched at 6 with another micro-batch size: the last task before wins
    tasks = samples.task_layouts(_log((0, 1, 2, False), (10, 2, 2, False), (6, 2, 1, False)))
    assert samples.layout_at(exp, schedule, 6, tasks).data == 1
    assert (samples.layout_at(exp, schedule, 7, tasks).micro_batch_size, samples.layout_at(exp, schedule, 12, tasks)
            .micro_batch_size) == (1, 1)
    phased = dataclasses.replace(exp, slurm=dataclasses.replace(
        exp.slurm, gpus_per_node=2, node_schedule=[NodePhase(nodes=1), NodePhase(nodes=2, from_iteration=10)]))
    schedule = run_schedule(phased)
    assert [samples.layout_at(phased, schedule, i, []).data for i in (10, 11)] == [1, 2]  # 2 and 4 processes / PP 2
    given = samples.iteration_samples(exp, 10, dp=2, micro_batch_size=1, log_lines=[], text=False)
    assert (given.layout.data, given.layout.micro_batch_size) == (2, 1) and "given" in given.layout.source


def test_a_blend_names_each_samples_dataset(exp, tmp_path):
    other = write_indexed(tmp_path / "other_text_document", [[7 + d % 50] * (40 + d) for d in range(60)])
    blend = [DataSource(prefix=exp.data.blend[0].prefix, weight=3.0), DataSource(prefix=other, weight=1.0)]
    exp = dataclasses.replace(exp, data=dataclasses.replace(exp.data, blend=blend, split="90,10,0"))
    result = samples.iteration_samples(exp, 12, log_lines=_log((0, 1, 2, False)))
    fed = _fed(exp, 12, 1, 2)
    sources = [s.source for b in result.micro_batches for s in b.samples]
    assert sorted(set(sources)) == [0, 1] and sources.count(0) > sources.count(1)
    for b in result.micro_batches:
        assert np.array_equal(np.array([s.tokens for s in b.samples]), fed[0, b.micro_batch])
        for s in b.samples:
            indexed = IndexedDataset(blend[s.source].prefix)
            assert s.prefix == blend[s.source].prefix
            assert np.concatenate([indexed.get(p.document, p.offset, p.length) for p in s.pieces]).tolist() == list(
                s.tokens)


@pytest.mark.parametrize("kwargs, message", [
    (dict(iteration=29), "trains iterations 1 to 28"),
    (dict(iteration=5, ranks=[1]), "--rank: got 1"),
    (dict(iteration=5, micro_batches=[9]), "--micro-batch-index: got 9"),
    (dict(iteration=12, dp=3), "not a multiple of micro batch size"),
])
def test_bad_requests_name_the_value(exp, kwargs, message):
    with pytest.raises(samples.SamplesError, match=message):
        samples.iteration_samples(exp, log_lines=_log((0, 1, 2, False)), text=False, **kwargs)


def _cli_experiment(trainings: Path, run: Path, corpus: str) -> None:
    batch = "batch: {global_batch_size: 8, micro_batch_size: 2, rampup: {start: 4, increment: 2, samples: 40}}\n"
    data = f"data: {{blend: [{{prefix: {json.dumps(corpus)}}}]}}\n"
    (trainings / "small.yaml").write_text(tiny_yaml(run, SHRUNK_MODEL, batch, data))


def test_cli_json_filters_and_a_synthetic_run_is_one_error_line(trainings, tmp_path, bundled_corpus):
    run = tmp_path / "run"
    _cli_experiment(trainings, run, bundled_corpus)
    exp = load_experiment("small", trainings)
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "main_log.txt").write_text("\n".join(_log((0, 2, 1, False))) + "\n")
    result = CliRunner().invoke(main, ["samples", "small", "--iteration", "7", "--rank", "1", "--micro-batch-index", "2",
                                       "--json", "--trainings-dir", str(trainings)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    [batch] = data["micro_batches"]
    assert (batch["dp_rank"], batch["micro_batch"], data["layout"]["data"]) == (1, 2, 2)
    expected = samples.iteration_samples(exp, 7, ranks=[1], micro_batches=[2])
    [sample] = batch["samples"]
    assert sample["tokens"] == list(expected.micro_batches[0].samples[0].tokens) and sample["text"]
    assert sample["position"] == run_schedule(exp).batch.consumed_after(6) + (2 * 2 + 1) * 1
    (run / "logs" / "main_log.txt").write_text("\n".join(_log((0, 1, 2, True))) + "\n")
    refused = CliRunner().invoke(main, ["samples", "small", "--iteration", "7", "--trainings-dir", str(trainings)])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    [line] = refused.output.strip().split("\n")
    assert "--synthetic-data" in line and "no corpus" in line


def test_the_command_imports_neither_torch_nor_deepspeed(trainings, tmp_path, bundled_corpus):
    _cli_experiment(trainings, tmp_path / "run", bundled_corpus)
    argv = ["samples", "small", "--iteration", "3", "--trainings-dir", str(trainings)]
    code = ("import sys\nfrom click.testing import CliRunner\nfrom bigscience_ops.cli import main\n"
            f"r = CliRunner().invoke(main, {argv!r})\n"
            "assert r.exit_code == 0, r.output\nprint(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_a_start_line_no_task_can_have_is_reported_and_skipped(trainings, tmp_path, bundled_corpus):
    """A task start line with micro batch size 0 (or DP 0, or a number of 5000 digits) made `bsops samples` divide by
    zero; it is now skipped, named in the output, and the layout comes from the lines that can be right."""
    run = tmp_path / "run"
    _cli_experiment(trainings, run, bundled_corpus)
    zero = TaskLayout("small", 1000, 1, 2, 2, 1, False, 28, 4).line().replace("micro batch size 1",
                                                                              "micro batch size 0")
    huge = TaskLayout("small", 1000, 1, 2, 2, 1, False, 28, 5).line().replace("DP=2", "DP=" + "9" * 5000)
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "main_log.txt").write_text("\n".join([*_log((0, 2, 1, False)), zero, huge]) + "\n")
    argv = ["samples", "small", "--iteration", "7", "--rank", "0", "--micro-batch-index", "0", "--trainings-dir",
            str(trainings)]
    result = CliRunner().invoke(main, [*argv, "--json", "--no-text"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["layout"]["data"], data["layout"]["micro_batch_size"]) == (2, 1)  # the task that started at 0
    assert len(data["skipped_log_lines"]) == 2
    assert "micro batch size 0" in data["skipped_log_lines"][0] and "5000 digits" in data["skipped_log_lines"][1]
    text = CliRunner().invoke(main, [*argv, "--no-text"])
    assert text.exit_code == 0 and sum(line.startswith("warning: ") for line in text.output.splitlines()) == 2
    (run / "logs" / "main_log.txt").write_text(zero + "\n")  # the only start line is impossible: the node phase's
    alone = samples.iteration_samples(load_experiment("small", trainings), 7, text=False)
    assert "no task in main_log.txt trained it yet" in alone.layout.source and len(alone.skipped_lines) == 1


# ---------------------------------------------------------------- the data folder, predictions, rollbacks


def _folder(path: Path) -> dict[str, tuple[int, str]]:
    """Every file of a folder: name -> (size, sha256)."""
    import hashlib

    return {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(path.iterdir())}


def test_samples_never_writes_into_the_data_folder_and_reads_the_trainers_index_files(tmp_path, bundled_corpus):
    """The index files the trainer wrote beside the data are read when whole; what is missing or torn is built in
    BSOPS_CACHE_DIR (the test's: conftest), and the data folder stays byte-identical."""
    import os
    import shutil

    data = tmp_path / "data"
    data.mkdir()
    for path in Path(bundled_corpus).parent.glob(Path(bundled_corpus).name + ".*"):
        if "_indexmap_" not in path.name:  # the data alone: no index file of any run
            shutil.copy2(path, data / path.name)
    exp = small_experiment(tmp_path / "run", str(data / Path(bundled_corpus).name))
    cache = Path(os.environ["BSOPS_CACHE_DIR"]) / "indices"
    before = _folder(data)
    result = samples.iteration_samples(exp, 9, log_lines=[], text=False)
    assert _folder(data) == before  # names, sizes and hashes
    built = sorted(p.name for p in cache.rglob("*.npy"))
    assert len(built) >= 3 and all("_indexmap_" in name for name in built)
    # the trainer's datasets: their index files beside the data, the samples the same
    train, _, _ = build_datasets(exp, dataset_sizes(exp, run_schedule(exp)), synthetic=False)
    for s in (s for b in result.micro_batches for s in b.samples):
        assert list(s.tokens) == train[s.index][:result.seqlen + 1].tolist()
    shutil.rmtree(cache)
    trained = _folder(data)
    assert len(trained) > len(before)
    again = samples.iteration_samples(exp, 9, log_lines=[], text=False)
    assert not cache.exists() and _folder(data) == trained  # read where the trainer wrote them, read only
    torn = next(data.glob("*_train_indexmap_*_shuffle_idx.npy"))
    with open(torn, "r+b") as handle:
        handle.truncate(torn.stat().st_size // 2)
    trained = _folder(data)
    third = samples.iteration_samples(exp, 9, log_lines=[], text=False)
    assert _folder(data) == trained and len(list(cache.rglob("*_shuffle_idx.npy"))) == 1  # rebuilt in the cache
    assert [s.tokens for b in third.micro_batches for s in b.samples] == [
        s.tokens for b in again.micro_batches for s in b.samples]


def test_an_iteration_the_run_has_not_trained_is_a_prediction_naming_no_task(exp):
    log = [*_log((0, 2, 1, False)), " iteration 6/ 28 | lm loss: 9 |"]
    past = samples.iteration_samples(exp, 6, log_lines=log, text=False)
    ahead = samples.iteration_samples(exp, 9, log_lines=log, text=False)
    text = samples.samples_text(ahead)
    assert "not trained yet: predicted from the plan" in text[2] and "reach iteration 6" in text[2]
    assert "the task that started" not in text[1] and "(predicted from the plan (not trained yet): the layout of the " \
                                                      "last task in the log given (started at iteration 0)" in text[1]
    assert past.trained and past.status == "trained" and past.layout.source == "the log given: the task that " \
                                                                              "started at iteration 0"
    assert not ahead.trained and ahead.status == "predicted" and ahead.trained_through == 6
    assert ahead.layout.source.startswith("predicted from the plan (not trained yet)")
    assert (ahead.layout.data, ahead.layout.micro_batch_size) == (2, 1)  # the last task's
    data = samples.samples_data(ahead)
    assert (data["trained"], data["status"], data["trained_through"]) == (False, "predicted", 6)
    assert samples.samples_data(past)["status_line"] is None
    nothing = samples.iteration_samples(exp, 3, log_lines=[], text=False)  # no log, no checkpoint: all predicted
    assert nothing.status == "predicted" and nothing.layout.source.startswith("predicted from the plan (not trained")


def _trained_log(exp, start: int, last: int, mtime: float) -> Path:
    """A task's start line at `start` and its iteration lines to `last`, as the trainer writes them, appended to
    main_log.txt, which is then dated `mtime`."""
    import os

    from bigscience_ops.run.iterations import IterationStats, iteration_line

    lines = [TaskLayout(exp.name, 1000, 1, 1, 1, 2, False, 28, start).line()]
    lines += [iteration_line(IterationStats(i, 28, 6 * i, 6 * i * 32, 10.0, 1e-4, 6, 7.0, 1.0, 1.0, None, 0, 0, 1.0,
                                            0.0)) for i in range(start + 1, last + 1)]
    log = Path(exp.paths.logs) / "main_log.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        handle.write("\n".join(lines) + "\n")
    os.utime(log, (mtime, mtime))
    return log


def test_right_after_a_rollback_the_skip_range_is_what_the_relaunch_will_do(exp):
    """rollback --step 10 --skip 12-14 of a run that trained 20: until the relaunch has trained past them, 12-14 'will
    be skipped at the relaunch'; iterations the abandoned branch trained are predictions again."""
    import time

    from bigscience_ops.run.rollback import rollback
    from bigscience_ops.run.records import as_recorded

    now = time.time()
    for step in (10, 20):
        complete_checkpoint(exp, step)
    _trained_log(exp, 0, 20, now - 600)
    rollback(exp, 10, "12-14", now=now - 300)
    recorded = as_recorded(exp)  # the skip, as `bsops samples` applies it
    pending = samples.iteration_samples(recorded, 13, text=False)
    line = samples.samples_text(pending)[2]
    assert "will be skipped at the relaunch: its data consumed, no update" in line
    assert "rollback to iteration 10" in line
    assert "consumed their data" not in line and "was consumed" not in line
    assert (pending.status, pending.trained_through) == ("will be skipped", 10)
    assert samples.iteration_samples(recorded, 18, text=False).status == "predicted"  # the abandoned branch's
    _trained_log(exp, 10, 16, now)  # the relaunch: starts at 10, steps over 12-14, trains to 16
    done = samples.iteration_samples(recorded, 13, text=False)
    assert (done.status, done.trained_through) == ("skipped", 16)
    assert samples.samples_text(done)[2] == "skipped (train.skip_iterations): its data was consumed, no update was made"
    assert samples.iteration_samples(recorded, 18, text=False).status == "predicted"
    assert samples.iteration_samples(recorded, 15, text=False).layout.source.endswith("started at iteration 10")


def test_the_index_cache_is_bsops_cache_dir_else_the_xdg_cache_else_home(monkeypatch, tmp_path):
    from bigscience_ops.data.gpt_dataset import user_index_cache

    monkeypatch.setenv("BSOPS_CACHE_DIR", str(tmp_path / "bsops"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_index_cache() == tmp_path / "bsops" / "indices"
    monkeypatch.delenv("BSOPS_CACHE_DIR")
    assert user_index_cache() == tmp_path / "xdg" / "bsops" / "indices"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_index_cache() == tmp_path / "home" / ".cache" / "bsops" / "indices"
