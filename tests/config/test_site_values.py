"""Site-specific values: the hub fields are flagged when inherited and reset by `bsops new`."""

from __future__ import annotations

import json

from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.config.loading import load_experiment
from bigscience_ops.config.site_values import (
    SITE_FIELDS, ClusterRules, IncompleteExperiment, check_complete, missing_site_values,
)

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


# ----------------------------------------------------------------------------- what a job needs

ANYWHERE = ClusterRules()  # a cluster with a default partition that takes jobs without an account
STRICT = ClusterRules(partition=True, account=True)


def _fields(check) -> list[str]:
    return [blank.field for blank in check.blanks]


def test_a_new_experiment_lists_what_a_job_needs_and_nothing_else(tmp_path: Path) -> None:
    trainings = tmp_path / "trainings"
    assert _run(trainings, "new", "mine", "--base", "tr1-13B").exit_code == 0
    exp = load_experiment("mine", trainings)
    assert _fields(missing_site_values(exp, cluster=ANYWHERE)) == [
        "data.blend", "data.tokenizer", "slurm.env_setup", "alerts.email_to"]
    assert _fields(missing_site_values(exp, cluster=STRICT)) == [
        "data.blend", "data.tokenizer", "slurm.partition", "slurm.account", "slurm.env_setup", "alerts.email_to"]
    assert _fields(missing_site_values(exp, slurm_job=False)) == ["data.blend", "data.tokenizer"]  # --local
    (trainings / "mine.yaml").write_text((trainings / "mine.yaml").read_text()
                                         .replace("blend: []", "blend: [{prefix: data/mine_text_document}]")
                                         .replace("vocab_file: null, merges_file: null", "vocab_file: v.json, merges_file: m.txt")
                                         .replace("env_setup: []", "env_setup: [source ~/venvs/bsops/bin/activate]")
                                         .replace("webhook_url_env: null", "webhook_url_env: TEAM_WEBHOOK")
                                         .replace("partition: null", "partition: gpu")
                                         .replace("account: null", "account: mine"))
    assert missing_site_values(load_experiment("mine", trainings), cluster=STRICT).blanks == []


def test_bundled_experiments_a_rehearsal_and_an_incomplete_one() -> None:
    for name in ("tr1-13B", "tr8-104B"):  # the seed runs': complete wherever they run
        assert missing_site_values(load_experiment(name), cluster=STRICT).blanks == [], name
    assert missing_site_values(load_experiment("tiny"), cluster=ANYWHERE).blanks == []
    # tiny is a CPU rehearsal: no env_setup or alert address needed, even on Slurm; a cluster without a
    # default partition still needs one.
    assert _fields(missing_site_values(load_experiment("tiny"), cluster=ClusterRules(partition=True))) == [
        "slurm.partition"]
    # gpt-760M is a record (record: true): nobody is told on purpose, so no alert address is asked for.
    assert _fields(missing_site_values(load_experiment("gpt-760M"), cluster=ANYWHERE)) == ["slurm.env_setup"]
    with pytest.raises(IncompleteExperiment, match=r"gpt-760M is incomplete: 1 value\(s\) a job needs are not set "
                                                   r"\(slurm.env_setup\); `bsops plan gpt-760M`"):
        check_complete(load_experiment("gpt-760M"), slurm_job=True)
    assert check_complete(load_experiment("gpt-760M"), slurm_job=True, allow_incomplete=True).blanks


def test_the_cluster_is_asked_and_its_answers_read(slurm_cluster, monkeypatch) -> None:
    from bigscience_ops import slurm
    from bigscience_ops.config.site_values import cluster_rules

    assert slurm.has_default_partition(slurm.run(slurm.sinfo_partitions_argv(), timeout=30).stdout)  # "bsops*"
    assert not slurm.enforces_accounts(slurm.run(slurm.scontrol_show_config_argv(), timeout=30).stdout)  # none
    assert slurm.cluster_needs(timeout=30) == (False, False)
    assert cluster_rules() == ClusterRules()
    assert not slurm.has_default_partition("gpu_p13\ngpu_p2\n\n") and slurm.has_default_partition("cpu\ngpu*\n")
    assert slurm.enforces_accounts("AccountingStorageEnforce = associations,limits,qos\nAccountingStorageHost = db\n")
    assert not slurm.enforces_accounts("AccountingStorageEnforce = none\n")
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")  # answers at once, without asking Slurm
    rules = cluster_rules()
    assert not rules.partition and not rules.account and "SLURM_CONF=/nonexistent/slurm.conf does not exist" in rules.unknown
    check = missing_site_values(load_experiment("tiny"))
    assert check.blanks == [] and check.cluster_note == rules.unknown


def test_hub_sync_refuses_a_hub_host_remote_or_token_name_from_a_base(tmp_path: Path) -> None:
    trainings = tmp_path / "trainings"
    trainings.mkdir()
    (trainings / "theirs.yaml").write_text(THEIRS)
    (trainings / "lazy.yaml").write_text("base: theirs\n")
    result = _run(trainings, "hub-sync", "lazy")
    assert result.exit_code == 2 and "Traceback" not in result.output
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert all(f"{field} (from {trainings / 'theirs.yaml'})" in line
               for field in ("hub.host", "hub.remote_template", "hub.token_env")) and "--trust-inherited-hub" in line
    (trainings / "own.yaml").write_text("base: theirs\nhub: {host: huggingface.co, remote_template: null, "
                                        "token_env: HF_TOKEN}\n")  # set in its own file: not refused for this
    trusted = _run(trainings, "hub-sync", "own", "--remote", str(tmp_path / "none.git"), "--what", "logs")
    assert trusted.exit_code == 2 and "inherits" not in trusted.output
    forced = _run(trainings, "hub-sync", "lazy", "--trust-inherited-hub", "--remote", str(tmp_path / "none.git"),
                  "--what", "logs")
    assert forced.exit_code == 2 and "inherits" not in forced.output
