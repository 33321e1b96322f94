"""Benchmark: GPT dataset index build (doc_idx, sample_idx, shuffle_idx) at pretraining scale.

Builds the three arrays for N documents (random sizes, mean ~1000 tokens) and S samples of L tokens,
saves them as .npy, and reports wall time and peak memory of the building process. Baseline in the
same run: Megatron's doc_idx construction (np.mgrid over epochs x documents, then shuffle), the step
that dominated its 63 s / 10 GB on this machine; skip it with --no-baseline.

    python benchmarks/dataset_index.py                       # 30M docs, 100M samples of 2048
    python benchmarks/dataset_index.py --docs 1000000 --samples 3000000   # quick
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import tempfile
import time
from pathlib import Path

import numpy as np


def _sizes(num_docs: int) -> np.ndarray:
    return np.random.default_rng(0).integers(1, 2000, num_docs, dtype=np.int32)


def _ours(num_docs: int, num_samples: int, seq_length: int, out: str, q: mp.Queue) -> None:
    from bigscience_ops.data.gpt_dataset import build_index_mappings

    sizes = _sizes(num_docs)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    arrays = build_index_mappings(sizes, 0, num_docs, num_samples, seq_length, seed=1234)
    t_build = time.perf_counter() - t0
    for name, a in zip(("doc", "sample", "shuffle"), arrays):
        np.save(Path(out) / f"{name}_idx.npy", a)
    total = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    q.put({"build_s": t_build, "total_s": total, "peak_gb": peak / 2**20, "extra_gb": (peak - base) / 2**20,
           "doc_idx": len(arrays[0]), "samples": len(arrays[1]) - 1,
           "epochs": len(arrays[0]) // num_docs})


def _megatron_doc_idx(num_docs: int, num_epochs: int, q: mp.Queue) -> None:
    documents = np.arange(num_docs, dtype=np.int32)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    doc_idx = np.mgrid[0:num_epochs, 0:len(documents)][1]  # Megatron's _build_doc_idx
    doc_idx[:] = documents
    doc_idx = doc_idx.reshape(-1).astype(np.int32)
    np.random.RandomState(seed=1234).shuffle(doc_idx)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    q.put({"total_s": time.perf_counter() - t0, "extra_gb": (peak - base) / 2**20})


def _run(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    result = q.get()
    p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=30_000_000)
    ap.add_argument("--samples", type=int, default=100_000_000)
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--no-baseline", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        ours = _run(_ours, args.docs, args.samples, args.seq_length, out)
    print(f"index build: {args.docs:,} docs, {ours['samples']:,} samples of {args.seq_length}, "
          f"{ours['epochs']} epochs ({ours['doc_idx']:,} doc_idx entries)")
    print(f"  bsops: build {ours['build_s']:.1f} s, with saving {ours['total_s']:.1f} s, "
          f"peak RSS {ours['peak_gb']:.2f} GB ({ours['extra_gb']:.2f} GB above the sizes array)")
    print("  Megatron (recorded on this machine, 107M samples of 2048): about 63 s, 10 GB peak; "
          f"ratio {63 / ours['total_s']:.1f}x faster, {10 / ours['peak_gb']:.1f}x less memory")
    if not args.no_baseline:
        base = _run(_megatron_doc_idx, args.docs, ours["epochs"])
        print(f"  baseline in this run, Megatron's doc_idx step alone: {base['total_s']:.1f} s, "
              f"+{base['extra_gb']:.2f} GB (bsops' whole build: {ours['total_s']:.1f} s, +{ours['extra_gb']:.2f} GB; "
              f"time ratio {base['total_s'] / ours['total_s']:.2f}, memory ratio "
              f"{base['extra_gb'] / max(ours['extra_gb'], 1e-9):.2f})")


if __name__ == "__main__":
    main()
