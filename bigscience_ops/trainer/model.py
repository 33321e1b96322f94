"""Megatron's GPT as DeepSpeed pipeline layers, built from the experiment's ModelConfig only.

Layer order (what `layer_specs` returns, and what `PipelineModule` partitions over stages):

    EmbeddingPipe (tied "word_embeddings")  tokens (B, T) -> hidden (B, T, h)
    TransformerBlock x num_layers           pre-LN: x + attn(ln(x)), x + mlp(ln(x))
    FinalNorm                               LayerNorm
    EmbeddingPipe.head (tied)               hidden (B, T, h) -> logits (B, T, V)

The output head reuses the word embedding; with PP > 1 the last stage holds a copy that DeepSpeed's
TiedLayerSpec keeps in sync (its gradients are all-reduced over the stages that share it).

Every layer initialises its parameters from its own generator seeded with (seed, layer index), so
the initial weights are the same whatever the pipeline split.

Tensor parallelism (Megatron's, see tensor_parallel.py): fused QKV and h -> ffn are column-parallel
(output rows split, attention heads split over TP ranks), the attention output and ffn -> h are
row-parallel (input columns split, outputs all-reduced, then the replicated bias added), the word
embedding is split over the (padded) vocabulary and the tied head produces vocab-split logits for
the vocab-parallel cross entropy. Each sharded weight is initialised in full from the layer's
generator, exactly as with TP=1, and then cut: TP=2 starts from the same model as TP=1.
LayerNorms, row-parallel biases and position embeddings are replicated; they receive identical
gradients on every TP rank and stay identical. Dropout follows Megatron: attention dropout (on this
rank's heads) draws from the rank's own TP-region generator, embedding and hidden dropout (on
replicated activations) from the default one, the same on every TP rank (tensor_parallel.py).

Positions (`position_embedding`): learned (a table added to the word embeddings) or alibi (BLOOM's:
no table; each head adds slope * key position to its attention scores, bigscience_ops/kernels/softmax.py; with TP
each rank uses the slopes of its own heads).

Kernels: LayerNorm, the attention output's dropout + residual add + LayerNorm, bias-GeLU, attention and
the LM cross-entropy go through bigscience_ops/kernels/ with the run's KernelChoice (`kernels` below:
one name for every op, auto, triton or torch, or a per-op choice, bigscience_ops/kernels/choice.py),
passed to every layer and to the loss. It is not part of GPTShape: it changes how the math runs, not
the model, so a checkpoint resumes under any choice.

`compile` (model.compile): each TransformerBlock is compiled in place by torch.compile (trainer/compiled.py),
its parameter names unchanged; its ops then run their torch references, which inductor fuses itself.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from bigscience_ops import kernels as fused
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer.tensor_parallel import (SINGLE, TensorParallel, copy_to_tp, mark_tensor_parallel,
                                                    reduce_from_tp, tp_region_rng, vocab_parallel_cross_entropy)
from bigscience_ops.kernels.choice import KernelChoice, as_choice
from bigscience_ops.kernels.softmax import alibi_slopes

Kernels = str | KernelChoice


def _generator(seed: int, layer_index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 100_003 + layer_index)


def _normal_(tensor: torch.Tensor, std: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * std)


def _sharded_normal(rows: int, cols: int, std: float, gen: torch.Generator, tp: TensorParallel,
                    dim: int) -> nn.Parameter:
    """The full (rows, cols) N(0, std) matrix drawn as with TP=1, then this rank's slice along `dim`."""
    full = torch.randn((rows, cols), generator=gen, dtype=torch.float32) * std
    param = nn.Parameter(tp.shard(full, dim))
    return mark_tensor_parallel(param) if tp.size > 1 else param


def _zeros(size: int, tp: TensorParallel) -> nn.Parameter:
    """A zero bias split over TP (column-parallel layers)."""
    param = nn.Parameter(torch.zeros(size // tp.size))
    return mark_tensor_parallel(param) if tp.size > 1 else param


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float, kernels: str = "auto") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.layer_norm(x, self.weight, self.bias, self.eps, self.kernels)


class EmbeddingPipe(nn.Module):
    """Word + learned position embeddings (+ optional LayerNorm), and the tied output head.

    With ALiBi there is no position table (the blocks' attention adds the positions).
    `with_positions=False` is the last stage's copy: only the word embedding the head needs. With TP
    the word embedding holds this rank's slice of the padded vocabulary (rows [rank V/tp, (rank+1) V/tp)).
    """

    def __init__(self, shape: GPTShape, seed: int, with_positions: bool = True, tp: TensorParallel = SINGLE,
                 kernels: Kernels = "auto") -> None:
        super().__init__()
        self.shape = shape
        self.tp = tp
        gen = _generator(seed, 0)
        self.word_embeddings = nn.Embedding(shape.padded_vocab_size // tp.size, shape.hidden_size)
        self.word_embeddings.weight = _sharded_normal(shape.padded_vocab_size, shape.hidden_size,
                                                      shape.init_method_std, gen, tp, dim=0)
        self.learned_positions = with_positions and shape.position_embedding == "learned"
        if with_positions:
            if self.learned_positions:
                self.position_embeddings = nn.Embedding(shape.max_position_embeddings, shape.hidden_size)
                _normal_(self.position_embeddings.weight, shape.init_method_std, gen)
            self.embed_norm = (LayerNorm(shape.hidden_size, shape.layernorm_epsilon, as_choice(kernels).layer_norm)
                               if shape.embed_layernorm else None)
            self.drop = nn.Dropout(shape.hidden_dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        x = self._words(tokens)  # (B, T, h)
        if self.learned_positions:
            assert T <= self.shape.max_position_embeddings, \
                f"sequence {T} > max positions {self.shape.max_position_embeddings}"
            x = x + self.position_embeddings(torch.arange(T, device=tokens.device))
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.drop(x)

    def _words(self, tokens: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel lookup: ids outside this rank's slice give zeros; the all-reduce sums the slices."""
        if self.tp.size == 1:
            return self.word_embeddings(tokens)
        per_rank = self.word_embeddings.num_embeddings
        local = tokens - self.tp.rank * per_rank
        outside = (local < 0) | (local >= per_rank)
        x = self.word_embeddings(local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(x, self.tp)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V/tp): this rank's slice of the vocabulary (all of it with TP=1)."""
        return F.linear(copy_to_tp(hidden, self.tp), self.word_embeddings.weight)


def head_forward(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """The tied output head as a pipeline layer (a module-level function: specs stay picklable)."""
    return embedding.head(hidden)


def _row_parallel(linear: nn.Linear, x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """A row-parallel linear: partial products summed over TP, then the replicated bias added once."""
    if tp.size == 1:
        return linear(x)
    return reduce_from_tp(F.linear(x, linear.weight), tp) + linear.bias


class SelfAttention(nn.Module):
    """Fused QKV (column-parallel: this rank's heads), attention, output projection (row-parallel)."""

    def __init__(self, shape: GPTShape, gen: torch.Generator, tp: TensorParallel = SINGLE,
                 kernels: Kernels = "auto") -> None:
        super().__init__()
        h = shape.hidden_size
        self.tp = tp
        self.kernels = as_choice(kernels).attention
        self.n_head = shape.num_attention_heads // tp.size  # heads on this rank
        self.head_size = h // shape.num_attention_heads
        # fused QKV in Megatron's per-head [q k v] row layout: a contiguous row slice is whole heads
        self.query_key_value = nn.Linear(h, 3 * h // tp.size)
        self.dense = nn.Linear(h // tp.size, h)
        self.query_key_value.weight = _sharded_normal(3 * h, h, shape.init_method_std, gen, tp, dim=0)
        self.dense.weight = _sharded_normal(h, h, shape.init_method_std / math.sqrt(2.0 * shape.num_layers), gen,
                                            tp, dim=1)
        self.query_key_value.bias = _zeros(3 * h, tp)
        nn.init.zeros_(self.dense.bias)
        self.attention_dropout = shape.attention_dropout
        # ALiBi: this rank's heads are [rank * n_head, (rank + 1) * n_head) of the model's
        self.slopes = (alibi_slopes(shape.num_attention_heads)[tp.rank * self.n_head:(tp.rank + 1) * self.n_head]
                       if shape.position_embedding == "alibi" else None)
        self._slopes_tensor: torch.Tensor | None = None  # on the activations' device, in fp32 (not a buffer: never cast)

    def _alibi(self, device: torch.device) -> torch.Tensor | None:
        if self.slopes is None:
            return None
        if self._slopes_tensor is None or self._slopes_tensor.device != device:
            self._slopes_tensor = torch.tensor(self.slopes, dtype=torch.float32, device=device)
        return self._slopes_tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        hs = self.head_size
        qkv = self.query_key_value(copy_to_tp(x, self.tp)).view(B, T, self.n_head, 3 * hs)  # (B, T, nh/tp, 3 hs)
        q, k, v = qkv.transpose(1, 2).split(hs, dim=-1)  # (B, nh/tp, T, hs)
        dropout = self.attention_dropout if self.training else 0.0
        # Own heads, own masks: the TP region's generator. Compiled with TP=1 there is nothing to keep apart, and
        # dynamo cannot trace the tracker's fork (a graph break in every block): the masks come from the compiled
        # graph's own seeded stream, as every dropout mask there does.
        own_masks = dropout > 0.0 and not (self.tp.size == 1 and torch.compiler.is_compiling())
        with tp_region_rng(self.tp) if own_masks else contextlib.nullcontext():
            y = fused.causal_attention(q, k, v, dropout, self.kernels, self._alibi(x.device))  # (B, nh/tp, T, hs)
        return _row_parallel(self.dense, y.transpose(1, 2).reshape(B, T, self.n_head * hs), self.tp)


class MLP(nn.Module):
    """h -> ffn (column-parallel) with bias-GeLU, ffn -> h (row-parallel, bias after the all-reduce)."""

    def __init__(self, shape: GPTShape, gen: torch.Generator, tp: TensorParallel = SINGLE,
                 kernels: Kernels = "auto") -> None:
        super().__init__()
        h, f = shape.hidden_size, shape.ffn_hidden_size
        self.tp = tp
        self.kernels = as_choice(kernels).bias_gelu
        self.dense_h_to_4h = nn.Linear(h, f // tp.size, bias=False)
        self.bias_h_to_4h = _zeros(f, tp)  # added inside bias_gelu, as Megatron fuses it
        self.dense_4h_to_h = nn.Linear(f // tp.size, h)
        self.dense_h_to_4h.weight = _sharded_normal(f, h, shape.init_method_std, gen, tp, dim=0)
        self.dense_4h_to_h.weight = _sharded_normal(h, f, shape.init_method_std / math.sqrt(2.0 * shape.num_layers),
                                                    gen, tp, dim=1)
        nn.init.zeros_(self.dense_4h_to_h.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = fused.bias_gelu(self.dense_h_to_4h(copy_to_tp(x, self.tp)), self.bias_h_to_4h, self.kernels)
        return _row_parallel(self.dense_4h_to_h, y, self.tp)


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x))).

    The attention output's dropout, its residual add and the post-attention LayerNorm are one op
    (kernels.residual_layer_norm: one kernel each way when Triton runs it). With `compile` the block is
    compiled in place and its ops run the torch references (inductor fuses them)."""

    def __init__(self, shape: GPTShape, seed: int, layer_number: int, tp: TensorParallel = SINGLE,
                 kernels: Kernels = "auto", compile: bool = False) -> None:
        super().__init__()
        k = as_choice("torch" if compile else kernels)
        gen = _generator(seed, layer_number)
        self.input_layernorm = LayerNorm(shape.hidden_size, shape.layernorm_epsilon, k.layer_norm)
        self.self_attention = SelfAttention(shape, gen, tp, k)
        self.post_attention_layernorm = LayerNorm(shape.hidden_size, shape.layernorm_epsilon, k.residual_layer_norm)
        self.mlp = MLP(shape, gen, tp, k)
        self.drop = nn.Dropout(shape.hidden_dropout)
        if compile:
            from bigscience_ops.trainer.compiled import compile_block
            compile_block(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ln = self.post_attention_layernorm
        dropout = self.drop.p if self.training else 0.0
        x, normed = fused.residual_layer_norm(x, self.self_attention(self.input_layernorm(x)), ln.weight, ln.bias,
                                              ln.eps, dropout, ln.kernels)
        return x + self.drop(self.mlp(normed))


class FinalNorm(LayerNorm):
    def __init__(self, shape: GPTShape, kernels: Kernels = "auto") -> None:
        super().__init__(shape.hidden_size, shape.layernorm_epsilon, as_choice(kernels).layer_norm)


def lm_loss(logits: torch.Tensor, labels: tuple[torch.Tensor, torch.Tensor], kernels: Kernels = "auto") -> torch.Tensor:
    """Megatron's masked LM loss: sum(CE * mask) / sum(mask), in fp32. logits (B, T, V)."""
    targets, loss_mask = labels
    losses = fused.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                 as_choice(kernels).cross_entropy)
    mask = loss_mask.reshape(-1).float()
    return (losses * mask).sum() / mask.sum()


class LMLoss:
    """`lm_loss` for logits split over TP along the vocabulary (B, T, V/tp) (the vocab-parallel CE),
    or over the whole vocabulary with TP=1; `kernels` chooses the cross-entropy kernel."""

    def __init__(self, tp: TensorParallel, kernels: Kernels = "auto") -> None:
        self.tp = tp
        self.kernels = as_choice(kernels).cross_entropy

    def __call__(self, logits: torch.Tensor, labels: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if self.tp.size == 1:
            return lm_loss(logits, labels, self.kernels)
        targets, loss_mask = labels
        losses = vocab_parallel_cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), self.tp,
                                              self.kernels)
        mask = loss_mask.reshape(-1).float()
        return (losses * mask).sum() / mask.sum()


def loss_function(tp: TensorParallel = SINGLE, kernels: Kernels = "auto") -> LMLoss:
    """The pipeline's loss: Megatron's masked LM loss, vocab-parallel when TP > 1."""
    return LMLoss(tp, kernels)


def layer_specs(shape: GPTShape, seed: int, tp: TensorParallel = SINGLE, kernels: Kernels = "auto",
                compile: bool = False) -> list:
    """The model as pipeline layer specs: embedding, blocks (compiled with `compile`), final norm, tied head (this
    TP rank's shards)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    specs: list = [TiedLayerSpec("word_embeddings", EmbeddingPipe, shape, seed, tp=tp, kernels=kernels,
                                 tied_weight_attr="word_embeddings.weight")]
    specs += [LayerSpec(TransformerBlock, shape, seed, i + 1, tp=tp, kernels=kernels, compile=compile)
              for i in range(shape.num_layers)]
    specs.append(LayerSpec(FinalNorm, shape, kernels))
    specs.append(TiedLayerSpec("word_embeddings", EmbeddingPipe, shape, seed, with_positions=False, tp=tp,
                               forward_fn=head_forward, tied_weight_attr="word_embeddings.weight"))
    return specs


def build_sequential(shape: GPTShape, seed: int, kernels: Kernels = "auto", compile: bool = False) -> nn.Module:
    """The same layers as one plain nn.Module, for the plain-PyTorch baseline of the benchmark (`compile`: each
    block compiled, as model.compile does in the trainer)."""

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = EmbeddingPipe(shape, seed, kernels=kernels)
            self.blocks = nn.ModuleList(TransformerBlock(shape, seed, i + 1, kernels=kernels, compile=compile)
                                        for i in range(shape.num_layers))
            self.final_norm = FinalNorm(shape, kernels)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embedding(tokens)
            for block in self.blocks:
                x = block(x)
            return self.embedding.head(self.final_norm(x))

    return GPT()


def weight_decay_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Megatron's split: no weight decay on biases and LayerNorm parameters."""
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
