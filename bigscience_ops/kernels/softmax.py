"""Scaled, causally masked softmax and causal attention: plain-torch references.

`scaled_causal_softmax` is Megatron's FusedScaleMaskSoftmax for the causal case; `causal_attention_torch`
is the whole softmax(q k^T * scale) v product the model calls. Its reference uses torch's
scaled_dot_product_attention (the same math as the explicit softmax, fewer passes over memory).

ALiBi (Press et al., "Train Short, Test Long"; BLOOM): no position embeddings; each head h adds
slope_h * j to the score of key j, as BLOOM's build_alibi_tensor. Per query row that equals
slope_h * (j - i) up to a constant, which the softmax ignores; the torch path and the Triton
kernel add the relative form (small where the weight is, so no precision is lost at long
sequences); the explicit reference adds BLOOM's form, and the tests compare the two. `alibi_slopes` gives
the slopes for any head count; with TP each rank passes its own heads' slice.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's per-head slopes for any head count (the paper's get_slopes, BLOOM's build_alibi_tensor).

    n a power of two: 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise the slopes of the closest power of
    two below n, followed by every other slope of twice that power, as many as the heads left over.
    """
    if num_heads < 1:
        raise ValueError(f"alibi_slopes: num_heads must be >= 1, got {num_heads}")
    closest = 2 ** math.floor(math.log2(num_heads))
    start = 2.0 ** (-8.0 / closest)
    slopes = [start ** (i + 1) for i in range(closest)]
    if closest < num_heads:
        extra = 2.0 ** (-4.0 / closest)  # 2^(-8 / (2 closest)): the odd-numbered slopes of 2 * closest heads
        slopes += [extra ** (2 * i + 1) for i in range(num_heads - closest)]
    return slopes


def alibi_bias(slopes: torch.Tensor, T: int) -> torch.Tensor:
    """BLOOM's bias: slope_h * j for key j, (nh, 1, T) in fp32, broadcast over the query rows."""
    return slopes.float().view(-1, 1, 1) * torch.arange(T, device=slopes.device, dtype=torch.float32).view(1, 1, T)


def scaled_causal_softmax(scores: torch.Tensor, scale: float, bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scores * scale + bias) with positions j > i masked out. scores: (..., T, T); computed in fp32."""
    t_q, t_k = scores.shape[-2:]
    assert t_q == t_k, f"causal softmax needs square scores, got {t_q} x {t_k}"
    mask = torch.ones(t_q, t_k, dtype=torch.bool, device=scores.device).triu(1)
    scaled = scores.float() * scale
    if bias is not None:
        scaled = scaled + bias
    probs = torch.softmax(scaled.masked_fill(mask, float("-inf")), dim=-1)
    return probs.to(scores.dtype)


def causal_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                               alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """Explicit attention: (B, nh, T, hs) x3 -> (B, nh, T, hs); alibi_slopes (nh,) adds ALiBi's bias."""
    T = q.shape[-2]
    bias = None if alibi_slopes is None else alibi_bias(alibi_slopes, T)
    probs = scaled_causal_softmax(q @ k.transpose(-2, -1), 1.0 / math.sqrt(q.shape[-1]), bias)
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p)
    return probs @ v


def causal_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """(B, nh, T, hs) x3 -> (B, nh, T, hs); dropout_p applies to the attention probabilities.

    With alibi_slopes (nh,) the bias and the causal mask go in as one additive (nh, T, T) mask in q's
    dtype, in the relative form slope * (j - i): near the diagonal, where the weight is, its values
    stay small and keep their precision in bf16 (BLOOM's slope * j would not at long sequences).
    """
    if alibi_slopes is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    T = q.shape[-2]
    pos = torch.arange(T, device=q.device, dtype=torch.float32)
    relative = pos.view(1, T) - pos.view(T, 1)  # (T, T): j - i
    mask = alibi_slopes.float().view(-1, 1, 1) * relative  # (nh, T, T)
    mask = mask.masked_fill(relative > 0, float("-inf")).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
