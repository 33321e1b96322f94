"""Site-specific values: the hub fields are flagged when inherited and reset by `bsops new`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.site_values import SITE_FIELDS

HUB_SITE_FIELDS = ["hub.host", "hub.remote_template", "hub.token_env", "hub.private"]
THEIRS = ("base: tiny\nhub: {logs_repo: them/logs, host: git.them.example, token_env: THEIR_TOKEN, private: false,\n"
          "      remote_template: 'https://git.them.example/{repo}.git'}\n")


def _run(trainings: Path, *args: str):
    return CliRunner().invoke(main, [*args, "--trainings-dir", str(trainings)], catch_exceptions=False)


def test_hub_fields_inherited_from_another_team_are_listed_by_show_and_plan(tmp_path: Path) -> None:
    assert set(HUB_SITE_FIELDS) <= set(SITE_FIELDS)
    trainings = tmp_path / "trainings"
    trainings.mkdir()
    (trainings / "theirs.yaml").write_text(THEIRS)
    (trainings / "lazy.yaml").write_text("base: theirs\n")
    shown = json.loads(_run(trainings, "show", "lazy", "--json").output)
    assert set(HUB_SITE_FIELDS) <= set(shown["inherited_site_values"])
    assert {Path(shown["inherited_site_values"][f]).name for f in HUB_SITE_FIELDS} == {"theirs.yaml"}
    planned = json.loads(_run(trainings, "plan", "lazy", "--json").output)
    assert planned["inherited_site_values"] == shown["inherited_site_values"]
    text = _run(trainings, "show", "lazy").output
    assert all(f in text for f in HUB_SITE_FIELDS)


def test_new_on_another_teams_base_keeps_neither_their_remote_nor_their_host(tmp_path: Path) -> None:
    trainings = tmp_path / "trainings"
    trainings.mkdir()
    (trainings / "theirs.yaml").write_text(THEIRS)
    assert _run(trainings, "new", "mine", "--base", "theirs").exit_code == 0
    hub = json.loads(_run(trainings, "show", "mine", "--json").output)
    assert hub["hub"]["remote_template"] is None and hub["hub"]["host"] == "huggingface.co"
    assert hub["hub"]["token_env"] == "HF_TOKEN" and hub["hub"]["private"] is True and hub["hub"]["logs_repo"] is None
    assert not [f for f in hub["inherited_site_values"] if f.startswith("hub.")]
