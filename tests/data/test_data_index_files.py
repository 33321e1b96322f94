"""Index files built straight to disk: the same bytes as the in-memory build + np.save; the lock fallback."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest

from bigscience_ops.data import gpt_dataset as gd
from bigscience_ops.data import index_mappings as im
from bigscience_ops.data import index_files as ixf
from bigscience_ops.data import locks
from tests.fixtures_data import write_indexed


def saved_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


CASES = [  # sizes, first_doc, end_doc, num_samples, seq_length, seed
    (np.random.default_rng(0).integers(1, 300, 500, dtype=np.int32), 0, 500, 200, 64, 1),  # one epoch
    (np.random.default_rng(1).integers(1, 300, 500, dtype=np.int32), 100, 400, 1500, 32, 7),  # epochs
    (np.random.default_rng(2).integers(0, 50, 300, dtype=np.int32), 0, 300, 700, 16, 3),  # empty docs
    (np.random.default_rng(3).integers(1, 90_000, 200, dtype=np.int32), 0, 200, 500, 2048, 5),  # > uint16
    (np.random.default_rng(4).integers(1, 40, 1000, dtype=np.int32), 0, 1000, 2000, 8, 11),  # many chunks
]
_FULL = np.random.default_rng(5).integers(1, 100, 400, dtype=np.int32)
CASES.append((_FULL, 0, 400, (3 * int(_FULL.sum()) - 1) // 16 - 2, 16, 2))  # 3 epochs, last one full


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("chunk", [7, 1 << 21])
@pytest.mark.parametrize("shuffle", ["compiled", "numpy"])
def test_files_equal_in_memory_build_saved_with_np_save(tmp_path, monkeypatch, case, chunk, shuffle):
    sizes, first, end, num_samples, seq_length, seed = CASES[case]
    monkeypatch.setattr(ixf, "CHUNK", chunk)
    if shuffle == "numpy":  # as where the C helper could not be compiled
        monkeypatch.setattr(ixf, "_compiled", None)
    else:
        assert ixf._compiled is not None, "bigscience_ops/data/_shuffle.c is not built: pip install -e ."
    expected = im.build_index_mappings(sizes, first, end, num_samples, seq_length, seed)
    paths = tuple(tmp_path / f"{name}.npy" for name in ("doc", "sample", "shuffle"))
    ixf.write_index_mappings(sizes, first, end, num_samples, seq_length, seed, paths)
    for path, array in zip(paths, expected):
        assert path.read_bytes() == saved_bytes(array), path.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.npy", "sample.npy", "shuffle.npy"]


def test_separate_last_epoch_case_is_covered():
    # CASES[1] and [4] must exercise Megatron's separately shuffled last epoch, or the test above misses it.
    plans = [im.index_plan(s, f, e, n, L) for s, f, e, n, L, _ in CASES]
    assert any(p[2] for p in plans) and any(p[1] > 1 and not p[2] for p in plans)


def test_without_flock_a_lock_file_serializes_builds(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "try_flock", lambda f: False)  # as on a filesystem without flock
    prefix = write_indexed(tmp_path / "c", [[1, 2, 3, 4, 5, 50256]] * 30)
    ds = gd.GPTDataset("train", gd.IndexedDataset(prefix), 0, 30, 40, 8, 1)
    assert ds.built and len(ds) >= 40
    assert not list(tmp_path.glob("*.lock*")) and not list(tmp_path.glob("*.tmp-*"))
    again = gd.GPTDataset("train", gd.IndexedDataset(prefix), 0, 30, 40, 8, 1)
    assert not again.built and [again[i].tolist() for i in range(3)] == [ds[i].tolist() for i in range(3)]


def test_lock_file_of_a_dead_process_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "try_flock", lambda f: False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True, timeout=60)
    lock = tmp_path / "x.lock"
    lock.write_text(f"{os.uname().nodename} {dead.stdout.strip()}\n")
    with locks.build_lock(lock, lambda: False) as build:
        assert build and lock.read_text().split()[1] == str(os.getpid())
    assert not lock.exists()


def test_lock_file_of_a_live_process_waits_until_the_files_exist(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "try_flock", lambda f: False)
    monkeypatch.setattr(locks, "POLL_S", 0.01)
    lock = tmp_path / "x.lock"
    lock.write_text(f"{os.uname().nodename} {os.getpid()}\n")  # held by a live process
    checks = []

    def done() -> bool:
        checks.append(1)
        return len(checks) >= 3  # the other builder finishes after a few polls

    with locks.build_lock(lock, done) as build:
        assert not build
    assert lock.exists() and len(checks) >= 3  # the other process's lock is left alone


# Peak RSS from VmHWM: ru_maxrss of a child starts at its parent's (pytest's) RSS and hides small peaks.
MEMORY_PROBE = """
import sys, numpy as np
from pathlib import Path
from bigscience_ops.data import index_mappings as im, index_files as ixf
def peak_kb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
sizes = np.random.default_rng(0).integers(1, 2000, 500_000, dtype=np.int32)
out = Path(sys.argv[2])
before = peak_kb()
if sys.argv[1] == "files":
    ixf.CHUNK = 1 << 16  # chunk buffers well under doc_idx, as at pretraining scale
    ixf.write_index_mappings(sizes, 0, len(sizes), 1_500_000, 2048, 1, tuple(out / n for n in "dsh"))
else:
    for n, a in zip("dsh", im.build_index_mappings(sizes, 0, len(sizes), 1_500_000, 2048, 1)):
        np.save(out / n, a)
print(peak_kb() - before)
"""


def test_files_build_peaks_at_doc_idx_not_at_all_three_arrays(tmp_path):
    """1.5M samples over 500k documents (7 epochs): doc_idx is 14 MB, the three arrays 32 MB in all."""
    extra_kb = {}
    for method in ("files", "memory"):
        (tmp_path / method).mkdir()
        done = subprocess.run([sys.executable, "-c", MEMORY_PROBE, method, str(tmp_path / method)],
                              capture_output=True, text=True, timeout=300, check=True)
        extra_kb[method] = int(done.stdout.split()[-1])
    doc_idx_kb = 3_500_000 * 4 // 1024
    assert extra_kb["files"] < 1.6 * doc_idx_kb, extra_kb
    assert extra_kb["memory"] > 2 * extra_kb["files"], extra_kb
