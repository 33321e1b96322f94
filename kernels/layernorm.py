"""LayerNorm: the plain-torch reference, called by the trainer through `layer_norm`.

The kernels issue adds a Triton kernel here; until then `layer_norm` is the reference itself,
so every device runs the same math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension, computed in the input dtype. x: (..., h)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return layer_norm_reference(x, weight, bias, eps)
