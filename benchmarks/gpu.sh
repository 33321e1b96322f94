#!/usr/bin/env bash
# GPU checks: kernel tests compiled for the GPU, the trainer's throughput, the kernel benchmark.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
if [[ -d .whl ]]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton; from importlib.metadata import version as v; print("python", __import__("sys").version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "liger", v("liger-kernel"), "deepspeed", v("deepspeed"))'
} 2>&1 | tee "$OUT/env.txt"
echo "== kernel tests on cuda" | tee "$OUT/tests.txt"
# Eight pytest-xdist workers compile Triton's kernels side by side (89 tests: 42 s on 16 cores, not minutes).
TRITON_INTERPRET=0 BSOPS_KERNEL_DEVICE=cuda timeout 240 $PY -m pytest -q --noconftest -o addopts="" -p no:cacheprovider \
  -n 8 tests/test_kernels_*.py 2>&1 | tail -40 | tee -a "$OUT/tests.txt"
for k in triton torch; do
  echo "== train throughput, kernels $k" | tee -a "$OUT/train.txt"
  timeout 120 $PY benchmarks/train_throughput.py --device cuda --kernels $k 2>&1 | tail -5 | tee -a "$OUT/train.txt"
done
echo "== kernels bench" | tee "$OUT/kernels.txt"
timeout ${KBENCH_S:-180} $PY benchmarks/kernels.py --dtype bf16 2>&1 | tee -a "$OUT/kernels.txt" | tail -60
