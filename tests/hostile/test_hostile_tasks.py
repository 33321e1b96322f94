"""Task files are code (ops/evaluate/taskfiles.py): hostile lm-eval task YAML refused by name, never run, never quoted.

Each row of HOSTILE is a task file (and what lies beside it) that `bsops eval` must refuse by default: it names the
file and never prints what the file holds (every row plants SECRET where a careless error would quote it). Trusted
(eval.trust_task_code: true), `!function` and an outside `include:` work as lm-eval runs them. Templates render in
a sandbox; names from inside a task file obey the rule of eval.tasks entries; a task that does not run makes the
evaluation exit non-zero, the result name it with why, and the hourly job alert once (the real SMTP server).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import EXIT_ERROR, main
from bigscience_ops.ops.evaluate import EvalError, driver, launcher, results, taskfiles
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_smtp import alerts_yaml
from tests.evaluate.test_ops_evaluate_results import eval_result
from tests.fixtures_runs import commit_checkpoint
from tests.fixtures_slurm import replay_sbatch, replay_squeue, sbatch_calls
from tests.cli.test_cli_evaluate import RECORDED, WORKER, replay_worker

SECRET = "SECRET-c4f3"
"""Planted in every hostile file where an error could quote it: no message may hold it."""
GOOD = ("dataset_path: json\ndataset_kwargs: {data_files: {test: d.jsonl}}\noutput_type: loglikelihood\n"
        "test_split: test\ndoc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n"
        "doc_to_target: \"{{' '+text.split(' ')[-1]}}\"\nmetric_list: [{metric: acc}]\n")
"""A task file's body without its name: a last-word task over d.jsonl beside it."""


def _pwn(folder: Path) -> None:
    (folder / "pwn.py").write_text(f"import pathlib\npathlib.Path({str(folder / 'PWNED')!r}).write_text('x')\n"
                                   "def process(docs):\n    return docs\n")


def _outside(folder: Path) -> Path:
    other = folder.parent / "elsewhere"
    other.mkdir(exist_ok=True)
    (other / "base.yaml").write_text(f"output_type: loglikelihood\ndescription: {SECRET}\n")
    return other / "base.yaml"


def _chain(folder: Path, n: int) -> str:
    for i in range(n):
        (folder / f"c{i}.yaml").write_text(f"include: c{i + 1}.yaml\n" if i + 1 < n else "output_type: loglikelihood\n")
    return "include: c0.yaml\ntask: t\n"


def _symlinked_include(folder: Path) -> str:
    (folder / "inner.yaml").symlink_to(_outside(folder))
    return "include: inner.yaml\ntask: t\n"


def _bomb() -> str:
    lines = [f'a0: &a0 ["{SECRET}"]'] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\ntask: t\n"


HOSTILE = {  # name -> (the task file's text, or a function of its folder that writes what it needs and returns it)
    "function tag": lambda f: (_pwn(f), f"task: t\nprocess_docs: !function pwn.process\n# {SECRET}\n")[1],
    "function as a class": lambda f: (_pwn(f), "task: t\nclass: !function pwn.process\n")[1],
    "function in a metric": lambda f: (_pwn(f), "task: t\nmetric_list: [{metric: !function pwn.process}]\n")[1],
    "include of the password file": "include: /etc/passwd\ntask: t\n",
    "include of a parent folder's file": lambda f: (_outside(f), "include: ../elsewhere/base.yaml\ntask: t\n")[1],
    "include through a link": _symlinked_include,
    "include loop": lambda f: ((f / "loop.yaml").write_text("include: task.yaml\n"), "include: loop.yaml\ntask: t\n")[1],
    "include chain too long": lambda f: _chain(f, taskfiles.MAX_FILES + 2),
    "task name with U+2028": f'task: "t\\u2028Subject: {SECRET}"\n' + GOOD,
    "task name with a link and HTML": f'task: "<img src=x onerror=alert(1)>[verify](https://evil.example/{SECRET})"\n',
    "task name with a newline": f'task: "t\\n{SECRET}"\n',
    "task name too long": "task: " + "t" * 300 + "\n",
    "task name not text": f"task: {{name: {SECRET}}}\n",
    "metric name with markdown": f'task: t\nmetric_list: [{{metric: "acc](https://evil.example/{SECRET})"}}]\n',
    "filter name with U+2029": f'task: t\nfilter_list: [{{name: "x\\u2029{SECRET}", filter: []}}]\n',
    "tag with a space": f'task: t\ntag: ["a {SECRET}"]\n',
    "group member with a link": f'group: g\ntask: ["https://evil.example/{SECRET}"]\n',
    "group name with U+0085": f'group: "g\\x85{SECRET}"\ntask: [t]\n',
    "metric fetched by HF evaluate": f"task: t\nmetric_list: [{{metric: acc, hf_evaluate: true}}]\n# {SECRET}\n",
    "metric lm-eval does not know": "task: t\nmetric_list: [{metric: pwn_metric}]\n",
    "python object tag": f"task: !!python/object/apply:os.system ['echo {SECRET}']\n",
    "alias bomb": _bomb(),
    "nesting too deep": "task: t\nx: " + "[" * 100 + "]" * 100 + "\n",
    "not UTF-8": lambda f: (f / "task.yaml").write_bytes(b"task: t\n# \xff\xfe " + SECRET.encode() + b"\n"),
    "a list, not a mapping": f"- task: {SECRET}\n",
    "YAML error at a token": f"task: t\nx: [https://evil.example/{SECRET}\n  y: 'z\n",
    "undefined alias": f"task: *{SECRET}\n",
}


def _plant(folder: Path, row) -> Path:
    path = folder / "task.yaml"
    text = row(folder) if callable(row) else row
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_task_file_is_refused_naming_it_and_never_quoting_it(name: str, tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    folder.mkdir()
    path = _plant(folder, HOSTILE[name])
    with pytest.raises(taskfiles.TaskFileError) as caught:
        driver.task_config(path)
    message = str(caught.value)
    assert str(folder) in message or str(folder.parent) in message
    assert SECRET not in message and "root:" not in message and "\n" not in message
    assert not (folder / "PWNED").exists()  # pwn.py was never imported


def _bytes_read() -> int:
    """What this process has read so far, from any file or pipe (read(2) and the like): /proc/self/io's rchar."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


def test_a_huge_task_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:  # 200 MB, sparse: what lm-eval read into 5.5 GB
        f.write(b"task: t\n")
        f.truncate(200 << 20)
    before = _bytes_read()
    with pytest.raises(taskfiles.TaskFileError, match=str(taskfiles.MAX_TASK_FILE)):
        driver.task_config(path)
    assert _bytes_read() - before < taskfiles.MAX_TASK_FILE, _bytes_read() - before  # refused from its size alone
    link = tmp_path / "link.yaml"
    link.symlink_to(tmp_path / "huge.yaml")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for other in (link, fifo, tmp_path):  # a link, a FIFO (never waited on), a folder
        with pytest.raises(taskfiles.TaskFileError):
            taskfiles.load(other)


def test_trusted_task_code_runs_as_lm_eval_runs_it(tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    folder.mkdir()
    _pwn(folder)
    outside = _outside(folder)
    (folder / "task.yaml").write_text(f"include: {outside}\ntask: t\nprocess_docs: !function pwn.process\n")
    config = driver.task_config(folder / "task.yaml", trust=True)
    assert config["process_docs"]([1, 2]) == [1, 2] and (folder / "PWNED").exists()  # imported, as lm-eval would
    assert config["output_type"] == "loglikelihood" and config["description"] == SECRET  # the outside include
    inside = folder / "sub"
    inside.mkdir()
    (inside / "base.yaml").write_text("output_type: multiple_choice\n")
    (folder / "ok.yaml").write_text("include: sub/base.yaml\ntask: t_ok\n")  # below its folder: always allowed
    assert driver.task_config(folder / "ok.yaml")["output_type"] == "multiple_choice"


def offline(monkeypatch, cache: Path) -> None:
    """`datasets` and huggingface_hub offline with an empty cache, as the eval job on a compute node runs (set in
    their modules too: they read the variables once, at import, and another test may have imported them)."""
    import datasets
    import huggingface_hub.constants

    for name, value in (("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"), ("HF_HOME", str(cache)),
                        ("HF_DATASETS_CACHE", str(cache / "datasets")), ("HF_HUB_CACHE", str(cache / "hub"))):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache / "hub"))


@pytest.fixture(scope="module")
def lm():
    from tests.evaluate.test_evaluate_bpb import _lm

    return _lm()


def _task(folder: Path, name: str, text: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "d.jsonl").write_text('{"text": "in the beginning god created"}\n{"text": "and the earth was"}\n')
    (folder / f"{name}.yaml").write_text(text)
    return str(folder / f"{name}.yaml")


def test_templates_are_sandboxed_and_a_task_that_cannot_run_is_missing_with_why(lm, tmp_path: Path, monkeypatch):
    offline(monkeypatch, tmp_path / "empty-cache")
    marker = tmp_path / "PWNED"
    tasks = [_task(tmp_path / "ok", "ok", "task: t_ok\n" + GOOD),
             _task(tmp_path / "ssti", "ssti", "task: t_ssti\n" + GOOD.replace(
                 "{{text.split(' ')[:-1]|join(' ')}}", "{{ cycler.__init__.__globals__.os.system('touch "
                 + str(marker) + "') }}")),
             _task(tmp_path / "hub", "hub", "task: t_hub\n" + GOOD.replace(
                 "dataset_path: json\ndataset_kwargs: {data_files: {test: d.jsonl}}", "dataset_path: EleutherAI/lambada_openai")),
             str(tmp_path / "gone.yaml")]
    missing: dict[str, str] = {}
    out = driver.run_tasks(lm, tasks, missing=missing, bootstrap_iters=10, prefetch="bsops eval prefetch ev")
    assert sorted(out["results"]) == ["t_ok"] and out["config"]["bootstrap_iters"] == 10
    assert sorted(missing) == sorted(tasks[1:]) and not marker.exists()
    assert "SecurityError" in missing[tasks[1]]
    assert "bsops eval prefetch ev" in missing[tasks[2]] and "does not exist" in missing[tasks[3]]
    assert all(why.isprintable() for why in missing.values())
    with pytest.raises(EvalError, match="gone.yaml"):  # without a `missing` to fill: the first one is an error
        driver.run_tasks(lm, tasks[3:], bootstrap_iters=10)


def test_result_names_from_anywhere_obey_the_rule():
    """Names lm-eval gives back (a registered task's, a group's) and names in a result file read back obey the rule
    too: a result with one is refused, never shown."""
    out = {"results": {"ok": {"acc,none": 0.5}, "t\u2028x": {"acc,none": 0.1}, "m": {"acc](https://e.x),none": 1.0},
                       "f": {"acc,x y": 1.0}}, "configs": {"t\u2028x": {}}}
    assert sorted(driver.refused_names(out)) == ["f", "m", "t\u2028x"]
    for hostile in ({"t\u2028x": {"acc,none": 0.1}}, {"ok": {"acc<img>,none": 0.1}}, {"ok": {"acc,a\u2029": 0.1}}):
        data = eval_result(100)
        data["results"] = hostile
        with pytest.raises(results.ResultError) as caught:
            results.from_dict(data, 100)
        assert "\u2028" not in str(caught.value) and "\u2029" not in str(caught.value)
    for hostile_bpb in ({"pile\u2028cc": {"bits_per_byte": 1.0}}, {"a/b": {"bits_per_byte": 1.0}}):
        data = eval_result(100)
        data["bsops"]["bits_per_byte"] = hostile_bpb
        with pytest.raises(results.ResultError):
            results.from_dict(data, 100)
    data = eval_result(100)
    data["bsops"]["missing"] = {"lambada_openai": "line one\u2028Subject: x"}
    with pytest.raises(results.ResultError):
        results.from_dict(data, 100)


# ----------------------------------------------------------------------------- through the command line

def _experiment(trainings: Path, tmp_path: Path, evaluation: str, *extra: str) -> None:
    (trainings / "ev.yaml").write_text(tiny_yaml(tmp_path / "run", f"eval: {{{evaluation}}}\n", *extra))


def _saved(tmp_path: Path, step: int) -> None:
    folder = tmp_path / "run" / "checkpoints" / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "bsops.json").write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)
    (folder.parent / "latest").write_text(f"global_step{step}")


def test_bsops_eval_refuses_task_code_before_any_rank_starts_unless_trusted(trainings, tmp_path, monkeypatch):
    folder = tmp_path / "tasks"
    folder.mkdir()
    _pwn(folder)
    (folder / "pwn.yaml").write_text("task: t\nprocess_docs: !function pwn.process\n" + GOOD)
    _saved(tmp_path, 50)
    started = []
    monkeypatch.setattr(launcher, "run_local", lambda *a, **k: started.append(a) or 1)
    _experiment(trainings, tmp_path, f"tasks: [{json.dumps(str(folder / 'pwn.yaml'))}]")
    refused = CliRunner().invoke(main, ["eval", "run", "ev", "--step", "50", "--trainings-dir", str(trainings)])
    assert refused.exit_code == EXIT_ERROR and started == [] and not (folder / "PWNED").exists()
    [line] = [x for x in refused.output.splitlines() if x.startswith("error: ")]
    assert str(folder / "pwn.yaml") in line and "trust_task_code" in line
    _experiment(trainings, tmp_path, f"tasks: [{json.dumps(str(folder / 'pwn.yaml'))}], trust_task_code: true")
    CliRunner().invoke(main, ["eval", "run", "ev", "--step", "50", "--trainings-dir", str(trainings)])
    assert len(started) == 1  # trusted: the ranks are started (here a stand-in)


def test_a_task_left_out_exits_non_zero_shows_why_and_alerts_once_then_recovers(trainings, tmp_path, monkeypatch,
                                                                               plain_server):
    inbox, port = plain_server
    _experiment(trainings, tmp_path, "tasks: [lambada_openai]", alerts_yaml(port))
    step = RECORDED["step"]
    _saved(tmp_path, step)
    # What the real ranks left for lambada_openai offline (tests/assets/eval/worker): the result, then exit 2.
    monkeypatch.setattr(launcher, "run_local", replay_worker("missing-task", []))
    why = json.loads((WORKER / "missing-task.json").read_text())["bsops"]["missing"]["lambada_openai"]
    here = CliRunner().invoke(main, ["eval", "run", "ev", "--step", str(step), "--trainings-dir", str(trainings)])
    assert RECORDED["missing-task"] == here.exit_code == EXIT_ERROR
    assert f"missing at step {step}: lambada_openai: {why}" in here.output.splitlines()  # in the table's lines
    stand_ins = replay_sbatch(replay_squeue(tmp_path / "bin", "squeue.txt"))  # recorded real answers
    monkeypatch.setenv("PATH", f"{stand_ins}:{os.environ['PATH']}")
    hourly = ["eval", "next", "ev", "--alert", "--trainings-dir", str(trainings)]
    first, second = (CliRunner().invoke(main, hourly) for _ in range(2))
    assert first.exit_code == second.exit_code == EXIT_ERROR
    assert len(inbox.messages) == 1  # once per cooldown
    body = inbox.messages[0].get_body(("plain",)).get_content()
    assert "lambada_openai" in body and f"global_step{step}" in body
    _saved_next = tmp_path / "run" / "checkpoints" / "global_step100"
    _saved_next.mkdir()
    (_saved_next / "bsops.json").write_text(json.dumps({"iteration": 100}))
    commit_checkpoint(_saved_next)
    (_saved_next.parent / "latest").write_text("global_step100")
    results.write(results.result_path(tmp_path / "run", "global_step100"), eval_result(100, {"lambada_openai/acc": 0.4}))
    recovered = CliRunner().invoke(main, hourly)
    assert recovered.exit_code == 0, recovered.output
    assert len(inbox.messages) == 2 and "lambada_openai" not in inbox.messages[1]["Subject"]
    assert sbatch_calls(stand_ins) == []  # each checkpoint had its result: no eval job was submitted


def test_an_include_of_lm_evals_own_task_file_is_allowed_and_nothing_beside_it(tmp_path: Path, monkeypatch) -> None:
    """A task file may `include:` a registered task's YAML from lm-eval's installed tasks folder (and that file its
    neighbours, as arc_challenge includes arc_easy); an include elsewhere, one that leaves that folder through `..`
    or a link, and a `!function` in the included lm-eval file are refused, naming the file, the include and what is
    allowed."""
    lm_eval_tasks = taskfiles.lm_eval_tasks_folder()
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "mine.yaml").write_text(f"include: {lm_eval_tasks / 'arc' / 'arc_challenge.yaml'}\ntask: my_arc\n")
    config = driver.task_config(folder / "mine.yaml")
    assert config["task"] == "my_arc" and config["dataset_name"] == "ARC-Challenge"  # arc_challenge's own
    assert config["dataset_path"] == "allenai/ai2_arc"  # from arc_easy.yaml, which arc_challenge.yaml includes
    refused = {
        "elsewhere": _outside(folder),
        "out of lm-eval's tasks through ..": lm_eval_tasks / ".." / "tasks" / ".." / "__init__.py",
        "a !function in lm-eval's file": lm_eval_tasks / "hellaswag" / "hellaswag.yaml",
    }
    for why, target in refused.items():
        (folder / "other.yaml").write_text(f"include: {target}\ntask: t\n")
        with pytest.raises(taskfiles.TaskFileError) as caught:
            taskfiles.load(folder / "other.yaml")
        message = str(caught.value)
        if why == "a !function in lm-eval's file":
            assert message.startswith(f"{target}: a !function tag") and "eval.trust_task_code" in message, message
            continue
        assert message.startswith(f"{folder / 'other.yaml'}: include: {target} is outside the task file's folder "
                                  f"{folder}; allowed: files in that folder (or below it), or lm-eval's own task "
                                  f"files in {lm_eval_tasks}, unless"), message
    fake = tmp_path / "lm_eval" / "tasks"  # an lm-eval tasks folder holding a link that leads out of it
    (fake / "sub").mkdir(parents=True)
    (fake / "sub" / "t.yaml").symlink_to(_outside(folder))
    monkeypatch.setattr(taskfiles, "lm_eval_tasks_folder", lambda: fake)
    (folder / "linked.yaml").write_text(f"include: {fake / 'sub' / 't.yaml'}\ntask: t\n")
    with pytest.raises(taskfiles.TaskFileError, match=rf"include: {fake / 'sub' / 't.yaml'} is outside .* or "
                                                      rf"lm-eval's own task files in {fake}"):
        taskfiles.load(folder / "linked.yaml")
