#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine and runs them. Usage: bash scripts/test.sh [pytest args]
# The tests run on two pytest-xdist workers unless the arguments say otherwise (-n 0: one process, -n N: N):
# tests/conftest.py keeps the job script's tests (Slurm, bsops launch --local) on one worker, the other launches on the other.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=(-n 2)
for arg in "$@"; do
    case "$arg" in
        -n | -n[0-9]* | --numprocesses | --numprocesses=* | no:xdist) workers=() ;;
    esac
done
exec .venv/bin/python -m pytest "${workers[@]}" "$@"
