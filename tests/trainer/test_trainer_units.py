"""Trainer pieces without a distributed launch: resume checks, `latest`, data order, model, log lines and metrics.
(The save schedule and the save: test_trainer_checkpointing.py; stop reasons: test_trainer_stopping.py.)"""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import time

import pytest
import torch

from bigscience_ops.run import ledger
from bigscience_ops.checkpoints import layout
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.run.iterations import IterationStats, iteration_line
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer import checkpointing as ckpt
from bigscience_ops.trainer.data import step_micro_batches
from bigscience_ops.trainer.sampling import SyntheticDataset, sample_indices
from bigscience_ops.trainer.metrics import Metrics, StepRecord
from bigscience_ops.trainer.model import EmbeddingPipe, TransformerBlock, build_sequential, lm_loss
from bigscience_ops.trainer.report import validation_lines
from tests.fixtures_trainer import small_experiment
from tests.fixtures_runs import commit_checkpoint


def _fake_checkpoint(root, step, meta):
    path = root / f"global_step{step}"
    path.mkdir(parents=True)
    layout.write_meta(path, meta)
    commit_checkpoint(path)
    (root / "latest").write_text(f"global_step{step}")
    return path


def test_find_resume_empty_and_complete(tmp_path):
    assert ckpt.find_resume(tmp_path / "missing") is None
    assert ckpt.find_resume(tmp_path) is None
    _fake_checkpoint(tmp_path, 7, {"iteration": 7})
    resume = ckpt.find_resume(tmp_path)
    assert resume.tag == "global_step7" and resume.meta["iteration"] == 7


def test_checkpoints_without_latest_are_an_error_not_a_fresh_start(tmp_path):
    _fake_checkpoint(tmp_path, 7, {"iteration": 7})
    (tmp_path / "latest").unlink()
    with pytest.raises(CheckpointError, match="global_step7"):
        ckpt.find_resume(tmp_path)


@pytest.mark.parametrize("content", ["global_step9", "garbage"])
def test_latest_naming_a_missing_folder_is_an_error(tmp_path, content):
    _fake_checkpoint(tmp_path, 7, {"iteration": 7})
    (tmp_path / "latest").write_text(content)
    with pytest.raises(CheckpointError, match=content):
        ckpt.find_resume(tmp_path)


@pytest.mark.parametrize("content", ["global_step7\n", "garbage", "global_step", "global_step7 global_step8"])
def test_latest_has_one_parser(tmp_path, content):
    """The trainer's resume and the ops commands read `latest` the same way (layout.latest_tag); the ledger counts
    where a resume starts (layout.resume_step), which a `latest` that cannot be read does not change."""
    _fake_checkpoint(tmp_path, 7, {"iteration": 7})
    (tmp_path / "latest").write_text(content)
    assert ledger.latest_iteration(tmp_path) == 7
    if content.strip() == "global_step7":
        assert layout.latest_step(tmp_path) == 7
        assert ckpt.find_resume(tmp_path).meta["iteration"] == 7
        return
    for read in (layout.latest_tag, ckpt.find_resume):
        with pytest.raises(CheckpointError):
            read(tmp_path)


def test_checkpoint_without_a_manifest_is_not_resumed_from(tmp_path):
    (tmp_path / "global_step3").mkdir()
    (tmp_path / "latest").write_text("global_step3")
    with pytest.raises(CheckpointError, match="no manifest.json: no manifest: the save did not finish"):
        ckpt.find_resume(tmp_path)


def test_shape_and_layout_mismatch_rejected(tmp_path):
    exp = small_experiment(tmp_path)
    shape = dataclasses.asdict(GPTShape.from_experiment(exp))
    _fake_checkpoint(tmp_path, 5, {"model": shape, "parallel": {"tensor": 1, "pipeline": 2}})
    resume = ckpt.find_resume(tmp_path)
    ckpt.check_compatible(resume, shape, 1, 2)
    with pytest.raises(CheckpointError, match="hidden_size: checkpoint 64, config 128"):
        ckpt.check_compatible(resume, {**shape, "hidden_size": 128}, 1, 2)
    with pytest.raises(CheckpointError, match="parallel.pipeline: checkpoint 2, config 1"):
        ckpt.check_compatible(resume, shape, 1, 1)


def test_megatron_sample_order_depends_only_on_consumed():
    # step after 12 consumed samples, 2 micro-batches of 2, DP=2: rank 0 reads 12,13 then 16,17
    assert sample_indices(12, 2, 2, 0, 2) == [12, 13, 16, 17]
    assert sample_indices(12, 2, 2, 1, 2) == [14, 15, 18, 19]
    ds = SyntheticDataset(100, 8, 50, seed=3)
    batches = list(step_micro_batches(ds, 12, 2, 2, 1, 2))
    tokens, (labels, mask) = batches[1]
    assert torch.equal(tokens[0], torch.from_numpy(ds[18][:-1])) and torch.equal(labels[1], torch.from_numpy(ds[19][1:]))
    assert mask.shape == (2, 8) and tokens.shape == (2, 8)


def test_model_init_does_not_depend_on_pipeline_split(tmp_path):
    shape = GPTShape.from_experiment(small_experiment(tmp_path))
    a, b = TransformerBlock(shape, 7, 2), TransformerBlock(shape, 7, 2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(TransformerBlock(shape, 7, 1).mlp.dense_h_to_4h.weight, a.mlp.dense_h_to_4h.weight)
    head_copy, embedding = EmbeddingPipe(shape, 7, with_positions=False), EmbeddingPipe(shape, 7)
    assert torch.equal(head_copy.word_embeddings.weight, embedding.word_embeddings.weight)
    assert not hasattr(head_copy, "position_embeddings")
    assert shape.padded_vocab_size == 256 and shape.ffn_hidden_size == 256


def test_parameter_count_matches_plan(tmp_path):
    from bigscience_ops.sizing import count_parameters

    exp = small_experiment(tmp_path, model=dict(embed_layernorm=True))
    model = build_sequential(GPTShape.from_experiment(exp), 1)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(exp.model).total


def test_causal_lm_trains_a_few_steps(tmp_path):
    shape = GPTShape.from_experiment(small_experiment(tmp_path))
    model = build_sequential(shape, 1)
    ds = SyntheticDataset(64, shape.seq_length, 256, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(15):
        tokens, labels = next(step_micro_batches(ds, step * 4, 1, 4, 0, 1))
        loss = lm_loss(model(tokens), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses


def test_kernel_references_agree():
    from bigscience_ops.kernels.softmax import causal_attention_reference, causal_attention_torch

    q, k, v = (torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    torch.testing.assert_close(causal_attention_torch(q, k, v), causal_attention_reference(q, k, v))


# The tr1-13B notes' iteration line, with Megatron-DeepSpeed's extra fields: the fields a parser reads.
LINE = re.compile(r" iteration +(\d+)/ +(\d+) \| consumed samples: +(\d+) \| .*elapsed time per iteration \(ms\): ([\d.]+) \| "
                  r"learning rate: ([\d.E+-]+) \| global batch size: +(\d+) \| lm loss: ([\d.E+-]+) \| loss scale: ([\d.]+) \| "
                  r"grad norm: ([\d.]+) \| .*number of skipped iterations: +(\d+) \| number of nan iterations: +(\d+) \|")


def test_iteration_line_has_megatrons_fields():
    stats = IterationStats(168000, 311541, 153013584, 153013584 * 2048, 13248.2, 1e-5, 1024, 2.376641, 131072.0,
                           19767.052, 1234.5, 0, 0, 77.3, 150.1)
    m = LINE.match(iteration_line(stats))
    assert m and m.group(1) == "168000" and m.group(3) == "153013584" and m.group(7) == "2.376641E+00"
    assert " validation loss at iteration 5 | lm loss value: 2.000000E+00 | lm loss PPL: 7.389056E+00 | " in validation_lines(5, 2.0)



def test_mfu_against_the_gpu_peak_table_and_the_override():
    from bigscience_ops.trainer.report import mfu, peak_tflops, peak_tflops_of

    for name, peak in [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0),
                       ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
                       ("Tesla V100-SXM2-32GB", 125.0), ("Tesla V100-PCIE-16GB", 112.0)]:
        assert peak_tflops_of(name) == peak, name
    assert peak_tflops_of("NVIDIA GeForce GTX 1080") is None
    assert peak_tflops(None, torch.device("cpu")) is None  # no made-up number on CPU
    assert peak_tflops(150.0, torch.device("cpu")) == 150.0
    assert mfu(150.1, None) is None and mfu(150.0, 300.0) == 0.5
    base = (1, 10, 4, 256, 100.0, 1e-4, 4, 2.0, 1.0, 0.5, 10.0, 0, 0, 40.0, 150.0)
    assert "MFU: 50.0% |" in iteration_line(IterationStats(*base, mfu=0.5))
    assert "MFU" not in iteration_line(IterationStats(*base))


def test_micro_batch_feed_reads_megatrons_order_from_any_consumed_position_and_past_skipped_steps():
    from bigscience_ops.trainer.data import MicroBatchFeed

    ds = SyntheticDataset(50, 8, 97, seed=3)
    mbs, dp, rank = 2, 2, 1
    for workers in (0, 2):
        feed = MicroBatchFeed(ds, 8, mbs, rank, dp, workers, torch.device("cpu"))
        # Steps of rampup sizes 12, 8, 20; the middle one is skipped (train.skip_iterations): the next reads on after it.
        for consumed, micro, skipped in ((8, 3, False), (20, 2, True), (28, 5, False)):
            if skipped:
                feed.skip(micro)
                continue
            got = list(feed.take(micro))
            want = list(step_micro_batches(ds, consumed, micro, mbs, rank, dp))
            assert len(got) == micro
            for (tokens, (labels, mask)), (w_tokens, (w_labels, w_mask)) in zip(got, want):
                assert torch.equal(tokens, w_tokens) and torch.equal(labels, w_labels) and torch.equal(mask, w_mask)
    # A DP change at a node-schedule phase resumes where the old layout stopped, whatever MBS x DP now is
    # (tr1-13B's 64-node phase starts 16 samples past a multiple of 32), exactly as Megatron's sampler does.
    dp = 4
    for rank in range(dp):
        feed = MicroBatchFeed(ds, 6, mbs, rank, dp, 0, torch.device("cpu"))
        got = list(feed.take(3))
        want = list(step_micro_batches(ds, 6, 3, mbs, rank, dp))
        assert [torch.equal(g[0], w[0]) for g, w in zip(got, want)] == [True] * 3


class _RecordingBoard:
    def __init__(self):
        self.scalars = []

    def scalar(self, tag, value, iteration, consumed_samples=None):
        if value is not None:
            self.scalars.append((tag, iteration, value))


@pytest.mark.slow  # waits out real timeouts: the whole suite runs it, the fast lane does not
def test_a_data_worker_writes_its_stacks_on_sigusr2_and_reads_on(capfd):
    """As its trainer does (trainer/stacks.py): the on-call look at a rank whose data worker hangs."""
    import psutil

    from bigscience_ops.trainer.data import MicroBatchFeed

    before = {p.pid for p in psutil.Process().children()}
    feed = MicroBatchFeed(SyntheticDataset(50, 8, 97, seed=3), 0, 2, 0, 1, 1, torch.device("cpu"))
    first = list(feed.take(2))
    [worker] = [p for p in psutil.Process().children() if p.pid not in before]
    worker.send_signal(signal.SIGUSR2)
    err, deadline = "", time.monotonic() + 60
    while "(MainThread), most recent call first:" not in err and time.monotonic() < deadline:
        time.sleep(0.1)
        err += capfd.readouterr().err
    assert "(MainThread), most recent call first:" in err and "in _worker_loop" in err, err
    assert worker.is_running() and len(list(feed.take(2))) == 2 and len(first) == 2


def test_a_data_worker_outlives_a_sigterm_from_slurm_and_ends_on_its_trainers():
    """scancel signals every process of the job: the worker must feed its trainer until it has saved. Its
    trainer's own SIGTERM (the DataLoader's and multiprocessing's shutdown) still ends it."""
    import psutil

    from bigscience_ops.trainer.data import MicroBatchFeed

    before = {p.pid for p in psutil.Process().children()}
    feed = MicroBatchFeed(SyntheticDataset(500, 8, 97, seed=3), 0, 2, 0, 1, 1, torch.device("cpu"))
    assert len(list(feed.take(2))) == 2
    [worker] = [p for p in psutil.Process().children() if p.pid not in before]
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True, timeout=30)  # another sender, as slurmstepd
    with pytest.raises(psutil.TimeoutExpired):
        worker.wait(timeout=2)
    assert len(list(feed.take(8))) == 8  # more than it had prefetched: it reads on
    worker.send_signal(signal.SIGTERM)  # from its trainer
    assert worker.wait(timeout=60) == 0


def test_closing_a_feed_ends_its_workers_without_a_signal():
    """The trainer closes its feeds before it exits: no SIGTERM that could merge with Slurm's."""
    import psutil

    from bigscience_ops.trainer.data import MicroBatchFeed

    before = {p.pid for p in psutil.Process().children()}
    feed = MicroBatchFeed(SyntheticDataset(500, 8, 97, seed=3), 0, 2, 0, 1, 2, torch.device("cpu"))
    assert len(list(feed.take(2))) == 2
    workers = [p for p in psutil.Process().children() if p.pid not in before]
    assert len(workers) == 2
    feed.close()
    _, alive = psutil.wait_procs(workers, timeout=30)  # already reaped by the DataLoader's join when it returns
    assert alive == []


def test_metrics_window_averages_applied_finite_steps_between_lines():
    board, lines, norms = _RecordingBoard(), [], []
    metrics = Metrics(board, lambda *text: lines.extend(text), train_iters=4, log_interval=2, flops_per_token=1e6,
                      peak_tflops=None, world_size=1, curriculum=False)

    def step(it, loss, applied):
        metrics.step(StepRecord(iteration=it, loss=loss, applied=applied, global_batch_size=4, seqlen=8, elapsed=0.5,
                                learning_rate=1e-3, grad_norm=1.0, loss_scale=1.0, consumed_samples=4 * it,
                                consumed_tokens=32 * it), lambda: norms.append(it) or 2.0)

    step(1, 3.0, True)
    step(2, float("nan"), True)  # NaN: counted, not averaged
    step(3, 9.0, False)  # not applied: not averaged
    step(4, 5.0, True)
    assert norms == [2, 4] and len(lines) == 2  # params norm (a collective) only on log iterations
    assert "lm loss: 3.000000E+00" in lines[0] and "number of nan iterations:   1" in lines[0]
    assert "lm loss: 5.000000E+00" in lines[1] and "number of nan iterations:   0" in lines[1]
    # skipped updates are counted per line, as Megatron's: the second line has one, the first none
    assert "number of skipped iterations:   0" in lines[0] and "number of skipped iterations:   1" in lines[1]
    assert [i for tag, i, _ in board.scalars if tag == "lm loss"] == [1, 2, 3, 4]
    assert [i for tag, i, _ in board.scalars if tag == "params-norm"] == [2, 4]
