#!/usr/bin/env bash
# Coverage of the suite (or of the tests given) with every Python process it starts measured: the CLI run as a
# process, pytest-xdist workers, trainer ranks, torchrun workers, local and Slurm job scripts (.coveragerc).
# Usage: bash scripts/coverage.sh [pytest args]     e.g. bash scripts/coverage.sh tests/ops/test_ops_backup.py -n 0
# Prints lines and branches for the modules that guard data or alerts (GUARDED below) and for the whole package,
# then coverage's own report of those modules with the missing lines and branches. Exits with pytest's status.
# Like scripts/test.sh, the tests run on two workers unless the arguments say otherwise (-n 0, -n N).
# The environment comes from scripts/setup.sh (.venv); this script only adds coverage to it when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
if [[ ! -x $py ]]; then
    echo "error: $py not found: run bash scripts/setup.sh first" >&2
    exit 2
fi
# patch = subprocess needs coverage 7.10 or later.
if ! "$py" - <<'EOF' 2>/dev/null; then
import coverage, sys
sys.exit(0 if coverage.version_info[:2] >= (7, 10) else 1)
EOF
    "$py" -m pip install -q "coverage>=7.10,<8"
fi

GUARDED=(
    bigscience_ops/checkpoints/layout.py
    bigscience_ops/checkpoints/manifest.py
    bigscience_ops/checkpoints/resume.py
    bigscience_ops/checkpoints/retention.py
    bigscience_ops/checkpoints/set_aside.py
    bigscience_ops/checkpoints/audit.py
    bigscience_ops/ops/keep/backup.py
    bigscience_ops/ops/tell/*.py
    bigscience_ops/ops/watch/*.py
    bigscience_ops/trainer/checkpointing.py
)

workers=(-n 2)
for arg in "$@"; do
    case "$arg" in
        -n | -n[0-9]* | --numprocesses | --numprocesses=* | no:xdist) workers=() ;;
    esac
done

# Data of an earlier run would be combined into this one.
rm -f .coverage .coverage.*
status=0
"$py" -m coverage run -m pytest "${workers[@]}" "$@" || status=$?
"$py" -m coverage combine --quiet
summary=$(mktemp -d)
trap 'rm -rf "$summary"' EXIT
"$py" -m coverage json --quiet -o "$summary/coverage.json"
"$py" - "$summary/coverage.json" "${GUARDED[@]}" <<'EOF'
"""One line per guarded module, their total and the whole package's: lines, branches, both together."""
import json
import sys

files = json.load(open(sys.argv[1]))["files"]
guarded = [p for p in sys.argv[2:] if not p.endswith("__init__.py")]


def row(name, s):
    lines, lines_hit = s["num_statements"], s["covered_lines"]
    branches, branches_hit = s["num_branches"], s["covered_branches"]
    total, hit = lines + branches, lines_hit + branches_hit
    pct = lambda h, n: f"{100 * h / n:5.1f}%" if n else "    -"
    print(f"{name:44} {lines_hit:5}/{lines:<5} {pct(lines_hit, lines)}  {branches_hit:5}/{branches:<5} "
          f"{pct(branches_hit, branches)}  {pct(hit, total)}")


def add(summaries):
    keys = ("num_statements", "covered_lines", "num_branches", "covered_branches")
    return {k: sum(s[k] for s in summaries) for k in keys}


empty = {"num_statements": 0, "covered_lines": 0, "num_branches": 0, "covered_branches": 0}
print(f"{'module':44} {'lines':>11} {'':6}  {'branches':>11} {'':6}  {'both':>6}")
for path in guarded:
    row(path.removeprefix("bigscience_ops/"), files.get(path, {}).get("summary", empty))
row("guarded modules", add([files.get(p, {}).get("summary", empty) for p in guarded]))
row("bigscience_ops (all)", add([f["summary"] for f in files.values()]))
EOF
echo
"$py" -m coverage report --include="$(IFS=,; echo "${GUARDED[*]}")" --skip-covered || true
exit "$status"
