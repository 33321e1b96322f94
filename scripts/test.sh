#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine and runs them. Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
