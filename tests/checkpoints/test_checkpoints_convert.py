"""bsops convert: real PP=2 and TP=2 checkpoints of the trainer, on the bundled corpus, loaded with transformers.

One run per layout (9 steps of a 2-layer GPT with the bundled tokenizer's 8192 tokens), several
checks per run: transformers loads the folder; its logits equal the trainer's own forward (PP=2: the
trainer's layers in one process; TP=2: the trainer's TP layers in two gloo processes, each loading
its own shards, the vocab-split logits gathered); AutoTokenizer gives the project tokenizer's ids.
The TP=2 run pads the vocabulary to 8200 (8 rows the converter removes). The PP=2 run has no
padding, so its converted model's loss on the run's validation samples equals the trainer's logged
validation loss exactly (with padding the trainer's softmax also spans the 8 padding logits, so
a model without them scores about 1e-3 nats lower).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from bigscience_ops import sizing
from bigscience_ops.schedule.run import run_schedule
from bigscience_ops.checkpoints import convert
from bigscience_ops.cli import EXIT_ERROR, main
from bigscience_ops.schema import DataSource
from bigscience_ops.errors import BsopsError
from tests.fixtures_git import bare_remote, blob_at, git, lfs_object, lfs_oid
from tests.fixtures_trainer import REPO, concurrently, run_ok, scalars, small_experiment, write_run
from tests.fixtures_runs import commit_checkpoint

VOCAB = 8192  # the bundled tokenizer's size
PADDED = 8200  # TP=2 run: make_vocab_size_divisible_by 100 (x TP 2 = 200): 8 padding rows to remove
DIVISIBLE = {"pp2": 128, "tp2": 100}  # the PP=2 run has no padding (8192 = 64 x 128)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    from bigscience_ops.data.corpus import ensure_bundled_corpus

    return ensure_bundled_corpus(tmp_path_factory.mktemp("corpus"))


def _train(out: Path, corpus: str, tensor: int, pipeline: int, divisible: int):
    """A real run on the bundled corpus (no --synthetic-data)."""
    exp = small_experiment(out, model=dict(vocab_size=VOCAB, make_vocab_size_divisible_by=divisible),
                           parallel=dict(tensor=tensor, pipeline=pipeline, zero_stage=0),
                           train=dict(samples=48, seed=1234, precision="fp32"),
                           checkpoint=dict(save_interval=100, exit_interval=None),
                           data=dict(blend=[DataSource(prefix=corpus)]))
    write_run(exp, out)
    run_ok(out, tensor * pipeline, synthetic=False)
    return exp


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus) -> dict:
    """name -> (experiment, converted folder, Conversion) for PP=2 and TP=2, trained side by side."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("pp2", "tp2")}

    def train_and_convert(name: str, tensor: int, pipeline: int):
        exp = _train(folders[name], corpus, tensor, pipeline, DIVISIBLE[name])
        return exp, folders[name] / "hf", convert.convert(exp, folders[name] / "hf")

    return concurrently({"pp2": lambda: train_and_convert("pp2", 1, 2), "tp2": lambda: train_and_convert("tp2", 2, 1)})


def _hf(folder: Path):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(folder).eval()


def _tokens(n: int = 3, t: int = 32) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(7))


def _meta(exp) -> dict:
    path = Path(exp.paths.checkpoints)
    return json.loads((path / (path / "latest").read_text().strip() / "bsops.json").read_text())


# ---------------------------------------------------------------- the trainer's own forward


def _pp_reference_logits(exp, tokens: torch.Tensor) -> torch.Tensor:
    """The trainer's layers (TP=1) in one process, each loading its own DeepSpeed layer file."""
    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer.model import build_sequential

    meta = _meta(exp)
    path = Path(exp.paths.checkpoints) / f"global_step{meta['iteration']}"
    model = build_sequential(GPTShape(**meta["model"]), exp.train.seed).eval()
    load = lambda i: torch.load(path / f"layer_{i:02d}-model_states.pt", weights_only=True)  # noqa: E731
    model.embedding.load_state_dict(load(0))
    for i, block in enumerate(model.blocks):
        block.load_state_dict(load(i + 1))
    model.final_norm.load_state_dict(load(len(model.blocks) + 1))
    with torch.no_grad():
        return model(tokens)


def _tp_rank(rank: int, path: str, model: dict, seed: int, tokens: torch.Tensor, init: str, result: str) -> None:
    """One TP rank: the trainer's TP layers with this rank's shards; rank 0 saves the gathered logits."""
    import torch.distributed as dist

    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer.model import EmbeddingPipe, FinalNorm, TransformerBlock
    from bigscience_ops.trainer.tensor_parallel import TensorParallel

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        tp = TensorParallel(rank=rank, size=2, group=dist.group.WORLD)
        shape = GPTShape(**model)
        load = lambda i: torch.load(f"{path}/layer_{i:02d}-model_{rank:02d}-model_states.pt", weights_only=True)  # noqa: E731
        emb = EmbeddingPipe(shape, seed, tp=tp)
        emb.load_state_dict(load(0))
        blocks = [TransformerBlock(shape, seed, i + 1, tp=tp) for i in range(shape.num_layers)]
        for i, block in enumerate(blocks):
            block.load_state_dict(load(i + 1))
        final = FinalNorm(shape)
        final.load_state_dict(load(shape.num_layers + 1))
        with torch.no_grad():
            x = emb(tokens)
            for block in blocks:
                x = block.eval()(x)
            local = emb.head(final(x))  # (B, T, V/2): this rank's vocabulary slice
            parts = [torch.empty_like(local) for _ in range(2)]
            dist.all_gather(parts, local.contiguous())
        if rank == 0:
            torch.save(torch.cat(parts, dim=-1), result)
    finally:
        dist.destroy_process_group()


def _tp_reference_logits(exp, tokens: torch.Tensor, tmp_path: Path) -> torch.Tensor:
    import torch.multiprocessing as mp

    meta = _meta(exp)
    path = Path(exp.paths.checkpoints) / f"global_step{meta['iteration']}"
    result = tmp_path / "tp_logits.pt"
    mp.spawn(_tp_rank, args=(str(path), meta["model"], exp.train.seed, tokens, f"file://{tmp_path / 'store'}",
                             str(result)), nprocs=2, join=True)
    return torch.load(result, weights_only=True)


@pytest.mark.slow
def test_pp2_logits_equal_the_trainers(runs):
    exp, folder, _ = runs["pp2"]
    tokens = _tokens()
    reference = _pp_reference_logits(exp, tokens)
    assert reference.shape[-1] == VOCAB
    with torch.no_grad():
        logits = _hf(folder)(tokens).logits
    assert logits.shape == (3, 32, VOCAB)  # vocab padding removed
    torch.testing.assert_close(logits, reference[..., :VOCAB], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_tp2_logits_equal_the_trainers(runs, tmp_path):
    exp, folder, _ = runs["tp2"]
    tokens = _tokens()
    reference = _tp_reference_logits(exp, tokens, tmp_path)
    assert reference.shape == (3, 32, PADDED)
    with torch.no_grad():
        logits = _hf(folder)(tokens).logits
    torch.testing.assert_close(logits, reference[..., :VOCAB], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_converted_model_gives_the_trainers_validation_loss(runs):
    """The trainer's last validation (logged to TensorBoard) read the eval_iters x gbs samples before
    consumed_valid_samples; the HF model's loss on the same samples, averaged the same way, equals it."""
    from bigscience_ops.trainer.data import step_micro_batches
    from bigscience_ops.trainer.train import Trainer

    exp, folder, conversion = runs["pp2"]
    meta = _meta(exp)
    logged = scalars(Path(exp.paths.tensorboard), "lm loss validation")
    assert list(logged) == [meta["iteration"]]
    trainer = Trainer(exp, {})
    trainer._build_data()  # the trainer's own validation dataset
    gbs = run_schedule(exp).batch.batch_size_at(meta["consumed_train_samples"])
    eval_iters, mbs = exp.logging.eval_iters, exp.batch.micro_batch_size
    start = meta["state"]["consumed_valid_samples"] - eval_iters * gbs
    assert start == 0
    model = _hf(folder)
    losses = []
    with torch.no_grad():
        for it in range(eval_iters):
            micro = []
            for tokens, (labels, mask) in step_micro_batches(trainer.valid_ds, start + it * gbs, gbs // mbs, mbs, 0, 1):
                logits = model(tokens).logits
                ce = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none")
                micro.append(float((ce * mask.reshape(-1)).sum() / mask.sum()))
            losses.append(sum(micro) / len(micro))
    assert sum(losses) / len(losses) == pytest.approx(logged[meta["iteration"]], rel=1e-6)
    assert conversion.iteration == meta["iteration"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2", "tp2"])
def test_output_folder_loads_with_transformers(runs, name):
    from transformers import AutoTokenizer

    from bigscience_ops.data.tokenizer import HFTokenizer, TokenizerSpec

    exp, folder, conversion = runs[name]
    model = _hf(folder)
    cfg = model.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_inner, cfg.vocab_size, cfg.n_positions) == (2, 64, 4, 256, VOCAB, 32)
    assert cfg.activation_function == "gelu_new" and cfg.eos_token_id == 0
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied head
    assert conversion.num_parameters == sum(p.numel() for p in model.parameters())
    unpadded = dataclasses.replace(exp.model, make_vocab_size_divisible_by=1)
    assert sizing.count_parameters(unpadded, 1).total == conversion.num_parameters  # the plan's count, no padding
    assert {p.name for p in folder.iterdir()} >= {"model.safetensors", "config.json", "tokenizer.json",
                                                   "tokenizer_config.json"}
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir() if p.is_file()}
    assert len(set(modes.values())) == 1, modes  # the weights as readable as the rest (safetensors writes 0600)
    text = "In the beginning God created the heaven and the earth."
    ours = HFTokenizer(TokenizerSpec("json", json_file=exp.data.tokenizer.json_file)).encode(text)
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok(text)["input_ids"] == ours and tok.eos_token_id == 0
    assert tok.decode(ours) == text


@pytest.mark.slow
def test_bf16_output_and_step_selection(runs, tmp_path):
    exp, folder, _ = runs["pp2"]
    meta = _meta(exp)
    out = tmp_path / "bf16"
    conversion = convert.convert(exp, out, step=meta["iteration"], dtype="bfloat16")
    model = _hf(out)
    assert model.transformer.wte.weight.dtype == torch.bfloat16
    fp32 = _hf(folder)
    torch.testing.assert_close(model.transformer.wte.weight.float(), fp32.transformer.wte.weight, rtol=1e-2, atol=1e-3)
    assert conversion.tag == f"global_step{meta['iteration']}"
    with pytest.raises(convert.ConvertError) as err:
        convert.convert(exp, tmp_path / "nope", step=meta["iteration"] + 1)
    assert str(meta["iteration"]) in str(err.value)  # lists the steps that exist
    with pytest.raises(convert.ConvertError):  # not empty
        convert.convert(exp, out)


def test_refuses_what_gpt2_cannot_express():
    model = dict(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96, seq_length=32,
                 max_position_embeddings=32, padded_vocab_size=256, embed_layernorm=False, init_method_std=0.02,
                 hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-5)
    assert convert.gpt2_config(model, 250, 0)["n_inner"] == 96  # a non-4h MLP is fine
    with pytest.raises(convert.ConvertError) as err:
        convert.gpt2_config({**model, "embed_layernorm": True}, 250, 0)
    assert "embed_layernorm" in str(err.value)
    with pytest.raises(convert.ConvertError) as err:
        convert.gpt2_config({**model, "rotary_embeddings": True}, 250, 0)
    assert "rotary_embeddings" in str(err.value)
    with pytest.raises(convert.ConvertError):
        convert.gpt2_config(model, 300, 0)  # more tokens than the padded vocabulary
    assert issubclass(convert.ConvertError, BsopsError)


def test_qkv_regrouping_matches_the_trainers_head_split():
    """Rows [head: q k v] -> c_attn columns [q heads | k heads | v heads], checked on labelled rows."""
    heads, hs, h = 3, 2, 6
    weight = torch.arange(3 * h, dtype=torch.float32).unsqueeze(1).repeat(1, h)  # row r holds r
    w, b = convert.qkv_to_c_attn(weight, torch.arange(3 * h, dtype=torch.float32), heads)
    assert w.shape == (h, 3 * h)
    for part in range(3):  # q, k, v
        for head in range(heads):
            for j in range(hs):
                trainer_row = head * 3 * hs + part * hs + j
                assert w[0, part * h + head * hs + j] == trainer_row and b[part * h + head * hs + j] == trainer_row


def test_alibi_is_refused_before_any_checkpoint_is_looked_for_and_a_push_names_remote(tmp_path):
    alibi = small_experiment(tmp_path / "run", model=dict(position_embedding="alibi"))
    with pytest.raises(convert.ConvertError) as err:  # the run has no checkpoint at all
        convert.convert(alibi, tmp_path / "out")
    assert "position_embedding = 'alibi'" in str(err.value) and "latest" not in str(err.value)
    with pytest.raises(convert.ConvertError, match="or pass --remote URL"):
        convert.check_push(alibi)


@pytest.mark.slow
def test_convert_command(runs, trainings, tmp_path, gpt2_files):
    exp, _, _ = runs["pp2"]
    src = Path(exp.paths.output)
    _conv_yaml(trainings, exp, "conv", tmp_path / "run")  # a run folder of its own (no record): today's YAML
    out = tmp_path / "cli"
    by_folder = CliRunner().invoke(main, ["convert", "--run", str(src), "--out", str(tmp_path / "by-folder")])
    assert by_folder.exit_code == 0, by_folder.output  # the run named by its folder: the model its record holds
    assert (tmp_path / "by-folder" / "model.safetensors").is_file()
    dry = CliRunner().invoke(main, ["convert", "--run", str(src), "--out", str(tmp_path / "dry"), "--dry-run"])
    assert dry.exit_code == 0 and "would convert global_step" in dry.stdout, dry.output  # checked, nothing written
    assert not (tmp_path / "dry").exists()
    other = CliRunner().invoke(main, ["convert", "conv", "--run", str(src), "--trainings-dir", str(trainings),
                                      "--out", str(tmp_path / "other")])
    assert other.exit_code == EXIT_ERROR and "records experiment 'tiny', not 'conv'" in other.stderr
    result = CliRunner().invoke(main, ["convert", "conv", "--trainings-dir", str(trainings), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file()
    again = CliRunner().invoke(main, ["convert", "conv", "--trainings-dir", str(trainings), "--out", str(out),
                                      "--step", "12345"])
    assert again.exit_code == EXIT_ERROR
    full = CliRunner().invoke(main, ["convert", "conv", "--trainings-dir", str(trainings), "--out", str(out)])
    assert full.exit_code == EXIT_ERROR and "pass --overwrite" in full.stderr  # names the option that allows it
    push = CliRunner().invoke(main, ["convert", "conv", "--trainings-dir", str(trainings), "--out", str(tmp_path / "p"),
                                     "--push"])
    assert push.exit_code == EXIT_ERROR and not (tmp_path / "p").exists()  # refused before converting: no repo
    (trainings / "gpt2tok.yaml").write_text(
        "base: conv\n"
        f"data: {{tokenizer: {{kind: gpt2-bpe, vocab_file: {gpt2_files[0]!r}, merges_file: {gpt2_files[1]!r}}}}}\n")
    wrong = CliRunner().invoke(main, ["convert", "gpt2tok", "--trainings-dir", str(trainings), "--out", str(tmp_path / "s")])
    assert wrong.exit_code == EXIT_ERROR and not (tmp_path / "s").exists()  # GPT-2's 50257 tokens > the model's 8192


@pytest.mark.slow
def test_convert_of_a_copy_of_tiny_finds_its_tokenizer_from_any_folder(runs, tmp_path, monkeypatch):
    """tiny copied as it is into a project's own trainings/ (the project has no corpus/), its run folder the
    project's runs/tiny holding the PP=2 run's checkpoints, converted from another folder: the tokenizer is
    the bundled corpus's (a relative corpus/ input the project lacks), not a missing one beside the copy."""
    exp, _, _ = runs["pp2"]
    project = tmp_path / "project"
    (project / "trainings").mkdir(parents=True)
    shutil.copy(REPO / "trainings" / "tiny.yaml", project / "trainings")
    (project / "runs" / "tiny").mkdir(parents=True)
    (project / "runs" / "tiny" / "checkpoints").symlink_to(exp.paths.checkpoints)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.delenv("BSOPS_DATA_DIR", raising=False)
    result = CliRunner().invoke(main, ["convert", "tiny", "--trainings-dir", str(project / "trainings"), "--out", "hf"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "elsewhere" / "hf"
    assert (out / "model.safetensors").is_file()
    assert (out / "tokenizer.json").read_bytes() == (REPO / "corpus" / "tokenizer.json").read_bytes()

@pytest.mark.slow
def test_convert_push_publishes_one_folder_per_step(runs, trainings, tmp_path, git_lfs):
    """--push through hub-sync's publish_folder to a local bare remote with real git-lfs: global_stepN/ on main."""
    exp, _, _ = runs["pp2"]
    remotes = tmp_path / "remotes"
    bare = bare_remote(remotes, "bs/conv-checkpoints")
    _conv_yaml(trainings, exp, "pushed", tmp_path / "run",
               f"hub: {{checkpoints_repo: bs/conv-checkpoints, remote_template: 'file://{remotes}/{{repo}}.git'}}\n")
    out = tmp_path / "pushed"
    result = CliRunner().invoke(main, ["convert", "pushed", "--trainings-dir", str(trainings), "--out", str(out), "--push"])
    assert result.exit_code == 0, result.output
    tag = f"global_step{_meta(exp)['iteration']}"
    tree = git("--git-dir", str(bare), "ls-tree", "-r", "--name-only", "main").split()
    assert {f"{tag}/{name}" for name in ("model.safetensors", "config.json", "tokenizer.json")} <= set(tree)
    oid = lfs_oid(blob_at(bare, f"{tag}/model.safetensors"))  # the weights travel as an LFS object
    assert lfs_object(bare, oid).read_bytes() == (out / "model.safetensors").read_bytes()
    assert json.loads(blob_at(bare, f"{tag}/config.json")) == json.loads((out / "config.json").read_text())


# ---------------------------------------------------------------- sharded weights

SMALL_SHARD = 100_000  # bytes: the 2-layer model (2.2 MB, 2.1 MB of it the word embedding) takes >= 3 shards


def _weight_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if "safetensors" in p.name)


def _checkpoint(exp) -> tuple[Path, dict]:
    meta = _meta(exp)
    return Path(exp.paths.checkpoints) / f"global_step{meta['iteration']}", meta


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2", "tp2"])
def test_sharded_conversion_loads_and_equals_the_single_file(runs, tmp_path, name):
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors import safe_open

    exp, single, conversion = runs[name]
    out = tmp_path / "sharded"
    sharded = convert.convert(exp, out, max_shard_size="100KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    n = len(shards)
    assert n >= 3
    assert shards == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert _weight_files(out) == [*shards, "model.safetensors.index.json"]  # no model.safetensors, no partial shard
    assert sorted(sharded.files) == sorted(p.name for p in out.iterdir())  # what a push uploads, all listed
    seen = []
    for shard in shards:
        with safe_open(out / shard, "pt") as f:
            assert f.metadata() == {"format": "pt"}
            keys = list(f.keys())
            size = sum(f.get_tensor(key).nbytes for key in keys)
        seen += [(key, shard) for key in keys]
        assert size <= SMALL_SHARD or len(keys) == 1, (shard, size)  # over the limit only when alone
    assert len(seen) == len(dict(seen)) and dict(seen) == index["weight_map"]  # every tensor once, where indexed
    with safe_open(single / "model.safetensors", "pt") as f:
        assert set(f.keys()) == set(index["weight_map"])
    # huggingface_hub's own split of the same state dict, in the same order, with the same limit
    path, meta = _checkpoint(exp)
    ordered = {k: v.clone() for k, v in convert.gpt2_tensors(path, meta["model"], meta["parallel"]["tensor"], VOCAB)}
    split = split_torch_state_dict_into_shards(ordered, max_shard_size=SMALL_SHARD)
    assert split.tensor_to_filename == index["weight_map"]
    assert index["metadata"] == {"total_size": split.metadata["total_size"], "total_parameters": conversion.num_parameters}
    assert sharded.num_parameters == conversion.num_parameters
    tokens = _tokens()
    with torch.no_grad():
        assert torch.equal(_hf(out)(tokens).logits, _hf(single)(tokens).logits)


@pytest.mark.slow
def test_default_size_writes_one_file_and_the_limit_is_inclusive(runs, tmp_path):
    exp, folder, conversion = runs["pp2"]
    assert _weight_files(folder) == ["model.safetensors"]  # 5GB default: no index
    assert conversion.files[0] == "model.safetensors"
    assert sorted(conversion.files) == sorted(p.name for p in folder.iterdir())
    path, meta = _checkpoint(exp)
    total = sum(t.nbytes for _, t in convert.gpt2_tensors(path, meta["model"], 1, VOCAB))
    exact = convert.convert(exp, tmp_path / "exact", max_shard_size=total)
    assert _weight_files(exact.out) == ["model.safetensors"]  # a shard may hold exactly max_shard_size bytes
    over = convert.convert(exp, tmp_path / "over", max_shard_size=total - 1)
    assert _weight_files(over.out) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                       "model.safetensors.index.json"]


@pytest.mark.slow
def test_overwrite_leaves_no_weights_of_the_earlier_conversion(runs, tmp_path):
    """transformers loads model.safetensors before any index, and a push uploads every file of the folder."""
    exp, single, _ = runs["pp2"]
    out = tmp_path / "again"
    convert.convert(exp, out)
    convert.convert(exp, out, overwrite=True, max_shard_size=SMALL_SHARD)
    assert "model.safetensors" not in _weight_files(out) and "model.safetensors.index.json" in _weight_files(out)
    tokens = _tokens(1, 8)
    with torch.no_grad():
        assert torch.equal(_hf(out)(tokens).logits, _hf(single)(tokens).logits)
    convert.convert(exp, out, overwrite=True)
    assert _weight_files(out) == ["model.safetensors"]


def _tensors(sizes: dict[str, int], on_yield=None):
    for i, (name, numel) in enumerate(sizes.items()):
        if on_yield:
            on_yield(i)
        yield name, torch.full((numel,), float(i))


def test_write_weights_streams_shards_and_gives_a_large_tensor_its_own(tmp_path):
    from safetensors.torch import load_file

    sizes = {"a": 4, "b": 4, "big": 20, "d": 4, "e": 4, "f": 4}  # float32: 16, 16, 80 (> 40), 16, 16, 16 bytes
    on_disk = {}
    weights = convert.write_weights(_tensors(sizes, lambda i: on_disk.setdefault(i, len(list(tmp_path.iterdir())))),
                                    tmp_path, 40)
    assert on_disk == {0: 0, 1: 0, 2: 0, 3: 2, 4: 2, 5: 2}  # [a b] and [big] were written before d was produced
    names = [f"model-{k:05d}-of-00004.safetensors" for k in range(1, 5)]
    assert weights.files == [*names, "model.safetensors.index.json"]
    assert [sorted(load_file(tmp_path / n)) for n in names] == [["a", "b"], ["big"], ["d", "e"], ["f"]]
    assert torch.equal(load_file(tmp_path / names[1])["big"], torch.full((20,), 2.0))
    assert (weights.total_size, weights.num_parameters) == (160, 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(weights.files)


def test_write_weights_removes_its_shards_when_the_tensors_fail(tmp_path):
    def failing():
        yield from _tensors({"a": 8, "b": 8, "c": 8})
        raise convert.ConvertError("layer 3 is missing")

    with pytest.raises(convert.ConvertError, match="layer 3"):
        convert.write_weights(failing(), tmp_path, 40)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["5XB", "0", "-1GB", "1.5", "GB", "5 G B", 0])
def test_bad_shard_sizes_are_refused_before_anything_is_written(runs, tmp_path, bad):
    exp, _, _ = runs["pp2"]
    with pytest.raises(convert.ConvertError) as err:
        convert.convert(exp, tmp_path / "out", max_shard_size=bad)
    assert repr(bad) in str(err.value) and "5GB" in str(err.value)  # the value, and what is allowed
    assert not (tmp_path / "out").exists()


def test_shard_sizes_parse_as_transformers_reads_them():
    from huggingface_hub.serialization._base import parse_size_to_int

    for size in ("5GB", "500MB", "1.5GB", "100KB", "2TB"):
        assert convert.parse_size(size) == parse_size_to_int(size)
    assert convert.parse_size("2GiB") == 2 * 2**30 and convert.parse_size("12345") == convert.parse_size(12345) == 12345


def _conv_yaml(trainings: Path, exp, name: str, output: Path, extra: str = "") -> None:
    """An experiment whose checkpoints are `exp`'s, its run folder (and so hub-sync's clones) at `output`."""
    (trainings / f"{name}.yaml").write_text(
        "base: tiny\n"
        f"model: {{num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: {VOCAB}, "
        "ffn_hidden_size: 256, make_vocab_size_divisible_by: 128}\n"
        f"paths: {{output: {str(output)!r}, checkpoints: {exp.paths.checkpoints!r}}}\n"
        f"data: {{tokenizer: {{kind: json, json_file: {exp.data.tokenizer.json_file!r}}}}}\n" + extra)


@pytest.mark.slow
def test_convert_command_max_shard_size(runs, trainings, tmp_path):
    exp, single, _ = runs["pp2"]
    _conv_yaml(trainings, exp, "shards", tmp_path / "run")
    cli = ["convert", "shards", "--trainings-dir", str(trainings)]
    out = tmp_path / "cli"
    result = CliRunner().invoke(main, [*cli, "--out", str(out), "--max-shard-size", "100KB"])
    assert result.exit_code == 0, result.output
    n = len(_weight_files(out)) - 1
    assert n >= 3 and f"model-00001-of-{n:05d}.safetensors ... model-{n:05d}-of-{n:05d}" in result.output
    bad = CliRunner().invoke(main, [*cli, "--out", str(tmp_path / "bad"), "--max-shard-size", "12QB"])
    assert bad.exit_code == EXIT_ERROR and "'12QB'" in bad.output and not (tmp_path / "bad").exists()
    hub = CliRunner().invoke(main, [*cli, "--out", str(tmp_path / "hub"), "--max-shard-size", "60GB", "--push",
                                    "--remote", f"file://{tmp_path}/nowhere.git"])
    assert hub.exit_code == EXIT_ERROR and "'60GB'" in hub.output and "50GB" in hub.output
    assert not (tmp_path / "hub").exists()  # refused before converting


@pytest.mark.slow
def test_convert_push_uploads_every_shard_and_the_index(runs, trainings, tmp_path, git_lfs):
    exp, _, _ = runs["pp2"]
    remotes = tmp_path / "remotes"
    bare = bare_remote(remotes, "bs/shard-checkpoints")
    _conv_yaml(trainings, exp, "pushshards", tmp_path / "run",
               f"hub: {{checkpoints_repo: bs/shard-checkpoints, remote_template: 'file://{remotes}/{{repo}}.git'}}\n")
    out = tmp_path / "pushed"
    result = CliRunner().invoke(main, ["convert", "pushshards", "--trainings-dir", str(trainings), "--out", str(out),
                                       "--max-shard-size", "100KB", "--push"])
    assert result.exit_code == 0, result.output
    tag = f"global_step{_meta(exp)['iteration']}"
    tree = git("--git-dir", str(bare), "ls-tree", "-r", "--name-only", "main").split()
    assert {f"{tag}/{p.name}" for p in out.iterdir()} == {name for name in tree if name.startswith(f"{tag}/")}
    for shard in _weight_files(out)[:-1]:
        oid = lfs_oid(blob_at(bare, f"{tag}/{shard}"))
        assert lfs_object(bare, oid).read_bytes() == (out / shard).read_bytes()
    index = blob_at(bare, f"{tag}/model.safetensors.index.json")
    assert json.loads(index) == json.loads((out / "model.safetensors.index.json").read_text())


# ---------------------------------------------------------------- memory: one shard, not the model

PEAK_RSS = """
import json, sys
import torch, safetensors.torch
from bigscience_ops.checkpoints import convert
from bigscience_ops.config.loading import from_dict

def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field + ":"))

exp = from_dict(json.loads(open(sys.argv[1]).read()))
before = status("VmRSS")
convert.convert(exp, sys.argv[2], max_shard_size=sys.argv[3], dtype=sys.argv[4])
print(json.dumps({"before": before, "peak": status("VmHWM")}))
"""


def _large_checkpoint(exp, root: Path, layers: int, hidden: int) -> Path:
    """`exp`'s run with its checkpoint replaced by a wider, deeper one (the trainer's own layers, TP=1, random
    weights) in DeepSpeed's per-layer files under `root`; the experiment.json that points at it."""
    from bigscience_ops.config.loading import to_dict
    from bigscience_ops.sizing import GPTShape
    from bigscience_ops.trainer.model import EmbeddingPipe, FinalNorm, TransformerBlock

    meta = _meta(exp)
    model = {**meta["model"], "num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": 4 * hidden,
             "num_attention_heads": hidden // 64, "padded_vocab_size": VOCAB}
    shape = GPTShape(**model)
    step = root / "checkpoints" / f"global_step{meta['iteration']}"
    step.mkdir(parents=True)
    with torch.no_grad():
        torch.save(EmbeddingPipe(shape, 1).state_dict(), step / "layer_00-model_states.pt")
        for i in range(layers):
            torch.save(TransformerBlock(shape, 1, i + 1).state_dict(), step / f"layer_{i + 1:02d}-model_states.pt")
        torch.save(FinalNorm(shape).state_dict(), step / f"layer_{layers + 1:02d}-model_states.pt")
    (step / "bsops.json").write_text(json.dumps({**meta, "model": model, "parallel": {**meta["parallel"], "tensor": 1}}))
    commit_checkpoint(step)
    (step.parent / "latest").write_text(step.name)
    big = dataclasses.replace(exp, paths=dataclasses.replace(exp.paths, checkpoints=str(step.parent)))
    (root / "experiment.json").write_text(json.dumps(to_dict(big)))
    return root / "experiment.json"


def _peak_rss(experiment: Path, out: Path, max_shard_size: str, dtype: str = "float32") -> int:
    """Bytes the conversion took on top of what the process held before it (VmHWM - VmRSS), in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(experiment), str(out), max_shard_size,
                           dtype], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rss = json.loads(proc.stdout.splitlines()[-1])
    return rss["peak"] - rss["before"]


@pytest.mark.slow
def test_sharded_conversion_holds_a_shard_not_the_model(runs, tmp_path):
    """A 16-layer 384-wide model (126 MB of fp32 weights): the single file holds all of them at once, 4MB shards
    about one shard plus one layer (measured 158 MB and 32 MB over the process's size before converting)."""
    exp, _, _ = runs["pp2"]
    experiment = _large_checkpoint(exp, tmp_path / "large", layers=16, hidden=384)
    single = _peak_rss(experiment, tmp_path / "single", "5GB")
    weights = (tmp_path / "single" / "model.safetensors").stat().st_size
    sharded = _peak_rss(experiment, tmp_path / "sharded", "4MB")
    assert len(_weight_files(tmp_path / "sharded")) > 30
    assert single >= weights and sharded < weights / 2, (single, sharded, weights)
