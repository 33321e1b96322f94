"""kernels/__init__.py and kernels/_launch.py: which implementation each `model.kernels` choice runs (and
what it refuses), and the launch geometry of the row-wise kernels on the interpreter and on a GPU.

Runs on CPU tensors under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), and on CUDA
tensors unchanged when a GPU is present (BSOPS_KERNEL_DEVICE=cuda). The GPU geometry is computed on
any machine with the SM count given; only the SM count itself needs the GPU.
"""

from __future__ import annotations

import pytest
import torch
import triton

from bigscience_ops import kernels
from bigscience_ops.errors import BsopsError
from bigscience_ops.kernels import _launch
from bigscience_ops.kernels._launch import (
    GPU_TILE, INTERPRETED_PROGRAMS, INTERPRETED_TILE, RowLaunch, row_launch, sm_count,
)
from bigscience_ops.kernels.crossentropy import cross_entropy_reference
from bigscience_ops.kernels.gelu import bias_gelu_reference
from bigscience_ops.kernels.layernorm import layer_norm_reference
from bigscience_ops.kernels.softmax import causal_attention_torch
from tests.fixtures_kernels import DEVICE, _close, _randn

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_dispatch_follows_the_switch(monkeypatch):
    x = _randn(4, 24, seed=15)
    w, b = _randn(24, seed=16), _randn(24, seed=17)
    reference = layer_norm_reference(x, w, b, 1e-5)
    assert torch.equal(kernels.layer_norm(x, w, b, 1e-5, "torch"), reference)
    assert torch.equal(kernels.layer_norm(x, w, b, 1e-5, "auto"), reference) == (not x.is_cuda)
    _close(kernels.layer_norm(x, w, b, 1e-5, "triton"), reference, torch.float32, "triton")
    with pytest.raises(kernels.KernelUnavailable, match="'fast'"):
        kernels.layer_norm(x, w, b, 1e-5, "fast")
    if not x.is_cuda:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(kernels.KernelUnavailable, match="TRITON_INTERPRET"):
            kernels.bias_gelu(x, b, "triton")


def test_use_triton_for_each_choice(monkeypatch):
    """torch: never; auto: on CUDA tensors only; triton: on CUDA, and on CPU tensors under the interpreter."""
    assert kernels.CHOICES == ("auto", "triton", "torch")
    here = torch.zeros(1, device=DEVICE)
    assert kernels.use_triton("torch", here) is False
    assert kernels.use_triton("auto", here) is here.is_cuda
    assert kernels.use_triton("auto", torch.zeros(1)) is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.use_triton("triton", torch.zeros(1)) is True
    if here.is_cuda:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert kernels.use_triton("triton", here) is True


@pytest.mark.parametrize("interpret", [None, "0"])
def test_triton_on_cpu_tensors_without_the_interpreter_is_refused(monkeypatch, interpret):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    with pytest.raises(kernels.KernelUnavailable) as refused:
        kernels.use_triton("triton", torch.zeros(1))
    assert isinstance(refused.value, BsopsError)  # the CLI's error type: a message and an exit code, no trace
    assert kernels.use_triton("torch", torch.zeros(1)) is False  # the other choices still answer
    assert kernels.use_triton("auto", torch.zeros(1)) is False


@pytest.mark.parametrize("choice", ["fast", "", "Triton", "cuda"])
def test_an_unknown_choice_is_refused_on_any_device(choice):
    for tensor in (torch.zeros(1), torch.zeros(1, device=DEVICE)):
        with pytest.raises(kernels.KernelUnavailable):
            kernels.use_triton(choice, tensor)


def _ops():
    """Each dispatched op as (name, call with a choice, the torch reference's result), small fp32 inputs."""
    x, w, b = _randn(6, 40, seed=80), _randn(40, seed=81), _randn(40, seed=82)
    q, k, v = (_randn(1, 2, 19, 16, seed=seed) for seed in (83, 84, 85))
    logits = _randn(7, 90, seed=86, scale=3.0)
    targets = torch.randint(0, 90, (7,), generator=torch.Generator().manual_seed(87)).to(DEVICE)
    return [
        ("layer_norm", lambda c: kernels.layer_norm(x, w, b, 1e-5, c), layer_norm_reference(x, w, b, 1e-5)),
        ("bias_gelu", lambda c: kernels.bias_gelu(x, b, c), bias_gelu_reference(x, b)),
        ("causal_attention", lambda c: kernels.causal_attention(q, k, v, 0.0, c), causal_attention_torch(q, k, v)),
        ("cross_entropy", lambda c: kernels.cross_entropy(logits, targets, c),
         cross_entropy_reference(logits, targets)),
    ]


def test_each_op_runs_what_the_choice_names():
    """torch: the reference itself; triton: the kernel (the reference's values); auto: triton's very result on
    CUDA, the reference's elsewhere."""
    for name, run, reference in _ops():
        assert torch.equal(run("torch"), reference), name
        triton_out = run("triton")
        _close(triton_out, reference, torch.float32, name)
        assert torch.equal(run("auto"), triton_out if DEVICE.type == "cuda" else reference), name


def test_row_launch_on_the_interpreter():
    """A few programs with large tiles: the interpreter pays per program, not per element."""
    assert row_launch(1000, 100, CPU) == RowLaunch(programs=4, rows_per_program=250, block_m=256, block_n=128,
                                                   num_warps=1)
    assert row_launch(3, 5000, CPU, max_block_n=1024) == RowLaunch(3, 1, 1, 1024, 1)
    assert row_launch(100, 50257, CPU) == RowLaunch(4, 25, 1, 65536, 1)  # a whole GPT-2 vocabulary row per tile
    assert row_launch(0, 0, CPU) == RowLaunch(1, 1, 1, 1, 1)


def test_row_launch_on_a_gpu(monkeypatch):
    """Tiles of at most 16 rows and GPU_TILE elements, at most 4 programs per SM (132 SMs: an H100 SXM)."""
    monkeypatch.setattr(_launch, "sm_count", lambda device: 132)
    assert row_launch(1000, 100, CUDA) == RowLaunch(programs=63, rows_per_program=16, block_m=16, block_n=128,
                                                    num_warps=4)
    assert row_launch(8, 50257, CUDA, max_block_n=4096) == RowLaunch(8, 1, 1, 4096, 8)
    assert row_launch(100_000, 1024, CUDA) == RowLaunch(528, 190, 4, 1024, 8)  # LayerNorm over 100k tokens
    assert row_launch(1000, 5000, CUDA) == RowLaunch(528, 2, 1, 8192, 16)


@pytest.mark.parametrize("device,sms", [(CPU, None), (CUDA, 132), (CUDA, 1)])
def test_row_launch_covers_every_row_within_the_tile_budget(monkeypatch, device, sms):
    monkeypatch.setattr(_launch, "sm_count", lambda d: sms)
    for rows in (1, 2, 5, 37, 111, 1000, 100_000):
        for cols in (1, 7, 100, 1100, 5000, 50257):
            for cap in (None, 1024):
                launch = row_launch(rows, cols, device, cap)
                case = (rows, cols, cap, launch)
                whole_row = triton.next_power_of_2(cols)
                assert launch.block_n == (whole_row if cap is None else min(whole_row, cap)), case
                assert launch.programs >= 1 and launch.programs * launch.rows_per_program >= rows, case
                assert launch.block_m >= 1 and launch.block_m & (launch.block_m - 1) == 0, case  # a power of two
                if device.type == "cuda":
                    assert launch.programs <= 4 * sms and launch.block_m <= 16, case
                    assert launch.block_m == 1 or launch.block_m * launch.block_n <= GPU_TILE, case
                    assert launch.num_warps in (4, 8, 16), case
                else:
                    assert launch.programs <= INTERPRETED_PROGRAMS and launch.num_warps == 1, case
                    assert launch.block_m == 1 or launch.block_m * launch.block_n <= INTERPRETED_TILE, case


@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a GPU (BSOPS_KERNEL_DEVICE=cuda)")
def test_sm_count_is_the_devices():
    assert sm_count(DEVICE) == torch.cuda.get_device_properties(DEVICE).multi_processor_count
    assert row_launch(1 << 20, 64, DEVICE).programs == 4 * sm_count(DEVICE)
