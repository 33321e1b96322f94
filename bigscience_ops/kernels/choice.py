"""`model.kernels` resolved per op: which implementation each fused op runs, and why.

The ops (OPS) each have two implementations: `torch` (the reference: eager torch, torch's SDPA for
attention, FlashAttention or memory-efficient attention inside on CUDA) and `triton` (the project's
kernel). The experiment's choice becomes one KernelChoice before the model is built:

    torch, triton   every op runs that implementation (no measurement);
    auto on CPU     the torch references (Triton runs on the CPU only interpreted, for tests);
    auto on CUDA    each op's candidates are timed at the run's shape (kernels/measure.py) and
                    `choose` keeps the Triton kernel only where it beats torch by more than MARGIN.

`choose` is a pure function of the timings, so the same measurements always give the same choice
(tests feed it timings). The choice says itself in one line (`describe`, printed once by rank 0)
and as a JSON-able record (`record`, written with the run; `from_record` reads it back).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from bigscience_ops.errors import BsopsError

OPS = ("layer_norm", "residual_layer_norm", "bias_gelu", "attention", "cross_entropy")
"""layer_norm: the blocks' input and the final LayerNorm; residual_layer_norm: the attention output's dropout,
residual add and the post-attention LayerNorm in one; bias_gelu: the MLP's; attention: causal self-attention
(with ALiBi and dropout); cross_entropy: the LM loss."""
IMPLEMENTATIONS = ("torch", "triton")
CHOICES = ("auto", "triton", "torch")
MARGIN = 0.05
"""Triton is kept only when its time is below (1 - MARGIN) x torch's: a kernel that cannot show it is
faster than a few percent of timing noise stays eager (the reference is the simpler, better-tested path)."""

Timings = Mapping[str, Mapping[str, "float | None"]]
"""op -> implementation -> ms per forward + backward at the run's shape (None: it failed to run)."""


class KernelChoiceError(BsopsError):
    """A kernel choice or a measurement that cannot be used: an unknown choice, op or implementation, or a
    time that is not a positive finite number."""


def choose(timings: Timings, margin: float = MARGIN) -> dict[str, str]:
    """Each measured op's implementation: `triton` where it ran and took less than (1 - margin) x torch's time
    (or torch failed to run), `torch` otherwise. Pure: the same timings give the same choice."""
    if not 0.0 <= margin < 1.0:
        raise KernelChoiceError(f"kernel choice: margin {margin!r} must be in [0, 1)")
    chosen = {}
    for op, times in timings.items():
        if op not in OPS:
            raise KernelChoiceError(f"kernel timings: unknown op {op!r}; allowed: {', '.join(OPS)}")
        for impl, ms in times.items():
            if impl not in IMPLEMENTATIONS:
                raise KernelChoiceError(f"kernel timings of {op}: unknown implementation {impl!r}; "
                                        f"allowed: {', '.join(IMPLEMENTATIONS)}")
            if ms is not None and not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0):
                raise KernelChoiceError(f"kernel timings of {op}/{impl}: got {ms!r} ms; allowed: a positive finite "
                                        "number, or None for a candidate that failed to run")
        torch_ms, triton_ms = times.get("torch"), times.get("triton")
        faster = triton_ms is not None and (torch_ms is None or triton_ms < (1.0 - margin) * torch_ms)
        chosen[op] = "triton" if faster else "torch"
    return chosen


@dataclass(frozen=True)
class KernelChoice:
    """The implementation of each op (auto, triton or torch: what kernels/__init__.py's dispatch takes), what
    the experiment asked for, and the timings and shape a measured choice was made from."""

    layer_norm: str = "auto"
    residual_layer_norm: str = "auto"
    bias_gelu: str = "auto"
    attention: str = "auto"
    cross_entropy: str = "auto"
    requested: str = "auto"
    timings: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict, compare=False)
    measured_at: str = ""
    """Where the timings were taken: tokens, widths, dtype, device (empty when nothing was measured)."""

    def __post_init__(self) -> None:
        for name in (*OPS, "requested"):
            value = getattr(self, name)
            if value not in CHOICES:
                raise KernelChoiceError(f"model.kernels ({name}): got {value!r}; allowed: {', '.join(CHOICES)}")

    def ops(self) -> dict[str, str]:
        return {op: getattr(self, op) for op in OPS}

    def describe(self) -> str:
        """One line: the choice per op, with the measured times when there are any."""
        parts = []
        for op, impl in self.ops().items():
            times = self.timings.get(op, {})
            shown = ", ".join(f"{name} {'failed' if ms is None else f'{ms:.3f} ms'}" for name, ms in times.items())
            parts.append(f"{op} {impl}" + (f" ({shown})" if shown else ""))
        how = f"measured at {self.measured_at}" if self.measured_at else "not measured"
        return f"> kernels ({self.requested}, {how}): " + "; ".join(parts)

    def record(self) -> dict:
        """JSON-able: what was asked, what each op runs, and the timings behind it."""
        return {"requested": self.requested, "ops": self.ops(),
                "timings_ms": {op: dict(times) for op, times in self.timings.items()},
                "measured_at": self.measured_at}

    @classmethod
    def from_record(cls, record: Mapping) -> KernelChoice:
        ops = record.get("ops")
        if not isinstance(ops, Mapping) or set(ops) != set(OPS):
            raise KernelChoiceError(f"kernels record: 'ops' must name each of {', '.join(OPS)}; got {ops!r}")
        return cls(**dict(ops), requested=record.get("requested", "auto"),
                   timings={op: dict(t) for op, t in dict(record.get("timings_ms") or {}).items()},
                   measured_at=str(record.get("measured_at") or ""))


def uniform(choice: str) -> KernelChoice:
    """Every op runs `choice` (auto, triton or torch), as the experiment's `model.kernels` names it."""
    if choice not in CHOICES:
        raise KernelChoiceError(f"model.kernels: got {choice!r}; allowed: {', '.join(CHOICES)}")
    return KernelChoice(**{op: choice for op in OPS}, requested=choice)


def as_choice(kernels: str | KernelChoice) -> KernelChoice:
    """A per-op choice from either a KernelChoice or one name for every op."""
    return kernels if isinstance(kernels, KernelChoice) else uniform(kernels)


def from_timings(requested: str, timings: Timings, measured_at: str, margin: float = MARGIN) -> KernelChoice:
    """The KernelChoice `choose` makes from `timings`; ops that were not measured take the torch reference."""
    chosen = {op: "torch" for op in OPS} | choose(timings, margin)
    return KernelChoice(**chosen, requested=requested, timings={op: dict(t) for op, t in timings.items()},
                        measured_at=measured_at)


def resolve(requested: str, device_type: str, measure: Callable[[], Timings], where: Callable[[], str],
            recorded: KernelChoice | None = None) -> KernelChoice:
    """The run's choice: torch and triton as named; auto elsewhere than CUDA the torch references, unmeasured; auto
    on CUDA the `recorded` choice (the checkpoint's a run resumes from) when it was measured `where()` this run
    would measure, so a resumed run keeps its kernels, else a choice from `measure()`."""
    fixed = uniform(requested)
    if requested != "auto":
        return fixed
    if device_type != "cuda":
        return replace(uniform("torch"), requested="auto")
    here = where()
    if recorded is not None and recorded.requested == "auto" and recorded.timings and recorded.measured_at == here:
        return recorded
    return from_timings(requested, measure(), here)

