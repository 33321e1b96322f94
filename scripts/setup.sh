#!/usr/bin/env bash
# Creates .venv with bsops and its test dependencies. Idempotent: a second run with unchanged
# pyproject.toml, setup.py and C sources returns at once; a change to any of them reinstalls, which
# also recompiles the C helper (bigscience_ops/data/_shuffle.c). Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
stamp=$venv/.setup-stamp
want=$(cat pyproject.toml setup.py bigscience_ops/data/*.c | sha256sum | cut -d' ' -f1)
# An editable install leaves bsops' own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set
# every process compiles them again (0.1 CPU s of each short command's start-up); compile them once,
# as pip does for a wheel. Stale files are ignored by Python (it checks the source's time and size).
compile_sources() { "$venv/bin/python" -m compileall -q bigscience_ops >/dev/null; }
if [[ -x $venv/bin/bsops && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    compile_sources
    exit 0
fi
echo "setup: creating $venv and installing bigscience-ops (first run takes a few minutes)" >&2
python3 -m venv "$venv"
# The install below rebuilds the C helper from its current source, whatever the timestamps (the
# build skips an extension whose .so is newer than its source).
rm -f bigscience_ops/data/_shuffle*.so
"$venv/bin/pip" install --quiet --upgrade pip
# torch first and pinned: it is the large one, and the pin keeps pip on the local CPU wheel.
"$venv/bin/pip" install --quiet torch==2.13.0
"$venv/bin/pip" install --quiet -e '.[test]'
compile_sources
echo "$want" > "$stamp"
versions=$("$venv/bin/python" -c 'from importlib.metadata import version as v; print("torch", v("torch"), "deepspeed", v("deepspeed"), "triton", v("triton"))')
echo "setup: done ($versions)" >&2
