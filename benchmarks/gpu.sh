#!/usr/bin/env bash
# The GPU acceptance command: on one GPU, offline, within 8 minutes, one table of pass/fail and figures
# (benchmarks/gpu_acceptance.py: the precision x ZeRO matrix through `bsops launch --local`, bsops eval against
# lm-eval's hf backend, the kernel tests compiled, throughput against the plain loops). Usage, from the repository:
#   bash benchmarks/gpu.sh [gpu_acceptance.py options, e.g. --only matrix,eval]
# Wheels the machine lacks (DeepSpeed, lm-eval and their parts: see benchmarks/RESULTS.md) go in .whl/ and are
# installed into /tmp/site first. The table is written to $OUT/acceptance.md (default /tmp/out); KBENCH=1 adds the
# kernel benchmark (benchmarks/kernels.py) after it.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
if [[ -d .whl ]]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
$PY benchmarks/gpu_acceptance.py --out "$OUT" "$@"
status=$?
if [[ ${KBENCH:-0} == 1 ]]; then
  timeout ${KBENCH_S:-180} $PY benchmarks/kernels.py --dtype bf16 > "$OUT/kernels.txt" 2>&1
  tail -60 "$OUT/kernels.txt"
fi
exit $status
