"""`bsops cron install --scrontab` merges a marked block into the user's scrontab and keeps the rest.

Debian ships no scrontab client, so a fake one stands in at the subprocess edge. It behaves as
Slurm's src/scrontab/scrontab.c does: `-l` prints the crontab, or "no crontab for USER" on stdout
with exit code 1; any other call copies the crontab to a temporary file, runs $VISUAL (else
$EDITOR) on it and installs what the editor left there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import EXIT_ERROR, main
from bigscience_ops.ops.cron import runner as cron, scrontab

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
    assert hourly == [f"0 * * * * {cron_dir.resolve()}/runners/scron-hourly.sh"]
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
    """Run on every machine: a scrontab client this one has is taken off PATH (as on a node without one)."""
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                                               if not (Path(d or ".") / "scrontab").exists()))
    assert shutil.which("scrontab") is None
    output = install(tmp_path / "cron")
    assert "no scrontab client" in output
    text = (tmp_path / "cron" / "runners" / "bsops.scrontab").read_text()
    assert text.startswith(scrontab.BEGIN) and "#SCRON --job-name=bsops-cron-daily" in text


def _entry_commands(crontab: str) -> list[str]:
    return [line.split(" ", 5)[5] for line in crontab.split("\n") if line[:1].isdigit()]


@pytest.mark.slurm
def test_entries_call_a_bash_script_holding_env_setup(client: Path, tmp_path: Path) -> None:
    """The installed command runs under /bin/sh as scrontab runs it; `source` and a `#` comment in
    env_setup work because they are lines of the bash script, which puts bsops on PATH here."""
    cron_dir = tmp_path / "cron dir"  # a space: the entry's path is quoted for sh
    cron_dir.mkdir()
    env_file = tmp_path / "env.sh"
    env_file.write_text(f"export PATH={Path(sys.executable).parent}:$PATH\n"
                        f"export PYTHONPATH={Path(__file__).resolve().parents[2]}\n")
    (cron_dir / "cron.yaml").write_text(f"env_setup: ['source {env_file}  # puts bsops on PATH', 'set -u']\n")
    install(cron_dir)
    crontab = client.read_text()
    assert all(line.startswith("#SCRON --") and " " not in line.removeprefix("#SCRON ")
               for line in crontab.split("\n") if line.startswith("#SCRON"))
    assert "source" not in crontab and "bsops cron run" not in crontab
    script = scrontab.entry_script(cron_dir, "hourly")
    assert script.stat().st_mode & 0o777 == 0o755
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n") and "\nset -euo pipefail\n" in text
    assert f"\nsource {env_file}  # puts bsops on PATH\nset -u\n" in text
    hourly = _entry_commands(crontab)[0]
    path = ":".join(p for p in os.environ["PATH"].split(":") if p != str(Path(sys.executable).parent))
    proc = subprocess.run(["/bin/sh", "-c", hourly], env={**os.environ, "PATH": path}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "pass done" in cron.log_path(cron_dir, "hourly").read_text()


@pytest.mark.parametrize(("yaml_text", "field"), [
    ("name_prefix: nightly ops\n", "name_prefix"),
    ("partition: cpu p\n", "partition"),
    ("account: 'six\\'\n", "account"),
    ("qos: --hold\n", "qos"),
    ("time: '20:00 --hold'\n", "time"),
])
def test_values_scrontab_cannot_carry_are_refused_at_load(client: Path, tmp_path: Path, yaml_text: str,
                                                           field: str) -> None:
    cron_dir = tmp_path / "cron"
    cron_dir.mkdir()
    (cron_dir / "cron.yaml").write_text(yaml_text)
    client.write_text(USERS_OWN)
    result = CliRunner().invoke(main, ["cron", "install", "--scrontab", "--cron-dir", str(cron_dir)])
    assert result.exit_code == EXIT_ERROR and result.output.startswith("error: ")
    assert f"cron.yaml: {field}: got" in result.output and "Traceback" not in result.output
    assert client.read_text() == USERS_OWN and not (cron_dir / "runners").exists()
