"""Hostile Hub settings and remotes, each through `bsops hub-sync` with a token in the environment.

Every row must end in exit 2 with one `error:` line naming what was wrong, no traceback, the token
in no output, no clone config and no request a foreign server saw; nothing written outside the
run's hub/ clones and the remotes, nothing deleted. A row is the experiment's hub settings, the
command's extra arguments and environment, and the remote it meets (a real git remote, or a real
https server that records what each request offered).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.redact import scrub
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_git import bare_remote, git, remote_holding, tree_snapshot

TOKEN = "hf_" + "Zq7kP2" * 6


@dataclass(frozen=True)
class Row:
    names: str
    """What the one error line must name (a field, an option, a file)."""
    hub: dict[str, object] = field(default_factory=dict)
    """hub settings over the default (logs to a local bare remote); {tmp}, {token}, {server} are filled in."""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    """Builds what the row meets under tmp (a remote with links, an old clone...)."""
    server: bool = False
    """Meets the recording https server, which must never see the token."""
    base: str | None = None
    """The settings come from this base file instead of the experiment's own (an inherited remote)."""
    pushes: bool = False
    """The rest of the files are pushed (a link refused one of them): the remote may change."""


def _links_to_outside(tmp: Path) -> None:
    remote_holding(tmp / "remotes", "bs/synced-logs", {"README.md": "theirs\n"},
                   links={"sub": str(tmp / "outside"), "notes.txt": str(tmp / "outside" / "victim.txt")})
    (tmp / "run" / "logs" / "sub").mkdir(parents=True)
    (tmp / "run" / "logs" / "sub" / "evil.txt").write_text("would land outside\n")
    (tmp / "run" / "logs" / "notes.txt").write_text("would overwrite their file\n")


def _lfsconfig(tmp: Path) -> None:
    remote_holding(tmp / "remotes", "bs/synced-logs",
                   {".lfsconfig": "[lfs]\n\turl = https://evil.example/lfs\n", "README.md": "theirs\n"})


def _linked_gitattributes(tmp: Path) -> None:
    remote_holding(tmp / "remotes", "bs/synced-logs", {"README.md": "theirs\n"},
                   links={".gitattributes": str(tmp / "outside" / "victim.txt")})


def _old_clone_with_a_credential_url(tmp: Path) -> None:
    bare = bare_remote(tmp / "remotes", "bs/synced-logs")
    clone = tmp / "run" / "hub" / "logs"
    git("clone", "--quiet", str(bare), str(clone))
    git("remote", "set-url", "origin", f"https://bot:{TOKEN}@huggingface.co/bs/synced-logs", cwd=clone)


ROWS: dict[str, Row] = {
    "token as URL password": Row("hub.remote_template", {"remote_template": "https://bot:{token}@huggingface.co/{{repo}}"}),
    "token as URL user": Row("hub.remote_template", {"remote_template": "https://{token}@huggingface.co/{{repo}}"}),
    "token in the URL query": Row("hub.remote_template",
                                  {"remote_template": "https://huggingface.co/{{repo}}?access_token={token}"}),
    "token in the URL fragment": Row("hub.remote_template", {"remote_template": "https://huggingface.co/{{repo}}#{token}"}),
    "token as ssh password": Row("hub.remote_template", {"remote_template": "ssh://bot:{token}@example.org/{{repo}}"}),
    "plain http remote": Row("hub.remote_template", {"remote_template": "http://huggingface.co/{{repo}}"}),
    "git:// remote": Row("hub.remote_template", {"remote_template": "git://example.org/{{repo}}"}),
    "ext:: transport": Row("hub.remote_template", {"remote_template": "ext::{tmp}/evil.sh/{{repo}}"}),
    "fd:: transport": Row("hub.remote_template", {"remote_template": "fd::7/{{repo}}"}),
    "ssh host as an option": Row("hub.remote_template",
                                 {"remote_template": "ssh://-oProxyCommand=touch%20{tmp}%2Fpwned/{{repo}}"}),
    "remote as a git option": Row("hub.remote_template", {"remote_template": "--upload-pack={tmp}/evil.sh{{repo}}"}),
    "remote with a line break": Row("hub.remote_template", {"remote_template": "file:///srv/x\u2028/{{repo}}"}),
    "--remote with a token": Row("--remote", args=("--what", "logs", "--remote",
                                                   "https://bot:{token}@huggingface.co/bs/x.git")),
    "--remote over http": Row("--remote", args=("--what", "logs", "--remote", "http://127.0.0.1:9/x.git")),
    "--remote via ext::": Row("--remote", args=("--what", "logs", "--remote", "ext::{tmp}/evil.sh")),
    "host with a path": Row("hub.host", {"host": "evil.example/x"}),
    "host with user-info": Row("hub.host", {"host": "huggingface.co@evil.example"}),
    "host with a line separator": Row("hub.host", {"host": "huggingface.co\u2028evil.example"}),
    "token_env as a shell command": Row("hub.token_env", {"token_env": "HF_TOKEN; touch {tmp}/pwned"}),
    "token with a newline": Row("hub.token_env", env={"HF_TOKEN": "{token}\nhost=evil.example"}),
    "HF_ENDPOINT elsewhere": Row("HF_ENDPOINT", {"remote_template": None}, env={"HF_ENDPOINT": "https://evil.example"}),
    "links in the remote": Row("logs/sub/evil.txt", setup=_links_to_outside, pushes=True),
    ".lfsconfig in the remote": Row(".lfsconfig", setup=_lfsconfig),
    ".gitattributes as a link": Row(".gitattributes", setup=_linked_gitattributes),
    "old clone with a credential URL": Row("pushes to 'https://huggingface.co/bs/synced-logs'",
                                           setup=_old_clone_with_a_credential_url),
    "foreign https host": Row("hub.host", {"remote_template": "{server}/{{repo}}.git"}, server=True),
    # Refused before any remote is looked at: hub-sync does not run on an inherited remote (cli/ops.py).
    "inherited foreign remote": Row("inherits hub.remote_template (from", {"remote_template": "{server}/{{repo}}.git"},
                                    server=True, base="theirs"),
}


def _fill(value: object, tmp: Path, server: str) -> object:
    return value.format(tmp=tmp, token=TOKEN, server=server) if isinstance(value, str) else value


def _outside_its_folders(tmp: Path) -> dict[str, object]:
    """Everything under tmp but the run's clones (hub/) and the remotes."""
    return {k: v for k, v in tree_snapshot(tmp).items()
            if not k.startswith(("run/hub", "remotes")) and not k.endswith(".lock")}


@pytest.mark.parametrize("name", ROWS)
def test_hostile_hub_input_gives_one_clear_error_and_leaks_nothing(git_lfs, name: str, tmp_path: Path, request,
                                                                   monkeypatch) -> None:
    row = ROWS[name]
    server = request.getfixturevalue("https_recorder") if row.server else None
    url = server.url if server else ""
    trainings, run, remotes = tmp_path / "trainings", tmp_path / "run", tmp_path / "remotes"
    trainings.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim.txt").write_text("theirs\n")
    (tmp_path / "evil.sh").write_text(f"#!/bin/sh\ntouch {tmp_path}/pwned\n")
    (tmp_path / "evil.sh").chmod(0o755)
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "main_log.txt").write_text("iteration 1/ 10 | lm loss: 9.1\n")
    if row.setup:
        row.setup(tmp_path)
    else:
        bare_remote(remotes, "bs/synced-logs")
    hub = {"logs_repo": "bs/synced-logs", "remote_template": f"file://{remotes}/{{repo}}.git", "push_attempts": 1}
    hub.update({k: _fill(v, tmp_path, url) for k, v in row.hub.items()})
    hub_line = f"hub: {json.dumps(hub)}\n"
    if row.base:
        (trainings / f"{row.base}.yaml").write_text(f"base: tiny\n{hub_line}")
        (trainings / "synced.yaml").write_text(tiny_yaml(run).replace("base: tiny", f"base: {row.base}"))
    else:
        (trainings / "synced.yaml").write_text(tiny_yaml(run, hub_line))
    env = {"HF_TOKEN": TOKEN, "HF_ENDPOINT": None, "HOME": str(tmp_path), **{k: _fill(v, tmp_path, url)
                                                                         for k, v in row.env.items()}}
    if server:
        env["GIT_SSL_CAINFO"] = request.getfixturevalue("cert")[0]
    monkeypatch.chdir(tmp_path)
    before, remotes_before = _outside_its_folders(tmp_path), tree_snapshot(remotes)

    result = CliRunner().invoke(main, ["hub-sync", "synced", "--trainings-dir", str(trainings),
                                       *(_fill(a, tmp_path, url) for a in row.args)], env=env)

    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: ") and all(c.isprintable() for c in lines[0]), lines
    assert row.names in lines[0], lines[0]
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert TOKEN not in result.output and TOKEN.lower() not in result.output.lower()
    assert not (tmp_path / "pwned").exists()
    assert _outside_its_folders(tmp_path) == before  # nothing written outside, nothing deleted
    if not row.pushes:
        assert tree_snapshot(remotes) == remotes_before
    for config in (run / "hub").glob("*/.git/config"):
        assert scrub(config.read_text()) == config.read_text(), config
    for path in (run / "hub").rglob("*") if (run / "hub").is_dir() else ():
        if path.is_file() and not path.is_symlink():
            assert TOKEN.encode() not in path.read_bytes(), path
    if server:
        assert server.paths or row.base, "git reached the foreign server (an inherited one is refused before git runs)"
        assert TOKEN not in server.passwords() and not server.authorizations

