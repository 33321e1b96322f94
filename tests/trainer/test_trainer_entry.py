"""`python -m bigscience_ops.trainer` (trainer/__main__.py): the trainer's imports run without the cyclic garbage
collector, and what they made is frozen, so that no later collection walks torch's and DeepSpeed's objects again
(DeepSpeed's bf16 optimizer forces six full collections while it is built)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, sys
full = []
gc.callbacks.append(lambda phase, info: phase == "start" and info["generation"] == 2 and full.append(1))
sys.argv = ["trainer"]  # no arguments: the trainer's parser exits 2 right after the imports
from bigscience_ops.trainer.__main__ import start
try:
    start()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"exit": code, "full collections": len(full), "frozen": gc.get_freeze_count(),
                  "collector on": gc.isenabled(), "torch imported": "torch" in sys.modules}))
"""


def test_the_trainers_imports_run_without_collections_and_are_frozen():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen.pop("frozen") > 100_000, seen  # torch and DeepSpeed alone make several hundred thousand objects
    assert seen == {"exit": 2, "full collections": 0, "collector on": True, "torch imported": True}
