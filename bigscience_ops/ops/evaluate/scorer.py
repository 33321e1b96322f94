"""This rank's part of the trained GPT, scoring token sequences for rank 0 (Megatron-DeepSpeed's eval harness).

Layout: ranks are laid out as the trainer's DeepSpeed topology with one data-parallel replica,
rank = stage * TP + tp_rank (TP fastest). Each rank builds only its pipeline stage's layers (the
trainer's own classes, trainer/model.py, without their random initialisation: `_uninitialised`), with
the stage split the trainer's PipelineModule makes (sizing.partition, parallel.partition_method),
in eval mode (no dropout), without DeepSpeed's engine or an optimizer.

Weights: DeepSpeed's layer files of the checkpoint (`layer_XX[-model_RR]-model_states.pt`; layer
numbers are global, so any pipeline split reads them as they are). With the checkpoint's own TP
each rank reads only its stage's files of its TP rank; with another TP it reads every TP shard of
its stage's layers, merges them as `bsops convert` does (column-parallel along rows, row-parallel
along columns, the rest replicated) and cuts its own slice; the word embedding keeps the real
vocabulary's rows and is padded again with zeros for the new TP (Megatron's padding per TP size).
The tied output head of the last stage is the word embedding of layer 0's files.

One forward pass (`Scorer._forward` on rank 0, `Scorer.follow` on the others):
    rank 0 broadcasts a command [op, B, T] (op 0: stop), then one (3, B, T) int64 tensor:
        inputs, targets and a mask of the positions to score (right padded);
    each stage receives the activations (b, T, h) from the same TP rank of the stage before
        (torch.distributed send/recv on the compute device), runs its layers, sends them on, one
        micro-batch of b rows after the other (about 2 x PP of them: the stages overlap, as a pipeline);
    the last stage runs the final norm's output through the tied head for the masked positions only,
        in chunks, and computes a vocab-parallel log-softmax over the REAL vocabulary (padded rows
        masked to -inf, as the export drops them): max and sum-exp all-reduced over TP, the target
        logit from the rank that holds it, the argmax as the lowest id holding the global max;
    its TP rank 0 sends rank 0 per item [sum of target log-probs, all argmax == target, argmax at the
        last scored position] (float64, on the CPU).
Commands and results travel through gloo on CPU tensors; activations on the compute device (gloo on
CPU, NCCL on GPUs, as the trainer's `cpu:gloo,cuda:nccl` group). The arithmetic is fp32 on the CPU;
on GPUs the layers run in the training precision (or fp32: eval.dtype) and the log-softmax in fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from datetime import timedelta
from functools import cached_property

import torch
import torch.distributed as dist
import torch.nn as nn

from bigscience_ops import sizing
from bigscience_ops.ops.evaluate import EvalError
from bigscience_ops.ops.evaluate.launcher import Target, layer_file
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer.model import EmbeddingPipe, FinalNorm, TransformerBlock
from bigscience_ops.trainer.tensor_parallel import SINGLE, TensorParallel

STOP, FORWARD = 0, 1
DEFAULT_BATCH_SIZE = 8
LOGIT_ELEMENTS = 1 << 25
"""Logits computed at once on a rank (positions x its vocabulary slice): 128 MB in fp32."""
FOLLOW_TIMEOUT = timedelta(hours=24)
"""The process group's timeout: followers wait in a broadcast while rank 0 prepares lm-eval's requests (datasets,
tokenization), which can take long; a rank that dies ends the others through torchrun, not through the timeout."""
WORD_EMBEDDINGS = "word_embeddings.weight"
SPLIT_DIM = {  # parameter name (inside its layer) -> TP split dimension; anything else is replicated
    WORD_EMBEDDINGS: 0,
    "self_attention.query_key_value.weight": 0, "self_attention.query_key_value.bias": 0,
    "self_attention.dense.weight": 1,
    "mlp.dense_h_to_4h.weight": 0, "mlp.bias_h_to_4h": 0,
    "mlp.dense_4h_to_h.weight": 1,
}
SHAPE_DEFAULTS = {"position_embedding": "learned"}
"""GPTShape fields newer than the first checkpoints, with the value those were written with."""


def init_distributed(exp) -> torch.device:
    """The process group (env:// as torchrun sets it) and this rank's device: the local GPU when the experiment
    runs on GPUs and one is visible (selected before the group, as the trainer does), else the CPU."""
    if exp.slurm.device == "gpu" and torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=FOLLOW_TIMEOUT)
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo", timeout=FOLLOW_TIMEOUT)
    return torch.device("cpu")


def compute_dtype(exp, device: torch.device, choice: str | None = None) -> torch.dtype:
    """fp32 on the CPU; on GPUs the training precision, or fp32 when eval.dtype (or `choice`, which overrides it)
    says so (as lm-eval's hf model loads an export by default)."""
    if device.type != "cuda" or (choice or exp.eval.dtype) == "fp32":
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(exp.train.precision, torch.float32)


@dataclasses.dataclass(frozen=True)
class Place:
    """This rank in the evaluation layout."""

    rank: int
    tensor: int
    pipeline: int

    @property
    def stage(self) -> int:
        return self.rank // self.tensor

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tensor

    def rank_of(self, stage: int, tp_rank: int) -> int:
        return stage * self.tensor + tp_rank

    @property
    def is_last(self) -> bool:
        return self.stage == self.pipeline - 1


def eval_shape(target: Target) -> GPTShape:
    """The checkpoint's model (bsops.json) with the vocabulary padded for the evaluation's TP."""
    fields = {f.name for f in dataclasses.fields(GPTShape)}
    saved = {**SHAPE_DEFAULTS, **{k: v for k, v in target.meta["model"].items() if k in fields}}
    shape = GPTShape(**saved)
    if target.tensor != target.saved_tensor:
        trained = target.meta.get("experiment", {}).get("model", {})
        divisible = trained.get("make_vocab_size_divisible_by", 128)
        shape = dataclasses.replace(shape, padded_vocab_size=sizing.padded_vocab_size(
            trained["vocab_size"], divisible, target.tensor))
    return shape


def stage_bounds(exp, target: Target) -> list[int]:
    """Stage boundaries over the pipeline layers [embedding, blocks..., final norm, head], as the trainer splits."""
    trained = target.meta.get("experiment", {}).get("model", {})
    names = {f.name for f in dataclasses.fields(exp.model)}
    model = dataclasses.replace(exp.model, **{k: v for k, v in trained.items() if k in names})
    method = target.meta.get("experiment", {}).get("parallel", {}).get("partition_method",
                                                                        exp.parallel.partition_method)
    parts = sizing.partition(method, sizing.pipeline_layers(model, target.tensor), target.pipeline)
    empty = [s for s in range(target.pipeline) if parts[s + 1] <= parts[s]]
    if empty:
        raise EvalError(f"--pipeline {target.pipeline}: partition_method {method!r} leaves stage {empty[0]} without "
                        f"layers (split {parts}); allowed: fewer stages")
    return list(parts)


class Scorer:
    """This rank's stage of the model; rank 0 asks (`score`, `next_tokens`, `close`), the others `follow`."""

    def __init__(self, exp, target: Target, device: torch.device | None = None,
                 dtype: torch.dtype | None = None) -> None:
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world != target.world_size:
            raise EvalError(f"{world} ranks started for TP={target.tensor} x PP={target.pipeline}; allowed: "
                            f"{target.world_size} (torchrun --nproc-per-node {target.world_size})")
        self.exp = exp
        self.target = target
        self.device = device or torch.device("cpu")
        self.dtype = dtype or compute_dtype(exp, self.device)
        self.place = Place(dist.get_rank() if dist.is_initialized() else 0, target.tensor, target.pipeline)
        self.shape = eval_shape(target)
        self.vocab_size = int(target.meta["experiment"]["model"]["vocab_size"])
        self.max_length = self.shape.seq_length
        self.batch_size = int(getattr(getattr(exp, "eval", None), "batch_size", None) or DEFAULT_BATCH_SIZE)
        # The torch references (SDPA's flash attention on CUDA) unless the experiment names triton: `auto` is a
        # training-speed choice measured at the training shape, and the references are what scoring is checked
        # against lm-eval's hf model with. ("auto" here would mean Triton for every op on CUDA, unmeasured.)
        self.kernels = "triton" if exp.model.kernels == "triton" else "torch"
        self.tp = self._tp_group()
        self.parts = stage_bounds(exp, target)
        self.last_layer = self.shape.num_layers + 2  # the head's index among the pipeline layers
        self.layers: list[tuple[int, nn.Module]] = []
        self.head: EmbeddingPipe | None = None
        self._closed = False
        self._broken = False  # a forward pass of rank 0 failed halfway: the followers cannot take a command
        self._build()

    @property
    def tensor(self) -> int:
        """TP of the evaluation."""
        return self.target.tensor

    @property
    def pipeline(self) -> int:
        """PP of the evaluation."""
        return self.target.pipeline

    @property
    def layout(self) -> dict[str, int]:
        return {"tensor": self.target.tensor, "pipeline": self.target.pipeline}

    @cached_property
    def eod(self) -> int:
        """The tokenizer's end-of-document id (rank 0's harness needs it; read from the tokenizer's files)."""
        from bigscience_ops.checkpoints.convert import tokenizer_files

        eod = tokenizer_files(self.exp.data.tokenizer).eod
        if eod is None:
            raise EvalError("data.tokenizer has no <|endoftext|> token; lm-eval's rolling windows need an "
                            "end-of-document id")
        return eod

    # ------------------------------------------------------------------ building

    def _tp_group(self) -> TensorParallel:
        """Every rank creates every stage's TP group, in the same order (as torch requires)."""
        if self.target.tensor == 1:
            return SINGLE
        mine = None
        for stage in range(self.target.pipeline):
            ranks = [self.place.rank_of(stage, r) for r in range(self.target.tensor)]
            group = dist.new_group(ranks=ranks)
            if self.place.stage == stage:
                mine = group
        return TensorParallel(rank=self.place.tp_rank, size=self.target.tensor, group=mine)

    def _build(self) -> None:
        shape, seed = self.shape, 0
        start, stop = self.parts[self.place.stage], self.parts[self.place.stage + 1]
        for index in range(start, stop):
            if index == self.last_layer and self.layers and self.layers[0][0] == 0:
                self.head = self.layers[0][1]  # one stage holds both ends: the embedding is the head (tied)
                continue
            with _uninitialised():
                if index == 0:
                    module: nn.Module = EmbeddingPipe(shape, seed, tp=self.tp, kernels=self.kernels)
                elif index <= shape.num_layers:
                    module = TransformerBlock(shape, seed, index, tp=self.tp, kernels=self.kernels)
                elif index == shape.num_layers + 1:
                    module = FinalNorm(shape, self.kernels)
                else:
                    module = EmbeddingPipe(shape, seed, with_positions=False, tp=self.tp, kernels=self.kernels)
            module = module.to(device=self.device, dtype=self.dtype).eval()
            self._load(module, index)
            if index == self.last_layer:
                self.head = module
            else:
                self.layers.append((index, module))

    def _load(self, module: nn.Module, index: int) -> None:
        """This rank's weights of pipeline layer `index` (the head: layer 0's word embedding) into `module`."""
        source = 0 if index == self.last_layer else index
        files = self._files(source)
        shards = [_read(file) for file in files]
        wanted = set(module.state_dict())
        held = set(shards[0])
        if not (wanted <= held if index == self.last_layer else wanted == held):
            raise EvalError(f"{files[0]}: holds {sorted(shards[0])}; layer {index} expects {sorted(wanted)} "
                            "(another model than bsops.json describes, or another trainer's checkpoint)")
        state = self._reshard(shards, wanted, files)
        try:
            module.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            last = str(exc).strip().split("\n")[-1].strip()  # "\n" only: a name in it may hold U+2028
            raise EvalError(f"{files[0]}: does not fit layer {index} of the model bsops.json describes "
                            f"({last})") from None

    def _files(self, index: int) -> list:
        saved = self.target.saved_tensor
        if saved == self.target.tensor:
            return [layer_file(self.target.path, index, saved, self.place.tp_rank)]
        return [layer_file(self.target.path, index, saved, r) for r in range(saved)]

    def _reshard(self, shards: list[dict], wanted: set[str], files: list) -> dict:
        """The state of this rank's slice: the file's own with the checkpoint's TP, else merged and cut again."""
        if self.target.saved_tensor == self.target.tensor:
            return {name: value for name, value in shards[0].items() if name in wanted}
        state = {}
        for name in shards[0]:
            if name not in wanted:
                continue
            parts = [s.get(name) for s in shards]
            if any(p is None or p.shape != parts[0].shape for p in parts):
                raise EvalError(f"{files[0].parent}: {name} differs in shape or presence between its TP shard files "
                                f"{', '.join(f.name for f in files)}; the checkpoint is inconsistent")
            dim = SPLIT_DIM.get(name)
            full = torch.cat(parts, dim=dim) if dim is not None else parts[0]
            if name == WORD_EMBEDDINGS:
                full = self._fit_vocabulary(full)
            state[name] = self.tp.shard(full, dim) if dim is not None else full
        return state

    def _fit_vocabulary(self, words: torch.Tensor) -> torch.Tensor:
        """The real vocabulary's rows, padded with zero rows to this layout's padded size."""
        rows = self.shape.padded_vocab_size
        real = words[:self.vocab_size]
        if rows == real.shape[0]:
            return real
        return torch.cat([real, real.new_zeros(rows - real.shape[0], real.shape[1])])

    # ------------------------------------------------------------------ rank 0

    def score(self, items: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Per (context, continuation): (sum of log p(continuation tokens | what precedes), whether the greedy
        token is the continuation's at every position). len(context) >= 1, len(context) + len(continuation) <=
        max_length + 1; the model reads (context + continuation)[:-1]. An empty continuation is (0.0, True)."""
        rows = []
        for i, (context, continuation) in enumerate(items):
            context, continuation = list(context), list(continuation)
            if not context:
                raise EvalError(f"item {i}: empty context; allowed: at least one token (lm-eval starts with the "
                                "end-of-document token)")
            if len(context) + len(continuation) > self.max_length + 1:
                raise EvalError(f"item {i}: {len(context)} + {len(continuation)} tokens; allowed: at most "
                                f"max_length + 1 = {self.max_length + 1} (truncate the context)")
            self._check_ids(context + continuation, i)
            whole = context + continuation
            rows.append((whole[:-1], whole[1:], len(context) - 1))
        out = self._run(rows)
        return [(0.0, True) if not continuation else (float(r[0]), bool(r[1]))
                for (_, continuation), r in zip(items, out)]

    def next_tokens(self, contexts: list[list[int]]) -> list[int]:
        """The greedy next token after each context (its last max_length tokens)."""
        rows = []
        for i, context in enumerate(contexts):
            context = list(context)[-self.max_length:]
            if not context:
                raise EvalError(f"context {i}: empty; allowed: at least one token")
            self._check_ids(context, i)
            rows.append((context, [0] * len(context), len(context) - 1))
        return [int(r[2]) for r in self._run(rows)]

    def close(self) -> None:
        """Rank 0: tell the other ranks to stop following (once)."""
        if self._closed or self.place.rank != 0:
            return
        self._closed = True
        if self.target.world_size > 1 and not self._broken:  # broken: rank 0 exits, torchrun ends the others
            dist.broadcast(torch.tensor([STOP, 0, 0], dtype=torch.int64), 0)

    def _check_ids(self, ids: list[int], i: int) -> None:
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise EvalError(f"item {i}: token id {bad!r}; allowed: whole numbers 0 to {self.vocab_size - 1} "
                            "(the model's vocabulary)")

    def _run(self, rows: list[tuple[list[int], list[int], int]]) -> list[list[float]]:
        """(inputs, targets, first scored position) per row -> [sum, greedy, last argmax] per row, longest first in
        batches of batch_size, returned in the order given."""
        if self.place.rank != 0:
            raise EvalError(f"rank {self.place.rank} asked for a forward pass; only rank 0 drives, the others follow")
        if self._closed:
            raise EvalError("the scorer is closed: the other ranks have stopped")
        order = sorted(range(len(rows)), key=lambda k: -len(rows[k][0]))
        out: list[list[float]] = [[]] * len(rows)
        for b in range(0, len(order), self.batch_size):
            chosen = order[b:b + self.batch_size]
            width = max(len(rows[k][0]) for k in chosen)
            data = torch.zeros(3, len(chosen), width, dtype=torch.int64)
            for j, k in enumerate(chosen):
                inputs, targets, first = rows[k]
                data[0, j, :len(inputs)] = torch.tensor(inputs, dtype=torch.int64)
                data[1, j, :len(targets)] = torch.tensor(targets, dtype=torch.int64)
                data[2, j, first:len(inputs)] = 1
            for j, values in zip(chosen, self._forward(data).tolist()):
                out[j] = values
        return out

    def _forward(self, data: torch.Tensor) -> torch.Tensor:
        self._broken = True
        if self.target.world_size > 1:
            dist.broadcast(torch.tensor([FORWARD, data.shape[1], data.shape[2]], dtype=torch.int64), 0)
            dist.broadcast(data, 0)
        result = self._step(data)
        source = self.place.rank_of(self.target.pipeline - 1, 0)
        if source != 0:
            result = torch.empty(data.shape[1], 3, dtype=torch.float64)
            dist.recv(result, source)
        assert result is not None
        self._broken = False
        return result

    # ------------------------------------------------------------------ every rank

    def follow(self) -> None:
        """Ranks other than 0: run rank 0's forward passes until it closes."""
        if self.place.rank == 0:
            raise EvalError("rank 0 drives the evaluation; it does not follow")
        results_to_0 = self.place.rank == self.place.rank_of(self.target.pipeline - 1, 0)
        while True:
            command = torch.empty(3, dtype=torch.int64)
            dist.broadcast(command, 0)
            op, batch, width = command.tolist()
            if op == STOP:
                return
            data = torch.empty(3, batch, width, dtype=torch.int64)
            dist.broadcast(data, 0)
            result = self._step(data)
            if results_to_0:
                dist.send(result, 0)

    @torch.no_grad()
    def _step(self, data: torch.Tensor) -> torch.Tensor | None:
        """This stage's part of one forward pass; the last stage returns the per-item results (CPU, float64).

        With PP > 1 the batch goes through in micro-batches (about 2 x PP of them), so that the stages work at the
        same time on consecutive ones, as a pipeline does; each stage receives, runs and sends them in order."""
        tokens, targets, mask = data.to(self.device).unbind(0)
        batch, width = tokens.shape
        micro = batch if self.target.pipeline == 1 else -(-batch // (2 * self.target.pipeline))
        results = []
        for lo in range(0, batch, micro):
            rows = slice(lo, min(lo + micro, batch))
            x = None
            if self.place.stage > 0:
                x = torch.empty(rows.stop - rows.start, width, self.shape.hidden_size, dtype=self.dtype,
                                device=self.device)
                dist.recv(x, self.place.rank_of(self.place.stage - 1, self.place.tp_rank))
            for index, module in self.layers:
                x = module(tokens[rows]) if index == 0 else module(x)
            if not self.place.is_last:
                dist.send(x.to(self.dtype).contiguous(), self.place.rank_of(self.place.stage + 1, self.place.tp_rank))
                continue
            results.append(self._results(x, targets[rows], mask[rows]))
        return torch.cat(results) if results else None

    def _results(self, hidden: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per item: [sum of log p(target) over the masked positions, all argmax == target, argmax at the last one]."""
        assert self.head is not None
        batch, width = targets.shape
        flat = mask.reshape(-1).nonzero().squeeze(-1)  # scored positions, in order
        item = flat // width
        wanted = targets.reshape(-1)[flat]
        rows = hidden.reshape(batch * width, -1)[flat]
        per_rank = self.head.word_embeddings.weight.shape[0]
        start = self.tp.rank * per_rank
        real = torch.arange(start, start + per_rank, device=self.device) < self.vocab_size
        chunk = max(1, LOGIT_ELEMENTS // per_rank)
        logps, argmaxes = [], []
        for i in range(0, rows.shape[0], chunk):
            logp, argmax = self._log_softmax_at(rows[i:i + chunk], wanted[i:i + chunk], real, start)
            logps.append(logp)
            argmaxes.append(argmax)
        logp = torch.cat(logps).double().cpu() if logps else torch.zeros(0, dtype=torch.float64)
        argmax = torch.cat(argmaxes).cpu() if argmaxes else torch.zeros(0, dtype=torch.int64)
        item, wanted = item.cpu(), wanted.cpu()
        sums = torch.zeros(batch, dtype=torch.float64).index_add_(0, item, logp)
        misses = torch.zeros(batch, dtype=torch.float64).index_add_(0, item, (argmax != wanted).double())
        last = torch.zeros(batch, dtype=torch.int64).scatter_reduce_(0, item, torch.arange(item.numel()), "amax")
        last_argmax = argmax[last].double() if argmax.numel() else torch.zeros(batch, dtype=torch.float64)
        return torch.stack([sums, (misses == 0).double(), last_argmax], dim=1)

    def _log_softmax_at(self, hidden: torch.Tensor, wanted: torch.Tensor, real: torch.Tensor,
                        start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(wanted) and the argmax over the real vocabulary, for rows of final hidden states (N, h)."""
        assert self.head is not None
        logits = self.head.head(hidden).float().masked_fill(~real, float("-inf"))  # (N, V/tp), this rank's ids
        local_max, local_arg = logits.max(dim=-1)
        top = local_max.clone()
        local = wanted - start
        inside = (local >= 0) & (local < logits.shape[-1])
        picked = logits.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        picked = torch.where(inside, picked, torch.zeros_like(picked))
        group = self.tp.group
        if self.tp.size > 1:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        sums = torch.stack([(logits - top.unsqueeze(-1)).exp().sum(dim=-1), picked])
        candidate = torch.where(local_max == top, local_arg + start, torch.full_like(local_arg, 2 ** 62))
        if self.tp.size > 1:
            dist.all_reduce(sums, group=group)
            dist.all_reduce(candidate, op=dist.ReduceOp.MIN, group=group)
        return sums[1] - top - sums[0].log(), candidate


@contextlib.contextmanager
def _uninitialised() -> Iterator[None]:
    """Inside: the trainer's layers are built without their random initialisation, since the checkpoint's weights
    replace every parameter. The trainer draws each full matrix from the layer's generator and then cuts this rank's
    slice (trainer/model.py): for a 100B model, minutes of random numbers and a full matrix in memory per weight.
    (Building on the meta device instead would import torch._dynamo for the meta kernels: over a second per rank.)"""
    from unittest import mock

    from bigscience_ops.trainer import model

    def sharded(rows: int, cols: int, std: float, gen: torch.Generator, tp: TensorParallel, dim: int) -> nn.Parameter:
        shape = [rows, cols]
        shape[dim] //= tp.size
        param = nn.Parameter(torch.empty(shape))
        return model.mark_tensor_parallel(param) if tp.size > 1 else param

    with mock.patch.object(model, "_sharded_normal", sharded), mock.patch.object(model, "_normal_", _nothing), \
            mock.patch.object(nn.Linear, "reset_parameters", _nothing), \
            mock.patch.object(nn.Embedding, "reset_parameters", _nothing):
        yield


def _nothing(*args: object) -> None:
    return None


def _read(file) -> dict:
    """One layer file's state dict (tensors only), mapped rather than read where torch can (files of older torch
    versions are read whole)."""
    try:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise EvalError(f"{file.parent}: missing {file.name}; the checkpoint is incomplete") from None
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a torn or foreign file
        reason = str(exc).strip().split("\n")[0].split(" (Could this error message be improved?")[0][:200]
        raise EvalError(f"{file}: unreadable ({type(exc).__name__}: {reason}); the checkpoint is torn or was not "
                        "written by torch.save; evaluate another step") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EvalError(f"{file}: holds {type(state).__name__}; expected a state dict of tensors (DeepSpeed's layer "
                        "file)")
    return state


def follow(scorer: Scorer) -> None:
    """Ranks other than 0: serve rank 0's forward passes until it closes the scorer."""
    scorer.follow()
