"""Warm start by depth scaling (Gopher G.3.3): a 2-block run trained a few dozen steps seeds a 4-block one.

The source is the session's golden run (2 blocks, PP=2 on two processes, 28 steps, checkpoints at
steps 2, 4, 6, 11, 16 and 28); the deeper target runs with PP=1, so the layer files, numbered over
the whole model, are what carries the weights across pipeline layouts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.checkpoints import warm_start
from bigscience_ops.checkpoints.warm_start import WarmStartError, layer_mapping
from bigscience_ops.cli import main
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_trainer import concurrently, run_ok, scalars, small_experiment, write_run


def _target(out: Path, **model):
    """The deeper experiment: 4 blocks by default, PP=1, validation every 2 steps, a short run."""
    return small_experiment(out, model=dict(num_layers=4, **model), parallel=dict(pipeline=1),
                            logging=dict(log_interval=2, eval_interval=2, eval_iters=2), train=dict(samples=40))


@pytest.fixture(scope="module")
def source_run(golden_run):
    """The golden run: small_experiment's 2 blocks with PP=2, trained 28 steps (read, never written)."""
    exp, out, _ = golden_run
    assert exp.parallel.pipeline == 2 and exp.model.num_layers == 2
    return exp, out


def test_layer_mapping_is_gophers():
    assert layer_mapping(2, 4) == [0, 0, 1, 1]
    assert layer_mapping(2, 3) == [0, 0, 1]
    assert layer_mapping(4, 6) == [0, 0, 1, 2, 2, 3]
    for src, tgt in ((2, 3), (3, 7), (24, 36)):
        mapping = layer_mapping(src, tgt)
        assert len(mapping) == tgt and sorted(mapping) == mapping and set(mapping) == set(range(src))


def test_parse_from():
    assert warm_start.parse_from("runs/a") == ("runs/a", None)
    assert warm_start.parse_from("runs/a:20") == ("runs/a", "20")
    assert warm_start.parse_from("tiny:latest") == ("tiny", None)
    assert warm_start.parse_from("C:/x") == ("C:/x", None)


def _tp2_source_and_warm_start(folder: Path) -> tuple[Path, Path, warm_start.WarmStart, Path]:
    """A TP=2 source trained 28 steps; a 3-block TP=2 target built from it by warm_start.build (its
    checkpoints copied aside to `built` before it trains), then trained."""
    src_out, out, built = folder / "source", folder / "warm", folder / "built"
    write_run(small_experiment(src_out, parallel=dict(tensor=2, pipeline=1)), src_out)
    run_ok(src_out, 2)
    exp = small_experiment(out, model=dict(num_layers=3), parallel=dict(tensor=2, pipeline=1),
                           logging=dict(log_interval=2, eval_interval=2, eval_iters=2), train=dict(samples=24))
    write_run(exp, out)
    result = warm_start.build(exp, warm_start.find_source(src_out / "checkpoints", None, str(src_out)))
    shutil.copytree(out / "checkpoints", built)
    run_ok(out, 2)
    return src_out, out, result, built


@pytest.fixture(scope="module")
def warm_runs(tmp_path_factory, source_run) -> dict:
    """The warm starts' launches, side by side: the 4-block target after `bsops warm-start --from` the golden run
    (its checkpoints copied aside to `built` before it trains), the same target from scratch, and the TP=2 chain."""
    _, src_out = source_run
    folders = {name: tmp_path_factory.mktemp(name) for name in ("tp2", "warm", "fresh")}
    warm_out, fresh_out = folders["warm"] / "run", folders["fresh"] / "run"
    write_run(_target(warm_out), warm_out)
    write_run(_target(fresh_out), fresh_out)
    cli = CliRunner().invoke(main, ["warm-start", "--from", str(src_out), str(warm_out / "experiment.json")])
    jobs = {"tp2": lambda: _tp2_source_and_warm_start(folders["tp2"]), "fresh": lambda: run_ok(fresh_out, 1)}
    if cli.exit_code == 0:  # else the test reports the CLI's output
        shutil.copytree(warm_out / "checkpoints", folders["warm"] / "built")
        jobs["warm"] = lambda: run_ok(warm_out, 1)
    return {"cli": cli, "warm_out": warm_out, "built": folders["warm"] / "built", "fresh_out": fresh_out,
            **concurrently(jobs)}


@pytest.mark.slow
def test_warm_start_continues_from_the_source(source_run, warm_runs):
    src_exp, src_out = source_run
    src_final = scalars(src_out / "tensorboard", "lm loss validation")
    src_loss = src_final[max(src_final)]

    warm_out, result, built = warm_runs["warm_out"], warm_runs["cli"], warm_runs["built"]
    assert result.exit_code == 0, result.output
    step0 = built / "global_step0"  # the checkpoints as `bsops warm-start` left them
    assert (built / "latest").read_text() == "global_step0"
    src_ckpt = src_out / "checkpoints" / "global_step28"
    origin = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3}  # embedding, blocks floor(i * 2 / 4) + 1, final LayerNorm
    for new, old in origin.items():
        assert (step0 / f"layer_{new:02d}-model_states.pt").read_bytes() == \
            (src_ckpt / f"layer_{old:02d}-model_states.pt").read_bytes()
    meta = json.loads((step0 / "bsops.json").read_text())
    assert meta["weights_only"] is True and meta["iteration"] == 0 and meta["consumed_train_samples"] == 0
    assert meta["model"]["num_layers"] == 4 and meta["parallel"]["pipeline"] == 1
    assert not list(step0.glob("*optim_states.pt")) and not list(step0.glob("rng_state_*"))

    fresh_out, proc = warm_runs["fresh_out"], warm_runs["warm"]
    warm_valid = scalars(warm_out / "tensorboard", "lm loss validation")
    fresh_valid = scalars(fresh_out / "tensorboard", "lm loss validation")
    first = min(warm_valid)
    assert first == min(fresh_valid) == 2  # fresh schedules: the warm run counts its steps from 0
    # measured: source 4.55 after 28 steps; warm 4.67 at its step 2; fresh 5.57 at step 2
    assert abs(warm_valid[first] - src_loss) < 0.4, (warm_valid, src_loss)
    assert fresh_valid[first] - warm_valid[first] > 0.6, (fresh_valid, warm_valid)
    # same schedules and data position as a run from scratch: the last checkpoints agree on both
    last = max(int(p.name.removeprefix("global_step")) for p in (fresh_out / "checkpoints").glob("global_step*"))
    warm_meta = json.loads((warm_out / "checkpoints" / f"global_step{last}" / "bsops.json").read_text())
    fresh_meta = json.loads((fresh_out / "checkpoints" / f"global_step{last}" / "bsops.json").read_text())
    for key in ("iteration", "consumed_train_samples", "consumed_tokens", "state", "lr_schedule"):
        assert warm_meta[key] == fresh_meta[key]
    assert "weights_only" not in warm_meta
    assert "warm start from" in proc.stdout


@pytest.mark.parametrize("model, parallel, field", [
    (dict(hidden_size=128), {}, "hidden_size"),
    (dict(num_attention_heads=8), {}, "num_attention_heads"),
    (dict(ffn_hidden_size=128), {}, "ffn_hidden_size"),
    (dict(vocab_size=512), {}, "padded_vocab_size"),
    (dict(position_embedding="alibi"), {}, "position_embedding"),
    (dict(num_layers=2), {}, "num_layers"),
    (dict(num_layers=1), {}, "num_layers"),
    ({}, dict(tensor=2), "parallel.tensor"),
])
@pytest.mark.slow
def test_refuses_what_a_layer_copy_cannot_make(source_run, tmp_path, model, parallel, field):
    _, src_out = source_run
    exp = small_experiment(tmp_path, model={"num_layers": 4, **model}, parallel=dict(pipeline=1, **parallel))
    source = warm_start.find_source(warm_start.source_checkpoints(str(src_out)), None, str(src_out))
    with pytest.raises(WarmStartError) as err:
        warm_start.build(exp, source)
    assert field in str(err.value)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_refuses_a_folder_with_checkpoints_and_unknown_steps(source_run, tmp_path):
    src_exp, src_out = source_run
    source = warm_start.find_source(warm_start.source_checkpoints(str(src_out / "checkpoints")), "11", "s")
    assert source.tag == "global_step11"
    with pytest.raises(WarmStartError, match="step 12"):
        warm_start.find_source(src_out / "checkpoints", "12", "s")
    # the source's own folder already holds checkpoints: never written into
    deeper_in_place = small_experiment(src_out, model=dict(num_layers=4), parallel=dict(pipeline=1))
    before = sorted(p.name for p in (src_out / "checkpoints").iterdir())
    with pytest.raises(WarmStartError, match="paths.checkpoints"):
        warm_start.build(deeper_in_place, source)
    assert sorted(p.name for p in (src_out / "checkpoints").iterdir()) == before
    # CLI: exit code 2, nothing written
    out = tmp_path / "t"
    write_run(small_experiment(out, model=dict(num_layers=2), parallel=dict(pipeline=1)), out)
    result = CliRunner().invoke(main, ["warm-start", "--from", f"{src_out}:16", str(out / "experiment.json")])
    assert result.exit_code == 2 and not (out / "checkpoints").exists()


@pytest.mark.slow
def test_warm_start_with_tp2_copies_each_ranks_files(warm_runs):
    """TP=2: every TP rank's layer file is mapped; a 3-block TP=2 target (blocks from 0, 0, 1) trains on."""
    src_out, out, result, built = warm_runs["tp2"]
    src_valid = scalars(src_out / "tensorboard", "lm loss validation")
    assert result.mapping == [0, 0, 1]
    src_ckpt = src_out / "checkpoints" / "global_step28"
    for new, old in {0: 0, 1: 1, 2: 1, 3: 2, 4: 3}.items():
        for rank in (0, 1):
            assert (built / result.target.name / f"layer_{new:02d}-model_{rank:02d}-model_states.pt").read_bytes() == \
                (src_ckpt / f"layer_{old:02d}-model_{rank:02d}-model_states.pt").read_bytes()
    warm_valid = scalars(out / "tensorboard", "lm loss validation")
    # measured: source 4.54 after 28 steps, warm 4.63 at step 2, a fresh model 5.57
    assert abs(warm_valid[2] - src_valid[max(src_valid)]) < 0.4, (warm_valid, src_valid)


@pytest.mark.slow
def test_from_an_experiment_name(source_run, tmp_path):
    """--from NAME[:STEP] reads the checkpoints of the experiment's paths.output."""
    _, src_out = source_run
    trainings = tmp_path / "trainings"
    trainings.mkdir()
    (trainings / "shallow.yaml").write_text(tiny_yaml(src_out))
    assert warm_start.source_checkpoints("shallow", trainings) == src_out / "checkpoints"
    out = tmp_path / "deep"
    write_run(small_experiment(out, model=dict(num_layers=3), parallel=dict(pipeline=1)), out)
    dry = CliRunner().invoke(main, ["warm-start", "--from", "shallow:16", "--trainings-dir", str(trainings),
                                    str(out / "experiment.json"), "--dry-run"])
    assert dry.exit_code == 0 and "would warm-start" in dry.stdout and "[0, 0, 1]" in dry.stdout, dry.output
    assert not (out / "checkpoints" / "global_step0").exists()
    result = CliRunner().invoke(main, ["warm-start", "--from", "shallow:16", "--trainings-dir", str(trainings),
                                       str(out / "experiment.json")])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "checkpoints" / "global_step0" / "bsops.json").read_text())
    assert meta["warm_start"]["source_iteration"] == 16 and meta["warm_start"]["block_from"] == [0, 0, 1]
    with pytest.raises(WarmStartError, match="no-such-run"):
        warm_start.source_checkpoints("no-such-run", trainings)
