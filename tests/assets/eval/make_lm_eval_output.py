"""Regenerates lm_eval_0.4.13_output.json: lm-eval's real output of simple_evaluate over three tiny inline tasks
(multiple_choice, loglikelihood, loglikelihood_rolling) answered by a seeded random LM, as `bsops eval` keeps it.

    HF_DATASETS_OFFLINE=1 .venv/bin/python tests/assets/eval/make_lm_eval_output.py \
        tests/assets/eval/lm_eval_0.4.13_output.json
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

import lm_eval
from lm_eval.api.model import LM
from lm_eval.utils import handle_non_serializable

DOCS = [{"ctx": "The cat sat on the", "a": " mat", "b": " moon", "label": 0},
        {"ctx": "Water is", "a": " wet", "b": " dry", "label": 0},
        {"ctx": "Fire is", "a": " cold", "b": " hot", "label": 1}]


class RandomLM(LM):
    def loglikelihood(self, requests):
        return [(-random.random() * 5, random.random() < 0.5) for _ in requests]

    def loglikelihood_rolling(self, requests):
        return [-random.random() * 50 for _ in requests]

    def generate_until(self, requests):
        return ["x" for _ in requests]


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    common = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}}, "test_split": "test"}
    tasks = [
        {**common, "task": "smoke_choice", "output_type": "multiple_choice", "doc_to_text": "{{ctx}}",
         "doc_to_choice": "{{[a, b]}}", "doc_to_target": "label",
         "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]},
        {**common, "task": "smoke_lastword", "output_type": "loglikelihood", "doc_to_text": "{{ctx}}",
         "doc_to_target": "{{a}}", "metric_list": [{"metric": "perplexity"}, {"metric": "acc"}]},
        {**common, "task": "smoke_ppl", "output_type": "loglikelihood_rolling", "doc_to_text": "",
         "doc_to_target": "{{ctx}}", "metric_list": [{"metric": "word_perplexity"}, {"metric": "byte_perplexity"},
                                                     {"metric": "bits_per_byte"}]},
    ]
    random.seed(0)
    out = lm_eval.simple_evaluate(model=RandomLM(), tasks=tasks, bootstrap_iters=10)
    out.pop("samples", None)
    for machine in ("pretty_env_info", "git_hash", "upper_git_hash", "transformers_version"):
        out.pop(machine, None)
    text = json.dumps(out, indent=2, default=handle_non_serializable).replace(str(folder) + "/", "")
    Path(sys.argv[1]).write_text(text + "\n")  # a file: lm-eval prints to stdout


if __name__ == "__main__":
    main()
