"""How every reader of a run's own record files treats them: as untrusted input.

The task ledger (ledger.py), `latest` and bsops.json (checkpoints/layout.py), the rollbacks
(rollbacks.py), the backup manifests and the alert state are written by bsops, but a node dying
mid-write, NFS, a hostile user or a copied folder can leave anything there. A file is opened only when
it is a plain file (never through a link, never a FIFO a reader would block on), read in bounded lines,
and each line checked field by field; a bad line is a `Problem` (file, line, what, a short repr'd
excerpt) beside the good records, never an exception from deep inside a reader. Written files are
replaced whole (`write_atomically`: write, fsync, rename) or appended in one write that first ends a
line an interrupted writer left open (`append_line`).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

from bigscience_ops.errors import BsopsError

T = TypeVar("T")


MAX_LINE = 64 * 1024
"""The longest line a record file may hold: a record is under 1 kB, so a longer line is damage, skipped unread."""
MAX_FILE = 64 << 20
"""Bytes of a record file read at most: a ledger of a year of hourly tasks is under 2 MB."""
MAX_STEP = 10**18 - 1
"""The largest step a record may name (`global_stepN` has at most 18 digits)."""
MAX_TIME = 253402300799.0
"""The last second of the year 9999: the latest epoch time a record may hold (and still be shown as a date)."""
EXCERPT = 60
"""Characters of a bad line or value shown in a problem, as a repr: never more of a file that is not what was expected."""


def excerpt(data: str | bytes, cap: int = EXCERPT) -> str:
    """A short repr of untrusted content: at most `cap` characters of it, and its length when cut."""
    if len(data) <= cap:
        return repr(data)
    unit = "bytes" if isinstance(data, bytes) else "characters"
    return f"{data[:cap]!r}... ({len(data)} {unit})"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run's record file: which file, which line (0: the file as a whole), what."""

    file: str
    line: int
    what: str
    """What was wrong, in words of the reader's own (never the file's content)."""
    held: str = ""
    """A short repr'd excerpt of what the line held (`excerpt`), empty when it shows nothing."""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.what}" + (f" (held {self.held})" if self.held else "")


@dataclass(frozen=True)
class Checked(Generic[T]):
    """A record file's good records, in file order, and a problem for each line (or the file) that was not one."""

    records: list[T] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


class RecordFileError(BsopsError):
    """A run's record file is not a plain file that can be read (a link, a FIFO, a folder, no permission)."""

    def __init__(self, path: str | os.PathLike[str], what: str) -> None:
        self.path, self.what = str(path), what
        super().__init__(f"{path}: {what}")


def kind_of(path: Path) -> str:
    """What is at `path`, in words, links not followed (a link's target path is shown capped, never what it holds)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {excerpt(os.readlink(path), 200)}"
        except OSError:
            return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a plain file"
    return "a special file (FIFO, device or socket)"


def open_plain(path: str | os.PathLike[str]) -> IO[bytes] | None:
    """`path` opened for reading when it is a plain file; None when nothing is there. A link (never followed),
    a FIFO (never blocked on), a folder or a device, or a file that cannot be opened is a RecordFileError."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) or path.is_symlink():
            raise RecordFileError(path, f"is {kind_of(path)}, not a plain file: a run's record is never read through "
                                        "a link") from None
        raise RecordFileError(path, f"cannot be opened ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(mode) else "a special file (FIFO, device or socket)"
        raise RecordFileError(path, f"is {what}, not a plain file")
    return os.fdopen(fd, "rb")


def read_small(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The bytes of a plain file of at most `limit` bytes (open_plain's rules); None when nothing is there.
    A longer file is a RecordFileError naming its size."""
    handle = open_plain(path)
    if handle is None:
        return None
    with handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise RecordFileError(path, f"holds more than {limit} bytes; expected at most {limit}")
    return data


def jsonl_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict | None, Problem | None]]:
    """(line number, the JSON object it holds or None, the problem or None) for each non-blank line of `path`.

    Nothing there: nothing. A file that is not plain (open_plain) is one problem at line 0. A line longer than
    MAX_LINE is skipped unread, one that is not UTF-8 or not one JSON object is a problem, and so is a last line
    without its end of line that does not parse (a write cut short); reading stops after MAX_FILE bytes.
    """
    name = str(path)
    try:
        handle = open_plain(path)
    except RecordFileError as exc:
        yield 0, None, Problem(name, 0, exc.what)
        return
    if handle is None:
        return
    with handle:
        number, read = 0, 0
        while True:
            try:
                raw = handle.readline(MAX_LINE + 1)
            except OSError as exc:
                yield number + 1, None, Problem(name, number + 1, f"cannot be read ({exc.strerror or exc})")
                return
            if not raw:
                return
            number += 1
            read += len(raw)
            if len(raw) > MAX_LINE:
                size = len(raw)
                while raw and not raw.endswith(b"\n") and read <= MAX_FILE:
                    raw = handle.readline(1 << 20)
                    size += len(raw)
                    read += len(raw)
                yield number, None, Problem(name, number, f"a line of {size} bytes or more; a record is under "
                                                          f"{MAX_LINE} bytes: not read")
            else:
                yield number, *json_object(name, number, raw)
            if read > MAX_FILE:
                yield number, None, Problem(name, 0, f"is more than {MAX_FILE} bytes long; the lines after line "
                                                     f"{number} were not read")
                return


def json_object(name: str, number: int, raw: bytes) -> tuple[dict | None, Problem | None]:
    """Line `number` of `name` as a JSON object, or the problem with it (None, None for a blank line)."""
    cut = not raw.endswith(b"\n")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, Problem(name, number, "not UTF-8 text", excerpt(raw))
    if not text.strip():
        return None, None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        why = ("cut short: it has no end of line, so its write was interrupted (a node dying mid-write, NFS)"
               if cut else "not a JSON record")
        return None, Problem(name, number, why, excerpt(text.strip()))
    if not isinstance(value, dict):
        return None, Problem(name, number, f"a JSON {type(value).__name__}, not a record (a JSON object)",
                             excerpt(text.strip()))
    return value, None


# --- the fields of a record: each checked by type and range, a bool never taken for a number

def check_int(value: Any, low: int = 0, high: int = MAX_STEP) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"got a {type(value).__name__}; expected a whole number from {low} to {high}"
    if not low <= value <= high:
        return f"got {value if abs(value) < 10**30 else 'a number of ' + str(len(str(abs(value)))) + ' digits'}; " \
               f"expected a whole number from {low} to {high}"
    return None


def check_time(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"got a {type(value).__name__}; expected epoch seconds (a number)"
    if not math.isfinite(value) or not 0 <= value <= MAX_TIME:
        return f"got {value if isinstance(value, float) or abs(value) < 10**30 else 'a huge number'}; expected " \
               f"epoch seconds from 0 to {MAX_TIME:.0f} (the year 9999)"
    return None


def check_str(value: Any, longest: int, *, optional: bool = False, choices: tuple[str, ...] = ()) -> str | None:
    """Text of at most `longest` characters with no control character (a newline in a job id would start a
    line of its own in every log that names it), or one of `choices`; None with `optional`."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        return f"got a {type(value).__name__}; expected text" + (" or null" if optional else "")
    if choices and value not in choices:
        return f"got {excerpt(value)}; expected one of {', '.join(choices)}"
    if len(value) > longest:
        return f"got {len(value)} characters; expected at most {longest}"
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        return f"got {excerpt(value)}; expected text without control characters"
    return None


def build(cls: Callable[..., T], data: Mapping[str, Any], rules: Mapping[str, Callable[[Any], str | None]],
          optional: tuple[str, ...] = ()) -> tuple[T | None, str | None]:
    """`cls(**data)` when every field passes its rule: (the record, None), else (None, what was wrong), naming
    the field. `optional` fields may be left out (their dataclass default)."""
    unknown = sorted(set(data) - set(rules))
    if unknown:
        return None, f"unknown field(s) {excerpt(', '.join(unknown))}; allowed: {', '.join(rules)}"
    missing = [name for name in rules if name not in data and name not in optional]
    if missing:
        return None, f"missing field(s) {', '.join(missing)}"
    for name, rule in rules.items():
        if name in data:
            why = rule(data[name])
            if why is not None:
                return None, f"field {name}: {why}"
    return cls(**data), None


def checked_jsonl(path: str | os.PathLike[str], make: Callable[[dict], tuple[T | None, str | None]]) -> Checked[T]:
    """Every line of a JSON-lines record file made into a record by `make` ((record, None) or (None, why)):
    the good ones and a problem for each other line."""
    out: Checked[T] = Checked()
    for number, data, problem in jsonl_lines(path):
        if problem is not None:
            out.problems.append(problem)
        elif data is not None:
            record, why = make(data)
            if record is None:
                out.problems.append(Problem(str(path), number, why or "not a record"))
            else:
                out.records.append(record)
    return out


# --- writing: whole files replaced atomically, records appended in one write

def write_atomically(path: str | os.PathLike[str], data: bytes, mode: int = 0o644,
                     tmp: str | os.PathLike[str] | None = None) -> None:
    """Replace `path` with `data` so that no reader ever sees part of it: a new file beside it (never through a
    link), written and fsynced, renamed over it, the folder fsynced. `tmp`: the new file's name where a writer's
    temporaries follow a convention of their own (a dataset's `NAME.tmp-PID`, which preprocess clears)."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a folder; the rename itself is still atomic
    finally:
        os.close(fd)


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one record line to a plain file (created if missing, never through a link) in one write, fsynced.
    A last line left without its end of line (a writer killed mid-write) is ended first, so the new record
    stays a line of its own and only the cut one is lost."""
    path = Path(path)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise RecordFileError(path, f"is {kind_of(path)}, not a plain file: no record is written through a "
                                        "link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordFileError(path, "is not a plain file: no record is written into it")
        if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
            data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
