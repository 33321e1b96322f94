"""bigscience_ops.ops.keep.gitlfs: a push that keeps failing waits a bounded time, then raises the last error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bigscience_ops.ops.keep import gitlfs
from bigscience_ops.schema import HubConfig


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
