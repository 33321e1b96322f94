"""What binds a dataset's record to its data, and the largest token id of a .bin as a scan found it.

A record (dataset_record.py) is a claim about the `.bin`/`.idx` beside it. Its `binding` ties it to their content:

  - `idx_sha256`: the sha256 of the whole .idx (its counts, sizes and pointers; small beside the .bin);
  - `bin_bytes`: the .bin's size;
  - `bin_sha256`: the sha256 of the whole .bin when it holds at most FULL_HASH_BYTES (the bundled corpus, test
    data, small datasets: one changed token is seen), else
  - `bin_sampled_sha256`: the sha256 of SAMPLES blocks of SAMPLE_BYTES spread evenly over the .bin (its first
    and last included), with their offsets: milliseconds on a terabyte, but a change inside no sampled block is
    not seen. That is why a record's largest id is also checked by a scan, once per file (below).

The scan reads the .bin at disk speed (numpy memmap in chunks of SCAN_CHUNK ids, bounded memory). A .bin hashed whole
is scanned each time (as cheap as its hash). A larger one's result is kept in `PREFIX.maxid` beside the .idx, else
(a read-only data folder, or a file there that is not this user's) in the user cache ($BSOPS_CACHE_DIR/maxid, else
$XDG_CACHE_HOME/bsops/maxid). A kept scan is a claim like a record, and the data folder is shared: it is used only
when

  - it was written by this user's bsops: it carries an HMAC-SHA256 under a key of this user's (`maxid-key` in the
    user cache: 32 random bytes, mode 0600, owned by the user). A `.maxid` anyone else wrote beside the data, or
    copied from another dataset, does not verify and is not used;
  - the content it was computed from is what the file holds now, as far as can be known without reading it: the
    binding (the .idx hashed whole, the .bin's size and sampled blocks) and the .bin's identity and change time
    (inode, size, mtime and ctime). Every write to the file, and every `touch`/utime that sets its mtime back,
    sets its ctime to the present, which no user but root can set back: an edit between the sampled blocks with
    the mtime restored is scanned again. (Keying by a hash of the whole .bin would read the whole .bin to look the
    cache up: the very scan the cache saves.)

Without a key of the user's (no writable user cache), nothing is kept and a large .bin is scanned each time. The
trainer checks every token it reads all the same (trainer/data.py), and `bsops data verify` reads everything
(data/verify.py). Records and caches are read only as regular files (`read_regular`: never through a link, never
a FIFO), of a bounded size.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

FULL_HASH_BYTES = 64 << 20  # a .bin up to this size is hashed whole
SAMPLES = 16  # blocks a larger .bin is sampled at
SAMPLE_BYTES = 1 << 16
HASH_READ = 1 << 22  # bytes read at once while hashing
SCAN_CHUNK = 1 << 24  # token ids read at once by a scan (32-128 MiB of memory by dtype)
CACHE_SUFFIX = ".maxid"  # PREFIX.maxid: the scan's result, beside PREFIX.idx
CACHE_FORMAT = 3  # 1: size and mtime only; 2: no ctime, no HMAC (both read as no cache)
CACHE_MAX_BYTES = 4096  # a larger file named like a cache is not one of ours
KEY_NAME = "maxid-key"  # the user's key for the caches' HMAC, in the user cache
KEY_BYTES = 32
_HEX = frozenset("0123456789abcdef")


# ----------------------------------------------------------------------------- reading a file bsops wrote

@dataclass(frozen=True)
class Regular:
    """What `read_regular` found: the bytes, or why there are none (`link`: the path is a symbolic link)."""

    data: bytes | None = None
    why: str | None = None  # None with no data: there is no file
    link: bool = False


def _kind(mode: int) -> str:
    for test, text in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return text
    return "not a regular file"


def read_regular(path: Path, max_bytes: int) -> Regular:
    """The bytes of `path` read as a regular file of at most `max_bytes`: never through a link (O_NOFOLLOW, so a
    link swapped in after the check is refused too), never blocking on a FIFO (O_NONBLOCK)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Regular()
    except OSError as exc:
        return Regular(why=f"{path} cannot be read ({exc.strerror or exc})")
    if stat.S_ISLNK(st.st_mode):
        return Regular(why=f"{path} is a symbolic link", link=True)
    if not stat.S_ISREG(st.st_mode):
        return Regular(why=f"{path} is not a regular file: it is {_kind(st.st_mode)}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Regular(why=f"{path} is a symbolic link", link=True)
        return Regular(why=f"{path} cannot be read ({exc.strerror or exc})")
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            return Regular(why=f"{path} is not a regular file: it is {_kind(mode)}")
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            return Regular(why=f"{path} cannot be read ({exc.strerror or exc})")
    if len(data) > max_bytes:
        return Regular(why=f"{path} holds more than {max_bytes} bytes; a file of bsops' of this kind holds at most "
                           f"{max_bytes}")
    return Regular(data)


# ----------------------------------------------------------------------------- the binding

def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_READ):
            digest.update(block)
    return digest.hexdigest()


def _sampled_sha256(path: Path, size: int) -> str:
    digest = hashlib.sha256(f"{size} {SAMPLES} {SAMPLE_BYTES}".encode())
    last = max(0, size - SAMPLE_BYTES)
    with open(path, "rb") as f:
        for i in range(SAMPLES):
            offset = last * i // (SAMPLES - 1)
            f.seek(offset)
            digest.update(offset.to_bytes(8, "little"))
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def compute(prefix: str | os.PathLike) -> dict:
    """The binding of dataset PREFIX's .bin and .idx as they are now (OSError when they cannot be read)."""
    prefix = os.fspath(prefix)
    bin_file = Path(f"{prefix}.bin")
    size = bin_file.stat().st_size
    bound = {"idx_sha256": _sha256_file(Path(f"{prefix}.idx")), "bin_bytes": size}
    if size <= FULL_HASH_BYTES:
        bound["bin_sha256"] = _sha256_file(bin_file)
    else:
        bound["bin_sampled_sha256"] = _sampled_sha256(bin_file, size)
    return bound


def _digest(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def valid(value: object) -> bool:
    """Whether a record's `binding` has the shape `compute` gives (any other is a record of the wrong types)."""
    if not isinstance(value, dict) or not _digest(value.get("idx_sha256")):
        return False
    size = value.get("bin_bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return False
    hashes = set(value) - {"idx_sha256", "bin_bytes"}
    return len(hashes) == 1 and hashes <= {"bin_sha256", "bin_sampled_sha256"} and _digest(value[hashes.pop()])


def sampled(bound: dict) -> bool:
    return "bin_sampled_sha256" in bound


# ----------------------------------------------------------------------------- the scan and its cache

def scan_max_id(bin_file: Path, dtype) -> int | None:
    """The largest token id in a .bin of `dtype` tokens, read in chunks of SCAN_CHUNK ids; None when empty."""
    import numpy as np

    size = bin_file.stat().st_size
    count = size // np.dtype(dtype).itemsize
    if count == 0:
        return None
    tokens = np.memmap(bin_file, mode="r", dtype=dtype, shape=(count,))
    try:
        best = None
        for start in range(0, count, SCAN_CHUNK):
            high = int(tokens[start:start + SCAN_CHUNK].max())
            best = high if best is None else max(best, high)
        return best
    finally:
        del tokens


def cache_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}{CACHE_SUFFIX}")


def user_cache_root() -> Path:
    """$BSOPS_CACHE_DIR, else $XDG_CACHE_HOME/bsops, else ~/.cache/bsops."""
    return Path(os.environ.get("BSOPS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "bsops"))


def user_cache_path(prefix: str | os.PathLike) -> Path:
    """Where a scan of a dataset in a folder bsops cannot write is kept: one file per .bin, named by its path."""
    where = hashlib.sha256(os.path.realpath(f"{os.fspath(prefix)}.bin").encode()).hexdigest()[:24]
    return user_cache_root() / "maxid" / f"{where}.json"


class NoKey(OSError):
    """The user's key for the scan caches cannot be read or made: nothing is kept, nothing kept is trusted."""


def user_key() -> bytes:
    """The user's secret for the caches' HMAC: `maxid-key` in the user cache, made on first use (32 random bytes,
    0600). NoKey when it cannot be made, or when the file there is not one only this user can read and write (a
    link, another owner's, readable by others: a key someone else knows proves nothing)."""
    path = user_cache_root() / KEY_NAME
    for _ in range(2):
        found = read_regular(path, KEY_BYTES)
        if found.data is not None or found.why is not None:
            break
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue  # another process made it meanwhile: read it
        except OSError as exc:
            raise NoKey(f"no key for the scan cache: {path} cannot be made ({exc.strerror or exc})") from None
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(KEY_BYTES))
    if found.data is None:
        raise NoKey(f"no key for the scan cache: {found.why or f'{path} vanished'}")
    st = os.lstat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or len(found.data) != KEY_BYTES:
        raise NoKey(f"no key for the scan cache: {path} is not a {KEY_BYTES}-byte file of this user's that only "
                    f"they can read (mode 0600): remove it, and bsops makes a new one")
    return found.data


def _key(prefix: str, bound: dict) -> dict:
    """What a cached scan is valid for: the binding, and this very file as it is now (its ctime: no user can set it
    back after a write)."""
    st = os.stat(f"{prefix}.bin")
    return {"binding": bound, "file": {"inode": st.st_ino, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                                       "ctime_ns": st.st_ctime_ns}}


def _mac(secret: bytes, key: dict, value: int | None) -> str:
    text = json.dumps({"format": CACHE_FORMAT, "key": key, "max_id": value}, sort_keys=True)
    return hmac.new(secret, text.encode("utf-8"), hashlib.sha256).hexdigest()


def _cached(path: Path, key: dict, secret: bytes) -> int | None | bool:
    """The cached largest id when the cache at `path` was written by this user's bsops for `key`; False otherwise."""
    found = read_regular(path, CACHE_MAX_BYTES)
    if found.data is None:
        return False
    try:
        data = json.loads(found.data)
    except ValueError:
        return False
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or data.get("key") != key:
        return False
    value, mac = data.get("max_id"), data.get("mac")
    if not (value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)):
        return False
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(secret, key, value)):
        return False
    return value


def _taken(path: Path, secret: bytes) -> str | None:
    """Why `path` is not free for this user's cache, or None: nothing there, or a cache this user's bsops wrote
    (stale or not). Another user's cache is left alone (overwriting it would only make them scan again), and so is
    anything that is not a cache of ours (a link, a file of the same name)."""
    found = read_regular(path, CACHE_MAX_BYTES)
    if found.data is None:
        return found.why
    try:
        data = json.loads(found.data)
        if hmac.compare_digest(_mac(secret, data["key"], data["max_id"]), data["mac"]):
            return None
    except (ValueError, KeyError, TypeError):
        pass
    return f"{path} holds a scan cache another user wrote, or another file"


def _keep(path: Path, key: dict, value: int | None, secret: bytes) -> None:
    from bigscience_ops.untrusted import write_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": CACHE_FORMAT, "key": key, "max_id": value, "mac": _mac(secret, key, value)}
    write_atomically(path, json.dumps(data).encode("utf-8"), tmp=f"{path}.tmp-{os.getpid()}")


def checked_max_id(prefix: str | os.PathLike, dtype, bound: dict | None = None) -> tuple[int | None, str]:
    """(the largest token id of PREFIX.bin, where it came from: "cache PATH", "scan" or "scan, not cached: why").
    `bound`: the data's binding when the caller has computed it. A .bin of at most FULL_HASH_BYTES is scanned each
    time and nothing is kept (the scan costs what its hash would: a cache would save nothing)."""
    prefix = os.fspath(prefix)
    if (bound["bin_bytes"] if bound is not None else os.stat(f"{prefix}.bin").st_size) <= FULL_HASH_BYTES:
        return scan_max_id(Path(f"{prefix}.bin"), dtype), "scan"
    try:
        secret = user_key()
    except NoKey as exc:
        return scan_max_id(Path(f"{prefix}.bin"), dtype), f"scan, not cached: {exc}"
    key = _key(prefix, bound if bound is not None else compute(prefix))
    beside, user = cache_path(prefix), user_cache_path(prefix)
    for path in (beside, user):
        value = _cached(path, key, secret)
        if value is not False:
            return value, f"cache {path}"
    value = scan_max_id(Path(f"{prefix}.bin"), dtype)
    if key != _key(prefix, key["binding"]):  # the file changed while it was scanned: what was read proves nothing
        return value, "scan, not cached: the .bin changed while it was scanned"
    why = None
    for path in (beside, user):
        taken = _taken(path, secret)
        if taken is not None:
            why = why or taken
            continue
        try:
            _keep(path, key, value, secret)
            return value, "scan"
        except OSError as exc:  # a read-only data folder: the user cache next
            why = why or exc.strerror or str(exc)
    return value, f"scan, not cached: {why}"
