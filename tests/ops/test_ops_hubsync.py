"""Hub sync with real git and git-lfs against local bare remotes: LFS objects, retries, locking, the token."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from bigscience_ops.errors import ConfigError
from bigscience_ops.ops.keep import gitlfs, hubsync
from tests.fixtures_experiments import tiny_yaml
from tests.fixtures_git import bare_remote, blob_at, git, hub_experiment, lfs_object, lfs_oid
from tests.fixtures_slurm import wait_until
from tests.fixtures_smtp import T0, alerts_yaml, free_port
from tests.fixtures_runs import commit_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_run(run: Path) -> None:
    (run / "logs").mkdir(parents=True, exist_ok=True)
    (run / "logs" / "main_log.txt").write_text("iteration 1/ 10 | lm loss: 9.1\n")
    (run / "logs" / "notes.txt").write_text("a small file stays a plain git blob\n")
    (run / "logs" / "big.dump").write_bytes(os.urandom(20_000))  # over lfs_size_mb = 0.01 (10 kB)
    (run / "tensorboard").mkdir(parents=True, exist_ok=True)
    (run / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"\x00event" * 10)


def test_sync_pushes_lfs_objects_and_commits_only_changes(git_lfs, tmp_path: Path) -> None:
    run, remotes = tmp_path / "run", tmp_path / "remotes"
    logs, tb = bare_remote(remotes, "bs/tiny-logs"), bare_remote(remotes, "bs/tiny-tensorboard")
    _write_run(run)
    # The alert state (with its error texts) and its lock stay on the cluster.
    (run / "logs" / ".bsops-alerts.json").write_text('{"jobs": {"backup": {"error": "/private/path"}}}\n')
    (run / "logs" / ".bsops-alerts.json.lock").write_text("")
    exp = hub_experiment(run, remotes)

    results = hubsync.sync(hubsync.settings(exp))
    assert [r.what for r in results] == ["logs", "tensorboard"]
    assert sorted(results[0].copied) == ["big.dump", "main_log.txt", "notes.txt"]
    assert all(r.commit and r.push_attempts == 1 for r in results)
    for bare, name, source in [(logs, "main_log.txt", run / "logs" / "main_log.txt"),
                               (logs, "big.dump", run / "logs" / "big.dump"),
                               (tb, "events.out.tfevents.1.host", run / "tensorboard" / "events.out.tfevents.1.host")]:
        oid = lfs_oid(blob_at(bare, name))
        assert oid == _sha(source), name
        assert lfs_object(bare, oid).read_bytes() == source.read_bytes()
    assert blob_at(logs, "notes.txt") == (run / "logs" / "notes.txt").read_bytes()

    again = hubsync.sync(hubsync.settings(exp))
    assert [(r.copied, r.commit, r.push_attempts) for r in again] == [([], None, 0), ([], None, 0)]
    assert git("--git-dir", str(logs), "rev-list", "--count", "main").strip() == "1"

    with open(run / "logs" / "main_log.txt", "a") as handle:
        handle.write("iteration 2/ 10 | lm loss: 8.7\n")
    logs_only = hubsync.sync(hubsync.settings(exp), what=["logs"])
    assert logs_only[0].copied == ["main_log.txt"] and logs_only[0].commit
    assert git("--git-dir", str(logs), "rev-parse", "main").strip() == logs_only[0].commit
    oid = lfs_oid(blob_at(logs, "main_log.txt"))
    assert lfs_object(bare=logs, oid=oid).read_text().count("iteration") == 2


def test_the_chronicle_goes_to_the_logs_repo_and_changes_only_with_the_run(git_lfs, tmp_path: Path) -> None:
    import time

    from bigscience_ops.run import ledger
    from tests.fixtures_git import remote_holding, tree_snapshot

    run, remotes = tmp_path / "run", tmp_path / "remotes"
    logs = bare_remote(remotes, "bs/tiny-logs")
    _write_run(run)
    exp = hub_experiment(run, remotes)
    first = hubsync.sync(hubsync.settings(exp), what=["logs"])[0]
    assert first.chronicle == "updated" and "CHRONICLE.md updated" in first.describe()
    assert "CHRONICLE.md" not in first.copied and first.push_attempts == 1
    text = blob_at(logs, "CHRONICLE.md").decode()
    assert text.startswith("# tiny: run chronicle") and "written by `bsops hub-sync` from" in text
    assert "Nothing recorded yet" in text and lfs_oid(blob_at(logs, "CHRONICLE.md")) is None  # a plain blob
    again = hubsync.sync(hubsync.settings(exp), what=["logs"])[0]
    assert (again.chronicle, again.commit, again.push_attempts) == (None, None, 0)  # unstamped: unchanged

    ledger.append(run / ledger.LEDGER_NAME, ledger.TaskRecord("launch", "4242", "", 0, time.time()))
    launched = hubsync.sync(hubsync.settings(exp), what=["logs"])[0]
    assert launched.copied == [] and launched.chronicle == "updated" and launched.commit
    assert "launched: job array 4242 submitted" in blob_at(logs, "CHRONICLE.md").decode()

    # A remote holding CHRONICLE.md as a link: nothing is written through it, and the logs still go out.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.md").write_text("theirs\n")
    before = tree_snapshot(outside)
    remote_holding(tmp_path / "hostile", "bs/tiny-logs", {"README.md": "x\n"},
                   links={"CHRONICLE.md": str(outside / "victim.md")})
    hostile = hub_experiment(tmp_path / "run2", tmp_path / "hostile")
    _write_run(tmp_path / "run2")
    refused = hubsync.sync(hubsync.settings(hostile), what=["logs"])[0]
    assert refused.chronicle == "not written: it is a link in the clone" and refused.commit
    assert tree_snapshot(outside) == before


def test_push_retries_and_an_unpushed_commit_goes_next_time(git_lfs, tmp_path: Path) -> None:
    run, remotes = tmp_path / "run", tmp_path / "remotes"
    bare = bare_remote(remotes, "bs/tiny-logs")
    refusals = tmp_path / "refusals"
    refusals.write_text("2")
    hook = bare / "hooks" / "pre-receive"
    # Refuses as many pushes as the counter file says, then accepts.
    hook.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        n=$(cat {refusals})
        if [ "$n" -gt 0 ]; then echo $((n - 1)) > {refusals}; echo "refused on purpose" >&2; exit 1; fi
        cat > /dev/null
        """))
    hook.chmod(0o755)
    _write_run(run)
    exp = hub_experiment(run, remotes, push_attempts=2)

    with pytest.raises(gitlfs.GitError) as failed:
        hubsync.sync(hubsync.settings(exp), what=["logs"], backoff_s=0)
    assert failed.value.returncode not in (0, None) and failed.value.argv[:2] == ["git", "push"]
    assert "refused on purpose" in failed.value.stderr
    assert subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "--verify", "-q", "main"],
                          capture_output=True, timeout=60).returncode != 0

    refusals.write_text("1")
    result = hubsync.sync(hubsync.settings(exp), what=["logs"], backoff_s=0)[0]
    assert result.copied == [] and result.commit is None and result.push_attempts == 2
    clone_head = git("rev-parse", "HEAD", cwd=hubsync.clone_path(hubsync.settings(exp), "logs")).strip()
    assert git("--git-dir", str(bare), "rev-parse", "main").strip() == clone_head


def _gate_hook(bare: Path, gate: Path) -> None:
    """A pre-receive hook that keeps the push running until the test creates gate/release."""
    gate.mkdir()
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\ntouch {gate}/started\nwhile [ ! -e {gate}/release ]; do sleep 0.2; done\ncat >/dev/null\n")
    hook.chmod(0o755)


_SYNC = """
import dataclasses, json, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.fixtures_git import hub_experiment
from bigscience_ops.ops.keep import hubsync
exp = hub_experiment(Path({run!r}), Path({remotes!r}))
result = hubsync.sync(hubsync.settings(exp), what=["logs"], wait_s={wait})[0]
print(json.dumps({{"skipped": result.skipped, "commit": result.commit, "copied": result.copied}}))
"""


def _start_sync(run: Path, remotes: Path, wait: float, env: dict) -> subprocess.Popen:
    code = _SYNC.format(repo=str(REPO), run=str(run), remotes=str(remotes), wait=wait)
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)


def _argv_of_all_processes() -> list[bytes]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry / "cmdline").read_bytes())
            except OSError:
                pass
    return out


def test_overlapping_syncs_and_the_token_never_leaks(git_lfs, tmp_path: Path) -> None:
    run, remotes, gate = tmp_path / "run", tmp_path / "remotes", tmp_path / "gate"
    bare = bare_remote(remotes, "bs/tiny-logs")
    _gate_hook(bare, gate)
    _write_run(run)
    token = "hf_" + os.urandom(12).hex()
    env = {**os.environ, "HF_TOKEN": token}

    first = _start_sync(run, remotes, wait=0, env=env)
    try:
        wait_until("the first sync's push to reach the remote", lambda: (gate / "started").exists(), timeout=120)
        # While that push runs: no process carries the token in its arguments.
        argvs = _argv_of_all_processes()
        assert any(b"receive-pack" in a or b"pre-receive" in a for a in argvs)
        assert not [a for a in argvs if token.encode() in a]
        # A second run does not wait: it skips and leaves the clone alone; a third one waits its turn.
        skipped = _start_sync(run, remotes, wait=0, env=env)
        out, err = skipped.communicate(timeout=120)
        assert skipped.returncode == 0, err
        assert '"skipped": "another sync' in out and '"commit": null' in out
        with open(run / "logs" / "main_log.txt", "a") as handle:
            handle.write("iteration 2/ 10 | lm loss: 8.7\n")
        third = _start_sync(run, remotes, wait=300, env=env)
    finally:
        (gate / "release").touch()
    out1, err1 = first.communicate(timeout=300)
    out3, err3 = third.communicate(timeout=300)
    assert first.returncode == 0 and third.returncode == 0, err1 + err3
    assert '"main_log.txt"' in out3 and '"commit": null' not in out3

    clone = hubsync.clone_path(hubsync.settings(hub_experiment(run, remotes)), "logs")
    assert subprocess.run(["git", "fsck", "--strict"], cwd=clone, capture_output=True, timeout=120).returncode == 0
    assert git("status", "--porcelain", cwd=clone) == ""
    assert git("rev-parse", "HEAD", cwd=clone) == git("--git-dir", str(bare), "rev-parse", "main")
    oid = lfs_oid(blob_at(bare, "main_log.txt"))
    assert lfs_object(bare, oid).read_bytes() == (run / "logs" / "main_log.txt").read_bytes()

    # The token is in no file under the clone, no commit, no file of the remote.
    for root in (clone, bare, run / "hub"):
        for path in Path(root).rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
    history = git("log", "--all", "-p", "--format=%H %an %ae %s %b", cwd=clone)
    assert token not in history and token not in out1 + err1 + out3 + err3


# (protocol, host) git asks about -> whether the helper for hub.host "hub.example" answers.
HELPER_ASKS = [("https", "hub.example", True), ("http", "hub.example", False), ("https", "evil.example", False),
               ("https", "hub.example:8443", False), ("https", "hub.example.evil.org", False),
               ("https", "evil.hub.example", False), ("ftp", "hub.example", False)]


@pytest.mark.parametrize("protocol,host,answers", HELPER_ASKS)
def test_the_credential_helper_answers_only_https_on_the_hub_host(git_lfs, tmp_path: Path, protocol: str, host: str,
                                                                  answers: bool) -> None:
    token = "hf_" + os.urandom(12).hex()
    env = gitlfs.git_env("MY_HUB_TOKEN", "hub.example",
                         base={**os.environ, "MY_HUB_TOKEN": token, "HOME": str(tmp_path)})
    assert not any(token in value for key, value in env.items() if key != "MY_HUB_TOKEN")
    request = f"protocol={protocol}\nhost={host}\n\n"
    proc = subprocess.run(["git", "credential", "fill"], input=request, env=env, capture_output=True, text=True,
                          timeout=60)
    assert (f"password={token}" in proc.stdout.splitlines()) is answers, proc.stderr
    assert answers or (proc.returncode != 0 and token not in proc.stdout + proc.stderr)
    # The helper itself, run the way git runs a `!` helper, checks the request too (not only git's URL scoping).
    helper = next(env[f"GIT_CONFIG_VALUE_{k[len('GIT_CONFIG_KEY_'):]}"] for k, v in env.items()
                  if k.startswith("GIT_CONFIG_KEY_") and v.endswith(".helper") and v != "credential.helper")
    direct = subprocess.run(["sh", "-c", helper[1:] + ' "$@"', helper[1:], "get"], input=request, env=env,
                            capture_output=True, text=True, timeout=60)
    assert direct.returncode == 0 and (f"password={token}" in direct.stdout.splitlines()) is answers


def test_no_token_no_helper_and_a_hostile_token_env_or_host_is_refused(tmp_path: Path) -> None:
    token_free = gitlfs.git_env("MY_HUB_TOKEN", "hub.example", base={**os.environ, "HOME": str(tmp_path)})
    assert [v for k, v in token_free.items() if k.startswith("GIT_CONFIG_KEY_")][-1] == "credential.helper"
    assert token_free["GIT_ALLOW_PROTOCOL"] == "https:ssh:file"
    with pytest.raises(gitlfs.TokenError):
        gitlfs.credential_helper("MY TOKEN; rm -rf /", "hub.example")
    with pytest.raises(gitlfs.TokenError):
        gitlfs.credential_helper("MY_HUB_TOKEN", "hub.example'; touch /tmp/x; '")
    with pytest.raises(gitlfs.TokenError) as err:
        gitlfs.git_env("MY_HUB_TOKEN", "hub.example", base={"MY_HUB_TOKEN": "hf_abcdefgh\nhost=evil.example"})
    assert "hf_abcdefgh" not in str(err.value) and "MY_HUB_TOKEN" in str(err.value)


def _local_commit(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    git("init", "--quiet", "--initial-branch=main", cwd=work)
    (work / "main_log.txt").write_text("iteration 1\n")
    git("add", "main_log.txt", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "--quiet", "-m", "one", cwd=work)
    return work


@pytest.mark.parametrize("case", ["https on the hub host", "https on a foreign host", "http on the hub host",
                                  "http allowed by hand, on the hub host"])
def test_a_real_push_offers_the_token_only_over_https_to_the_hub_host(git_lfs, tmp_path: Path, cert, case: str,
                                                                      monkeypatch) -> None:
    from tests.fixtures_git import recording_server

    token = "hf_" + os.urandom(12).hex()
    monkeypatch.setenv("MY_HUB_TOKEN", token)
    work = _local_commit(tmp_path)
    https = case.startswith("https")
    with recording_server(cert if https else None) as server:
        host = "huggingface.co" if "foreign" in case else server.host
        extra = {"GIT_SSL_CAINFO": cert[0], "HOME": str(tmp_path)}
        if "by hand" in case:
            extra["GIT_ALLOW_PROTOCOL"] = "http:https"  # past the first wall: the helper still says nothing
        proc = gitlfs.Git(work, "MY_HUB_TOKEN", host).run("push", f"{server.url}/bs/tiny-logs.git", "HEAD:refs/heads/main",
                                                         check=False, extra_env=extra)
    assert proc.returncode != 0  # the server refuses everyone
    offered = token in server.passwords()
    assert offered is (case == "https on the hub host"), (server.paths, proc.stderr)
    assert case == "http on the hub host" or server.paths  # git did reach the server (but for the protocol wall)
    assert token not in proc.stderr + proc.stdout


def test_publish_folder_one_folder_per_step_on_one_branch(git_lfs, tmp_path: Path) -> None:
    run, remotes = tmp_path / "run", tmp_path / "remotes"
    bare = bare_remote(remotes, "bs/tiny-checkpoints")
    exp = hub_experiment(run, remotes)
    src = tmp_path / "hf"
    src.mkdir()
    (src / "model.safetensors").write_bytes(os.urandom(3000))
    (src / "config.json").write_text('{"n_layer": 2}\n')

    sha = hubsync.publish_folder(hubsync.settings(exp), src, "global_step10")
    assert sha == git("--git-dir", str(bare), "rev-parse", "main").strip()
    oid = lfs_oid(blob_at(bare, "global_step10/model.safetensors"))
    assert oid == _sha(src / "model.safetensors") and lfs_object(bare, oid).is_file()
    assert blob_at(bare, "global_step10/config.json") == b'{"n_layer": 2}\n'
    assert hubsync.publish_folder(hubsync.settings(exp), src, "global_step10") == "unchanged"

    (src / "config.json").write_text('{"n_layer": 2, "step": 20}\n')
    hubsync.publish_folder(hubsync.settings(exp), src, "global_step20")
    tree = git("--git-dir", str(bare), "ls-tree", "-r", "--name-only", "main").split()
    assert {"global_step10/config.json", "global_step20/config.json", "global_step20/model.safetensors"} <= set(tree)
    assert git("--git-dir", str(bare), "for-each-ref", "--format=%(refname)").split() == ["refs/heads/main"]
    with pytest.raises(hubsync.HubSyncError):
        hubsync.publish_folder(hubsync.settings(exp), src, "../escape")


def test_remote_choices_are_checked(tmp_path: Path) -> None:
    exp = hub_experiment(tmp_path / "run", tmp_path / "remotes")
    with pytest.raises(hubsync.HubSyncError):
        hubsync.selected(hubsync.settings(exp), ["logs", "tensorboard"], "file:///srv/x.git")
    with pytest.raises(hubsync.HubSyncError):
        hubsync.selected(hubsync.settings(exp), ["weights"], None)
    none = dataclasses.replace(exp, hub=dataclasses.replace(exp.hub, logs_repo=None, tensorboard_repo=None))
    with pytest.raises(hubsync.HubSyncError):
        hubsync.selected(hubsync.settings(none), None, None)
    assert hubsync.selected(hubsync.settings(none), ["logs"], "file:///srv/x.git") == ["logs"]
    assert hubsync.remote_for(hubsync.settings(exp), "bs/tiny-logs") == (
        f"file://{tmp_path / 'remotes'}/bs/tiny-logs.git", False)
    hub = dataclasses.replace(exp, hub=dataclasses.replace(exp.hub, remote_template=None))
    assert hubsync.remote_for(hubsync.settings(hub), "bs/tiny-logs")[1] is True


def test_config_rejects_a_template_without_repo(trainings: Path) -> None:
    from bigscience_ops.config.loading import load_experiment

    (trainings / "mirror.yaml").write_text("base: tiny\nhub: {remote_template: 'file:///srv/mirror.git'}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("mirror", trainings)
    assert err.value.field == "hub.remote_template"


# --- `bsops hub-sync --alert`, what the hourly job runs: cooldown and recovery emails -------------------

def _alerting_experiment(trainings: Path, tmp_path: Path, smtp_port: int) -> None:
    (trainings / "synced.yaml").write_text(
        tiny_yaml(tmp_path / "run",
                  f"hub: {{logs_repo: bs/synced-logs, remote_template: {json.dumps(f'file://{tmp_path}/remotes/{{repo}}.git')}, "
                  "push_attempts: 1}\n",
                  alerts_yaml(smtp_port, 60)))
    (tmp_path / "run" / "logs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "run" / "logs" / "main_log.txt").write_text("iteration 1/ 10 | lm loss: 9.1\n")


def _refusing(bare: Path, refuse: bool) -> None:
    hook = bare / "hooks" / "pre-receive"
    if refuse:
        hook.write_text("#!/bin/sh\necho 'quota exceeded' >&2\nexit 1\n")
        hook.chmod(0o755)
    else:
        hook.unlink()


def _sync_at(trainings: Path, clock: list, minutes: int):
    from click.testing import CliRunner

    from bigscience_ops.cli import main

    clock[0] = T0 + timedelta(minutes=minutes)
    return CliRunner().invoke(main, ["hub-sync", "synced", "--alert", "--trainings-dir", str(trainings)])


def test_a_failing_sync_emails_once_per_cooldown_then_one_recovery(git_lfs, trainings: Path, tmp_path: Path,
                                                                    plain_server, monkeypatch) -> None:
    from bigscience_ops.ops.tell import notify

    inbox, port = plain_server
    _alerting_experiment(trainings, tmp_path, port)
    bare = bare_remote(tmp_path / "remotes", "bs/synced-logs")
    _refusing(bare, True)
    clock = [T0]
    monkeypatch.setattr(notify, "_now", lambda: clock[0])

    runs = [_sync_at(trainings, clock, m) for m in (0, 20, 40)]
    assert [r.exit_code for r in runs] == [2, 2, 2] and len(inbox.messages) == 1
    first = inbox.messages[0]
    assert first["Subject"] == "[bsops] synced: hub-sync failed"
    body = first.get_content()
    assert "quota exceeded" in body and "`bsops hub-sync synced`" in body
    assert "repeats at most every 60 minutes while it keeps failing; a recovery email" in body
    assert "alert email sent to oncall@example.org" in runs[0].stderr
    for held in runs[1:]:
        assert "hub-sync failed again (failing since 2026-11-22T10:00:00); the alert email was held back" in held.stderr
        assert "quota exceeded" in held.stderr  # the error itself is still printed for cron's log

    assert _sync_at(trainings, clock, 60).exit_code == 2 and len(inbox.messages) == 2  # the cooldown is over
    assert "failing since 2026-11-22 10:00 (1 h 00 min)" in inbox.messages[1].get_content()

    _refusing(bare, False)
    worked = _sync_at(trainings, clock, 75)
    assert worked.exit_code == 0, worked.output
    assert blob_at(bare, "main_log.txt")  # the commits the refused runs left went out
    assert len(inbox.messages) == 3
    recovery = inbox.messages[2]
    assert recovery["Subject"] == "[RECOVERED] synced: hub-sync works again"
    assert "failed from 2026-11-22 10:00 for 1 h 15 min" in recovery.get_content()
    assert "quota exceeded" in recovery.get_content()
    assert _sync_at(trainings, clock, 135).exit_code == 0 and len(inbox.messages) == 3


def test_a_failure_never_emailed_clears_silently(git_lfs, trainings: Path, tmp_path: Path, plain_server,
                                                 monkeypatch) -> None:
    from bigscience_ops.ops.tell import notify

    inbox, port = plain_server
    _alerting_experiment(trainings, tmp_path, free_port())  # the SMTP server is down
    bare = bare_remote(tmp_path / "remotes", "bs/synced-logs")
    _refusing(bare, True)
    clock = [T0]
    monkeypatch.setattr(notify, "_now", lambda: clock[0])

    failed = _sync_at(trainings, clock, 0)
    assert failed.exit_code == 2 and "***ALERT: the hub-sync alert email could not be sent" in failed.stderr
    state = tmp_path / "run" / "logs" / ".bsops-alerts.json"
    assert json.loads(state.read_text())["jobs"]["hub-sync"]["sent"] == {}  # kept, so the next run retries

    _alerting_experiment(trainings, tmp_path, port)  # the server is back, and so is the remote
    _refusing(bare, False)
    worked = _sync_at(trainings, clock, 10)
    assert worked.exit_code == 0, worked.output
    assert inbox.messages == [] and "email" not in worked.stderr
    assert json.loads(state.read_text())["jobs"] == {}


# --- links committed in the remote: hub-sync never writes or reads through them ----------------------------

def test_links_in_the_remote_never_take_a_sync_out_of_its_clone(git_lfs, tmp_path: Path) -> None:
    from tests.fixtures_git import remote_holding, tree_snapshot

    run, remotes, outside = tmp_path / "run", tmp_path / "remotes", tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("theirs\n")
    bare = remote_holding(remotes, "bs/tiny-logs", {"README.md": "their logs\n"},
                          links={"sub": str(outside), "notes.txt": str(outside / "victim.txt"),
                                 "big.dump": "../../../outside/victim.txt"})
    _write_run(run)
    (run / "logs" / "sub").mkdir()
    (run / "logs" / "sub" / "evil.txt").write_text("would land outside\n")
    before = tree_snapshot(outside)
    exp = hub_experiment(run, remotes)

    result = hubsync.sync(hubsync.settings(exp), what=["logs"])[0]
    assert sorted(result.refused) == ["big.dump", "notes.txt", "sub/evil.txt"]
    assert result.copied == ["main_log.txt"] and result.commit and result.push_attempts == 1
    assert tree_snapshot(outside) == before
    clone = hubsync.clone_path(hubsync.settings(exp), "logs")
    assert not any(p.is_symlink() for p in clone.rglob("*"))  # links are checked out as plain files
    assert lfs_oid(blob_at(bare, "main_log.txt")) == _sha(run / "logs" / "main_log.txt")
    assert "refused (a link in the clone)" in result.describe()

    # A clone made before links were checked out as files holds real links: still nothing goes through them.
    git("config", "core.symlinks", "true", cwd=clone)
    for name in ("sub", "notes.txt", "big.dump"):
        (clone / name).unlink()
    git("checkout", "--", "sub", "notes.txt", "big.dump", cwd=clone)
    assert (clone / "sub").is_symlink()
    (run / "logs" / "notes.txt").write_text("changed\n")
    (run / "logs" / "sub" / "evil.txt").write_text("changed too\n")
    again = hubsync.sync(hubsync.settings(exp), what=["logs"])[0]
    assert sorted(again.refused) == ["big.dump", "notes.txt", "sub/evil.txt"]
    assert tree_snapshot(outside) == before

    # publish_folder refuses a step folder that is a link in the remote.
    ckpt = remote_holding(remotes, "bs/tiny-checkpoints", {"README.md": "x\n"}, links={"global_step10": str(outside)})
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text("{}\n")
    with pytest.raises(hubsync.HubSyncError) as err:
        hubsync.publish_folder(hubsync.settings(exp), src, "global_step10/inner")
    assert "global_step10" in str(err.value) and tree_snapshot(outside) == before
    assert git("--git-dir", str(ckpt), "rev-list", "--count", "main").strip() == "1"


def test_hub_sync_alert_on_hostile_records_pushes_an_escaped_chronicle_and_tells_of_a_failure(
        git_lfs, trainings: Path, tmp_path: Path, plain_server, monkeypatch) -> None:
    """Records with wrong field types and Markdown/HTML payloads: hub-sync --alert still pushes the logs and the
    chronicle (bad lines listed, payloads as text), and a sync that fails afterwards is still emailed."""
    from bigscience_ops.run import ledger
    from bigscience_ops.run import rollbacks
    from bigscience_ops.ops.tell import notify

    inbox, port = plain_server
    _alerting_experiment(trainings, tmp_path, port)
    bare = bare_remote(tmp_path / "remotes", "bs/synced-logs")
    run = tmp_path / "run"
    ledger.append(run / ledger.LEDGER_NAME, ledger.TaskRecord("launch", "<script>alert(1)</script>", "", 0, 1.8e9))
    ledger.append(run / ledger.LEDGER_NAME, ledger.TaskRecord("begin", "7_1", "![p](https://evil.example/p.png)", 0,
                                                              1.8e9 + 60))
    with open(run / ledger.LEDGER_NAME, "a") as handle:
        handle.write('{"event": "end", "job_id": "7_1", "nodes": {"x": 1}, "iteration": "5", "time": NaN}\n')
        handle.write('{"event": "end", "job_id": "7_1", "nodes": "n", "iteration": 5, "time": 1e400}\n')
    (run / rollbacks.RECORD).write_text('{"time": "now", "from_step": [], "to_step": null}\n')
    clock = [T0]
    monkeypatch.setattr(notify, "_now", lambda: clock[0])

    synced = _sync_at(trainings, clock, 0)
    assert synced.exit_code == 0 and "Traceback" not in synced.output, synced.output
    assert "CHRONICLE.md updated" in synced.output and inbox.messages == []
    page = blob_at(bare, "CHRONICLE.md").decode()
    assert "&lt;script&gt;" in page and "<script" not in page and "![p](" not in page
    assert "## Records not read" in page and page.count("- `task-ledger.jsonl` line") == 2
    assert "- `rollbacks.jsonl` line 1" in page

    _refusing(bare, True)  # and when the sync itself fails, the alert still goes out
    (run / "logs" / "main_log.txt").write_text("iteration 2/ 10 | lm loss: 8.7\n")
    failed = _sync_at(trainings, clock, 10)
    assert failed.exit_code == 2 and "Traceback" not in failed.output and len(inbox.messages) == 1


def test_the_eval_result_files_go_to_the_logs_repo_under_eval(git_lfs, tmp_path: Path) -> None:
    from bigscience_ops.ops.evaluate import results
    from tests.evaluate.test_ops_evaluate_results import write_results

    run, remotes = tmp_path / "run", tmp_path / "remotes"
    logs = bare_remote(remotes, "bs/tiny-logs")
    _write_run(run)
    write_results(run, {100: {"smoke_choice/acc": 0.5}})
    step = run / "checkpoints" / "global_step100"  # the chronicle counts a result only for a checkpoint the run has
    step.mkdir(parents=True)
    (step / "bsops.json").write_text('{"iteration": 100}')
    commit_checkpoint(step)
    (run / "checkpoints" / "latest").write_text("global_step100")
    (run / "eval" / "jobs.jsonl").write_text('{"event": "submitted"}\n')  # the scheduler's ledger stays here
    (run / "eval" / ".global_step200.json.77.tmp").write_text("{")  # a write in progress
    outside = tmp_path / "secret.json"
    outside.write_text('{"token": "x"}\n')
    os.symlink(outside, run / "eval" / "global_step300.json")  # never followed
    with open(run / "eval" / "global_step400.json", "wb") as handle:
        handle.truncate(results.MAX_RESULT + 1)  # over what any reader reads: named, not pushed
    exp = hub_experiment(run, remotes)
    first = hubsync.sync(hubsync.settings(exp), what=["logs"])[0]
    assert [c for c in first.copied if c.startswith("eval/")] == ["eval/global_step100.json"] and first.commit
    assert first.too_large == ["eval/global_step400.json"]
    assert blob_at(logs, "eval/global_step100.json") == (run / "eval" / "global_step100.json").read_bytes()
    tree = git("--git-dir", str(logs), "ls-tree", "-r", "--name-only", "main").split()
    assert [name for name in tree if name.startswith("eval/")] == ["eval/global_step100.json"]
    assert "## Evaluation" in blob_at(logs, "CHRONICLE.md").decode()
