"""`--model bsops` in lm-eval's registry (ops/evaluate/plugin.py): registered beside lm-eval's own models, its
model_args checked before anything is loaded. The run through lm-eval's command line under torchrun, against
`bsops eval`'s and the hf model's numbers, is tests/test_evaluate_harness.py's (slow: the session's trained run)."""

from __future__ import annotations

import pytest


def test_bsops_is_a_model_of_lm_evals_registry_beside_its_own():
    from lm_eval.api.registry import get_model, model_registry

    from bigscience_ops.ops.evaluate import lm_eval_hook, plugin

    assert get_model("bsops") is lm_eval_hook.Entry and lm_eval_hook.Entry.model() is plugin.BsopsModel
    assert {"hf", "vllm", "dummy"} <= set(model_registry.keys())  # lm-eval's own models are still found


@pytest.mark.parametrize("args", [{"run": "tiny", "pretrained": "gpt2"}, {"run": "tiny", "dtype": "float16"}])
def test_model_args_bsops_does_not_know_are_refused_by_name(args):
    from bigscience_ops.ops.evaluate import EvalError, plugin

    with pytest.raises(EvalError) as caught:
        plugin.BsopsModel.create_from_arg_obj(args)
    named = (set(args) - {"run"}).pop()
    assert named in str(caught.value) and "allowed" in str(caught.value)


def test_a_run_without_a_checkpoint_is_refused_naming_its_folder(tmp_path, monkeypatch):
    from bigscience_ops.ops.evaluate import EvalError, plugin

    (tmp_path / "trainings").mkdir()
    (tmp_path / "trainings" / "ev.yaml").write_text(f"base: tiny\npaths: {{output: {tmp_path / 'run'}}}\n")
    with pytest.raises(EvalError, match=str(tmp_path / "run" / "checkpoints")):
        plugin.BsopsModel(run="ev", trainings_dir=str(tmp_path / "trainings"))
