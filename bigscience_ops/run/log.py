"""The run's main_log.txt: find it, read its last lines, follow what is appended, stream it whole.

The log lives in the run folder (paths.logs/main_log.txt) on the cluster; elsewhere it is read
from the logs repo's clone that hub-sync keeps (<run>/hub/logs/, see ops/keep/hubsync.py) or from any
clone of that repo. `follow` polls (no inotify: it also works on network file systems) and
survives the file being rotated (renamed away, a new one created) or truncated: it then starts
again from the new file's first line.

A log is untrusted input: a node that crashed on NFS leaves hundreds of MB of NUL bytes, a process
can print a line of gigabytes without a line break, a clone can hold a FIFO or a link to a device or a secret.
So every reader here is linear and bounded, whatever the lines are:

- `read_tail`/`tail` read at most `TAIL_BYTES` (64 MiB) from the end (fewer when the lines asked for are found
  sooner), in one pass, and say what the window held (`Tail`: bytes read, NUL bytes, the bytes after
  the last line break, whether it stopped short of the lines asked for);
- `reverse_lines` yields lines from the last one backwards over at most `max_bytes` from the end;
- `follow` and `lines` stream in blocks, holding at most one line of `LINE_BYTES`;
- a line longer than `LINE_BYTES` is cut there (`CUT` says how much was left out), NUL bytes are
  dropped from every line, and bytes that are not UTF-8 become U+FFFD;
- only a regular file is read, never through a link (the run's other records are read so too): a link, a
  FIFO, a device or a folder is refused by name (opened without following a link or blocking, checked with
  fstat on the descriptor read, so a swap after a check is caught).

The lines are the log's text as it is (the watchdog and the views parse them); what shows one on a terminal (`bsops
logs`, a cron pass's lines, a file's name) shows it through `for_terminal`, which makes every escape sequence and
control character visible text, so a log cannot clear the screen, retitle the window or plant a hyperlink.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.errors import BsopsError

LOG_NAME = "main_log.txt"
"""The main log's name in paths.logs: every task's lines, the job script's and the trainer's (main_log)."""
_BLOCK = 64 * 1024
TAIL_BYTES = 64 << 20
"""At most this many bytes are read from the end of a log for its last lines, fewer when the lines asked for come
sooner: `bsops logs`, `info` and the watchdog answer in the same time whatever the log ends with. 64 MiB hold the
watchdog's largest health window (schema.MAX_LOG_LINES iteration lines of about 300 bytes, twice)."""
LINE_BYTES = 64 << 10
"""A line longer than this is cut (Megatron's lines are well under 1 KiB; a traceback line under 10 KiB)."""
CUT = " [line cut: {more} bytes not shown]"
"""Appended to a line cut at LINE_BYTES; `{more}` is a number, or 'more than N' where its end was not read yet."""


class LogError(BsopsError):
    """The log cannot be found or read: names the paths tried, or what the path is instead of a file."""


class LogMissing(LogError):
    """No log at any of the places tried (the run has not logged yet): names them."""


def main_log(logs: str | os.PathLike[str]) -> Path:
    """The run's main log in its logs folder (paths.logs): where the job script appends every task's lines."""
    return Path(logs) / LOG_NAME


def log_candidates(exp, from_clone: Path | None = None) -> list[Path]:
    """Where the main log may be, in order: the run folder, then the synced clone (or `from_clone`)."""
    if from_clone is not None:
        clones = [Path(from_clone)]
        first: list[Path] = []
    else:
        clones = [Path(exp.paths.output) / "hub" / "logs"] if exp.paths.output else []
        first = [main_log(exp.paths.logs)] if exp.paths.logs else []
    return first + [p for clone in clones for p in (clone / LOG_NAME, clone / "logs" / LOG_NAME)]


def find_log(exp, from_clone: Path | None = None) -> Path:
    """The first main_log.txt of `log_candidates` that is there; one that is not a regular file (a link, a FIFO, a
    folder) is refused by name rather than passed over (LogError), and none there is LogMissing."""
    candidates = log_candidates(exp, from_clone)
    for path in candidates:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode):
            return path
        raise LogError(f"{path} is {_kind(mode)}, not a log file; allowed: a regular file")
    tried = ", ".join(str(p) for p in candidates) or "none (the experiment has no paths.logs)"
    raise LogMissing(f"no {LOG_NAME} for {exp.name!r}; looked at: {tried}. Has the run started, or has hub-sync "
                     "cloned its logs repo? (a clone elsewhere: --from-clone DIR)")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of `path` when it is a regular file, not a link. A FIFO is opened without waiting for
    a writer and refused, as are links, folders and devices: LogError names what it is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LogError(f"{path} is a link, not a log file; allowed: a regular file (bsops reads a run's files "
                           "never through a link)") from None
        raise LogError(f"cannot read {path}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise LogError(f"{path} is {_kind(mode)}, not a log file; allowed: a regular file")
    return fd


def _pread(fd: int, size: int, offset: int) -> bytes:
    """One positional read: every byte a reader of this module reads goes through here (tests count them)."""
    return os.pread(fd, size, offset)


def _block(fd: int, position: int, path: str | os.PathLike[str]) -> bytes:
    try:
        return _pread(fd, _BLOCK, position)
    except OSError as exc:  # EIO from a network file system, ...
        raise LogError(f"cannot read {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class Tail:
    """The last lines of a log and what the window they were read from held."""

    lines: list[str]
    """The last complete lines asked for (fewer when the window holds fewer), oldest first, each cut at
    LINE_BYTES and without NUL bytes."""
    offset: int
    """The byte just past the last complete line: where following starts."""
    size: int
    """The file's size when it was read."""
    read: int
    """Bytes read from the end: at most TAIL_BYTES (or the limit given)."""
    partial: int
    """Bytes after the last line break within the window: a line being written, or (the whole window) a
    line without end, such as the NUL bytes a crashed node leaves."""
    nuls: int
    """NUL bytes in the window."""
    clipped: bool
    """The window stopped at the byte limit before the lines asked for were found: older lines, or the head
    of a line longer than the window, were not read."""


def read_tail(path: str | os.PathLike[str], n: int, max_bytes: int = TAIL_BYTES) -> Tail:
    """The last `n` complete lines of `path`, reading at most `max_bytes` from its end in one backwards pass."""
    if n < 0:
        raise LogError(f"line count: got {n}; allowed: 0 or more")
    if max_bytes < 1:
        raise LogError(f"bytes to read: got {max_bytes}; allowed: 1 or more")
    fd = open_regular(path)
    try:
        for _ in range(3):  # a file truncated while it is read is read again from its new end
            found = _window(fd, n, max_bytes)
            if found is not None:
                break
        else:
            raise LogError(f"{path} kept shrinking while it was read; try again")
    except OSError as exc:
        raise LogError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    size, pos, read, newlines, data, before = found
    complete_end = data.rfind(b"\n") + 1  # a partial last line is left for `follow`
    pieces = data[:complete_end].split(b"\n")[:-1]
    if pieces and before != b"\n":
        pieces = pieces[1:]  # the first piece is the end of a line that started before the window
    chosen = pieces[-n:] if n else []
    return Tail([_line(piece) for piece in chosen], pos + complete_end, size, read, len(data) - complete_end,
                data.count(b"\0"), pos > 0 and newlines <= n)


def _window(fd: int, n: int, max_bytes: int) -> tuple[int, int, int, int, bytes, bytes] | None:
    """(size, start, bytes read, line breaks, the bytes, the byte before them) of the window holding the last
    `n` lines or `max_bytes`; None when the file shrank under the reader."""
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    pos, newlines, read = size, 0, 0
    while pos > 0 and newlines <= n and read < max_bytes:
        step = min(_BLOCK, pos, max_bytes - read)
        data = _pread(fd, step, pos - step)
        if len(data) < step:
            return None
        pos -= step
        read += step
        chunks.append(data)
        newlines += data.count(b"\n")
    before = _pread(fd, 1, pos - 1) if pos > 0 else b"\n"
    return size, pos, read, newlines, b"".join(reversed(chunks)), before


def tail(path: str | os.PathLike[str], n: int, max_bytes: int = TAIL_BYTES) -> tuple[list[str], int]:
    """The last `n` complete lines of `path` and the byte offset just past them (where following starts);
    at most `max_bytes` are read (read_tail says what the window held). When the window ends before `n` lines
    were found (a line longer than it, NUL bytes), the lines start with `unread_note`'s line, so a reader of the
    tail sees that older lines exist and why they are not shown."""
    found = read_tail(path, n, max_bytes)
    note = unread_note(found, n)
    return ([note] if note else []) + found.lines, found.offset


def unread_note(found: Tail, n: int) -> str | None:
    """One line saying what a tail's window left unread, when it stopped at its byte limit before `n` lines
    were found; else None."""
    if not found.clipped or not n or len(found.lines) >= n:
        return None
    if found.nuls * 2 >= found.read:
        why = f"{found.nuls} of them are NUL bytes, what a node that crashed while writing leaves"
    elif not found.lines:
        why = "they hold no whole line: a line longer than that"
    else:
        why = "a line longer than the rest of them starts before"
    return (f"[bsops: only the last {found.read} bytes of {found.size} were read; {why}; "
            f"the {found.size - found.read} bytes before are not shown]")


def reverse_lines(path: str | os.PathLike[str], max_bytes: int, partial: bool = False) -> Iterator[str]:
    """The complete lines of `path` from the last one backwards, over at most `max_bytes` from its end; with
    `partial`, the bytes after the last line break first (a line still being written). A line that starts
    before the window is not yielded; one longer than LINE_BYTES is yielded cut (its head kept)."""
    fd = open_regular(path)
    try:
        pos = os.fstat(fd).st_size
        limit = max(0, pos - max_bytes)
        carry, more = b"", 0  # the head of the earliest line seen, and how much of it was left out
        keep, at_end = partial, True  # whether `carry` is yielded once whole; no line break seen yet
        while pos > limit:
            step = min(_BLOCK, pos - limit)
            try:
                block = _pread(fd, step, pos - step)
            except OSError as exc:
                raise LogError(f"cannot read {path}: {exc.strerror}") from None
            if len(block) < step:
                return  # truncated while read: what was yielded stands
            pos -= step
            pieces = block.split(b"\n")
            if len(pieces) == 1:  # no line break: the line goes on before this block
                if keep:
                    carry, more = _grown(block, carry, more)
                continue
            if keep:
                line, left = _grown(pieces[-1], carry, more)
                if line or left or not at_end:  # a log that ends with a line break has no partial line
                    yield _line(line, left)
            keep, at_end = True, False
            for piece in reversed(pieces[1:-1]):
                yield _line(piece)
            carry, more = _grown(pieces[0], b"", 0)
        if pos == 0 and keep and (carry or more or not at_end):
            yield _line(carry, more)
    finally:
        os.close(fd)


def _grown(before: bytes, carry: bytes, more: int) -> tuple[bytes, int]:
    """A line read backwards grows at its front: keep its first LINE_BYTES, count what is left out."""
    joined = before + carry
    if len(joined) <= LINE_BYTES:
        return joined, more
    return joined[:LINE_BYTES], more + len(joined) - LINE_BYTES


def follow(path: Path, offset: int = 0, interval: float = 1.0, stop: Callable[[], bool] | None = None,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """Yield each complete line appended to `path` after byte `offset`, polling every `interval` seconds.

    When the file is replaced (another inode) or shrinks, reading starts again at the new file's
    beginning. A missing file is waited for; a path that is not a regular file is refused (LogError).
    A line longer than LINE_BYTES is yielded cut once it is that long, and the rest of it skipped.
    Ends when `stop()` returns true (checked while idle).
    """
    path = Path(path)
    fd: int | None = None
    identity = None
    position = 0
    splitter = _Splitter(early=True)
    try:
        while True:
            if fd is None:
                try:
                    fd = open_regular(path)
                except LogError:
                    if os.path.lexists(path):  # there, but not a file to read (a link, a FIFO): refused
                        raise
                    fd = None  # not there (yet): waited for
                else:
                    st = os.fstat(fd)
                    identity = (st.st_dev, st.st_ino)
                    position = min(offset, st.st_size)
            chunk = _block(fd, position, path) if fd is not None else b""
            if chunk:
                position += len(chunk)
                yield from splitter.feed(chunk)
                continue
            if fd is not None and _replaced(path, identity, position):
                os.close(fd)
                fd, offset, splitter = None, 0, _Splitter(early=True)
                continue
            if stop is not None and stop():
                return
            sleep(interval)
    finally:
        if fd is not None:
            os.close(fd)


def lines(path: str | os.PathLike[str], containing: bytes | None = None) -> Iterator[str]:
    """Every line of `path`, first to last (the last one too when it has no line break yet), read in blocks:
    linear in the file's size, holding one line of at most LINE_BYTES. With `containing`, only the lines that
    hold those bytes are decoded and yielded (the others are skipped as bytes)."""
    fd = open_regular(path)
    splitter = _Splitter(containing)
    position = 0
    try:
        while True:
            chunk = _block(fd, position, path)
            if not chunk:
                break
            position += len(chunk)
            yield from splitter.feed(chunk)
        yield from splitter.end()
    finally:
        os.close(fd)


class _Splitter:
    """Bytes in, complete lines out, holding at most LINE_BYTES of the line being read. With `early` (following),
    a line that outgrows LINE_BYTES is yielded cut at once, not when (if ever) its line break comes."""

    def __init__(self, containing: bytes | None = None, early: bool = False) -> None:
        self.pending = b""
        self.skipped = 0  # bytes of the current line left out after its first LINE_BYTES
        self.sent = False  # the current line was yielded already (early, cut)
        self.containing, self.early = containing, early

    def feed(self, chunk: bytes) -> Iterator[str]:
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:
            yield from self._end_line(piece)
        self._add(pieces[-1])
        if self.early and self.skipped and not self.sent:
            self.sent = True
            yield _line(self.pending, f"more than {self.skipped}")

    def end(self) -> Iterator[str]:
        """The last line when the bytes ended without a line break."""
        if self.pending or self.skipped:
            yield from self._end_line(b"")

    def _add(self, piece: bytes) -> None:
        room = max(LINE_BYTES - len(self.pending), 0)
        self.pending += piece[:room]
        self.skipped += max(len(piece) - room, 0)

    def _end_line(self, piece: bytes) -> Iterator[str]:
        self._add(piece)
        line, skipped, sent = self.pending, self.skipped, self.sent
        self.pending, self.skipped, self.sent = b"", 0, False
        if sent or (self.containing is not None and self.containing not in line):
            return
        yield _line(line, skipped)


def append_lines(path: str | os.PathLike[str], lines: list[str] | tuple[str, ...]) -> None:
    """Append `lines` to bsops' own log `path` (watchdog.log, a cron log), created with its folder if missing. Only
    a regular file is written, never through a link: a FIFO in its place is refused, never waited on (a writer
    of a FIFO blocks until a reader comes), and it, a folder or an unwritable file is a LogError naming it."""
    path = Path(path)
    data = "".join(line + "\n" for line in lines).encode("utf-8", errors="replace")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        try:  # what is there instead of a file, when something is (a FIFO without reader: ENXIO)
            mode = os.lstat(path).st_mode
            what = f"it is {_kind(mode)}" if not stat.S_ISREG(mode) else exc.strerror
        except OSError:
            what = exc.strerror
        raise LogError(f"cannot write {path}: {what}; allowed: a regular file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LogError(f"cannot write {path}: it is {_kind(mode)}; allowed: a regular file")
        while data:
            data = data[os.write(fd, data):]
    except OSError as exc:
        raise LogError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def head(path: str | os.PathLike[str], size: int) -> bytes | None:
    """The first `size` bytes of a regular file (not a link), or None for anything else: nothing there, a link, a
    FIFO (never waited on), a folder, an unreadable file. For bsops' own small files (job scripts' headers)."""
    try:
        fd = open_regular(path)
    except LogError:
        return None
    try:
        return _pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def _replaced(path: Path, identity: tuple[int, int] | None, position: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return True
    return (st.st_dev, st.st_ino) != identity or st.st_size < position


def _line(raw: bytes, more: int | str = 0) -> str:
    """One line's bytes as text: cut at LINE_BYTES (with CUT when bytes were left out), NUL bytes dropped,
    a trailing CR dropped, bytes that are not UTF-8 as U+FFFD."""
    if len(raw) > LINE_BYTES:
        more = len(raw) - LINE_BYTES if not more else more
        raw = raw[:LINE_BYTES]
    text = raw.replace(b"\0", b"").rstrip(b"\r").decode("utf-8", errors="replace")
    return text + CUT.format(more=more) if more else text


def for_terminal(text: str) -> str:
    """`text` (a line of a run's log, a file's name, a tool's answer) fit to print on a terminal: every character
    str.isprintable() refuses becomes a visible escape (`\\x1b`, `\\x9b`, `\\u202e`, `\\u2028`), a tab kept. That
    is ESC (so no CSI or OSC sequence: no colour, cursor move, clear-screen, window title or OSC 8 hyperlink), the
    other C0 and C1 controls, DEL, a line break inside the text, the bidi overrides and isolates, zero-width
    characters and the Unicode line and paragraph separators."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\t" else _visible(c) for c in text)


def _visible(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _decode(line: bytes) -> str:
    return _line(line)
