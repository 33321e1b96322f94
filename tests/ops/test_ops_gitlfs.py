"""bigscience_ops.ops.keep.gitlfs: a push that keeps failing waits a bounded time, then raises the last error; every
command ends within its time, whatever the remote does, and takes every process it started with it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bigscience_ops.ops.keep import gitlfs
from bigscience_ops.schema import HubConfig
from tests.fixtures_https import hostile_https  # noqa: F401 (a fixture)
from tests.hang import ends_within


def test_waits_between_failing_pushes_are_capped_and_the_most_attempts_fit_in_the_hourly_period(
        tmp_path: Path) -> None:
    """A real git push to a remote that does not exist fails every time: with hub.push_attempts at its
    bound, the waits double from backoff_s up to MAX_WAIT_S, and all of them end before the next hourly run."""
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(tmp_path)], check=True, timeout=60)
    for args in (["config", "user.email", "t@example.org"], ["config", "user.name", "t"],
                 ["commit", "--quiet", "--allow-empty", "-m", "x"],
                 ["remote", "add", "origin", str(tmp_path / "no-such-remote.git")]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, timeout=60)
    waits: list[float] = []
    attempts = HubConfig.__dataclass_fields__["push_attempts"].metadata["bounds"]["at_most"]
    with pytest.raises(gitlfs.GitError) as failed:
        gitlfs.push(gitlfs.Git(tmp_path), attempts, backoff_s=10.0, sleep=waits.append)
    assert failed.value.argv[:2] == ["git", "push"]
    assert waits == [10, 20, 40, 80, 160, 300, 300, 300, 300]
    assert sum(waits) < 3600


def test_lfs_patterns_are_read_as_git_reads_gitattributes(tmp_path: Path) -> None:
    """A remote's .gitattributes may hold U+2028 or U+0085 inside a pattern: git ends lines at '\\n' only."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    name = "logs\u2028part\x85.bin"
    (tmp_path / ".gitattributes").write_text(f"{name} filter=lfs diff=lfs merge=lfs -text\n*.txt text\n",
                                             encoding="utf-8")
    said = subprocess.run(["git", "-c", "core.quotePath=false", "check-attr", "filter", "--", name], cwd=tmp_path,
                          capture_output=True, text=True, check=True).stdout
    assert said.endswith(": filter: lfs\n")  # git's own reading: the whole name is one pattern
    assert gitlfs.lfs_patterns(gitlfs.Git(tmp_path)) == {name}


# --- every command has a total time, and takes what it started with it ------------------------------------

def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _processes_naming(text: str) -> list[int]:
    """The live processes whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes() and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow  # waits out real timeouts: the whole suite runs it, the fast lane does not
@pytest.mark.parametrize("behaviour", ["reads the request, never answers", "drip headers", "drip body"])
def test_a_clone_from_a_remote_that_stalls_ends_in_its_time_with_its_helpers(behaviour: str, hostile_https, cert,
                                                                               tmp_path: Path) -> None:
    """git-remote-https (git's child) waits on a server that never finishes its answer: the command ends at its
    timeout, a GitError that says it timed out, and neither git nor its helper is left running."""
    from tests.fixtures_https import SCRIPTS

    server = hostile_https(SCRIPTS[behaviour])
    url = f"https://127.0.0.1:{server.port}/org/logs.git"
    git = gitlfs.Git(tmp_path, timeout_s=1)
    with pytest.raises(gitlfs.GitError) as failed:  # the server stalls for ever: only the timeout ends the clone
        ends_within(lambda: git.run("clone", "--quiet", url, str(tmp_path / "clone"),
                                    extra_env={"GIT_SSL_CAINFO": cert[0]}), "a stalled clone, its timeout not kept")
    assert failed.value.returncode is None and failed.value.argv[:2] == ["git", "clone"]
    assert len(server.requests) >= 1  # it did reach the server, and hung there
    assert _processes_naming(f"127.0.0.1:{server.port}") == []


def test_a_command_whose_children_ignore_sigterm_is_killed_whole(tmp_path: Path, monkeypatch) -> None:
    """A child that ignores SIGTERM (what git would do with its lock files) gets SIGKILL after the grace."""
    monkeypatch.setattr(gitlfs, "STOP_GRACE_S", 0.3)
    subprocess.run(["git", "init", "--quiet", str(tmp_path / "w")], check=True, timeout=60)
    script = tmp_path / "stubborn.sh"
    script.write_text("#!/bin/sh\ntrap '' TERM\nsleep 300 &\necho $! > \"$BSOPS_TEST_PIDFILE\"\nwait\n")
    script.chmod(0o755)
    pidfile = tmp_path / "pid"
    git = gitlfs.Git(tmp_path / "w", timeout_s=1)
    with pytest.raises(gitlfs.GitError) as failed:  # without the SIGKILL, the command would wait out the sleep's 300 s
        ends_within(lambda: git.run("-c", f"alias.stubborn=!{script}", "stubborn",
                                    extra_env={"BSOPS_TEST_PIDFILE": str(pidfile)}), "a child ignoring SIGTERM kept")
    assert failed.value.returncode is None
    assert not _alive(int(pidfile.read_text()))


def test_a_command_has_no_terminal_and_no_stdin(tmp_path: Path) -> None:
    """Nothing git starts can wait on a person: stdin is empty, and there is no terminal to prompt on."""
    subprocess.run(["git", "init", "--quiet", str(tmp_path)], check=True, timeout=60)
    said = gitlfs.Git(tmp_path, timeout_s=30).run(
        "-c", "alias.probe=!cat; tty; ps -o sid= -p $$; ps -o sid= -p " + str(os.getpid()), "probe", check=False)
    lines = said.stdout.split("\n")
    assert lines[0] == "not a tty" and lines[1].strip() != lines[2].strip()  # its own session, not ours


def test_the_deadline_bounds_every_command_and_the_waits_between_pushes(tmp_path: Path) -> None:
    """A sync's deadline: a push that keeps failing stops waiting when the next try could not start before it,
    and no command starts once it has passed."""
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(tmp_path)], check=True, timeout=60)
    for args in (["config", "user.email", "t@example.org"], ["config", "user.name", "t"],
                 ["commit", "--quiet", "--allow-empty", "-m", "x"],
                 ["remote", "add", "origin", str(tmp_path / "no-such-remote.git")]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, timeout=60)
    waits: list[float] = []
    near = gitlfs.Git(tmp_path, deadline=time.monotonic() + 35)
    with pytest.raises(gitlfs.GitError):
        gitlfs.push(near, 10, backoff_s=10.0, sleep=waits.append)
    assert waits == [10, 20]  # a third wait (40 s) would end after the deadline
    past = gitlfs.Git(tmp_path, deadline=time.monotonic() - 1)
    with pytest.raises(gitlfs.GitError) as failed:
        past.run("status")
    assert failed.value.returncode is None and "time limit" in str(failed.value)


def test_a_clone_carries_its_deadline_to_every_command(tmp_path: Path) -> None:
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(bare)], check=True, timeout=60)
    deadline = time.monotonic() + 600
    git = gitlfs.clone_or_open(str(bare), tmp_path / "clone", None, deadline=deadline)
    assert git.deadline == deadline and 0 < git.time_left() <= 600
    assert gitlfs.clone_or_open(str(bare), tmp_path / "clone", None, deadline=deadline).deadline == deadline
