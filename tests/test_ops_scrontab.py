"""`bsops cron install --scrontab` merges a marked block into the user's scrontab and keeps the rest.

Debian ships no scrontab client, so a fake one stands in at the subprocess edge. It behaves as
Slurm's src/scrontab/scrontab.c does: `-l` prints the crontab, or "no crontab for USER" on stdout
with exit code 1; any other call copies the crontab to a temporary file, runs $VISUAL (else
$EDITOR) on it and installs what the editor left there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.ops import scrontab

FAKE = """#!/bin/bash
store={store}
if [[ ${{1-}} == -l ]]; then
    if [[ -f $store ]]; then cat "$store"; exit 0; fi
    echo "no crontab for $(id -un)"; exit 1
fi
tmp=$(mktemp)
[[ -f $store ]] && cp "$store" "$tmp"
"${{VISUAL:-${{EDITOR:-vi}}}}" "$tmp" || {{ echo "scrontab: fatal: editor returned non-zero exit code" >&2; exit 1; }}
cp "$tmp" "$store"
"""

USERS_OWN = """# my own nightly job
#SCRON --partition=prepost
#SCRON --time=10
30 2 * * * /home/me/bin/nightly.sh
"""


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake client on PATH; returns the file where it keeps the installed crontab."""
    store = tmp_path / "installed-crontab"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scrontab").write_text(FAKE.format(store=store))
    (bindir / "scrontab").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return store


def install(cron_dir: Path) -> str:
    result = CliRunner().invoke(main, ["cron", "install", "--scrontab", "--cron-dir", str(cron_dir)])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_block_is_merged_and_the_users_entries_kept(client: Path, tmp_path: Path) -> None:
    client.write_text(USERS_OWN)
    cron_dir = tmp_path / "cron"
    install(cron_dir)
    first = client.read_text()
    assert first.startswith(USERS_OWN)
    hourly = [line for line in first.splitlines() if line.startswith("0 * * * * ")]
    assert hourly == [f"0 * * * * bsops cron run hourly --cron-dir {cron_dir.resolve()} --no-rearm"]
    assert first.count(scrontab.BEGIN) == 1 and first.count(scrontab.END) == 1
    # Installing again (say with other settings) replaces the block only.
    client.write_text(first + "15 * * * * /home/me/bin/later.sh\n")
    (cron_dir / "cron.yaml").write_text("account: six@cpu\n")
    install(cron_dir)
    second = client.read_text()
    assert second.startswith(USERS_OWN) and second.endswith("15 * * * * /home/me/bin/later.sh\n")
    assert second.count(scrontab.BEGIN) == 1 and "#SCRON --account=six@cpu" in second
    assert len([line for line in second.splitlines() if line.startswith("0 * * * * ")]) == 1


def test_an_empty_scrontab_gets_the_block(client: Path, tmp_path: Path) -> None:
    install(tmp_path / "cron")
    text = client.read_text()
    assert text.startswith(scrontab.BEGIN) and text.endswith(scrontab.END + "\n")


def test_a_broken_block_is_refused_and_nothing_installed(client: Path, tmp_path: Path) -> None:
    client.write_text(USERS_OWN + scrontab.BEGIN + "\n0 * * * * x\n")  # the end marker was deleted by hand
    result = CliRunner().invoke(main, ["cron", "install", "--scrontab", "--cron-dir", str(tmp_path / "cron")])
    assert result.exit_code != 0 and "marker" in result.output
    assert client.read_text() == USERS_OWN + scrontab.BEGIN + "\n0 * * * * x\n"


def test_a_cron_folder_resolving_to_a_name_with_a_newline_is_refused(client: Path, tmp_path: Path) -> None:
    """The cron folder's path goes on the entry's line; a symlink can hide a newline in its target."""
    target = tmp_path / "cron\n* * * * * touch pwned"
    target.mkdir()
    (tmp_path / "cron").symlink_to(target)
    client.write_text(USERS_OWN)
    result = CliRunner().invoke(main, ["cron", "install", "--scrontab", "--cron-dir", str(tmp_path / "cron")])
    assert result.exit_code != 0 and repr(str(target)) in result.output
    assert client.read_text() == USERS_OWN


def test_without_a_client_the_block_is_written_for_a_login_node(tmp_path: Path, monkeypatch) -> None:
    if shutil.which("scrontab"):
        pytest.skip("this machine has a scrontab client")
    output = install(tmp_path / "cron")
    assert "no scrontab client" in output
    text = (tmp_path / "cron" / "runners" / "bsops.scrontab").read_text()
    assert text.startswith(scrontab.BEGIN) and "#SCRON --job-name=bsops-cron-daily" in text
