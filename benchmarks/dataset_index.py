"""Benchmark: GPT dataset index build (doc_idx, sample_idx, shuffle_idx) at pretraining scale.

N documents (random sizes, mean ~1000 tokens) and S samples of L tokens. Two methods, each in a
fresh process, side by side:
  previous  the three arrays built in memory (`index_mappings.build_index_mappings`), then np.save;
  files     `index_files.write_index_mappings`: straight into the .npy files in bounded memory.
It prints wall time, CPU time, peak RSS (whole process, and above the sizes array), the ratios,
the seconds of each stage of the files method, whether its compiled shuffle helper
(bigscience_ops/data/_shuffle.c) is built, and checks that both methods wrote identical bytes.

    python benchmarks/dataset_index.py                       # 30M docs, 100M samples of 2048
    python benchmarks/dataset_index.py --docs 1000000 --samples 3000000   # quick
"""

from __future__ import annotations

import argparse
import filecmp
import multiprocessing as mp
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

NAMES = ("doc", "sample", "shuffle")


def _sizes(num_docs: int) -> np.ndarray:
    return np.random.default_rng(0).integers(1, 2000, num_docs, dtype=np.int32)


def _peak_kb() -> int:
    """VmHWM: this process's peak RSS (ru_maxrss would start at the parent's RSS)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1])


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _build(method: str, num_docs: int, num_samples: int, seq_length: int, out: str, q: mp.Queue) -> None:
    from bigscience_ops.data.index_mappings import build_index_mappings
    from bigscience_ops.data import index_files

    sizes = _sizes(num_docs)
    base = _peak_kb()
    paths = tuple(Path(out) / f"{method}_{name}_idx.npy" for name in NAMES)
    stages: dict[str, float] = {}
    t0, c0 = time.perf_counter(), _cpu()
    if method == "previous":
        arrays = build_index_mappings(sizes, 0, num_docs, num_samples, seq_length, seed=1234)
        t_build = time.perf_counter() - t0
        for path, a in zip(paths, arrays):
            np.save(path, a)
        del arrays
    else:
        index_files.write_index_mappings(sizes, 0, num_docs, num_samples, seq_length, 1234, paths, stages)
        t_build = None
    total = time.perf_counter() - t0
    peak = _peak_kb()
    doc_len = len(np.load(paths[0], mmap_mode="r"))
    q.put({"build_s": t_build, "total_s": total, "cpu_s": _cpu() - c0, "peak_gb": peak / 2**20,
           "extra_gb": (peak - base) / 2**20, "doc_idx": doc_len, "epochs": doc_len // num_docs,
           "stages": stages, "helper": getattr(index_files._compiled, "__file__", None)})


def _run(*args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_build, args=(*args, q))
    p.start()
    result = q.get()
    p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=30_000_000)
    ap.add_argument("--samples", type=int, default=100_000_000)
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the .npy files, made if missing (default: the system's temporary folder)")
    args = ap.parse_args()
    if args.out is not None:
        if args.out.exists() and not args.out.is_dir():
            ap.error(f"--out {args.out} is a file; give a folder (it is made if missing)")
        args.out.mkdir(parents=True, exist_ok=True)
    print(f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(dir=args.out) as out:
        files = _run("files", args.docs, args.samples, args.seq_length, out)
        prev = _run("previous", args.docs, args.samples, args.seq_length, out)
        same = all(filecmp.cmp(Path(out) / f"files_{n}_idx.npy", Path(out) / f"previous_{n}_idx.npy",
                               shallow=False) for n in NAMES)
    print(f"index build: {args.docs:,} docs, {args.samples:,} samples of {args.seq_length}, "
          f"{files['epochs']} epochs ({files['doc_idx']:,} doc_idx entries)")
    print(f"  {'method':<30} {'wall s':>8} {'CPU s':>8} {'peak RSS GB':>12} {'above sizes GB':>15}")
    for name, r in (("previous (in memory + np.save)", prev), ("files (straight to .npy)", files)):
        print(f"  {name:<30} {r['total_s']:8.1f} {r['cpu_s']:8.1f} {r['peak_gb']:12.2f} {r['extra_gb']:15.2f}")
    print(f"  previous: build alone {prev['build_s']:.1f} s, saving {prev['total_s'] - prev['build_s']:.1f} s")
    print(f"  ratio previous / files: wall {prev['total_s'] / files['total_s']:.2f}x, "
          f"CPU {prev['cpu_s'] / files['cpu_s']:.2f}x, peak RSS {prev['peak_gb'] / files['peak_gb']:.2f}x")
    print("  files, per stage (s; the shuffle_idx thread's overlap the others):")
    for stage, seconds in sorted(files["stages"].items(), key=lambda kv: kv[0].startswith("shuffle_idx:")):
        print(f"    {stage:<34} {seconds:6.2f}")
    helper = files["helper"]
    print(f"  shuffle helper: {'compiled, ' + helper if helper else 'NOT BUILT: numpy shuffle (pip install -e .)'}")
    print(f"  identical bytes: {'yes' if same else 'NO'}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end (the machine may be shared: compare ratios)")
    if not same:
        raise SystemExit("the two methods wrote different index files")


if __name__ == "__main__":
    main()
