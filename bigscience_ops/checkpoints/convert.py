"""A DeepSpeed checkpoint of the bundled trainer -> a transformers GPT-2 model folder.

The trainer's GPT is GPT-2's architecture (learned positions, pre-LN blocks, tanh GeLU, final
LayerNorm, head tied to the word embedding), so a checkpoint becomes a `GPT2LMHeadModel`:

    model.safetensors      the weights, TP shards and pipeline stages merged, vocab padding removed;
                           past max_shard_size (default 5GB) model-00001-of-0000N.safetensors ...
                           and model.safetensors.index.json instead, as transformers' save_pretrained
    config.json            GPT2Config (activation "gelu_new", n_inner = ffn_hidden_size)
    tokenizer files        the experiment's tokenizer, laid out so AutoTokenizer loads it
    bsops_conversion.json  where the weights came from (experiment, step, consumed tokens, TP/PP)

Streaming: the weights are produced one pipeline layer at a time (`gpt2_tensors` is a generator)
and written into a shard as soon as the next tensor would take it past max_shard_size, so memory
holds about one shard plus one layer's TP pieces, never the model (tr8-104B is ~208 GB in bf16).
How many shards there are is known only at the end, so they are written under temporary names
(.model-00001.safetensors.partial) and renamed when the last one is closed; sizing them first from
the shapes would repeat, in a second place, what every layer's tensors are. A tensor larger than
max_shard_size gets a shard of its own. The Hub refuses files over 50 GB, so a push refuses a
larger max_shard_size before converting, and any written file over it before uploading.

What DeepSpeed's pipeline engine writes per layer (`layer_XX-model_states.pt`, or with TP > 1
`layer_XX-model_RR-model_states.pt` per TP rank RR): layer 0 the embedding (word + positions),
layers 1..L the blocks, L+1 the final LayerNorm; the tied head is the word embedding and is not
saved again. Layer numbers are global, so pipeline stages need no merging beyond reading every file.

TP shards (see trainer/tensor_parallel.py) are merged by concatenation: column-parallel weights
and biases (fused QKV, h -> ffn, the word embedding) along their output rows, row-parallel weights
(attention output, ffn -> h) along their input columns; everything else is replicated and must be
equal on every rank.

QKV: the trainer fuses it per head, rows [head0: q k v, head1: q k v, ...] (B, T, nh, 3 hs); GPT-2's
c_attn is a Conv1D (weight (in, out), y = x W + b) whose outputs are [q of all heads, k ..., v ...].
So rows are regrouped (nh, 3, hs) -> (3, nh, hs), and every Linear weight is transposed for Conv1D.

Vocab padding: the trainer's softmax spans the padded vocabulary (as Megatron's does); the converted
model has only the tokenizer's vocab_size logits, so its loss is that of the trained model restricted
to real tokens (lower by the probability mass the padding rows held, about 1e-3 nats when small).

What GPT-2 cannot express is refused by name (embed_layernorm, position_embedding alibi, and any
model option this converter does not know).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bigscience_ops.checkpoints import layout
from bigscience_ops.checkpoints import manifest
from bigscience_ops.checkpoints.layout import META, CheckpointError
from bigscience_ops.errors import BsopsError

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
EOD_TOKEN = "<|endoftext|>"

# Weight files, named as transformers names them (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, and
# huggingface_hub's "model{suffix}.safetensors" with suffix -00001-of-00042).
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
SHARD = "model-{index:05d}-of-{count:05d}.safetensors"
PARTIAL = ".model-{index:05d}.safetensors.partial"  # a shard while the number of shards is unknown
# What an earlier conversion into the same folder may have left: removed before writing with overwrite,
# since transformers loads a stale model.safetensors before any index, and a push uploads every file.
WEIGHT_FILES = re.compile(r"model\.safetensors|model\.safetensors\.index\.json|model-\d{5}-of-\d{5}\.safetensors"
                          r"|\.model-\d{5}\.safetensors\.partial")
MAX_SHARD_SIZE = "5GB"  # transformers' default
HUB_FILE_LIMIT = 50 * 10**9  # the Hugging Face Hub refuses larger files
SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")

# Model options the trainer records in bsops.json, and what each becomes in GPT-2.
EXPRESSIBLE = {"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
               "max_position_embeddings", "padded_vocab_size", "init_method_std", "hidden_dropout",
               "attention_dropout", "layernorm_epsilon"}
# Model options GPT-2 can express only at one value: option -> (that value, why any other is refused).
# A checkpoint whose bsops.json predates an option has its GPT-2 value.
REFUSED = {"embed_layernorm": (False, "GPT-2 has no LayerNorm after the embedding"),
           "position_embedding": ("learned", "GPT-2 has learned position embeddings only, no ALiBi; "
                                             "position_embedding alibi cannot be converted to GPT-2")}

# Per trainer parameter name: the TP split dimension (None: replicated on every TP rank).
BLOCK_SPLIT = {
    "input_layernorm.weight": None, "input_layernorm.bias": None,
    "self_attention.query_key_value.weight": 0, "self_attention.query_key_value.bias": 0,
    "self_attention.dense.weight": 1, "self_attention.dense.bias": None,
    "post_attention_layernorm.weight": None, "post_attention_layernorm.bias": None,
    "mlp.dense_h_to_4h.weight": 0, "mlp.bias_h_to_4h": 0,
    "mlp.dense_4h_to_h.weight": 1, "mlp.dense_4h_to_h.bias": None,
}
EMBEDDING_SPLIT = {"word_embeddings.weight": 0, "position_embeddings.weight": None}
FINAL_NORM_SPLIT = {"weight": None, "bias": None}


class ConvertError(BsopsError):
    """A checkpoint cannot be converted: names the checkpoint, what is wrong and what is allowed."""


SIZE_ALLOWED = ("allowed: a positive whole number of bytes, or a number with a unit KB, MB, GB, TB "
                "(powers of 1000, as transformers' max_shard_size) or KiB, MiB, GiB, TiB (powers of 1024), "
                "e.g. 5GB or 500MB")


def parse_size(size: int | str, field: str = "max_shard_size") -> int:
    """Bytes in a transformers-style size: 5GB, 500MB, 1.5GB, 2GiB, or a whole number of bytes."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        m = SIZE.fullmatch(size) if isinstance(size, str) else None
        unit = m.group(2).upper() if m else ""
        if m is None or (unit and unit not in SIZE_UNITS) or (not unit and not m.group(1).isdigit()):
            raise ConvertError(f"{field} {size!r} is not a size; {SIZE_ALLOWED}")
        value = int(float(m.group(1)) * SIZE_UNITS[unit]) if unit else int(m.group(1))
    if value < 1:
        raise ConvertError(f"{field} {size!r} is {value} bytes; {SIZE_ALLOWED}")
    return value


@dataclass(frozen=True)
class Conversion:
    """What `convert` wrote."""

    out: Path
    tag: str
    iteration: int
    config: dict
    files: list[str]
    num_parameters: int


# ---------------------------------------------------------------- which checkpoint


def select_checkpoint(checkpoints: Path, step: int | None = None) -> tuple[str, Path, dict]:
    """(tag, folder, bsops.json) of `global_step<step>`, or of the one `latest` names when step is None; it must be
    a complete checkpoint whose files match its manifest (sizes and hashes): nothing else is converted."""
    checkpoints = Path(checkpoints)
    try:
        complete = ", ".join(str(c.step) for c in layout.complete_checkpoints(checkpoints)) or "none"
        if step is None:
            step = layout.resume_step(checkpoints)  # `latest` when it names a complete checkpoint, else the newest
        tag = None if step is None else f"global_step{step}"
    except CheckpointError as exc:
        raise ConvertError(str(exc)) from None
    if tag is None:
        raise ConvertError(f"{checkpoints}: no complete checkpoint to convert; complete steps: {complete} (pick one "
                           "with --step once the run has saved)")
    ckpt = layout.Checkpoint(tag, layout.step_of(tag), checkpoints / tag)
    if not ckpt.path.is_dir() or ckpt.is_link:
        raise ConvertError(f"{checkpoints}: no checkpoint folder {tag!r}; complete steps: {complete}")
    try:
        found = ckpt.manifest()
        if found is None:
            raise ConvertError(f"{ckpt.path}: no {manifest.MANIFEST}: the save did not finish (or was made before "
                               f"manifests: `bsops verify --adopt` adopts it); complete steps: {complete}")
        bad = manifest.verify(ckpt.path, found).mismatches
        if bad:
            raise ConvertError(f"{ckpt.path} does not match its manifest: {bad[0]}; complete steps: {complete}")
        return tag, ckpt.path, ckpt.meta()
    except CheckpointError as exc:
        raise ConvertError(str(exc)) from None


# ---------------------------------------------------------------- config


def _refuse(problems: list[str]) -> None:
    if problems:
        raise ConvertError("cannot convert to GPT-2: " + "; ".join(problems)
                           + f". Convertible options: {', '.join(sorted(EXPRESSIBLE))}, with "
                           + ", ".join(f"{k} {json.dumps(ok)}" for k, (ok, _) in REFUSED.items()))


def refuse_inexpressible(model: dict) -> None:
    """ConvertError naming each REFUSED option of `model` (the experiment's or a checkpoint's) GPT-2 lacks."""
    _refuse([f"model.{k} = {model[k]!r}: {why}" for k, (ok, why) in REFUSED.items() if model.get(k, ok) != ok])


def gpt2_config(model: dict, vocab_size: int, eod_id: int | None, dtype: str = "float32") -> dict:
    """GPT2Config as a dict for the trainer's model options (bsops.json "model"); refuses what GPT-2 lacks."""
    problems = [f"model.{k} = {model[k]!r}: {why}" for k, (ok, why) in REFUSED.items() if model.get(k, ok) != ok]
    unknown = sorted(set(model) - EXPRESSIBLE - set(REFUSED))
    problems += [f"model.{k} = {model[k]!r}: an option this converter does not know how to express in GPT-2"
                 for k in unknown]
    _refuse(problems)
    if dtype not in DTYPES:
        raise ConvertError(f"dtype {dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    if not 0 < vocab_size <= model["padded_vocab_size"]:
        raise ConvertError(f"vocab_size {vocab_size} does not fit the checkpoint's padded vocabulary "
                           f"{model['padded_vocab_size']}; allowed: 1 to {model['padded_vocab_size']}")
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": model["max_position_embeddings"],
        "n_embd": model["hidden_size"],
        "n_layer": model["num_layers"],
        "n_head": model["num_attention_heads"],
        "n_inner": model["ffn_hidden_size"],
        "activation_function": "gelu_new",  # the tanh approximation, as the trainer's bias_gelu
        "resid_pdrop": model["hidden_dropout"],
        "embd_pdrop": model["hidden_dropout"],
        "attn_pdrop": model["attention_dropout"],
        "layer_norm_epsilon": model["layernorm_epsilon"],
        "initializer_range": model["init_method_std"],
        "scale_attn_weights": True,  # 1/sqrt(head size), as the trainer's attention
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": eod_id,
        "eos_token_id": eod_id,
        "torch_dtype": dtype,
        "use_cache": True,
    }


# ---------------------------------------------------------------- weights


def layer_files(path: Path, index: int, tensor: int) -> list[Path]:
    """DeepSpeed's file(s) for pipeline layer `index`, one per TP rank."""
    if tensor == 1:
        return [Path(path) / f"layer_{index:02d}-model_states.pt"]
    return [Path(path) / f"layer_{index:02d}-model_{rank:02d}-model_states.pt" for rank in range(tensor)]


def check_layer_files(path: Path, layers: int, tensor: int) -> None:
    """Refuse a checkpoint missing any layer file before hours are spent converting the layers before it."""
    missing = [f.name for i in range(layers + 2) for f in layer_files(path, i, tensor) if not f.is_file()]
    if missing:
        raise ConvertError(f"{path}: missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
                           f"({len(missing)} of the {(layers + 2) * tensor} layer files for {layers} blocks, "
                           f"TP={tensor}); the checkpoint is incomplete or was not written by bsops' trainer")


def _load_layer(path: Path, index: int, tensor: int, expected: dict) -> list[dict]:
    import torch

    shards = []
    for file in layer_files(path, index, tensor):
        if not file.is_file():
            raise ConvertError(f"{path}: missing {file.name} (layer {index}, TP={tensor}); "
                               "the checkpoint is incomplete or was not written by bsops' trainer")
        state = torch.load(file, map_location="cpu", weights_only=True)
        if set(state) != set(expected):
            raise ConvertError(f"{file}: holds {sorted(state)}; expected {sorted(expected)} "
                               "(a model option GPT-2 cannot express, or another trainer's checkpoint)")
        shards.append(state)
    return shards


def _merge(shards: list[dict], split: dict, where: str) -> dict:
    """One full state dict from the TP ranks' shards: concatenated along the split dim, or the replicated copy."""
    import torch

    merged = {}
    for name, dim in split.items():
        parts = [s[name] for s in shards]
        if dim is not None:
            merged[name] = torch.cat(parts, dim=dim)
            continue
        for rank, part in enumerate(parts[1:], start=1):
            if part.shape != parts[0].shape or not torch.allclose(part.float(), parts[0].float(), rtol=1e-3, atol=1e-5):
                raise ConvertError(f"{where}: {name} should be replicated over TP ranks but rank {rank} differs "
                                   "from rank 0; the checkpoint is inconsistent")
        merged[name] = parts[0]
    return merged


def qkv_to_c_attn(weight, bias, num_heads: int) -> tuple:
    """The trainer's fused QKV (3h, h) per-head [q k v] rows -> GPT-2's c_attn Conv1D weight (h, 3h) and bias (3h,)."""
    three_h, h = weight.shape
    head_size = three_h // (3 * num_heads)
    w = weight.view(num_heads, 3, head_size, h).transpose(0, 1).reshape(three_h, h)  # [q heads, k heads, v heads]
    b = bias.view(num_heads, 3, head_size).transpose(0, 1).reshape(three_h)
    return w.t(), b


def gpt2_tensors(path: Path, model: dict, tensor: int, vocab_size: int, dtype: str = "float32",
                 progress: Callable[[int, int], None] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint at `path` (written with TP=`tensor`) as GPT2LMHeadModel's state dict, without the tied
    lm_head: (name, tensor) pairs in state-dict order, one pipeline layer read at a time; `progress(done, total)`
    after each layer."""
    import torch

    target = getattr(torch, dtype)
    layers = model["num_layers"]
    total = layers + 2

    def put(name: str, value) -> tuple[str, torch.Tensor]:
        return name, value.to(target).contiguous()

    emb = _merge(_load_layer(path, 0, tensor, EMBEDDING_SPLIT), EMBEDDING_SPLIT, f"{path} layer 0")
    words = emb["word_embeddings.weight"]
    if words.shape[0] != model["padded_vocab_size"]:
        raise ConvertError(f"{path}: word embedding has {words.shape[0]} rows; bsops.json says the padded "
                           f"vocabulary is {model['padded_vocab_size']}")
    yield put("transformer.wte.weight", words[:vocab_size])  # vocab padding removed
    yield put("transformer.wpe.weight", emb["position_embeddings.weight"])
    del emb, words  # the padded embedding is the largest tensor: hold it no longer than its shard does
    if progress:
        progress(1, total)
    for i in range(layers):
        b = _merge(_load_layer(path, i + 1, tensor, BLOCK_SPLIT), BLOCK_SPLIT, f"{path} layer {i + 1}")
        p = f"transformer.h.{i}."
        yield put(p + "ln_1.weight", b["input_layernorm.weight"])
        yield put(p + "ln_1.bias", b["input_layernorm.bias"])
        c_attn_w, c_attn_b = qkv_to_c_attn(b["self_attention.query_key_value.weight"],
                                           b["self_attention.query_key_value.bias"], model["num_attention_heads"])
        yield put(p + "attn.c_attn.weight", c_attn_w)
        yield put(p + "attn.c_attn.bias", c_attn_b)
        del c_attn_w, c_attn_b
        yield put(p + "attn.c_proj.weight", b["self_attention.dense.weight"].t())
        yield put(p + "attn.c_proj.bias", b["self_attention.dense.bias"])
        yield put(p + "ln_2.weight", b["post_attention_layernorm.weight"])
        yield put(p + "ln_2.bias", b["post_attention_layernorm.bias"])
        yield put(p + "mlp.c_fc.weight", b["mlp.dense_h_to_4h.weight"].t())
        yield put(p + "mlp.c_fc.bias", b["mlp.bias_h_to_4h"])
        yield put(p + "mlp.c_proj.weight", b["mlp.dense_4h_to_h.weight"].t())
        yield put(p + "mlp.c_proj.bias", b["mlp.dense_4h_to_h.bias"])
        del b  # this layer's merged tensors go with its shard, not with the next layer
        if progress:
            progress(i + 2, total)
    final = _merge(_load_layer(path, layers + 1, tensor, FINAL_NORM_SPLIT), FINAL_NORM_SPLIT, f"{path} layer {layers + 1}")
    yield put("transformer.ln_f.weight", final["weight"])
    yield put("transformer.ln_f.bias", final["bias"])
    if progress:
        progress(total, total)


# ---------------------------------------------------------------- weight files


@dataclass(frozen=True)
class Weights:
    """What `write_weights` wrote."""

    files: list[str]  # model.safetensors, or the shards in order and then model.safetensors.index.json
    total_size: int  # bytes of tensor data (the index's metadata.total_size)
    num_parameters: int


def write_weights(tensors: Iterable[tuple[str, torch.Tensor]], out: Path, max_shard_size: int) -> Weights:
    """Write (name, tensor) pairs as they come into safetensors shards of at most `max_shard_size` bytes each
    (a larger tensor gets a shard of its own), named and indexed as transformers' save_pretrained names them.

    A shard is written as soon as the next tensor would take it past the limit, so memory holds one shard
    at a time. Shards are written under temporary names and renamed once their number is known; on an
    error the ones written so far are removed.
    """
    from safetensors.torch import save_file

    out = Path(out)
    partials: list[Path] = []
    shard_of: dict[str, int] = {}  # tensor name -> shard number, from 0
    shard: dict = {}
    shard_bytes = total_size = num_parameters = 0

    def close_shard() -> None:
        nonlocal shard, shard_bytes
        if shard:
            partials.append(out / PARTIAL.format(index=len(partials) + 1))
            save_file(shard, str(partials[-1]), metadata={"format": "pt"})
            shard, shard_bytes = {}, 0

    try:
        for name, value in tensors:
            size = value.numel() * value.element_size()
            if shard and shard_bytes + size > max_shard_size:
                close_shard()
            shard[name], shard_of[name] = value, len(partials)
            shard_bytes += size
            total_size += size
            num_parameters += value.numel()
            del value
            if shard_bytes > max_shard_size:  # one tensor past the limit: alone in its shard
                close_shard()
        close_shard()
        count = len(partials)
        names = [WEIGHTS] if count == 1 else [SHARD.format(index=k + 1, count=count) for k in range(count)]
        mode = _file_mode()
        for partial, name in zip(partials, names):
            os.chmod(partial, mode)  # safetensors writes 0600; the model folder's other files are 0644 (umask)
            os.replace(partial, out / name)
    except BaseException:
        for partial in partials:
            partial.unlink(missing_ok=True)
        raise
    if count == 1:
        return Weights(names, total_size, num_parameters)
    index = {"metadata": {"total_parameters": num_parameters, "total_size": total_size},
             "weight_map": {name: names[k] for name, k in shard_of.items()}}
    (out / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return Weights([*names, WEIGHTS_INDEX], total_size, num_parameters)


def _file_mode() -> int:
    """The mode a new file gets here: 0666 less the process umask (0644 with the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# ---------------------------------------------------------------- tokenizer


@dataclass(frozen=True)
class TokenizerFiles:
    """The experiment's tokenizer as transformers wants it: files to copy (source -> name), class, vocabulary."""

    copies: dict[str, Path]
    tokenizer_class: str
    size: int
    eod: int | None


def tokenizer_files(tokenizer) -> TokenizerFiles:
    """Read the experiment's tokenizer (data.tokenizer) without writing anything."""
    if tokenizer.kind == "json":
        src = _require_file(tokenizer.json_file, "data.tokenizer.json_file")
        data = json.loads(src.read_text(encoding="utf-8"))
        vocab = dict(data.get("model", {}).get("vocab") or {})
        vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
        copies, cls = {"tokenizer.json": src}, "PreTrainedTokenizerFast"
    else:
        vocab_src = _require_file(tokenizer.vocab_file, "data.tokenizer.vocab_file")
        copies = {"vocab.json": vocab_src, "merges.txt": _require_file(tokenizer.merges_file, "data.tokenizer.merges_file")}
        vocab, cls = json.loads(vocab_src.read_text(encoding="utf-8")), "GPT2Tokenizer"
    return TokenizerFiles(copies, cls, max(vocab.values(), default=-1) + 1, vocab.get(EOD_TOKEN))


def write_tokenizer(files: TokenizerFiles, out: Path, model_max_length: int) -> list[str]:
    """Copy the tokenizer into `out` with a tokenizer_config.json, so AutoTokenizer loads it; the names written."""
    for name, src in files.copies.items():
        shutil.copyfile(src, Path(out) / name)
    config = {"tokenizer_class": files.tokenizer_class, "model_max_length": model_max_length, "add_prefix_space": False}
    if files.eod is not None:
        config.update(bos_token=EOD_TOKEN, eos_token=EOD_TOKEN, unk_token=EOD_TOKEN)
    (Path(out) / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return [*files.copies, "tokenizer_config.json"]


def _require_file(path: str | None, field: str) -> Path:
    if not path or not Path(path).is_file():
        raise ConvertError(f"{field}: {path} does not exist; the converted model needs the experiment's tokenizer")
    return Path(path)


# ---------------------------------------------------------------- the whole conversion


def convert(exp, out: Path, step: int | None = None, dtype: str = "float32", overwrite: bool = False,
            progress: Callable[[int, int], None] | None = None,
            max_shard_size: int | str = MAX_SHARD_SIZE, dry_run: bool = False) -> Conversion:
    """Convert experiment `exp`'s checkpoint (`latest`, or `global_step<step>`) into the folder `out`, the weights
    in safetensors shards of at most `max_shard_size` (bytes, or "5GB"/"500MB" as transformers takes it). With
    `dry_run`, everything is checked and nothing read past the checkpoint's metadata or written: the Conversion
    has no files and no parameter count."""
    shard_bytes = parse_size(max_shard_size)
    # What GPT-2 cannot express is refused from the experiment first: no word about steps for an ALiBi run.
    refuse_inexpressible({k: getattr(exp.model, k) for k in REFUSED if hasattr(exp.model, k)})
    tag, path, meta = select_checkpoint(Path(exp.paths.checkpoints), step)
    model = meta.get("model")
    trained = meta.get("experiment", {}).get("model", {})
    tensor = meta.get("parallel", {}).get("tensor")
    if not isinstance(model, dict) or "vocab_size" not in trained or not isinstance(tensor, int):
        raise ConvertError(f"{path / META}: lacks model, experiment.model.vocab_size or parallel.tensor; "
                           "not written by this version of bsops' trainer")
    vocab_size = trained["vocab_size"]
    tok = tokenizer_files(exp.data.tokenizer)
    if tok.size > vocab_size:
        raise ConvertError(f"data.tokenizer has {tok.size} tokens but the checkpoint's model.vocab_size is "
                           f"{vocab_size}; ids past {vocab_size - 1} would have no embedding. "
                           "Use the tokenizer the model was trained with")
    config = gpt2_config(model, vocab_size, tok.eod, dtype)  # refuses what GPT-2 cannot express
    check_layer_files(path, model["num_layers"], tensor)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConvertError(f"output folder {out} is not empty; choose a new folder, or pass --overwrite to write "
                           "into it")
    if dry_run:
        return Conversion(out=out, tag=tag, iteration=int(meta.get("iteration", layout.step_of(tag))),
                          config=config, files=[], num_parameters=0)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():  # an earlier conversion's weights would shadow (model.safetensors) or join these
        if WEIGHT_FILES.fullmatch(stale.name) and stale.is_file():
            stale.unlink()
    weights = write_weights(gpt2_tensors(path, model, tensor, vocab_size, dtype, progress), out, shard_bytes)
    tokenizer_written = write_tokenizer(tok, out, model["max_position_embeddings"])
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    source = {"experiment": getattr(exp, "name", None), "checkpoint": str(path), "iteration": meta.get("iteration"),
              "consumed_tokens": meta.get("consumed_tokens"), "parallel": meta.get("parallel")}
    (out / "bsops_conversion.json").write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    files = [*weights.files, "config.json", *tokenizer_written, "bsops_conversion.json"]
    return Conversion(out=out, tag=tag, iteration=int(meta.get("iteration", layout.step_of(tag))),
                      config=config, files=files, num_parameters=weights.num_parameters)


def check_push(exp, remote: str | None = None, max_shard_size: int | str | None = None) -> None:
    """Refuse a push that has nowhere to go, or shards the Hub would refuse, before hours of conversion are spent."""
    if not exp.hub.checkpoints_repo and remote is None:
        raise ConvertError(f"{exp.name}: hub.checkpoints_repo is not set; set it in the experiment, or pass --remote "
                           "URL (any git remote)")
    if max_shard_size is not None and (size := parse_size(max_shard_size)) > HUB_FILE_LIMIT:
        raise ConvertError(f"max_shard_size {max_shard_size!r} is {size:,} bytes, over the Hugging Face Hub's limit "
                           f"of 50GB per file, so the push would be refused; allowed with a push: up to 50GB "
                           f"(default {MAX_SHARD_SIZE})")


def check_pushable(conversion: Conversion) -> None:
    """Refuse a converted folder holding a file over the Hub's limit (bsops convert --push checks before uploading)."""
    too_big = [f"{name} ({size:,} bytes)" for name in conversion.files
               if (size := (conversion.out / name).stat().st_size) > HUB_FILE_LIMIT]
    if too_big:
        raise ConvertError(f"{conversion.out}: {', '.join(too_big)} over the Hugging Face Hub's limit of 50GB per "
                           f"file; convert again with a smaller max_shard_size (default {MAX_SHARD_SIZE})")
