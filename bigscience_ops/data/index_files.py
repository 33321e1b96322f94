"""The GPT dataset's three index arrays built straight into their .npy files, in bounded memory.

The files hold the same bytes as `index_mappings.build_index_mappings` followed by `np.save` (same
RNG calls in the same order, same dtypes); only where the arrays live while they are built differs:

  doc_idx      filled and shuffled in anonymous memory, written, then dropped. (Shuffling a
               file-backed mapping in place measured 17x slower here: each random write dirties a
               4 KB page of the file.) It is the peak: 4 bytes per document per epoch.
  sample_idx   computed from doc_idx read back from its file in chunks, and appended to its file
               chunk by chunk: never whole in memory.
  shuffle_idx  built by a second thread while sample_idx is computed. Its RNG reaches the state the
               doc_idx shuffle leaves by making the same draws with no array, while doc_idx is
               filled and shuffled.

Every shuffle is numpy's RandomState.shuffle, done by the compiled helper `_shuffle` (_shuffle.c:
the same MT19937 draws and swaps, with the next swaps' cache lines prefetched, GIL released) from
and back into the RandomState's state; at a few hundred million entries it is ~5x faster than
numpy's loop, which waits on a cache miss per swap. Without the helper (no C compiler at install)
numpy's shuffle does it, with the same bytes, and says so once on stderr; numpy's holds the GIL, so
the two threads then mostly take turns (27.8 s instead of 5.8 s for 210M doc_idx entries).

Every file is written under a temporary name and renamed into place, so a reader never sees a
partial file; builders take `locks.build_lock` (works without flock too).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

from bigscience_ops.data.errors import DataError
from bigscience_ops.data.index_mappings import index_plan

try:
    from bigscience_ops.data import _shuffle as _compiled
except ImportError:  # no C compiler at install time: numpy's shuffle, same bytes
    _compiled = None
_told_fallback = False

CHUNK = 1 << 21  # doc_idx entries handled at once for sample_idx


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The header np.save writes for a C-ordered array of this dtype and shape."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


def _fallback_notice() -> None:
    global _told_fallback
    if not _told_fallback:
        _told_fallback = True
        print("bsops: the compiled shuffle helper (bigscience_ops/data/_shuffle.c) is not built; the index "
              "build uses numpy's shuffle (same bytes, ~5x slower). Reinstall with a C compiler "
              "(pip install -e .) to build it.", file=sys.stderr)


def _with_state(rng: np.random.RandomState, draw) -> None:
    """Run `draw(key, pos) -> pos` on rng's MT19937 state and put the state back into rng."""
    name, key, pos, has_gauss, gauss = rng.get_state()
    key = np.array(key, dtype=np.uint32)  # a writable copy the helper updates in place
    pos = draw(key, pos)
    rng.set_state((name, key, pos, has_gauss, gauss))


def _shuffle(rng: np.random.RandomState, array: np.ndarray) -> None:
    """`rng.shuffle(array)` for a contiguous 1-D array: the same result and the same RNG state after."""
    if _compiled is None or not array.flags.c_contiguous or array.itemsize not in (4, 8):
        if _compiled is None:
            _fallback_notice()
        rng.shuffle(array)
    elif len(array) > 1:
        _with_state(rng, lambda key, pos: _compiled.shuffle(array, key, pos))


def _skip_shuffle(rng: np.random.RandomState, n: int) -> None:
    """Advance `rng` exactly as `rng.shuffle` of an n-element 1-D array would, without the array."""
    if n <= 1:
        return
    if _compiled is not None:
        _with_state(rng, lambda key, pos: _compiled.advance(n, key, pos))
    else:
        _fallback_notice()
        rng.shuffle(as_strided(np.zeros(1, dtype=np.int8), shape=(n,), strides=(0,)))


def _fill_doc_idx(first_doc: int, end_doc: int, num_epochs: int) -> np.ndarray:
    """first_doc..end_doc-1, num_epochs times: each chunk is one add to a cached ramp, no temporaries."""
    n = end_doc - first_doc
    doc_idx = np.empty(num_epochs * n, dtype=np.int32)
    ramp = np.arange(min(n, CHUNK), dtype=np.int32)
    for epoch in range(num_epochs):
        for s in range(0, n, CHUNK):
            e = min(n, s + CHUNK)
            np.add(ramp[:e - s], first_doc + s, out=doc_idx[epoch * n + s:epoch * n + e])
    return doc_idx


def _write_sample_idx(path: Path, sizes: np.ndarray, doc_idx_path: Path, doc_idx_len: int,
                      seq_length: int, num_samples: int) -> None:
    """Megatron's sample_idx (see index_mappings.build_sample_idx), appended to `path` chunk by chunk.

    Sample k starts at token k * seq_length of the documents laid end to end in doc_idx order; its
    row is (the position in doc_idx of the document holding that token, the offset in it). Each
    chunk's buffers are allocated once: at pretraining scale a fresh array per step costs page
    faults comparable to the arithmetic.
    """
    dtype = np.dtype(np.int32 if doc_idx_len < np.iinfo(np.int32).max else np.int64)
    # A compact copy of the sizes makes the random gather touch half the memory.
    small = sizes.astype(np.uint16) if len(sizes) and int(sizes.max()) < 1 << 16 else np.asarray(sizes)
    L = seq_length
    header = _npy_header(np.dtype(np.int32), (doc_idx_len,))
    chunk = min(CHUNK, max(1, doc_idx_len))
    docs_buf = np.empty(chunk, dtype=np.int32)
    sizes_buf = np.empty(chunk, dtype=small.dtype)
    ends_buf = np.empty(chunk, dtype=np.int64)
    ceil_buf = np.empty(chunk + 1, dtype=np.int64)
    counts_buf = np.empty(chunk, dtype=np.int64)
    positions = np.arange(chunk, dtype=np.int64)
    rows_buf = np.empty((0, 2), dtype=dtype)
    written = 0
    base = 0  # tokens before the chunk
    with open(doc_idx_path, "rb") as src, open(path, "wb") as out:
        out.write(_npy_header(dtype, (num_samples + 1, 2)))
        np.zeros((1, 2), dtype=dtype).tofile(out)  # sample 0 starts at (0, 0)
        written = 1
        src.seek(len(header))
        for start in range(0, doc_idx_len, chunk):
            first_k = -(-base // L)  # the first sample starting at or after the chunk
            if first_k > num_samples:
                break
            n = min(chunk, doc_idx_len - start)
            docs = docs_buf[:n]
            if src.readinto(memoryview(docs).cast("B")) != docs.nbytes:
                raise DataError(f"{doc_idx_path}: doc_idx ended before its {doc_idx_len} entries")
            doc_sizes = np.take(small, docs, out=sizes_buf[:n], mode="wrap")  # ids < len(sizes)
            ends = np.cumsum(doc_sizes, dtype=np.int64, out=ends_buf[:n])
            ends += base
            ceil_buf[0] = first_k
            ceil_ends = ceil_buf[1:n + 1]
            np.add(ends, L - 1, out=ceil_ends)
            ceil_ends //= L  # samples starting before each document's end
            counts = np.subtract(ceil_ends, ceil_buf[:n], out=counts_buf[:n])
            holder = np.repeat(positions[:n], counts)  # per sample from first_k: its document
            lo = 1 if first_k == 0 else 0
            hi = max(0, min(len(holder), num_samples + 1 - first_k))
            if hi > lo:
                holder = holder[lo:hi]
                if len(rows_buf) < len(holder):
                    rows_buf = np.empty((len(holder), 2), dtype=dtype)
                rows = rows_buf[:len(holder)]
                rows[:, 0] = holder + start
                # offset = k * L - (the document's first token) = k * L - (end - size)
                doc_starts = np.take(ends, holder) - np.take(doc_sizes, holder)
                rows[:, 1] = np.arange((first_k + lo) * L, (first_k + hi) * L, L, dtype=np.int64) - doc_starts
                rows.tofile(out)
                written += len(rows)
            base = int(ends[-1])
    if written != num_samples + 1:
        raise DataError(f"internal: sample_idx has {written} rows, expected {num_samples + 1}")


def write_index_mappings(sizes: np.ndarray, first_doc: int, end_doc: int, num_samples: int, seq_length: int,
                         seed: int, paths: tuple[Path, Path, Path], stages: dict[str, float] | None = None) -> None:
    """doc_idx, sample_idx, shuffle_idx for documents [first_doc, end_doc) into `paths` (.npy files).

    `stages`, when given, receives the seconds of each stage by name; those of the shuffle_idx thread
    ("shuffle_idx ...") overlap the others.
    """
    stages = {} if stages is None else stages

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        stages[name] = now - since
        return now

    tokens_per_epoch, num_epochs, separate_last_epoch, from_full_epochs = index_plan(
        sizes, first_doc, end_doc, num_samples, seq_length)
    n = end_doc - first_doc
    doc_len = num_epochs * n
    total = (num_epochs * tokens_per_epoch - 1) // seq_length
    tmps = [_tmp(Path(p)) for p in paths]
    for p in paths:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    go = threading.Event()  # set once doc_idx is out of memory
    failed: list[BaseException] = []

    def shuffle_idx_job() -> None:
        try:
            t = time.perf_counter()
            rng = np.random.RandomState(seed=seed)
            if separate_last_epoch and num_epochs > 1:
                _skip_shuffle(rng, (num_epochs - 1) * n)
                _skip_shuffle(rng, n)
            else:
                _skip_shuffle(rng, doc_len)
            t = lap("shuffle_idx: RNG past doc_idx", t)
            go.wait()
            if failed:
                return
            t = time.perf_counter()
            dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
            shuffle_idx = np.arange(total, dtype=dtype)
            t = lap("shuffle_idx: fill", t)
            shuffled = from_full_epochs if separate_last_epoch else total
            _shuffle(rng, shuffle_idx[:shuffled])
            if shuffled != total:
                _shuffle(rng, shuffle_idx[shuffled:])
            t = lap("shuffle_idx: shuffle", t)
            _save(tmps[2], shuffle_idx)
            lap("shuffle_idx: save", t)
        except BaseException as exc:  # re-raised by the building thread
            failed.append(exc)

    worker = threading.Thread(target=shuffle_idx_job, name="shuffle_idx", daemon=True)
    worker.start()
    try:
        t = time.perf_counter()
        rng = np.random.RandomState(seed=seed)
        doc_idx = _fill_doc_idx(first_doc, end_doc, num_epochs)
        t = lap("doc_idx: fill", t)
        if separate_last_epoch and num_epochs > 1:
            _shuffle(rng, doc_idx[:(num_epochs - 1) * n])
            _shuffle(rng, doc_idx[(num_epochs - 1) * n:])
        else:
            _shuffle(rng, doc_idx)
        t = lap("doc_idx: shuffle", t)
        _save(tmps[0], doc_idx)
        del doc_idx
        go.set()
        t = lap("doc_idx: save", t)
        _write_sample_idx(tmps[1], sizes, tmps[0], doc_len, seq_length, total)
        t = lap("sample_idx", t)
    except BaseException as exc:
        failed.append(exc)
        go.set()
    worker.join()
    lap("waiting for shuffle_idx", t)
    try:
        if failed:
            raise failed[0]
        for tmp, path in zip(tmps, paths):
            os.replace(tmp, path)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
