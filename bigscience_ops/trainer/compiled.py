"""`model.compile: true`: each transformer block is compiled by torch.compile, with its compilations counted and
bounded.

A block is compiled in place (`nn.Module.compile`): its parameters keep their names, so checkpoints
are the same with compile on or off and a run can resume under either. Every block runs the same
code with parameters as graph inputs, so one graph serves all of them; a new input shape (a
curriculum's sequence length), grad mode (activation checkpointing's first pass) or dtype adds one.
Each graph handed to the compiler is counted (`compiled_graphs`) and announced by rank 0; dynamo
recompiles one code object at most RECOMPILE_LIMIT times, after which that frame runs eagerly (and
the count stops growing), so a shape that changes every step costs a bounded compile time.

Inside a compiled block the ops run their torch references (model.py): inductor fuses the dropout,
residual adds, LayerNorm and bias-GeLU itself (Triton kernels on CUDA, C++ on CPU) and keeps SDPA.
With dropout, inductor draws its own masks (a pure function of the default generator's state, as
eager's), so compile on and off give the same losses only without dropout; a resumed run is still
reproducible under either.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn

BACKEND = os.environ.get("BSOPS_COMPILE_BACKEND", "inductor")
"""The torch.compile backend: inductor, or aot_eager (dynamo and AOTAutograd without code generation) to tell a
compiler fault from a tracing one, as torch's own debugging advice goes."""
RECOMPILE_LIMIT = 8
"""Graphs per code object before dynamo stops recompiling it (torch's default: what 8 shapes cost at most)."""

_graphs = 0


def compiled_graphs() -> int:
    """Graphs the compiler has been handed in this process (first compilations and recompilations)."""
    return _graphs


def _announce(count: int) -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0:
        sys.stdout.write(f"> torch.compile: graph {count} compiled (recompile limit {RECOMPILE_LIMIT} per block "
                         "code object)\n")
        sys.stdout.flush()


def _counting_backend(gm: torch.fx.GraphModule, example_inputs: list):
    global _graphs
    _graphs += 1
    _announce(_graphs)
    return torch._dynamo.lookup_backend(BACKEND)(gm, example_inputs)


def compile_block(module: nn.Module) -> nn.Module:
    """Compile `module` in place (its state_dict keys unchanged), through the counting backend, and bound
    recompilations to RECOMPILE_LIMIT. Compilation happens at the first call."""
    config = torch._dynamo.config
    setattr(config, "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit",  # renamed
            RECOMPILE_LIMIT)
    module.compile(backend=_counting_backend)
    return module
