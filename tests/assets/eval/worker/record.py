"""Re-record what `bsops eval`'s ranks (ops/evaluate/worker.py under torchrun, launcher.run_local) leave for two
requests, the result files the command-line tests replay (tests/cli/test_cli_evaluate.py, tests/hostile/test_hostile_tasks.py):

`PYTHONPATH=. .venv/bin/python tests/assets/eval/worker/record.py`   (about a minute: trains, then evaluates twice)

tiny shrunk as tests/fixtures_trainer.py's small_experiment on the bundled corpus (a 2-layer GPT, PP=2, CPU) is
trained to its last step and evaluated in its own layout, offline (no HF cache):
  sources.json          eval.sources {held: the corpus's last lines}: the result file, exit 0
  missing-task.json     eval.tasks [lambada_openai] as well: lm-eval cannot load it offline, so the result holds
                        bits per byte and names the task left out, and the ranks exit 2
exits.json holds each request's exit code and the step evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    from bigscience_ops.checkpoints import layout
    from bigscience_ops.data.corpus import ensure_bundled_corpus
    from bigscience_ops.ops.evaluate import launcher, results
    from bigscience_ops.schema import EvalConfig
    from tests.fixtures_trainer import run_ok, small_experiment, write_run

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with tempfile.TemporaryDirectory(prefix="bsops-record-worker-") as folder:
        work = Path(folder)
        corpus = ensure_bundled_corpus(work / "corpus")
        out = work / "run"
        exp = small_experiment(out, corpus)
        write_run(exp, out)
        run_ok(out, 2, synthetic=False)
        step = layout.latest_step(out / "checkpoints")
        held = work / "held.jsonl"
        held.write_text("".join(json.dumps({"text": f"And the {n}th verse was read out loud in the hall."}) + "\n"
                                for n in range(1, 9)))
        env = {"HF_HOME": str(work / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        exits = {"step": step}
        for case, tasks in (("sources", []), ("missing-task", ["lambada_openai"])):
            evaluated = dataclasses.replace(exp, eval=EvalConfig(tasks=tasks, sources={"held": str(held)}))
            exits[case] = launcher.run_local(evaluated, step, env=env)
            written = results.result_path(evaluated, f"global_step{step}")
            shutil.copy(written, HERE / f"{case}.json")
            written.unlink()
        (HERE / "exits.json").write_text(json.dumps(exits, indent=1) + "\n")
    print(json.dumps(exits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
