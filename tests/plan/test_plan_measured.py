"""`bsops plan` beside its estimate.tflops_per_gpu shows the trainer's TFLOPs measured on the GPU the experiment's
slurm.constraint names, when benchmarks/RESULTS.md has a section for it (bigscience_ops/benchmark_results.py)."""

from __future__ import annotations

import dataclasses

import pytest

from bigscience_ops import benchmark_results
from bigscience_ops.benchmark_results import measured_tflops, read_results
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.plan import make_plan
from bigscience_ops.planview import _duration, measured_on_gpu, plan_text
from bigscience_ops.trainer.report import peak_tflops_of

RESULTS = """# Benchmark results

## GPU checks

### NVIDIA H200 (2026-11-20)

**Trainer throughput** (`train_throughput.py --device cuda`, GPT-2 124M, bf16, GBS 64):
```
kernels triton   plain PyTorch loop   345938 tokens/s   297.54 TFLOPs  MFU 30.1%
                 bsops trainer        347659 tokens/s   250.00 TFLOPs  MFU 25.3%   ratio 1.005
```

### NVIDIA A100-SXM4-80GB (2026-11-25)

`train_throughput.py --device cuda --model 760m`, 760M, bf16
  bsops trainer        100000 tokens/s   140.50 TFLOPs  MFU 45.0%
  bsops trainer        101000 tokens/s   141.25 TFLOPs  MFU 45.3%

### NVIDIA H200 (2026-11-28)

`train_throughput.py --device cuda --model 760m`, 760M, bf16
  plain PyTorch loop   400000 tokens/s   372.00 TFLOPs  MFU 37.6%
  bsops trainer        430000 tokens/s   495.00 TFLOPs  MFU 50.1%

## Dataset index build

  bsops trainer        1 tokens/s   999.00 TFLOPs  (not a GPU section: never read)
"""


def test_the_latest_section_of_the_gpu_family_and_its_best_trainer_line():
    h200 = measured_tflops("h200", RESULTS)
    assert (h200.gpu, h200.date, h200.tflops, h200.model) == ("H200", "2026-11-28", 495.0, "760M")
    a100 = measured_tflops("a100-80g", RESULTS)  # a constraint feature against the device's own name
    assert (a100.gpu, a100.tflops) == ("A100-SXM4-80GB", 141.25)
    assert measured_tflops("NVIDIA H200", RESULTS).tflops == 495.0
    for unknown in ("v100-32g", "", "80g", "h20"):
        assert measured_tflops(unknown, RESULTS) is None, unknown
    assert measured_tflops("h200", RESULTS.replace("bsops trainer", "bsops trainr")) is None


def test_the_repositorys_results_have_a_measurement_for_the_h200():
    measured = measured_tflops("h200", read_results())
    assert measured is not None and 0 < measured.tflops <= peak_tflops_of("NVIDIA H200")


def test_no_file_no_measurement(tmp_path):
    assert read_results(tmp_path / "RESULTS.md") is None


@pytest.fixture
def gpu_tiny():
    exp = load_experiment("tiny")
    return dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, device="gpu", constraint="h200"))


def test_the_plan_shows_the_measured_rate_and_its_days(gpu_tiny, tmp_path, monkeypatch):
    results = tmp_path / "RESULTS.md"
    results.write_text(RESULTS)
    monkeypatch.setattr(benchmark_results, "RESULTS", results)
    plan = make_plan(gpu_tiny)
    measured = measured_on_gpu(gpu_tiny)
    assert measured.tflops == 495.0
    text = plan_text(plan, gpu_tiny)
    at_measured = plan.days * gpu_tiny.estimate.tflops_per_gpu / 495.0
    assert at_measured < plan.days
    assert "495 TFLOPs/GPU" in text and _duration(at_measured) in text and _duration(plan.days) in text

    monkeypatch.setattr(benchmark_results, "RESULTS", tmp_path / "absent.md")  # an installed package: no file
    assert measured_on_gpu(gpu_tiny) is None and "495" not in plan_text(plan, gpu_tiny)
    cpu = dataclasses.replace(gpu_tiny, slurm=dataclasses.replace(gpu_tiny.slurm, device="cpu"))
    monkeypatch.setattr(benchmark_results, "RESULTS", results)
    assert measured_on_gpu(cpu) is None
