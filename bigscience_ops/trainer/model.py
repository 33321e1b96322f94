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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.gelu import bias_gelu
from kernels.layernorm import layer_norm
from kernels.softmax import causal_attention


@dataclass(frozen=True)
class GPTShape:
    """What the layers need from the experiment: ModelConfig with derived sizes filled in."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    padded_vocab_size: int
    embed_layernorm: bool
    init_method_std: float
    hidden_dropout: float
    attention_dropout: float
    layernorm_epsilon: float

    @classmethod
    def from_experiment(cls, exp) -> GPTShape:
        from bigscience_ops.plan import padded_vocab_size

        m = exp.model
        return cls(
            num_layers=m.num_layers,
            hidden_size=m.hidden_size,
            num_attention_heads=m.num_attention_heads,
            ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
            seq_length=m.seq_length,
            max_position_embeddings=m.max_position_embeddings or m.seq_length,
            padded_vocab_size=padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, exp.parallel.tensor),
            embed_layernorm=m.embed_layernorm,
            init_method_std=m.init_method_std,
            hidden_dropout=m.hidden_dropout,
            attention_dropout=m.attention_dropout,
            layernorm_epsilon=m.layernorm_epsilon,
        )


def _generator(seed: int, layer_index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 100_003 + layer_index)


def _normal_(tensor: torch.Tensor, std: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * std)


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)


class EmbeddingPipe(nn.Module):
    """Word + learned position embeddings (+ optional LayerNorm), and the tied output head.

    `with_positions=False` is the last stage's copy: only the word embedding the head needs.
    """

    def __init__(self, shape: GPTShape, seed: int, with_positions: bool = True) -> None:
        super().__init__()
        self.shape = shape
        gen = _generator(seed, 0)
        self.word_embeddings = nn.Embedding(shape.padded_vocab_size, shape.hidden_size)
        _normal_(self.word_embeddings.weight, shape.init_method_std, gen)
        if with_positions:
            self.position_embeddings = nn.Embedding(shape.max_position_embeddings, shape.hidden_size)
            _normal_(self.position_embeddings.weight, shape.init_method_std, gen)
            self.embed_norm = LayerNorm(shape.hidden_size, shape.layernorm_epsilon) if shape.embed_layernorm else None
            self.drop = nn.Dropout(shape.hidden_dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        assert T <= self.shape.max_position_embeddings, f"sequence {T} > max positions {self.shape.max_position_embeddings}"
        positions = torch.arange(T, device=tokens.device)
        x = self.word_embeddings(tokens) + self.position_embeddings(positions)  # (B, T, h)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.drop(x)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.word_embeddings.weight)  # (B, T, V)


def head_forward(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """The tied output head as a pipeline layer (a module-level function: specs stay picklable)."""
    return embedding.head(hidden)


class SelfAttention(nn.Module):
    def __init__(self, shape: GPTShape, gen: torch.Generator) -> None:
        super().__init__()
        h = shape.hidden_size
        self.n_head = shape.num_attention_heads
        self.query_key_value = nn.Linear(h, 3 * h)  # fused QKV, Megatron's per-head [q k v] layout
        self.dense = nn.Linear(h, h)
        _normal_(self.query_key_value.weight, shape.init_method_std, gen)
        _normal_(self.dense.weight, shape.init_method_std / math.sqrt(2.0 * shape.num_layers), gen)
        nn.init.zeros_(self.query_key_value.bias)
        nn.init.zeros_(self.dense.bias)
        self.attention_dropout = shape.attention_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        qkv = self.query_key_value(x).view(B, T, self.n_head, 3 * hs)  # (B, T, nh, 3 hs)
        q, k, v = qkv.transpose(1, 2).split(hs, dim=-1)  # (B, nh, T, hs)
        dropout = self.attention_dropout if self.training else 0.0
        y = causal_attention(q, k, v, dropout)  # (B, nh, T, hs)
        return self.dense(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, shape: GPTShape, gen: torch.Generator) -> None:
        super().__init__()
        h, f = shape.hidden_size, shape.ffn_hidden_size
        self.dense_h_to_4h = nn.Linear(h, f, bias=False)
        self.bias_h_to_4h = nn.Parameter(torch.zeros(f))  # added inside bias_gelu, as Megatron fuses it
        self.dense_4h_to_h = nn.Linear(f, h)
        _normal_(self.dense_h_to_4h.weight, shape.init_method_std, gen)
        _normal_(self.dense_4h_to_h.weight, shape.init_method_std / math.sqrt(2.0 * shape.num_layers), gen)
        nn.init.zeros_(self.dense_4h_to_h.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(bias_gelu(self.dense_h_to_4h(x), self.bias_h_to_4h))


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x)))."""

    def __init__(self, shape: GPTShape, seed: int, layer_number: int) -> None:
        super().__init__()
        gen = _generator(seed, layer_number)
        self.input_layernorm = LayerNorm(shape.hidden_size, shape.layernorm_epsilon)
        self.self_attention = SelfAttention(shape, gen)
        self.post_attention_layernorm = LayerNorm(shape.hidden_size, shape.layernorm_epsilon)
        self.mlp = MLP(shape, gen)
        self.drop = nn.Dropout(shape.hidden_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.self_attention(self.input_layernorm(x)))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class FinalNorm(LayerNorm):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__(shape.hidden_size, shape.layernorm_epsilon)


def lm_loss(logits: torch.Tensor, labels: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Megatron's masked LM loss: sum(CE * mask) / sum(mask), in fp32. logits (B, T, V)."""
    targets, loss_mask = labels
    losses = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
    mask = loss_mask.reshape(-1).float()
    return (losses * mask).sum() / mask.sum()


def layer_specs(shape: GPTShape, seed: int) -> list:
    """The model as pipeline layer specs: embedding, blocks, final norm, tied head."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    specs: list = [TiedLayerSpec("word_embeddings", EmbeddingPipe, shape, seed, tied_weight_attr="word_embeddings.weight")]
    specs += [LayerSpec(TransformerBlock, shape, seed, i + 1) for i in range(shape.num_layers)]
    specs.append(LayerSpec(FinalNorm, shape))
    specs.append(TiedLayerSpec("word_embeddings", EmbeddingPipe, shape, seed, with_positions=False,
                               forward_fn=head_forward, tied_weight_attr="word_embeddings.weight"))
    return specs


def build_sequential(shape: GPTShape, seed: int) -> nn.Module:
    """The same layers as one plain nn.Module, for the plain-PyTorch baseline of the benchmark."""

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = EmbeddingPipe(shape, seed)
            self.blocks = nn.ModuleList(TransformerBlock(shape, seed, i + 1) for i in range(shape.num_layers))
            self.final_norm = FinalNorm(shape)

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
