"""`--model bsops` in lm-eval's registry (ops/evaluate/plugin.py): registered beside lm-eval's own models, its
model_args checked before anything is loaded. The run through lm-eval's command line under torchrun, against
`bsops eval`'s and the hf model's numbers, is tests/evaluate/test_evaluate_harness.py's (slow: the session's trained run)."""

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


@pytest.mark.parametrize(("given", "precision", "chosen"), [
    (None, "bf16", None), ("auto", "bf16", "training"), ("float32", "bf16", "fp32"), ("bfloat16", "bf16", "training"),
    ("float16", "fp16", "training"), ("half", "fp16", "training"), ("training", "fp32", "training"),
    ("fp32", "bf16", "fp32"),
])
def test_lm_evals_dtype_names_are_the_training_precision_or_fp32(given, precision, chosen):
    from types import SimpleNamespace

    from bigscience_ops.ops.evaluate import plugin

    assert plugin.dtype_choice(SimpleNamespace(train=SimpleNamespace(precision=precision)), given) == chosen


@pytest.mark.parametrize(("given", "precision"), [("bfloat16", "fp32"), ("float16", "bf16"), ("int8", "bf16"), (3, "bf16")])
def test_a_dtype_the_run_did_not_train_in_is_refused_naming_what_is_allowed(given, precision):
    from types import SimpleNamespace

    from bigscience_ops.ops.evaluate import EvalError, plugin

    with pytest.raises(EvalError, match=rf"dtype={given!r}: allowed: auto \(the training precision, {precision}\)"):
        plugin.dtype_choice(SimpleNamespace(train=SimpleNamespace(precision=precision)), given)


def test_batch_size_auto_is_refused_and_a_number_is_taken():
    from bigscience_ops.ops.evaluate import EvalError, plugin

    assert plugin.batch_size_choice(None, 8) == 8 and plugin.batch_size_choice("4", 8) == 4
    assert plugin.batch_size_choice(2, 8) == 2
    for refused in ("auto", "auto:4", 0, "-1", True):
        with pytest.raises(EvalError, match="does not search a batch size; allowed: a whole number >= 1"):
            plugin.batch_size_choice(refused, 8)


def test_a_device_other_than_where_the_ranks_score_is_refused():
    from bigscience_ops.ops.evaluate import EvalError, plugin

    plugin.device_check(None, "cpu")
    plugin.device_check("cuda:0", "cpu")  # lm-eval's own default when --device is left out: taken as none given
    plugin.device_check("cpu", "cpu")
    plugin.device_check("cuda:0", "cuda")
    for other in ("cuda:1", "cuda", "mps"):
        with pytest.raises(EvalError, match=rf"--device {other}: this run scores on cpu .*allowed: cpu, or leave it"):
            plugin.device_check(other, "cpu")
    with pytest.raises(EvalError, match=r"--device cpu: this run scores on cuda"):
        plugin.device_check("cpu", "cuda")


def test_lm_evals_results_and_output_folder_are_named_after_the_run_and_step(monkeypatch, tmp_path):
    """lm-eval names `--output_path DIR`'s folder after model_args' pretrained= (else a random word): for `--model
    bsops` it is the checkpoint's run and step; another model's name is lm-eval's own. The real `lm_eval --model
    bsops --output_path` run is test_evaluate_harness.py's (slow)."""
    from lm_eval.loggers import EvaluationTracker

    from bigscience_ops.ops.evaluate import plugin, results

    monkeypatch.setattr(plugin.BsopsModel, "last_name", results.model_name("tiny", "global_step221"))
    names = {}
    for source, args in (("bsops", {"run": "tiny", "step": "latest"}), ("hf", {"pretrained": "org/gpt2"})):
        tracker = EvaluationTracker(output_path=str(tmp_path / source))
        tracker.general_config_tracker.log_experiment_args(model_source=source, model_args=args,
                                                           system_instruction=None, chat_template=None,
                                                           fewshot_as_multiturn=False)
        tracker.save_results_aggregated(results={"results": {}}, samples=None)
        [folder] = (tmp_path / source).iterdir()
        names[source] = (tracker.general_config_tracker.model_name, folder.name)
    assert names == {"bsops": ("tiny/global_step221", "tiny__global_step221"), "hf": ("org/gpt2", "org__gpt2")}
