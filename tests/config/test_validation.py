"""config/validation.py: the rules across an experiment's fields, each a named check, run from one place."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from bigscience_ops.config import validation
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _refused(trainings: Path, text: str) -> ConfigError:
    (trainings / "bad.yaml").write_text("base: tiny\n" + text)
    with pytest.raises(ConfigError) as err:
        load_experiment("bad", trainings)
    return err.value


@pytest.mark.parametrize(("text", "field", "value"), [
    ("model: {hidden_size: 100, num_attention_heads: 3}\n", "model.hidden_size", "100"),
    ("batch: {global_batch_size: 16, micro_batch_size: 4, rampup: {start: 4, increment: 5, samples: 100}}\n",
     "batch.rampup.increment", "5"),
    ("lr_schedule: {warmup_samples: 10, warmup_iters: 2}\n", "lr_schedule.warmup_iters", "warmup_samples"),
    ("optimizer: {lr: 0.001, min_lr: 0.01}\n", "optimizer.min_lr", "0.01"),
    ("train: {skip_iterations: ['9-3']}\n", "train.skip_iterations", "9-3"),
    ("alerts: {email_to: ['oncall at example.org']}\n", "alerts.email_to[0]", "oncall at example.org"),
    ("alerts: {email_to: ['a@example.org', 'nobody']}\n", "alerts.email_to[1]", "nobody"),
    ("alerts: {email_from: 'bsops'}\n", "alerts.email_from", "bsops"),
    ("alerts: {webhook_url_env: 'A B'}\n", "alerts.webhook_url_env", "A B"),
    ("alerts: {smtp_password_env: 'PASS-WORD'}\n", "alerts.smtp_password_env", "PASS-WORD"),
    ("hub: {token_env: 'HF TOKEN'}\n", "hub.token_env", "HF TOKEN"),
    ("slurm: {time: '3'}\n", "slurm.time", "3"),  # shorter than tiny's 5-minute exit margin
    ("slurm: {time: 'soon'}\n", "slurm.time", "soon"),
    ("slurm: {signal_seconds: 70000}\n", "slurm.signal_seconds", "70000"),
    ("eval: {tasks: ['lambada openai']}\n", "eval.tasks[0]", "lambada openai"),
    ("eval: {tasks: [kjv], sources: {kjv: held.jsonl}}\n", "eval.sources.kjv", "kjv"),
    ("eval: {sources: {'a b': held.jsonl}}\n", "eval.sources.a b", "a b"),
    ("eval: {alert_drop: {lambada_acc: 0.01}}\n", "eval.alert_drop.lambada_acc", "lambada_acc"),
    ("eval: {alert_drop: {lambada/acc: 0}}\n", "eval.alert_drop.lambada/acc", "0"),
    ("eval: {references: {GPT2: {piqa/acc/x: 0.7}}}\n", "eval.references.GPT2.piqa/acc/x", "piqa/acc/x"),
    ("eval: {references: {GPT2: {piqa/acc: high}}}\n", "eval.references.GPT2.piqa/acc", "high"),
    ("eval: {references: [GPT2]}\n", "eval.references", "GPT2"),
    ("eval: {time: 'tomorrow'}\n", "eval.time", "tomorrow"),
])
def test_each_rule_names_its_field_and_value(trainings: Path, text: str, field: str, value: str) -> None:
    error = _refused(trainings, text)
    assert error.field == field and value in str(error.value), (error.field, error.value)


def test_an_address_is_one_line_with_an_at_sign() -> None:
    assert validation.is_email_address("oncall@example.org")
    for bad in ("oncall", "a b@example.org", "a@example.org\nBcc: x@evil", "a@example.org\u2028", "", None, 3):
        assert not validation.is_email_address(bad), bad


def test_the_rules_run_from_one_place() -> None:
    """validate and check_derived are called once each, from config/loading.py's _checked (files and run records alike)."""
    calls = []
    for path in sorted((REPO / "bigscience_ops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "validation" and node.func.attr in ("validate", "check_derived"):
                calls.append((path.name, node.func.attr))
    assert sorted(calls) == [("loading.py", "check_derived"), ("loading.py", "validate")]


@pytest.mark.parametrize("switch", ["", "/", ".", "{run}", "{run}/checkpoints", "{run}/..", "/dev/null", "{dir}",
                                    "{fifo}"])
def test_a_kill_switch_that_would_stop_the_run_for_ever_is_refused(trainings: Path, tmp_path: Path, switch: str) -> None:
    """The empty path (the project folder), `/`, the run folder and its folders, a device, a directory or a pipe:
    each would read as "stopped on purpose" every hour, with no alert."""
    (tmp_path / "a-dir").mkdir()
    os.mkfifo(tmp_path / "a-fifo")
    value = switch.format(run=tmp_path / "run", dir=tmp_path / "a-dir", fifo=tmp_path / "a-fifo")
    error = _refused(trainings, f"paths: {{output: {json.dumps(str(tmp_path / 'run'))}}}\n"
                                f"checkpoint: {{kill_switch_path: {json.dumps(value)}}}\n")
    assert error.field == "checkpoint.kill_switch_path"


@pytest.mark.parametrize("switch", ["{run}/kill-switch", "{run}/stop/now", "{elsewhere}", "{existing}"])
def test_a_kill_switch_file_anywhere_else_is_taken(trainings: Path, tmp_path: Path, switch: str) -> None:
    (tmp_path / "existing").write_text("")  # the run stopped on purpose: still a valid experiment
    value = switch.format(run=tmp_path / "run", elsewhere=tmp_path / "switches" / "run-1",
                          existing=tmp_path / "existing")
    (trainings / "ok.yaml").write_text(f"base: tiny\npaths: {{output: {json.dumps(str(tmp_path / 'run'))}}}\n"
                                       f"checkpoint: {{kill_switch_path: {json.dumps(value)}}}\n")
    assert load_experiment("ok", trainings).checkpoint.kill_switch_path == value


def test_eval_paths_resolve_like_data_paths_and_nodes_cover_the_layout(trainings: Path, tmp_path: Path) -> None:
    """Task files and sources are absolute after loading (corpus/ falls back to the bundled corpus as data paths
    do), registered task names stay names, and the eval job's nodes hold TP x PP processes."""
    (trainings / "ev.yaml").write_text("base: tiny\nparallel: {tensor: 2, pipeline: 2}\nslurm: {gpus_per_node: 3}\n"
                                       "eval: {tasks: [piqa, mine/last.yaml], sources: {cc: held/cc.jsonl},\n"
                                       "       alert_drop: {piqa/acc: 0.02}, references: {GPT2-XL: {piqa/acc: 0.7078}}}\n")
    exp = load_experiment("ev", trainings)
    root = trainings.parent
    assert exp.eval.tasks == ["piqa", str(root / "mine/last.yaml")]
    assert exp.eval.sources == {"cc": str(root / "held/cc.jsonl")}
    assert exp.eval.nodes == 2 and "eval.nodes" in exp.derived
    assert exp.eval.alert_drop == {"piqa/acc": 0.02} and exp.eval.references == {"GPT2-XL": {"piqa/acc": 0.7078}}
    assert exp.eval.configured


# What the schema accepts but a run could not train, save or resume is refused by `bsops plan` before anything runs;
# every other precision x ZeRO stage x layout is launched, saved and resumed by tests/trainer/test_trainer_matrix_*.py.
PHASES = "  node_schedule: [{nodes: 2}, {nodes: 4, from_iteration: 100}]\n"


@pytest.mark.parametrize(("text", "field", "value"), [
    ("train: {precision: fp16}\n", "train.precision", "fp16"),  # tiny: slurm.device cpu
    ("train: {precision: bf16}\nparallel: {zero_stage: 0}\nslurm:\n" + PHASES, "parallel.zero_stage", "0"),
])
def test_plan_refuses_what_could_not_train_or_resume_in_one_line(trainings: Path, text: str, field: str,
                                                                 value: str) -> None:
    from click.testing import CliRunner

    from bigscience_ops.cli import main

    (trainings / "bad.yaml").write_text("base: tiny\n" + text)
    result = CliRunner().invoke(main, ["plan", "bad", "--trainings-dir", str(trainings)])
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert f"{field}: got {value}" in line or f"{field}: got {value!r}" in line or f"{field}: got '{value}'" in line, line


@pytest.mark.parametrize("text", [
    "train: {precision: bf16}\nparallel: {zero_stage: 1}\nslurm:\n" + PHASES,  # ZeRO's partitions convert
    "train: {precision: fp32}\nparallel: {zero_stage: 0}\nslurm:\n" + PHASES,  # loads at another DP as it is
    "train: {precision: bf16}\nparallel: {zero_stage: 0}\n",  # one node count: resumes (the matrix)
])
def test_the_combinations_that_resume_are_accepted(trainings: Path, text: str) -> None:
    (trainings / "ok.yaml").write_text("base: tiny\n" + text)
    exp = load_experiment("ok", trainings)
    assert exp.train.precision in ("fp32", "bf16")


@pytest.mark.parametrize("field, folder", [
    *[("output", folder) for folder in ("/", "{home}", "~", "/etc", "/etc/bsops", "/usr/local/runs", "/var", "/tmp",
                                        "/home", "/proc/self", "{run}/../../../../../../../..")],
    *[(field, folder) for field in ("checkpoints", "tensorboard", "logs", "codecarbon") for folder in ("/", "/etc")],
])
def test_a_run_folder_that_is_the_root_home_or_a_system_folder_is_refused(trainings: Path, tmp_path: Path,
                                                                          folder: str, field: str) -> None:
    """A run writes its records, checkpoints and logs into these, and retention deletes inside them: `/` (a typo, or
    `paths.output=/` on the command line) or the home folder would scatter them among everything else."""
    value = folder.format(home=os.path.expanduser("~"), run=tmp_path / "run")
    text = f"paths: {{output: {json.dumps(str(tmp_path / 'run'))}, {field}: {json.dumps(value)}}}\n"
    if field == "output":
        text = f"paths: {{output: {json.dumps(value)}}}\n"
    error = _refused(trainings, text)
    assert error.field == f"paths.{field}" and error.value == os.path.expanduser(value)


@pytest.mark.parametrize("folder", ["{tmp}/run", "/tmp/x", "/var/tmp/x", "{home}/runs/x", "runs/x"])
def test_a_run_folder_of_its_own_anywhere_else_is_taken(trainings: Path, tmp_path: Path, folder: str) -> None:
    value = folder.format(tmp=tmp_path, home=os.path.expanduser("~"))
    (trainings / "ok.yaml").write_text(f"base: tiny\npaths: {{output: {json.dumps(value)}}}\n")
    assert load_experiment("ok", trainings).paths.output.endswith(value.removeprefix("runs/"))


def test_a_run_record_naming_the_root_as_its_folder_is_refused_too() -> None:
    """experiment.json is untrusted: rebuilt from it, the same rule holds."""
    from bigscience_ops.config.loading import from_dict, to_dict

    data = to_dict(load_experiment("tiny"))
    data["paths"]["checkpoints"] = "/"
    with pytest.raises(ConfigError) as err:
        from_dict(data, "experiment.json")
    assert err.value.field == "paths.checkpoints" and err.value.source == "experiment.json"
