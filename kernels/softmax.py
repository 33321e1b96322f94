"""Scaled, causally masked softmax and causal attention: plain-torch references.

`scaled_causal_softmax` is Megatron's FusedScaleMaskSoftmax for the causal case; `causal_attention`
is the whole softmax(q k^T * scale) v product the model calls. Its reference uses torch's
scaled_dot_product_attention (the same math as the explicit softmax, fewer passes over memory).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def scaled_causal_softmax(scores: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scores * scale) with positions j > i masked out. scores: (..., T, T); computed in fp32."""
    t_q, t_k = scores.shape[-2:]
    assert t_q == t_k, f"causal softmax needs square scores, got {t_q} x {t_k}"
    mask = torch.ones(t_q, t_k, dtype=torch.bool, device=scores.device).triu(1)
    probs = torch.softmax((scores.float() * scale).masked_fill(mask, float("-inf")), dim=-1)
    return probs.to(scores.dtype)


def causal_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """Explicit attention: (B, nh, T, hs) x3 -> (B, nh, T, hs)."""
    probs = scaled_causal_softmax(q @ k.transpose(-2, -1), 1.0 / math.sqrt(q.shape[-1]))
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p)
    return probs @ v


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """(B, nh, T, hs) x3 -> (B, nh, T, hs); dropout_p applies to the attention probabilities."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
