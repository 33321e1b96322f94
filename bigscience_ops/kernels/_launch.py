"""Launch geometry shared by the row-wise kernels (LayerNorm, bias-GeLU, cross-entropy).

On a GPU a program handles a tile of BLOCK_M rows at a time and there are a few programs per SM.
Under Triton's interpreter (CPU tensors, TRITON_INTERPRET=1) every program costs milliseconds of
Python, while the work inside a program is vectorised numpy: there, a handful of programs with
large tiles is fastest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

INTERPRETED_PROGRAMS = 4  # programs per launch under the interpreter
INTERPRETED_TILE = 1 << 16  # elements per tile under the interpreter
GPU_TILE = 4096  # elements per tile (BLOCK_M x BLOCK_N) on a GPU: fits registers with 4-16 warps


@dataclass(frozen=True)
class RowLaunch:
    programs: int  # grid size along the rows
    rows_per_program: int
    block_m: int  # rows per tile
    block_n: int  # columns per tile (a power of two)
    num_warps: int


def row_launch(rows: int, cols: int, device: torch.device, max_block_n: int | None = None) -> RowLaunch:
    """How to cover a (rows, cols) matrix: whole rows per tile when `max_block_n` is None."""
    block_n = triton.next_power_of_2(max(cols, 1))
    if max_block_n is not None:
        block_n = min(block_n, max_block_n)
    if device.type == "cuda":
        block_m = max(1, min(16, GPU_TILE // block_n))
        programs = min(triton.cdiv(rows, block_m), 4 * sm_count(device))
        num_warps = min(16, max(4, block_m * block_n // 512))
    else:
        block_m = max(1, min(triton.next_power_of_2(triton.cdiv(rows, INTERPRETED_PROGRAMS)),
                             INTERPRETED_TILE // block_n))
        programs = min(triton.cdiv(rows, block_m), INTERPRETED_PROGRAMS)
        num_warps = 1
    programs = max(programs, 1)
    return RowLaunch(programs, triton.cdiv(max(rows, 1), programs), block_m, block_n, num_warps)


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """`t` (..., cols) as a (rows, cols) matrix whose columns are contiguous (a copy only where they are not)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


_SM_COUNTS: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]
