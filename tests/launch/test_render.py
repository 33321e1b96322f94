"""`bsops render`: golden job scripts, the DeepSpeed JSON, and quoting of hostile values.

Regenerate the goldens after an intended template change: python scripts/regenerate_goldens.py render
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bigscience_ops import slurm
from bigscience_ops.launch import render as rendering
from bigscience_ops.plan import make_plan
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.errors import PlanError
from tests.fixtures_render import install_shims

GOLDEN = Path(__file__).parents[1] / "assets" / "golden"


GOLDEN_NAMES = ("tr1-13B", "tr8-104B")


def golden_texts(name: str, out: Path) -> dict[Path, str]:
    """Each golden file of bundled experiment `name` and what rendering it into `out` gives now, the run's folders
    written as <OUT> and <CWD> (scripts/regenerate_goldens.py writes these; the test compares them)."""
    exp = load_experiment(name)
    rendered = rendering.render(exp, out, make_plan(exp))
    # A bundled seed is a record: its run folder is under the current folder (each test's own).
    text = {k: v.replace(str(out.resolve()), "<OUT>").replace(str(Path.cwd()), "<CWD>") for k, v in rendered.files.items()}
    return {GOLDEN / f"{name}.slurm": text[f"{name}.slurm"], GOLDEN / f"{name}.ds_config.json": text["ds_config.json"]}


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_scripts(name: str, tmp_path: Path) -> None:
    for path, text in golden_texts(name, tmp_path / "out").items():
        assert text == path.read_text(), f"{path} differs; regenerate: python scripts/regenerate_goldens.py render"


def test_script_has_array_resources_and_derived_exit(tmp_path: Path) -> None:
    exp = load_experiment("tr1-13B")
    script = rendering.render(exp, tmp_path, make_plan(exp)).files["tr1-13B.slurm"]
    assert "#SBATCH --array=1-10%1\n" in script
    assert "#SBATCH --nodes=16\n" in script and "#SBATCH --gres=gpu:4\n" in script
    assert "#SBATCH --partition=gpu_p13\n" in script and "#SBATCH --account=six@gpu\n" in script
    assert "saves then exits after 1190 minutes" in script
    main_log = Path(exp.paths.logs) / "main_log.txt"
    assert f"\nMAIN_LOG={main_log}\n" in script and 'tee -a "$MAIN_LOG"' in script
    assert "source $six_ALL_CCFRWORK/code/tr1-13B/bigscience/train/tr1-13B-base/start-tr1-13B\n" in script


def test_each_job_rendezvous_on_a_port_and_id_of_its_own(tmp_path: Path) -> None:
    """Jobs sharing a node (an array task starting while the last one's processes still exit) must not meet on
    one port: a task's second node once joined the ending task's rendezvous and waited for ever."""
    exp = load_experiment("tr1-13B")
    script = rendering.render(exp, tmp_path, make_plan(exp)).files["tr1-13B.slurm"]
    [port_line] = [line for line in script.split("\n") if line.startswith("MASTER_PORT=")]
    assert '--master_port "$MASTER_PORT"\n    --rdzv_id "${SLURM_JOB_ID:-none}"\n' in script

    def port(**env: str) -> int:
        shell = subprocess.run(["bash", "-c", f'{port_line}\necho "$MASTER_PORT"'], env={"PATH": os.environ["PATH"], **env},
                               capture_output=True, text=True, check=True)
        return int(shell.stdout)

    assert exp.slurm.master_port == 6000
    assert [port(SLURM_JOB_ID=str(job)) for job in (2896, 2897, 3999, 4000)] == [6896, 6897, 6999, 6000]
    assert port(SLURM_JOB_ID="2897", BSOPS_MASTER_PORT="23456") == 23456  # bsops launch --local's free port


def test_deepspeed_json_from_config(tmp_path: Path) -> None:
    exp = load_experiment("tr1-13B")
    ds = json.loads(rendering.render(exp, tmp_path, make_plan(exp)).files["ds_config.json"])
    assert ds["train_micro_batch_size_per_gpu"] == 1 and ds["train_batch_size"] == 1024
    assert ds["zero_optimization"] == {"stage": 1}
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale"] == 0 and not ds["bf16"]["enabled"]
    assert ds["gradient_clipping"] == 1.0
    assert "activation_checkpointing" in ds
    tiny_exp = load_experiment("tiny")
    tiny = json.loads(rendering.render(tiny_exp, tmp_path, make_plan(tiny_exp)).files["ds_config.json"])
    assert not tiny["fp16"]["enabled"] and not tiny["bf16"]["enabled"]
    assert "activation_checkpointing" not in tiny


def test_experiment_json_reloads(tmp_path: Path) -> None:
    from bigscience_ops.config.loading import from_dict, to_dict

    exp = load_experiment("tr8-104B")
    data = json.loads(rendering.render(exp, tmp_path, make_plan(exp)).files["experiment.json"])
    assert to_dict(from_dict(data)) == to_dict(exp)


def test_invalid_plan_is_not_rendered(tmp_path: Path) -> None:
    import dataclasses

    exp = load_experiment("tr1-13B")
    exp = dataclasses.replace(exp, slurm=dataclasses.replace(exp.slurm, nodes=64, node_schedule=[]))  # one phase
    with pytest.raises(PlanError) as err:
        rendering.render(exp, tmp_path, make_plan(exp))
    assert err.value.problems[0].field == "batch.rampup"


def test_unquoted_none_or_bool_cannot_reach_the_script() -> None:
    env = rendering.environment()
    with pytest.raises(TypeError):
        env.from_string("X={{ v }}").render(v=None)


HOSTILE = "it's a \"job\" $(touch PWNED) `touch PWNED2` ; rm -rf x"


def test_hostile_values_pass_through_unchanged(tmp_path: Path, trainings: Path) -> None:
    """Names are refused at load (tests/cluster/test_cluster_sbatch_parser.py); a run folder may hold shell syntax."""
    weird = tmp_path / f"runs {HOSTILE}"
    (trainings / "evil.yaml").write_text(
        "base: tiny\n"
        f"paths: {{output: {json.dumps(str(weird))}}}\n")
    exp = load_experiment("evil", trainings)
    out = tmp_path / f"out {HOSTILE}"
    script = rendering.write(rendering.render(exp, out, make_plan(exp)), out)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30).returncode == 0

    env = install_shims(tmp_path)
    log = tmp_path / "argv.jsonl"
    run = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    argv = json.loads(log.read_text())
    assert argv[argv.index("--experiment") + 1] == str(out.resolve() / "experiment.json")
    assert argv[argv.index("--deepspeed-config") + 1] == str(out.resolve() / "ds_config.json")
    assert argv[argv.index("--node_rank") + 1] == "0"
    assert argv[argv.index("--master_addr") + 1] == "node-a"
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert (weird / "logs" / "main_log.txt").is_file()
    assert not list(tmp_path.rglob("PWNED*")), "a value was executed by the shell"
    # sbatch reads #SBATCH lines with its own parser (slurm.sbatch_words): the folder is one word.
    assert f"--output={weird}/logs/%x-%A_%a.out" in slurm.script_options(script)
