"""runlog.py, the one reader of a run's logs: every read is linear and bounded, whatever the log ends with.

The bytes read are counted at runlog's one read function (`_pread`), and sparse files far larger than any
test could read whole (a terabyte of NUL bytes) show that the end is read, not the file. tests/views/test_views.py
holds the ordinary tail and follow cases; tests/hostile/test_hostile_queue.py the hostile table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bigscience_ops.run import log as runlog


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every read runlog makes, in order."""
    sizes: list[int] = []
    real = runlog._pread

    def counted(fd: int, size: int, offset: int) -> bytes:
        data = real(fd, size, offset)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(runlog, "_pread", counted)
    return sizes


def _sparse(path: Path, size: int, head: bytes = b"") -> Path:
    """A file of `size` bytes: `head`, then a hole that reads as NUL bytes (no disk used)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def test_the_bytes_a_tail_reads_are_bounded_whatever_the_last_line(tmp_path: Path, reads: list[int]) -> None:
    log = _sparse(tmp_path / "main_log.txt", 1 << 40, b" iteration 1/ 10 | lm loss: 2.0 |\n")  # 1 TiB of NULs
    found = runlog.read_tail(log, 20)  # how long it takes, against a normal log: benchmarks/log_tail.py
    assert sum(reads) <= runlog.TAIL_BYTES + 1 and found.read == runlog.TAIL_BYTES
    assert found.lines == [] and found.clipped and found.nuls == runlog.TAIL_BYTES and found.size == 1 << 40
    lines, offset = runlog.tail(log, 20)
    assert len(lines) == 1 and lines[0].startswith("[bsops: only the last") and offset == (1 << 40) - runlog.TAIL_BYTES
    reads.clear()
    runlog.read_tail(log, 20, max_bytes=1000)
    assert sum(reads) <= 1001


def test_a_tail_reads_only_as_far_as_the_lines_asked_for(tmp_path: Path, reads: list[int]) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(200_000)))  # 2.3 MB
    assert runlog.tail(log, 3)[0] == ["line 199997", "line 199998", "line 199999"]
    assert sum(reads) <= 64 * 1024 + 1  # one block and the byte before it


def test_a_complete_line_longer_than_the_window_is_not_taken_for_lines(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes(b"old 1\nold 2\n" + b"x" * 5000 + b"\nnew 1\nnew 2\n")
    found = runlog.read_tail(log, 10, max_bytes=1000)
    assert found.lines == ["new 1", "new 2"] and found.clipped and found.read == 1000
    lines, _ = runlog.tail(log, 10, max_bytes=1000)
    assert lines[1:] == ["new 1", "new 2"] and "line longer than" in lines[0]
    assert runlog.tail(log, 2, max_bytes=1000)[0] == ["new 1", "new 2"]  # all asked for: no note


def test_a_window_that_starts_at_a_line_start_keeps_that_line(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes(b"a" * 10 + b"\n" + b"0123456789\n")
    assert runlog.read_tail(log, 5, max_bytes=11).lines == ["0123456789"]


def test_lines_longer_than_the_limit_are_cut_and_say_so(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    long = b"y" * (runlog.LINE_BYTES + 500)
    log.write_bytes(b"before\n" + long + b"\nafter\n")
    [before, cut, after] = runlog.tail(log, 3)[0]
    assert (before, after) == ("before", "after")
    assert cut == "y" * runlog.LINE_BYTES + runlog.CUT.format(more=500)
    assert [len(line) for line in runlog.lines(log)] == [6, len(cut), 5]
    assert list(runlog.reverse_lines(log, 1 << 20)) == ["after", cut, "before"]


def test_nul_bytes_are_dropped_from_lines_and_undecodable_bytes_replaced(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes(b"\0\0\0 iteration 5/ 10 | lm loss: 2.0 |\nbad \xff\xfe bytes\r\n")
    assert runlog.tail(log, 2)[0] == [" iteration 5/ 10 | lm loss: 2.0 |", "bad \ufffd\ufffd bytes"]


def test_reverse_lines_go_backwards_within_their_window(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes(b"a\nb\nc\npartial")
    assert list(runlog.reverse_lines(log, 1000)) == ["c", "b", "a"]
    assert list(runlog.reverse_lines(log, 1000, partial=True)) == ["partial", "c", "b", "a"]
    assert list(runlog.reverse_lines(log, 11)) == ["c"]  # "b" may start before the last 11 bytes: not yielded
    log.write_bytes(b"a\n\nb\n")
    assert list(runlog.reverse_lines(log, 1000, partial=True)) == ["b", "", "a"]
    big = tmp_path / "big.txt"
    big.write_bytes(b"".join(b"%d\n" % i for i in range(100_000)))  # many blocks
    assert list(runlog.reverse_lines(big, 1 << 30)) == [str(i) for i in reversed(range(100_000))]


def test_reverse_lines_read_at_most_their_window(tmp_path: Path, reads: list[int]) -> None:
    log = _sparse(tmp_path / "main_log.txt", 1 << 40, b"start\n")
    assert list(runlog.reverse_lines(log, 4 << 20, partial=True)) == []
    assert sum(reads) <= 4 << 20


def test_lines_stream_the_whole_log_once(tmp_path: Path, reads: list[int]) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes(b"> training x: 1 start\n" + b"\0" * (3 << 20) + b"\nplain\n> training y: 2 start\nend")
    assert list(runlog.lines(log, containing=b"> training ")) == ["> training x: 1 start", "> training y: 2 start"]
    assert sum(reads) == log.stat().st_size  # every byte once
    every = list(runlog.lines(log))
    assert every[0] == "> training x: 1 start" and every[-1] == "end" and len(every) == 5
    assert every[1] == runlog.CUT.format(more=(3 << 20) - runlog.LINE_BYTES)  # NULs dropped, the cut counted


def test_follow_yields_a_line_without_end_cut_once(tmp_path: Path) -> None:
    log = tmp_path / "main_log.txt"
    log.write_bytes(b"")
    steps = [lambda: log.open("ab").write(b"z" * (runlog.LINE_BYTES * 3)),
             lambda: log.open("ab").write(b"z" * 10 + b"\nnext\n")]

    def sleep(_: float) -> None:
        if steps:
            steps.pop(0)()

    got = list(runlog.follow(log, 0, interval=1, stop=lambda: not steps, sleep=sleep))
    assert len(got) == 2 and got[1] == "next"
    assert got[0].startswith("z" * runlog.LINE_BYTES) and "line cut: more than" in got[0]


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_only_regular_files_are_read(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "main_log.txt"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    for read in (lambda: runlog.tail(path, 5), lambda: list(runlog.lines(path)),
                 lambda: list(runlog.reverse_lines(path, 100)),
                 lambda: next(runlog.follow(path, 0, stop=lambda: True))):
        with pytest.raises(runlog.LogError, match="not a log file"):
            read()


def test_a_log_is_never_read_through_a_link(tmp_path: Path) -> None:
    """As the run's other records: a link in a log's place (a clone's main_log.txt pointing at a key) is refused by
    name, whether it points at a file, nowhere or a device; the folder holding the log may be a link."""
    target = tmp_path / "real.txt"
    target.write_text("one\ntwo\n")
    for name, points_to in (("link.txt", target), ("dangling.txt", tmp_path / "nowhere")):
        (tmp_path / name).symlink_to(points_to)
        with pytest.raises(runlog.LogError, match="is a link"):
            runlog.tail(tmp_path / name, 1)
        with pytest.raises(runlog.LogError, match="is a link"):
            next(runlog.follow(tmp_path / name, 0, stop=lambda: True))
    (tmp_path / "linked-folder").symlink_to(tmp_path)
    assert runlog.tail(tmp_path / "linked-folder" / "real.txt", 1)[0] == ["two"]


def test_a_log_truncated_while_read_is_read_again_or_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "main_log.txt"
    log.write_text("a\nb\n")
    real, calls = runlog._pread, []

    def shrinking(fd: int, size: int, offset: int) -> bytes:
        calls.append(size)
        return real(fd, size, offset)[:-1] if len(calls) == 1 else real(fd, size, offset)

    monkeypatch.setattr(runlog, "_pread", shrinking)
    assert runlog.tail(log, 2)[0] == ["a", "b"]
    monkeypatch.setattr(runlog, "_pread", lambda fd, size, offset: b"")  # always short: a file that keeps shrinking
    with pytest.raises(runlog.LogError, match="kept shrinking"):
        runlog.tail(log, 2)


def test_bsops_own_logs_are_appended_only_as_regular_files(tmp_path: Path) -> None:
    runlog.append_lines(tmp_path / "new" / "watchdog.log", ["one", "two"])
    runlog.append_lines(tmp_path / "new" / "watchdog.log", ["three \udcff"])  # a surrogate escape: replaced
    assert (tmp_path / "new" / "watchdog.log").read_text() == "one\ntwo\nthree ?\n"
    os.mkfifo(tmp_path / "fifo.log")
    (tmp_path / "folder.log").mkdir()
    (tmp_path / "link.log").symlink_to(tmp_path / "new" / "watchdog.log")
    for name, what in (("fifo.log", "cannot write"), ("folder.log", "cannot write"), ("link.log", "a link")):
        with pytest.raises(runlog.LogError, match=what):
            runlog.append_lines(tmp_path / name, ["x"])
    assert (tmp_path / "new" / "watchdog.log").read_text().count("\n") == 3  # nothing written through the link


def test_head_reads_the_start_of_a_regular_file_only(tmp_path: Path) -> None:
    (tmp_path / "script.slurm").write_bytes(b"#!/bin/bash\n" + b"#" * 100_000)
    assert runlog.head(tmp_path / "script.slurm", 12) == b"#!/bin/bash\n"
    os.mkfifo(tmp_path / "fifo.slurm")
    assert runlog.head(tmp_path / "fifo.slurm", 12) is None and runlog.head(tmp_path / "none", 12) is None
