"""`SECTION.KEY=VALUE` on the command line: one precedence for every field (command line > file > bases > defaults),
typed, bounded and refused exactly as in the file, kept in the experiment (its run's record) and shown by plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.config.loading import COMMAND_LINE, field_origins, from_dict, load_experiment, to_dict
from bigscience_ops.errors import ConfigError
from bigscience_ops.schema import OptimizerConfig


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def refused(texts: list[str], trainings: Path | None = None, name: str = "tiny") -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_experiment(name, trainings, texts)
    return err.value


def test_values_are_typed_as_in_the_file() -> None:
    exp = load_experiment("tiny", None, ["train.seed=7", "optimizer.lr=3e-4", "train.samples=10e3",
                                         "eval.tasks=[arc_easy, piqa]", "alerts.email_to=[x@y.z]", "slurm.nodes=1"])
    assert exp.train.seed == 7 and type(exp.train.seed) is int
    assert exp.optimizer.lr == 3e-4 and type(exp.optimizer.lr) is float
    assert exp.train.samples == 10_000 and type(exp.train.samples) is int
    assert exp.eval.tasks == ["arc_easy", "piqa"] and exp.alerts.email_to == ["x@y.z"] and exp.slurm.nodes == 1
    assert exp.overrides == ["train.seed=7", "optimizer.lr=3e-4", "train.samples=10e3", "eval.tasks=[arc_easy, piqa]",
                             "alerts.email_to=[x@y.z]", "slurm.nodes=1"]
    assert load_experiment("tiny").overrides == []


def test_bounds_and_types_are_refused_as_in_the_file(trainings: Path) -> None:
    for text, line in (("train.seed=-1", "train: {seed: -1}"), ("optimizer.lr=2", "optimizer: {lr: 2}"),
                       ("train.seed=1.5", "train: {seed: 1.5}"), ("optimizer.lr=abc", "optimizer: {lr: abc}")):
        (trainings / "bad.yaml").write_text(f"base: tiny\n{line}\n")
        in_file = refused([], trainings, "bad")
        given = refused([text])
        assert (given.source, given.field, given.value) == (COMMAND_LINE, in_file.field, in_file.value)
        assert given.allowed == in_file.allowed and str(given).startswith(f"command line: {in_file.field}: got ")


def test_an_unknown_key_or_section_lists_the_valid_ones() -> None:
    err = refused(["train.sed=7"])
    assert (err.source, err.field) == (COMMAND_LINE, "train.sed")
    assert "valid keys of train: " in err.allowed and "seed" in err.allowed.split(": ")[-1].split(", ")
    err = refused(["trian.seed=7"])
    assert err.field == "trian" and {"train", "optimizer", "slurm"} <= set(err.allowed.split(": ")[-1].split(", "))


def test_command_line_over_file_over_base_over_defaults(trainings: Path) -> None:
    (trainings / "b.yaml").write_text("base: tiny\ntrain: {seed: 11}\noptimizer: {beta1: 0.8}\n")
    (trainings / "x.yaml").write_text("base: b\ntrain: {seed: 22}\noptimizer: {weight_decay: 0.2}\n")
    default = OptimizerConfig(lr=1e-3)  # optimizer.eps: set by none of x, b and tiny
    plain = load_experiment("x", trainings)
    assert (plain.train.seed, plain.optimizer.weight_decay, plain.optimizer.beta1, plain.optimizer.eps) == (
        22, 0.2, 0.8, default.eps)
    texts = ["train.seed=7", "optimizer.weight_decay=0.3", "optimizer.beta1=0.7", "optimizer.eps=1e-7"]
    given = load_experiment("x", trainings, texts)
    assert (given.train.seed, given.optimizer.weight_decay, given.optimizer.beta1, given.optimizer.eps) == (
        7, 0.3, 0.7, 1e-7)
    assert given.optimizer.lr == plain.optimizer.lr  # a sibling the command line leaves alone keeps its source's
    origins = field_origins("x", trainings, texts[:1])
    assert origins["train.seed"] == COMMAND_LINE and origins["optimizer.beta1"] == str(trainings / "b.yaml")
    assert origins["optimizer.weight_decay"] == str(trainings / "x.yaml") and "optimizer.eps" not in origins


def test_the_command_line_replaces_a_node_plan_as_a_file_does() -> None:
    phases = load_experiment("tiny", None, ["slurm.node_schedule=[{nodes: 1}, {nodes: 2, from_iteration: 12}]"])
    assert [p.nodes for p in phases.slurm.node_schedule] == [1, 2] and phases.slurm.nodes == 1
    err = refused(["slurm.nodes=2", "slurm.node_schedule=[{nodes: 1}]"])
    assert err.source == COMMAND_LINE and "not both" in err.allowed


@pytest.mark.parametrize("texts, field, allowed", [
    (["train.seed"], "", "no '='"),
    (["=7"], "", "no field path"),
    (["train..seed=7"], "", "is no field path"),
    (["train.seed =7"], "", "is no field path"),
    (["name=other"], "name", "file name"),
    (["base=tr1-13B"], "base", "base"),
    (["derived=[]"], "derived", "computed"),
    (["record=true"], "record", "file's statement"),
    (["overrides=[train.seed=1]"], "overrides", "kept by bsops"),
    (["train.seed=1", "train.seed=2"], "train.seed", "given twice ('train.seed=1', then 'train.seed=2')"),
    (["train={seed: 1}", "train.seed=2"], "train.seed", "overlaps train"),
    (["eval.references.m={acc: 1}"], "eval.references.m", "eval.references is one value"),
    (["eval.tasks=- a"], "eval.tasks", "one YAML flow value"),
    (["description=note: here"], "description", "quoted"),
    (["train.seed=[1"], "train.seed", "valid YAML"),
    (["train.seed=\n7"], "", "U+000A (newline)"),
    (["description=a\tb"], "", "U+0009 (tab)"),
    (["description=a\u2028b"], "", "U+2028 (line separator)"),
    (["description=a\x85b"], "", "U+0085 (next line)"),
    (['description="a\\nb"'], "description", "U+000A (newline)"),  # an escape YAML turns into a line break
    (['alerts.email_to=["a@b\\u2029c"]'], "alerts.email_to[0]", "U+2029"),
    (["train.seed="], "train.seed", "a value is required"),
    (["paths.output=/x/run #2"], "paths.output", "YAML reads only '/x/run' of it"),  # a comment: cut, so refused
    (["description=run #2"], "description", "YAML reads only 'run' of it"),
    (["eval.tasks=[a, b] # c"], "eval.tasks", "YAML reads only '[a, b]' of it"),
    (["description='a' #b"], "description", "YAML reads only \"'a'\" of it"),
    (["description=#x"], "description", "YAML reads none of it"),
    (["description= #x"], "description", "YAML reads none of it"),
    (["description=--- x"], "description", "YAML reads only 'x' of it"),  # a document marker
])
def test_refused_naming_the_value_and_what_is_allowed(texts: list[str], field: str, allowed: str) -> None:
    err = refused(texts)
    assert err.source == COMMAND_LINE and err.field == field and allowed in err.allowed, str(err)


def test_a_value_is_typed_whole_or_refused_as_a_comment_would_cut_it(tmp_path: Path) -> None:
    """` #` in a value: refused as `': '` is (above), kept whole when quoted; a `#` with no space before it is no
    comment. The run folder is the value as typed: nothing is launched into a cut one."""
    given = [f"paths.output='{tmp_path}/run #2'", "description=a#b", "eval.tasks=[a#1.yaml]"]
    exp = load_experiment("tiny", None, given)
    assert exp.paths.output == f"{tmp_path}/run #2" and exp.paths.checkpoints == f"{tmp_path}/run #2/checkpoints"
    assert exp.description == "a#b" and Path(exp.eval.tasks[0]).name == "a#1.yaml"
    assert exp.overrides == given
    cut = run("launch", "tiny", "--local", f"paths.output={tmp_path}/run #2")
    assert cut.exit_code == 2 and len(cut.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_file_may_not_set_the_overrides_field(trainings: Path) -> None:
    (trainings / "x.yaml").write_text("base: tiny\noverrides: [train.seed=7]\n")
    err = refused([], trainings, "x")
    assert err.source == str(trainings / "x.yaml") and err.field == "overrides"


def test_a_rule_across_fields_names_the_command_line() -> None:
    err = refused(["batch.global_batch_size=7"])
    assert "with the command line's batch.global_batch_size=7" in err.source


def test_the_record_keeps_the_values_and_the_assignments() -> None:
    exp = load_experiment("tiny", None, ["train.seed=7"])
    data = to_dict(exp)
    assert data["train"]["seed"] == 7 and data["overrides"] == ["train.seed=7"]
    assert to_dict(from_dict(json.loads(json.dumps(data)))) == data
    del data["overrides"]  # a record written before the field: loaded without any
    assert from_dict(data).overrides == []


def test_plan_show_and_help(tmp_path: Path) -> None:
    plan = run("plan", "tiny", "train.seed=7", "optimizer.lr=3e-4", "eval.tasks=[a.yaml, b.yaml]")
    assert plan.exit_code == 0, plan.output
    assert plan.stdout.splitlines()[1] == "overrides (command line): train.seed=7 optimizer.lr=3e-4 'eval.tasks=[a.yaml, b.yaml]'"
    assert "LR 0.0003 -> " in plan.stdout
    data = json.loads(run("plan", "tiny", "--json", "train.seed=7").stdout)
    assert data["overrides"] == ["train.seed=7"]
    assert json.loads(run("plan", "tiny", "--json").stdout)["overrides"] == []
    assert "overrides (command line)" not in run("plan", "tiny").stdout
    shown = json.loads(run("show", "tiny", "--json", "train.seed=7").stdout)
    assert shown["train"]["seed"] == 7 and shown["overrides"] == ["train.seed=7"]
    assert "\noverrides:\n- train.seed=7\n" in run("show", "tiny", "train.seed=7").stdout
    assert "overrides" not in run("show", "tiny").stdout
    bad = run("plan", "tiny", "train.seed=-1")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: command line: train.seed: got -1; must be in [0, ")
    hostile = run("plan", "tiny", "description=a\rb")
    assert hostile.exit_code == 2 and len(hostile.stderr.splitlines()) == 1 and "U+000D" in hostile.stderr
    for command in ("plan", "show", "render", "launch"):
        helped = run(command, "--help").stdout
        assert "[SECTION.KEY=VALUE]..." in helped.splitlines()[0] and "bsops fields" in helped
    assert "the command line, then the experiment file" in " ".join(run("--help").stdout.split())  # the rule, once


def test_render_writes_what_the_command_line_set(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = run("render", "tiny", "--out", str(out), "train.seed=7", "batch.micro_batch_size=2", "slurm.array=3")
    assert result.exit_code == 0, result.output
    assert "(or: bsops launch tiny train.seed=7 batch.micro_batch_size=2 slurm.array=3)" in result.stdout
    recorded = json.loads((out / "experiment.json").read_text())
    assert recorded["train"]["seed"] == 7 and recorded["slurm"]["array"] == 3
    assert recorded["overrides"] == ["train.seed=7", "batch.micro_batch_size=2", "slurm.array=3"]
    assert json.loads((out / "ds_config.json").read_text())["train_micro_batch_size_per_gpu"] == 2
    assert "#SBATCH --array=1-3%1\n" in (out / "tiny.slurm").read_text()


def test_a_dry_run_launch_shows_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # no cluster: the queue is not checked
    dry = run("launch", "train.seed=7", "--dry-run", "optimizer.lr=3e-4")  # EXP left out: tiny
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines()[1] == "overrides (command line): train.seed=7 optimizer.lr=3e-4"
    assert "dry run: nothing submitted" in dry.stdout and not Path("runs").exists()


# ----------------------------------------------------------------------------- docs/OVERRIDES.md, "where ... recorded"

def test_every_task_of_a_launch_reads_the_launchs_record_never_the_yaml(tmp_path: Path) -> None:
    """docs/OVERRIDES.md: the job script hands the trainer, `task begin` and `task end` the record beside it."""
    import re

    out = tmp_path / "r"
    assert run("render", "tiny", "--out", str(out), "train.seed=7").exit_code == 0
    script = (out / "tiny.slurm").read_text()
    named = re.findall(r"--experiment (\S+)", script)
    assert len(named) >= 3 and set(named) == {str(out / "experiment.json")} and "tiny.yaml" not in script


def test_settings_given_at_launch_are_recorded_and_those_that_watch_read_the_file_today(tmp_path: Path) -> None:
    """docs/OVERRIDES.md: an alerts/hub/backup/eval override given to launch is kept in the record, and the run as
    status, hub-sync, backup and eval open it (run.open) takes those sections from the experiment file; an override
    given to that command changes them for it, and the run's own fields stay the record's."""
    from bigscience_ops import run as runs

    out = tmp_path / "r"
    given = ["alerts.stall_minutes=5", f"backup.dest={tmp_path / 'store'}", "train.seed=7"]
    assert run("render", "tiny", "--out", str(out), *given).exit_code == 0
    record = (out / "experiment.json").read_bytes()
    opened = runs.open(None, None, out)  # `bsops status --run DIR`, and so hub-sync, backup, eval
    assert opened.recorded.alerts.stall_minutes == 5 and opened.recorded.backup.dest == str(tmp_path / "store")
    today = load_experiment("tiny")
    assert opened.experiment.alerts == today.alerts and opened.experiment.backup == today.backup
    assert opened.experiment.train.seed == 7  # the run's own field: its record's
    now = runs.open(None, None, out, ("alerts.stall_minutes=9", "train.seed=99"))
    assert now.experiment.alerts.stall_minutes == 9 and now.experiment.train.seed == 7
    by_name = runs.open("tiny", None, None, (f"paths.output={out}",))  # paths.output: which run
    assert by_name.folder == out and by_name.record == out / "experiment.json" and by_name.experiment.train.seed == 7
    assert (out / "experiment.json").read_bytes() == record


def test_status_with_overrides_records_them_nowhere(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # the queue cannot be asked: exit 2
    out = tmp_path / "r"
    assert run("render", "tiny", "--out", str(out)).exit_code == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    status = run("status", "--run", str(out), "--no-email", "alerts.stall_minutes=7")  # an override, not a name
    assert status.exit_code == 0 and "has not been launched yet" in status.stdout, status.output
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {p: after[p] for p in before} == before
    assert not [p for p, data in after.items() if b"stall_minutes=7" in data]


def test_the_hourly_jobs_take_no_overrides_and_read_the_file_each_hour(tmp_path: Path) -> None:
    cron_dir = tmp_path / "cron"
    refused = run("cron", "add", "tiny", "--jobs", "status", "--cron-dir", str(cron_dir), "alerts.stall_minutes=5")
    assert refused.exit_code == 2 and not cron_dir.exists()
    assert run("cron", "add", "tiny", "--jobs", "status", "--cron-dir", str(cron_dir)).exit_code == 0
    [job] = (cron_dir / "cron.hourly").glob("*.slurm")
    [line] = [line for line in job.read_text().splitlines() if "bsops status tiny --trainings-dir" in line]
    assert "=" not in line.partition("bsops status")[2]


def test_eval_takes_overrides_of_its_settings_only_and_records_them_for_its_ranks() -> None:
    from bigscience_ops.ops.evaluate import commands
    from bigscience_ops.ops.evaluate import launcher

    refused = run("eval", "run", "tiny", "--latest", "model.hidden_size=512")
    assert refused.exit_code == 2 and "model.hidden_size" in refused.stderr and len(refused.stderr.splitlines()) == 1
    given = ["eval.limit=5", "alerts.stall_minutes=9"]
    commands.check_overrides(given)
    exp = commands.with_overrides(load_experiment("tiny", None, given), given)
    assert json.loads(launcher.experiment_record(exp))["overrides"] == given
