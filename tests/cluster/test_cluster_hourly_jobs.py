"""`bsops cron add` writes the hourly hub-sync and backup jobs; run with bash, they push, back up, and email failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.checkpoints import layout
from bigscience_ops.ops.keep import store as backup_store
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_git import bare_remote, blob_at, lfs_object, lfs_oid
from tests.fixtures_smtp import alerts_yaml
from tests.fixtures_runs import commit_checkpoint


def _experiment(trainings: Path, tmp_path: Path, port: int, dest: Path) -> None:
    (trainings / "synced.yaml").write_text(
        tiny_yaml(tmp_path / "run",
                  f"hub: {{logs_repo: bs/synced-logs, remote_template: {json.dumps(f'file://{tmp_path}/remotes/{{repo}}.git')}, "
                  "push_attempts: 1}\n",
                  f"backup: {{dest: {json.dumps(str(dest))}}}\n",
                  alerts_yaml(port)))


def _checkpoint(scratch: Path, step: int) -> None:
    folder = scratch / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "layer_00-model_states.pt").write_bytes(os.urandom(4000))
    (folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(os.urandom(8000))
    (folder / "bsops.json").write_text(json.dumps({"iteration": step}))
    commit_checkpoint(folder)
    (scratch / "latest").write_text(f"global_step{step}")


def _bash(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_cron_add_writes_three_jobs_that_run_and_email_failures(git_lfs, trainings: Path, tmp_path: Path,
                                                                 plain_server) -> None:
    inbox, port = plain_server
    _experiment(trainings, tmp_path, port, tmp_path / "store")
    cron_dir = tmp_path / "cron"
    result = CliRunner().invoke(main, ["cron", "add", "synced", "--cron-dir", str(cron_dir),
                                       "--trainings-dir", str(trainings)])
    assert result.exit_code == 0, result.output
    hourly = cron_dir / "cron.hourly"
    assert sorted(p.name for p in hourly.iterdir()) == [
        "synced-backup.slurm", "synced-hub-sync.slurm", "synced-slurm-status.slurm"]
    for script in hourly.iterdir():
        assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    assert "#SBATCH --job-name=bsops.synced.hub-sync\n" in (hourly / "synced-hub-sync.slurm").read_text()

    only = CliRunner().invoke(main, ["cron", "add", "synced", "--jobs", "backup", "--cron-dir", str(tmp_path / "c2"),
                                     "--trainings-dir", str(trainings)])
    assert only.exit_code == 0 and [p.name for p in (tmp_path / "c2" / "cron.hourly").iterdir()] == ["synced-backup.slurm"]
    assert CliRunner().invoke(main, ["cron", "add", "synced", "--jobs", "stauts", "--cron-dir", str(tmp_path / "c3"),
                                     "--trainings-dir", str(trainings)]).exit_code != 0

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "main_log.txt").write_text("iteration 1/ 221 | lm loss: 9.0\n")
    _checkpoint(run / "checkpoints", 5)
    bare = bare_remote(tmp_path / "remotes", "bs/synced-logs")

    sync = _bash(hourly / "synced-hub-sync.slurm", tmp_path)
    assert sync.returncode == 0, sync.stdout + sync.stderr
    oid = lfs_oid(blob_at(bare, "main_log.txt"))
    assert lfs_object(bare, oid).read_bytes() == (run / "logs" / "main_log.txt").read_bytes()

    saved = _bash(hourly / "synced-backup.slurm", tmp_path)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    store = backup_store.run_store(tmp_path / "store", "synced", layout.run_id(run / "checkpoints"))
    assert backup_store.verify(store, "global_step5") == []
    assert sorted(p.name for p in (store / "global_step5").iterdir()) == ["bsops.json", "layer_00-model_states.pt"]
    assert inbox.messages == []

    # The remote refuses the next push: the sync job fails and emails.
    hook = bare / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'quota exceeded' >&2\nexit 1\n")
    hook.chmod(0o755)
    with open(run / "logs" / "main_log.txt", "a") as handle:
        handle.write("iteration 2/ 221 | lm loss: 8.8\n")
    failed = _bash(hourly / "synced-hub-sync.slurm", tmp_path)
    assert failed.returncode == 2
    assert len(inbox.messages) == 1 and "hub-sync" in inbox.messages[0]["Subject"]
    assert "quota exceeded" in inbox.messages[0].get_content()

    # The backup store is not a folder: the backup job fails and emails.
    _experiment(trainings, tmp_path, port, tmp_path / "not-a-folder")
    (tmp_path / "not-a-folder").write_text("")
    failed = _bash(hourly / "synced-backup.slurm", tmp_path)
    assert failed.returncode == 2
    assert len(inbox.messages) == 2 and "backup" in inbox.messages[1]["Subject"]
