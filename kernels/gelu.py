"""Bias + GeLU, as Megatron's fused bias_gelu (tanh approximation): plain-torch reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(x + bias). x: (..., f), bias: (f,)."""
    return F.gelu(x + bias, approximate="tanh")


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return bias_gelu_reference(x, bias)
