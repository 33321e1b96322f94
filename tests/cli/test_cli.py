"""The `bsops` commands: exit codes, JSON output, and no heavy imports on the ops paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from bigscience_ops.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_light_commands_import_neither_torch_nor_deepspeed(tmp_path: Path) -> None:
    code = f"""
import sys
from click.testing import CliRunner
from bigscience_ops.cli import main
for args in (["--help"], ["list"], ["show", "tr1-13B"], ["plan", "tr8-104B"],
             ["render", "tr1-13B", "--out", {str(tmp_path)!r}], ["plan", "tiny", "--json"]):
    if args[:2] == ["plan", "tiny"]:  # the data's pre-flight check reads tiny's dataset with numpy, and only that
        print(sorted(m for m in ("numpy",) if m in sys.modules))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (args, result.output)
heavy = sorted(m for m in ("torch", "deepspeed", "triton", "transformers") if m in sys.modules)
print(heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "[]"]


def test_plan_json_has_the_numbers() -> None:
    result = run("plan", "tr1-13B", "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["train_iters"] == 311541
    assert data["dp"] == 8 and type(data["dp"]) is int and [p["dp"] for p in data["phases"]] == [8, 32, 64]
    assert data["params"]["padded_vocab"] == 50432
    assert data["increments"][0]["steps"] == 4961
    assert [p for p in data["problems"] if p["severity"] == "error"] == []
    storage = data["storage"]
    assert storage["schedule_saves"] == 268 and storage["saves"] == 270 and storage["time_exit_saves"] == 54
    assert storage["written"] == (270 + 54) * storage["checkpoint_bytes"]
    mem = data["memory"]
    assert mem["largest_total"] == max(mem["total_per_stage"]) < mem["gpu_limit"]
    assert [a["in_flight"] for a in mem["activations"]] == [4, 3, 2, 1]


def test_plan_with_errors_exits_1_and_names_the_field() -> None:
    result = run("plan", "tr1-13B", "--nodes", "64")
    assert result.exit_code == 1
    assert "batch.rampup" in result.output


def test_config_error_exits_2_with_the_field(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("model: {num_layers: 1.5}\n")
    result = CliRunner().invoke(main, ["plan", "x", "--trainings-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "model.num_layers" in result.output and "x.yaml" in result.output


def test_render_writes_three_files(tmp_path: Path) -> None:
    result = run("render", "tiny", "--out", str(tmp_path / "r"))
    assert result.exit_code == 0
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["ds_config.json", "experiment.json", "tiny.slurm"]


def test_show_marks_derived_values() -> None:
    result = run("show", "tr8-104B")
    assert result.exit_code == 0
    assert "ffn_hidden_size: 65536  # derived" in result.output
    assert result.output.startswith("name: tr8-104B")
    data = json.loads(run("show", "tr8-104B", "--json").output)
    assert data["model"]["ffn_hidden_size"] == 65536 and "model.ffn_hidden_size" in data["derived"]


def test_list_shows_every_experiment() -> None:
    names = [line.split()[0] for line in run("list").output.splitlines()]
    assert {"tiny", "tr1-13B", "tr8-104B", "megatron-7.5B", "gpt-760M", "tr1-13B-short"} <= set(names)


def test_console_script_help_is_fast(repo_root: Path) -> None:
    bsops = Path(sys.executable).parent / "bsops"
    out = subprocess.run([str(bsops), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "plan" in out.stdout


def test_show_and_plan_list_site_values_inherited_from_a_base() -> None:
    shown = json.loads(run("show", "tr8-104B", "--json").output)
    inherited = shown["inherited_site_values"]
    assert {"slurm.account", "slurm.partition", "alerts.email_to", "data.blend"} <= set(inherited)
    assert all(Path(source).name == "tr1-13B.yaml" for source in inherited.values())
    planned = json.loads(run("plan", "tr8-104B", "--json").output)
    assert planned["inherited_site_values"] == inherited
    assert json.loads(run("show", "tr1-13B", "--json").output)["inherited_site_values"] == {}


def test_new_experiment_resets_every_site_value_of_its_base(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BSOPS_TRAININGS", raising=False)
    result = run("new", "mine", "--base", "tr1-13B")
    assert result.exit_code == 0, result.output
    path = tmp_path / "trainings" / "mine.yaml"
    shown = json.loads(run("show", "mine", "--json").output)
    assert shown["slurm"]["account"] is None and shown["slurm"]["partition"] is None
    assert shown["alerts"]["email_to"] == [] and shown["data"]["blend"] == []
    assert shown["paths"]["output"] == str(tmp_path / "runs" / "mine")
    assert shown["model"]["hidden_size"] == 5120  # the model still comes from the base
    assert shown["inherited_site_values"] == {}  # the tokenizer too: reset, with the base's kind
    assert shown["data"]["tokenizer"] == {"kind": "gpt2-bpe", "vocab_file": None, "merges_file": None, "json_file": None}
    assert run("new", "mine").exit_code == 2 and path.is_file()  # never overwritten


def test_a_new_users_first_commands_in_a_folder_of_their_own(tmp_path: Path, monkeypatch) -> None:
    """new -> list -> plan -> show -> render -> launch: the bundled experiments stay reachable, the new file's
    blanks are a to-do that render and launch refuse, and no advice sends the user back to `bsops new`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BSOPS_TRAININGS", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # no cluster: answered at once
    todo = ["data.blend", "data.tokenizer", "slurm.env_setup", "alerts.email_to"]
    new = run("new", "myrun", "--base", "tr1-13B")
    assert new.exit_code == 0
    lines = new.stdout.splitlines()
    assert lines[1] == f"fill in these fields in {tmp_path}/trainings/myrun.yaml, then check it with: bsops plan myrun"
    assert [line.split(":")[0].strip() for line in lines[2:]] == todo
    listed = run("list").stdout.splitlines()
    assert listed[:2] == [f"local ({tmp_path}/trainings):", "  myrun                tr1-13B on this cluster"]
    assert listed[2].startswith("bundled with bsops (") and "  tiny " in "\n".join(listed)
    assert run("plan", "tiny").exit_code == 0
    plan = run("plan", "myrun")
    assert plan.exit_code == 1 and f"to do before a job can run: 4 value(s) to set in {tmp_path}/trainings/myrun.yaml" \
        in plan.stdout
    assert [line.split(":")[0].strip() for line in plan.stdout.split("(render and launch refuse until then):\n")[1]
            .splitlines()[:4]] == todo
    assert "not checked against the cluster: Slurm's configuration SLURM_CONF=" in plan.stdout
    assert run("plan", "myrun", "--allow-incomplete").exit_code == 0
    assert [b["field"] for b in json.loads(run("plan", "myrun", "--json").stdout)["missing_site_values"]] == todo
    for result in (new, plan, run("show", "myrun")):
        assert "bsops new" not in result.output  # advice never loops back to the command just run
    render = run("render", "myrun")
    assert render.exit_code == 2 and not (tmp_path / "rendered").exists()
    assert render.stderr.splitlines()[-1] == (
        "error: myrun is incomplete: 4 value(s) a job needs are not set (data.blend, data.tokenizer, slurm.env_setup, "
        "alerts.email_to); `bsops plan myrun` lists what to put there; or pass --allow-incomplete")
    allowed = run("render", "myrun", "--allow-incomplete")
    assert allowed.exit_code == 0 and (tmp_path / "rendered" / "myrun" / "myrun.slurm").is_file()
    assert allowed.stderr.count("warning: myrun is incomplete (--allow-incomplete): ") == 4
    local = run("launch", "myrun", "--local")
    assert local.exit_code == 2 and "2 value(s) a job needs are not set (data.blend, data.tokenizer)" in local.stderr
    assert not (tmp_path / "runs" / "myrun" / "logs").exists()  # nothing ran
    dry = run("launch", "myrun", "--dry-run", "--allow-incomplete")
    assert dry.exit_code == 0 and "queue not checked: Slurm's configuration SLURM_CONF=" in dry.stdout
    assert dry.stdout.startswith(f"run folder: {tmp_path}/runs/myrun (relative paths of")
