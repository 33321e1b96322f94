"""Fused kernels: each module holds Triton kernels, their launcher, the autograd wrapper and a plain-torch reference.

    layernorm.py      LayerNorm (fp32 statistics, fp32 weight/bias gradient reduction)
    residual_layernorm.py  dropout + residual add + LayerNorm in one kernel each way
    gelu.py           bias + GeLU (tanh), Megatron's fused bias_gelu
    attention.py      causal flash attention with dropout and ALiBi (reference and slopes in softmax.py)
    crossentropy.py   chunked (vocab-parallel) cross-entropy: per-shard partials, no fp32 logits copy

The model calls the functions below with each op's implementation from its KernelChoice (choice.py:
the experiment's `model.kernels`, resolved per op before the model is built; on CUDA `auto` is
measured there). What each name means here, for one op:
    auto    Triton on CUDA tensors, the references elsewhere (an op the run did not resolve);
    triton  Triton everywhere: CUDA, or CPU tensors under Triton's interpreter (TRITON_INTERPRET=1);
    torch   the references everywhere (attention: torch's SDPA, FlashAttention inside on CUDA).
The Triton modules are imported only when a Triton kernel is about to run, so the torch path
works on machines where Triton has no driver (softmax.py, torch only, is imported at once).
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from bigscience_ops.errors import BsopsError
from bigscience_ops.kernels.softmax import causal_attention_torch

CHOICES = ("auto", "triton", "torch")


class KernelUnavailable(BsopsError):
    """`model.kernels` asks for Triton where it cannot run, or names an unknown choice."""


def use_triton(choice: str, tensor: torch.Tensor) -> bool:
    """Whether `choice` runs the Triton kernel on `tensor` (raises when it asks for the impossible)."""
    if choice == "torch":
        return False
    if choice == "auto":
        return tensor.is_cuda
    if choice == "triton":
        if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise KernelUnavailable(f"model.kernels: got 'triton' for a tensor on {tensor.device}; Triton runs on "
                                    "CUDA, or on the CPU only under TRITON_INTERPRET=1 (for tests). "
                                    "Use 'auto' (Triton on CUDA, torch elsewhere) or 'torch'")
        return True
    raise KernelUnavailable(f"model.kernels: got {choice!r}; allowed: {', '.join(CHOICES)}")


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               kernels: str = "auto") -> torch.Tensor:
    """LayerNorm over the last dimension. x: (..., h); weight, bias: (h,)."""
    if use_triton(kernels, x):
        from bigscience_ops.kernels.layernorm import layer_norm_triton
        return layer_norm_triton(x, weight, bias, eps)
    from bigscience_ops.kernels.layernorm import layer_norm_reference
    return layer_norm_reference(x, weight, bias, eps)


def residual_layer_norm(x: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                        dropout_p: float = 0.0, kernels: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(s, LayerNorm(s)) with s = x + dropout(branch, dropout_p): the residual stream and the next LayerNorm's
    output. x, branch: (..., h); weight, bias: (h,); dropout_p 0 outside training."""
    if use_triton(kernels, x):
        from bigscience_ops.kernels.residual_layernorm import residual_layer_norm_triton
        return residual_layer_norm_triton(x, branch, weight, bias, eps, dropout_p)
    from bigscience_ops.kernels.residual_layernorm import residual_layer_norm_reference
    return residual_layer_norm_reference(x, branch, weight, bias, eps, dropout_p)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, kernels: str = "auto") -> torch.Tensor:
    """gelu_tanh(x + bias). x: (..., f), bias: (f,)."""
    if use_triton(kernels, x):
        from bigscience_ops.kernels.gelu import bias_gelu_triton
        return bias_gelu_triton(x, bias)
    from bigscience_ops.kernels.gelu import bias_gelu_reference
    return bias_gelu_reference(x, bias)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                     kernels: str = "auto", alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) [+ ALiBi], causal) v with dropout on the probabilities.

    (B, nh, T, hs) x3 -> (B, nh, T, hs); alibi_slopes (nh,): these heads' ALiBi slopes, or None.
    Dropout draws from the default generator of q's device (see attention.py for the Triton seed).
    """
    if use_triton(kernels, q):
        from bigscience_ops.kernels.attention import causal_attention_triton
        return causal_attention_triton(q, k, v, dropout_p, alibi_slopes)
    return causal_attention_torch(q, k, v, dropout_p, alibi_slopes)


Partials = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, kernels: str = "auto", vocab_start: int = 0,
                  combine: Callable[[Partials], Partials] | None = None) -> torch.Tensor:
    """Per-token cross-entropy in fp32: logits (N, V_shard) holding ids [vocab_start, vocab_start + V_shard),
    targets (N,) global ids -> (N,).

    With the vocabulary split over TP ranks, `combine` turns this shard's partials (max, sum of
    exp(z - max), target logit or 0) into the global ones: all-reduces over the TP group (see
    trainer/tensor_parallel.py). The torch path takes the whole vocabulary only (vocab_start 0, no combine).
    """
    if use_triton(kernels, logits):
        from bigscience_ops.kernels.crossentropy import cross_entropy_triton
        return cross_entropy_triton(logits, targets, vocab_start, combine)
    from bigscience_ops.kernels.crossentropy import cross_entropy_reference
    assert vocab_start == 0 and combine is None, "the torch cross-entropy takes the whole vocabulary"
    return cross_entropy_reference(logits, targets)
