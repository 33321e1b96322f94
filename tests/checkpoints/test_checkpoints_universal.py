"""Resume with another DP, TP or PP through DeepSpeed's universal checkpoint (real torchrun runs on CPU/gloo).

One uninterrupted reference (TP=PP=DP=1, ZeRO-1) trains 10 steps. The reshaped run trains the same
experiment in one run folder with three layouts, each launch resuming the last one's checkpoint with
another: TP=2 to step 4, then PP=2 to step 7 (TP 2 -> 1), then DP=2 to step 10 (PP 2 -> 1, DP 1 -> 2).
The samples of a step depend only on the consumed samples, so every resumed step sees the reference's
data and its loss must match the reference's; the optimizer state (Adam's moments) must have come
along too, or the steps after each resume drift away.

The runs train on the bundled corpus and record the token ids they feed at RECORD_AT
(BSOPS_RECORD_TOKENS_AT): `bsops samples` must give them bit for bit in the rampup with DP=1, in the
first step after a resume with the same DP, and in the first step after a resume with DP=2
(micro-batches of 1 instead of 2).
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from bigscience_ops.checkpoints import layout, universal
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer import checkpointing as ckpt
from tests.fixtures_runs import commit_checkpoint
from tests.fixtures_trainer import (
    CORPUS_VOCAB, append_main_log, concurrently, launch, run_ok, scalars, small_experiment, write_run,
)

STEPS, SPLIT = 10, 6  # the reference's steps; SPLIT: where the ZeRO-0 run changes its DP
CHAIN = ((4, (2, 1, 1)), (7, (1, 2, 1)), (STEPS, (1, 1, 2)))
"""The reshaped run's launches, one after another in one folder: (the step it exits at, its layout (tensor,
pipeline, data)). Each resumes the last one's checkpoint with another layout (the micro-batch is 2 // data)."""
HOPS = {"tp2_to_pp2": 1, "pp2_dp1_to_dp2": 2}
"""name: the launch of CHAIN that resumes with a layout of its own: TP 2 -> 1 (and PP 1 -> 2); PP 2 -> 1 and
DP 1 -> 2."""
RECORD_AT = (3, 5, 8, STEPS)  # the rampup (batch 4) with TP=2; batch 4 after the PP resume; 6 after the DP one; 8
RECORD = {"BSOPS_RECORD_TOKENS_AT": ",".join(map(str, RECORD_AT))}


def _experiment(out: Path, tensor: int, pipeline: int, data: int, exit_interval: int, zero_stage: int = 1,
                corpus: str | None = None):
    """ZeRO-1; DP=2 runs micro-batches of 1, so every layout sees the same samples per step."""
    return small_experiment(out, corpus, parallel=dict(tensor=tensor, pipeline=pipeline, zero_stage=zero_stage),
                            batch=dict(micro_batch_size=2 // data),
                            checkpoint=dict(save_interval=100, exit_interval=exit_interval))


def _train(out: Path, corpus: str, grid: tuple[int, int, int], exit_interval: int,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """One launch on the bundled corpus, its output appended to the run's main_log.txt (as the job script does)."""
    exp = _experiment(out, *grid, exit_interval, corpus=corpus)
    write_run(exp, out)
    tensor, pipeline, data = grid
    proc = run_ok(out, tensor * pipeline * data, env=env, synthetic=False)
    append_main_log(exp, proc)
    return proc


def _grid_at(iteration: int) -> tuple[int, int, int]:
    """The layout the reshaped run trained `iteration` with."""
    return next(grid for last, grid in CHAIN if iteration <= last)


def _refused_resume(out: Path, source: Path, corpus: str) -> subprocess.CompletedProcess:
    """A ZeRO-0 run with DP=2 pointed at the DP=1 ZeRO-1 checkpoints in `source`."""
    exp = _experiment(out, 1, 1, 2, STEPS, zero_stage=0, corpus=corpus)
    exp = dataclasses.replace(exp, paths=dataclasses.replace(exp.paths, checkpoints=str(source / "checkpoints")))
    write_run(exp, out)
    return launch(out, 2, synthetic=False)


def _zero0_dp_change(out: Path, corpus: str) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """ZeRO-0 with DP=1 to step SPLIT, then resumed with DP=2 to STEPS."""
    procs = []
    for grid, exit_interval in (((1, 1, 1), SPLIT), ((1, 1, 2), STEPS)):
        write_run(_experiment(out, *grid, exit_interval, zero_stage=0, corpus=corpus), out)
        procs.append(run_ok(out, grid[0] * grid[1] * grid[2], synthetic=False))
    return out, procs


@pytest.fixture(scope="module")
def reshape_runs(tmp_path_factory, bundled_corpus) -> dict[str, tuple[Path, list[subprocess.CompletedProcess]]]:
    """The reference, the reshaped run (CHAIN, recording its tokens at RECORD_AT), the ZeRO-0 DP change, and (once
    the reference is there) the refused resume of the reference's checkpoints: launched side by side."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("reference", "refused", "reshaped", "zero0_dp1_to_dp2")}
    corpus = bundled_corpus

    def reference_then_refused() -> tuple[tuple[Path, list[subprocess.CompletedProcess]], subprocess.CompletedProcess]:
        out = folders["reference"]
        reference = (out, [_train(out, corpus, (1, 1, 1), STEPS)])
        return reference, _refused_resume(folders["refused"], out, corpus)

    def reshaped() -> tuple[Path, list[subprocess.CompletedProcess]]:
        out = folders["reshaped"]
        return out, [_train(out, corpus, grid, last, RECORD) for last, grid in CHAIN]

    done = concurrently({"reshaped": reshaped, "reference": reference_then_refused,
                         "zero0_dp1_to_dp2": lambda: _zero0_dp_change(folders["zero0_dp1_to_dp2"], corpus)})
    return {"reference": done["reference"][0], "reshaped": done["reshaped"],
            "refused": (folders["refused"], [done["reference"][1]]), "zero0_dp1_to_dp2": done["zero0_dp1_to_dp2"]}


@pytest.mark.slow
def test_reshaped_run_trains_every_step_once_and_keeps_each_launchs_checkpoint(reshape_runs):
    out, _ = reshape_runs["reshaped"]
    assert sorted(scalars(out / "tensorboard", "lm loss")) == list(range(1, STEPS + 1))
    assert [c.step for c in layout.list_checkpoints(out / "checkpoints")] == [last for last, _ in CHAIN]
    last_resumed = CHAIN[max(HOPS.values()) - 1][0]
    assert (out / "checkpoints" / "latest_universal").read_text().strip() == f"global_step{last_resumed}_universal"
    for last, (tensor, pipeline, data) in CHAIN:
        meta = layout.Checkpoint(f"global_step{last}", last, out / "checkpoints" / f"global_step{last}").meta()
        assert meta["parallel"] == {"tensor": tensor, "pipeline": pipeline, "data": data}, last


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HOPS))
def test_reshaped_resume_continues_the_uninterrupted_run(reshape_runs, name):
    """Every step up to the end of the launch that resumed with another layout has the reference's loss; that launch
    converted the last launch's checkpoint to a universal one and resumed from it."""
    reference = scalars(reshape_runs["reference"][0] / "tensorboard", "lm loss")
    out, procs = reshape_runs["reshaped"]
    hop = HOPS[name]
    source, last = CHAIN[hop - 1][0], CHAIN[hop][0]
    losses = scalars(out / "tensorboard", "lm loss")
    assert sorted(losses)[:last] == list(range(1, last + 1))
    for step in range(1, last + 1):
        assert math.isclose(losses[step], reference[step], rel_tol=1e-5), (name, step, losses[step], reference[step])
    assert f"converted global_step{source}" in procs[hop].stdout, procs[hop].stdout[-3000:]
    assert (out / "checkpoints" / f"global_step{source}_universal" / "bsops.json").is_file()


@pytest.mark.slow
def test_consumed_samples_and_lr_carry_over(reshape_runs):
    reference = ckpt.find_resume(reshape_runs["reference"][0] / "checkpoints").meta
    meta = ckpt.find_resume(reshape_runs["reshaped"][0] / "checkpoints").meta
    assert meta["state"] == reference["state"]
    assert meta["lr_schedule"] == reference["lr_schedule"]
    ref_lr = scalars(reshape_runs["reference"][0] / "tensorboard", "learning-rate")
    assert scalars(reshape_runs["reshaped"][0] / "tensorboard", "learning-rate") == pytest.approx(ref_lr)


@pytest.mark.slow
def test_universal_copy_holds_full_parameters_and_adam_moments(reshape_runs, tmp_path, bundled_corpus):
    out, _ = reshape_runs["reshaped"]
    split, (tensor, _, _) = CHAIN[0]
    assert tensor == 2  # the first launch's checkpoint is TP-sharded
    zero = out / "checkpoints" / f"global_step{split}_universal" / "zero"
    shape = GPTShape.from_experiment(_experiment(tmp_path, 2, 1, 1, split, corpus=bundled_corpus))
    h, f = shape.hidden_size, shape.ffn_hidden_size
    expected = {"tied_modules.word_embeddings.word_embeddings.weight": (shape.padded_vocab_size, h),
                "1.self_attention.query_key_value.weight": (3 * h, h), "1.self_attention.dense.weight": (h, h),
                "1.mlp.dense_h_to_4h.weight": (f, h), "1.mlp.dense_4h_to_h.weight": (h, f),
                "1.input_layernorm.weight": (h,), f"{shape.num_layers + 1}.bias": (h,)}
    for name, full in expected.items():
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            tensor = torch.load(zero / name / f"{state}.pt", weights_only=False)["param"]
            assert tuple(tensor.shape) == full, (name, state)
        assert torch.load(zero / name / "exp_avg_sq.pt", weights_only=False)["param"].abs().sum() > 0, name
    # the row-parallel attention output was merged along its input dimension: TP rank 1's shard is the right half
    shard = torch.load(out / "checkpoints" / f"global_step{split}" / "layer_01-model_01-model_states.pt",
                       weights_only=True)["self_attention.dense.weight"]
    full = torch.load(zero / "1.self_attention.dense.weight" / "fp32.pt", weights_only=False)["param"]
    assert torch.equal(full[:, h // 2:], shard)


@pytest.mark.slow
def test_second_resume_does_not_convert_again(reshape_runs):
    out, procs = reshape_runs["reshaped"]
    split = CHAIN[-2][0]
    source = out / "checkpoints" / f"global_step{split}"
    assert f"converted global_step{split}" in procs[-1].stdout
    marker = universal.universal_path(source) / "bsops.json"
    before = marker.stat().st_mtime_ns
    assert universal.convert(source, CORPUS_VOCAB) is False
    assert marker.stat().st_mtime_ns == before


def test_fit_vocabulary_cuts_only_surplus_padding(tmp_path):
    folder = tmp_path / "global_step3_universal"
    zero = folder / "zero" / universal.WORD_EMBEDDINGS
    zero.mkdir(parents=True)
    full = torch.arange(12.0).reshape(6, 2)
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        torch.save({"param": full, "vocab_tensor": True}, zero / f"{state}.pt")
    layout.write_meta(folder, {"universal": {"source": "global_step3", "vocabulary_rows": 6}})
    assert universal.fit_vocabulary(folder, 8) is False
    assert universal.fit_vocabulary(folder, 4) is True
    assert torch.equal(torch.load(zero / "exp_avg.pt", weights_only=False)["param"], full[:4])
    assert universal.ready(tmp_path / "global_step3", 4) and not universal.ready(tmp_path / "global_step3", 3)


def _checkpoint(tmp_path: Path, tensor: int, data: int, zero_stage: int) -> tuple[ckpt.Resume, dict]:
    exp = _experiment(tmp_path, tensor, 1, data, SPLIT, zero_stage)
    shape = dataclasses.asdict(GPTShape.from_experiment(exp))
    layout.write_meta(tmp_path / "global_step4", {"model": shape, "parallel": {"tensor": tensor, "pipeline": 1,
                                                                          "data": data},
                                                 "experiment": {"model": {"vocab_size": 256},
                                                                "parallel": {"zero_stage": zero_stage}}})
    commit_checkpoint(tmp_path / "global_step4")
    (tmp_path / "latest").write_text("global_step4")
    return ckpt.find_resume(tmp_path), shape


def test_reshape_plan_decisions(tmp_path):
    resume, shape = _checkpoint(tmp_path, 1, 1, 1)
    same = universal.Layout(1, 1, 1, 1)
    assert universal.reshape_plan(resume.path, resume.meta, shape, same, 256) is None
    plan = universal.reshape_plan(resume.path, resume.meta, shape, universal.Layout(1, 1, 2, 1), 256)
    assert plan == universal.Reshape(universal.Layout(1, 1, 1, 1), universal.Layout(1, 1, 2, 1))
    # A checkpoint written before model.position_embedding existed holds the learned table: it resumes.
    older = {**resume.meta, "model": {k: v for k, v in resume.meta["model"].items() if k != "position_embedding"}}
    assert universal.reshape_plan(resume.path, older, shape, same, 256) is None
    with pytest.raises(universal.ReshapeError, match="model.position_embedding: checkpoint 'learned', config 'alibi'"):
        universal.reshape_plan(resume.path, older, {**shape, "position_embedding": "alibi"}, same, 256)


def test_unconvertible_resume_is_refused_with_one_line_per_cause(tmp_path):
    resume, shape = _checkpoint(tmp_path, 1, 1, 0)
    with pytest.raises(universal.ReshapeError) as err:
        universal.reshape_plan(resume.path, resume.meta, shape, universal.Layout(2, 1, 1, 0), 256)
    lines = str(err.value).splitlines()
    assert "TP=1 PP=1 DP=1 ZeRO-0" in lines[0] and "TP=2 PP=1 DP=1 ZeRO-0" in lines[0]
    assert len([line for line in lines if line.startswith("  - ")]) == 2  # zero_stage of the checkpoint, and of the config
    with pytest.raises(universal.ReshapeError, match="model.hidden_size: checkpoint 64, config 128"):
        universal.reshape_plan(resume.path, resume.meta, {**shape, "hidden_size": 128}, universal.Layout(1, 1, 1, 0),
                               256)
    with pytest.raises(universal.ReshapeError, match="model.vocab_size: checkpoint 256, config 300"):
        universal.reshape_plan(resume.path, resume.meta, shape, universal.Layout(2, 1, 1, 1), 300)


@pytest.mark.slow
def test_trainer_refuses_before_building_an_engine(reshape_runs):
    """A ZeRO-0 resume of the DP=1 run with DP=2: exit 2, the causes on stderr, no engine built."""
    source, _ = reshape_runs["reference"]
    _, [proc] = reshape_runs["refused"]
    assert proc.returncode != 0
    assert "parallel.zero_stage 0" in proc.stderr
    assert "number of parameters" not in proc.stdout
    assert not (source / "checkpoints" / f"global_step{STEPS}_universal").exists()


@pytest.mark.slow
def test_zero0_dp_change_loads_without_conversion(reshape_runs):
    """ZeRO-0 in fp32 keeps the whole optimizer per TP/PP rank, so DP 1 -> 2 (a node-schedule phase of a
    ZeRO-0 run) loads the checkpoint as it is, with Adam's moments, and continues the reference's losses."""
    out, _ = reshape_runs["zero0_dp1_to_dp2"]
    reference = scalars(reshape_runs["reference"][0] / "tensorboard", "lm loss")
    losses = scalars(out / "tensorboard", "lm loss")
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, value in losses.items():
        assert math.isclose(value, reference[step], rel_tol=1e-5), (step, value, reference[step])
    assert not (out / "checkpoints" / "latest_universal").exists()
    assert ckpt.find_resume(out / "checkpoints").meta["parallel"]["data"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("iteration", RECORD_AT)
def test_samples_gives_the_token_ids_each_rank_recorded(reshape_runs, iteration):
    """`bsops samples` (views/samples.py) on the run's last experiment.json and main_log.txt gives every recorded
    micro-batch of every rank bit for bit: in the rampup, after a resume with the same DP, and with DP=2 after a DP
    change."""
    from bigscience_ops.config.loading import from_dict
    from bigscience_ops.trainer.faults import token_record_path
    from bigscience_ops.views import samples

    out, _ = reshape_runs["reshaped"]
    exp = from_dict(json.loads((out / "experiment.json").read_text()), str(out / "experiment.json"))
    result = samples.iteration_samples(exp, iteration, text=False)
    tensor, pipeline, data = _grid_at(iteration)
    assert (result.layout.data, result.layout.micro_batch_size) == (data, 2 // data), (iteration, result.layout)
    recorded = sorted((out / "debug").glob(f"tokens-iter{iteration}-*.npz"))
    assert len(recorded) == len(result.micro_batches) == result.global_batch_size // (2 // data), recorded
    for batch in result.micro_batches:
        ids = np.array([s.tokens for s in batch.samples])
        fed = np.load(token_record_path(out / "debug", iteration, batch.dp_rank, batch.micro_batch))
        assert np.array_equal(fed["tokens"], ids[:, :-1]) and np.array_equal(fed["labels"], ids[:, 1:]), (
            iteration, batch.dp_rank, batch.micro_batch)
