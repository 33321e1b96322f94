"""Hostile config values: no control character reaches a job script.

Two walls, each tested on its own: the config loader refuses the value with its field path, and
rendering refuses it even when a value bypasses the loader (a hand-built config, a derived path).
A job-script template joins the table by adding one renderer to RENDERERS. The scrontab block is
built without templates and has a wall of its own, tested over the same HOSTILE table.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bigscience_ops.launch import render as rendering
from bigscience_ops.cli import EXIT_ERROR, main
from bigscience_ops.plan import make_plan
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.schema import Experiment
from bigscience_ops.errors import ConfigError
from bigscience_ops.ops import hourly_registry
from bigscience_ops.ops.cron import runner as cron, scrontab

# A value that would end an #SBATCH line and run a command, and its cousins.
HOSTILE = {
    "newline": "gpu\ntouch /tmp/pwned",
    "carriage return": "gpu\rtouch /tmp/pwned",
    "nul": "gpu\x00x",
    "escape": "gpu\x1b[2Kx",
    "del": "gpu\x7fx",
    "tab": "gpu\tx",
    "vertical tab": "gpu\x0bx",
}

# Experiment fields that land on an #SBATCH line or in a shell variable of the training script.
EXPERIMENT_FIELDS = ["slurm.job_name", "slurm.partition", "slurm.account", "slurm.constraint", "slurm.qos",
                     "paths.logs", "paths.checkpoints", "paths.tensorboard", "description"]


def _replace(exp: Experiment, dotted: str, value: object) -> Experiment:
    section, key = dotted.split(".") if "." in dotted else ("", dotted)
    if not section:
        return dataclasses.replace(exp, **{key: value})
    return dataclasses.replace(exp, **{section: dataclasses.replace(getattr(exp, section), **{key: value})})


def _render_training(dotted: str) -> Callable[[str, Path], str]:
    def render(value: str, tmp_path: Path) -> str:
        exp = _replace(load_experiment("tr1-13B"), dotted, value)
        return rendering.render(exp, tmp_path / "out", make_plan(exp)).files["tr1-13B.slurm"]
    return render


def _render_cron_runner(option: str) -> Callable[[str, Path], str]:
    def render(value: str, tmp_path: Path) -> str:
        settings = dataclasses.replace(cron.CronSettings(), **{option: value})
        return cron.render_runner(tmp_path, "hourly", settings).text
    return render


def _render_hourly_job(kind: str, where: str) -> Callable[[str, Path], str]:
    def render(value: str, tmp_path: Path) -> str:
        exp = _replace(load_experiment("tr1-13B"), "backup.dest", str(tmp_path / "store"))  # the backup job needs one
        exp = _replace(exp, "hub.logs_repo", "org/logs")  # the hub-sync job needs one (a record's are set aside)
        settings = cron.CronSettings()
        if where == "job_name":
            exp = _replace(exp, "slurm.job_name", value)
        else:
            settings = dataclasses.replace(settings, **{where: value})
        return hourly_registry.render(kind, tmp_path, exp, tmp_path, settings).text
    return render


# template: field -> a function rendering that template with the hostile value in that field.
RENDERERS: dict[str, Callable[[str, Path], str]] = {
    **{f"train.slurm.j2:{f}": _render_training(f) for f in EXPERIMENT_FIELDS},
    **{f"cron-runner.slurm.j2:{o}": _render_cron_runner(o) for o in ("partition", "account", "qos", "time", "name_prefix")},
    **{f"hourly-job.slurm.j2:{k}:{o}": _render_hourly_job(k, o) for k in ("status", "hub-sync", "backup")
       for o in ("job_name", "partition", "account", "qos")},
}


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("case", list(RENDERERS))
def test_rendering_refuses_control_characters(case: str, kind: str, tmp_path: Path) -> None:
    with pytest.raises(rendering.RenderError) as caught:
        RENDERERS[case](HOSTILE[kind], tmp_path)
    assert repr(HOSTILE[kind])[1:-1] in str(caught.value)  # the message shows the value


@pytest.mark.parametrize("case", list(RENDERERS))
def test_renderers_accept_the_same_field_without_control_characters(case: str, tmp_path: Path) -> None:
    """The table's renderers really put the value into the script (else the refusal proves nothing)."""
    value = "abc-17" if not case.endswith(("time", "paths.logs", "paths.checkpoints", "paths.tensorboard")) else None
    if case.endswith(":time"):
        value = "00:17:00"
    elif value is None:
        value = str(tmp_path / "abc-17")
    assert value in RENDERERS[case](value, tmp_path)


def test_env_setup_items_are_one_shell_line_each(tmp_path: Path) -> None:
    exp = load_experiment("tr1-13B")
    with_tab = _replace(exp, "slurm.env_setup", ["export A=1\t# aligned"])
    assert "export A=1\t# aligned\n" in rendering.render(with_tab, tmp_path, make_plan(with_tab)).files["tr1-13B.slurm"]
    for bad in ("export A=1\ntouch /tmp/pwned", "export A=1\r", "export A=\x1b[2J"):
        with pytest.raises(rendering.RenderError):
            bad_exp = _replace(exp, "slurm.env_setup", [bad])
            rendering.render(bad_exp, tmp_path, make_plan(bad_exp))


def _write_experiment(trainings: Path, name: str, dotted: str, value: object) -> None:
    section, _, key = dotted.rpartition(".")
    body: dict = {"base": "tr1-13B"}
    target = body
    for part in filter(None, section.split(".")):
        target = target.setdefault(part, {})
    target[key] = value
    (trainings / f"{name}.yaml").write_text(yaml.safe_dump(body), encoding="utf-8")


LOADED_FIELDS = EXPERIMENT_FIELDS + ["paths.output", "alerts.email_from", "data.tokenizer.vocab_file", "hub.logs_repo", "name"]


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("dotted", [f for f in LOADED_FIELDS if f != "name"])
def test_loader_refuses_control_characters_with_the_field_path(trainings: Path, dotted: str, kind: str) -> None:
    _write_experiment(trainings, "hostile", dotted, HOSTILE[kind])
    with pytest.raises(ConfigError) as caught:
        load_experiment("hostile", trainings)
    assert caught.value.field == dotted and caught.value.value == HOSTILE[kind]


@pytest.mark.parametrize("kind", ["newline", "escape", "tab"])
def test_loader_refuses_control_characters_in_list_items(trainings: Path, kind: str) -> None:
    _write_experiment(trainings, "hostile", "alerts.email_to", ["a@example.org", HOSTILE[kind]])
    with pytest.raises(ConfigError) as caught:
        load_experiment("hostile", trainings)
    assert caught.value.field == "alerts.email_to[1]"


def test_loader_refuses_a_file_name_with_a_newline(trainings: Path) -> None:
    shutil.copy(trainings / "tiny.yaml", trainings / "ti\nny.yaml")
    with pytest.raises(ConfigError) as caught:
        load_experiment(str(trainings / "ti\nny.yaml"))
    assert caught.value.field == "name"


def test_env_setup_allows_a_tab_but_no_line_break(trainings: Path) -> None:
    _write_experiment(trainings, "tabbed", "slurm.env_setup", ["export A=1\t# aligned"])
    assert load_experiment("tabbed", trainings).slurm.env_setup == ["export A=1\t# aligned"]
    for i, bad in enumerate(["export A=1\ntouch /tmp/pwned", "export A=1\r", "a\x00"]):
        _write_experiment(trainings, f"broken{i}", "slurm.env_setup", ["module load cuda", bad])
        with pytest.raises(ConfigError) as caught:
            load_experiment(f"broken{i}", trainings)
        assert caught.value.field == "slurm.env_setup[1]"


@pytest.mark.parametrize("kind", ["newline", "carriage return", "escape", "tab"])
def test_cron_settings_refuse_control_characters(tmp_path: Path, kind: str) -> None:
    (tmp_path / "cron.yaml").write_text(yaml.safe_dump({"partition": HOSTILE[kind]}), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        cron.load_settings(tmp_path)
    assert caught.value.field == "partition"


@pytest.mark.parametrize("where", ["experiment", "cron.yaml"])
@pytest.mark.parametrize("kind", ["newline", "nul", "del"])
def test_cron_add_refuses_hostile_values_and_writes_nothing(trainings: Path, tmp_path: Path, where: str,
                                                            kind: str) -> None:
    cron_dir = tmp_path / "cron"
    (cron_dir / "cron.hourly").mkdir(parents=True)
    if where == "experiment":
        _write_experiment(trainings, "hostile", "slurm.job_name", HOSTILE[kind])
    else:
        _write_experiment(trainings, "hostile", "description", "fine")
        (cron_dir / "cron.yaml").write_text(yaml.safe_dump({"account": HOSTILE[kind]}), encoding="utf-8")
    result = CliRunner().invoke(main, ["cron", "add", "hostile", "--cron-dir", str(cron_dir),
                                       "--trainings-dir", str(trainings)])
    assert result.exit_code == EXIT_ERROR, result.output
    assert list((cron_dir / "cron.hourly").iterdir()) == []


# Where each scrontab field's value goes: a CronSettings built in code, bypassing cron.yaml's loader.
SCRONTAB_FIELDS = ["name_prefix", "time", "partition", "account", "qos", "cron_dir", "env_setup"]


def _scrontab_block(where: str, value: str, tmp_path: Path) -> str:
    if where == "cron_dir":
        return scrontab.block(tmp_path / value, cron.CronSettings())
    settings = dataclasses.replace(cron.CronSettings(), **{where: [value] if where == "env_setup" else value})
    if where == "env_setup":  # it goes into the entries' scripts, never on a scrontab line
        return "".join(script.text for script in scrontab.entry_scripts(tmp_path, settings))
    return scrontab.block(tmp_path, settings)


# A tab is allowed in a trusted shell line (tested below).
@pytest.mark.parametrize(("where", "kind"), [(w, k) for w in SCRONTAB_FIELDS for k in HOSTILE
                                             if (w, k) != ("env_setup", "tab")])
def test_scrontab_block_refuses_control_characters(where: str, kind: str, tmp_path: Path) -> None:
    with pytest.raises(scrontab.ScrontabError) as caught:
        _scrontab_block(where, HOSTILE[kind], tmp_path)
    assert repr(HOSTILE[kind])[1:-1] in str(caught.value)  # the message shows the value


@pytest.mark.parametrize("where", SCRONTAB_FIELDS)
def test_scrontab_block_carries_the_same_field_without_control_characters(where: str, tmp_path: Path) -> None:
    """Each field really reaches a line of the block (else the refusal above proves nothing)."""
    value = "00:17:00" if where == "time" else "abc-17"
    assert value in _scrontab_block(where, value, tmp_path)


def test_cron_env_setup_allows_a_tab_but_no_line_break(tmp_path: Path) -> None:
    with_tab = "export A=1\t# aligned"
    (tmp_path / "cron.yaml").write_text(yaml.safe_dump({"env_setup": ["module load cuda", with_tab]}),
                                        encoding="utf-8")
    settings = cron.load_settings(tmp_path)
    assert settings.env_setup == ["module load cuda", with_tab]
    assert f"\n{with_tab}\n" in cron.render_runner(tmp_path, "hourly", settings).text
    assert f"\n{with_tab}\nexec bsops cron run hourly " in scrontab.entry_scripts(tmp_path, settings)[0].text
    for bad in ("export A=1\ntouch /tmp/pwned", "export A=1\r", "a\x00"):
        (tmp_path / "cron.yaml").write_text(yaml.safe_dump({"env_setup": ["module load cuda", bad]}),
                                            encoding="utf-8")
        with pytest.raises(ConfigError) as caught:
            cron.load_settings(tmp_path)
        assert caught.value.field == "env_setup[1]"
        # The renderer's wall, for settings built in code.
        with pytest.raises(rendering.RenderError):
            cron.render_runner(tmp_path, "hourly", dataclasses.replace(settings, env_setup=[bad]))
