"""Benchmark: what committing a checkpoint with a manifest costs on top of the save, side by side, and why xxh3_128.

A save is a commit (bigscience_ops/trainer/checkpointing.py): each rank writes its files as DeepSpeed's checkpoint
engine does (torch.save), but through a writer that hashes the bytes as they go by (manifest.HashingWriter), fsyncs
each, and rank 0 then writes the manifest and `latest` atomically. This runs the plain save and the commit,
alternating, on the same machine, for two checkpoints:

  tiny   the tiny experiment's: 11 files, 80.4 MB (`bsops plan tiny`: 21.2 MB weights, 59.1 MB Adam moments)
  large  --large-gb GB (default 1.2) in 26 files: a 100M-parameter model's weights and Adam moments

  save     torch.save of every file to its path (what DeepSpeed's checkpoint engine does; its own bookkeeping left
           out, so the ratios below are upper bounds)
  commit   the trainer's save: torch.save through the hashing writer, fsync, the manifest and `latest`
  hash     the time the hashing writer spent in xxh3_128 during the commit (the hash's own cost)
  fsync    os.fsync of every file (the data on the disk before the manifest says it is)
  re-read  xxh3_128 of every file read back through a memory map (manifest.hash_file: what a resume's and a
           backup's verification cost per byte, the page cache warm)

Each is the median of --repeat runs, in fresh folders. Then the trainer itself (unless --no-trainer): the tiny
experiment's model on 2 CPU ranks (PP=2), saving every iteration for 6 iterations, each save's time as the trainer
logs it ("successfully saved checkpoint ... (N ms)": DeepSpeed's save_checkpoint, its barriers, the commit); the
hash's share of that is the tiny hash time above over the median of those saves.
The target: the hash at most 5% of the save at both sizes.
fsync is printed apart: it is what makes the commit durable, and its cost is the disk's, not the hash's.
The hash is chosen by the table at the top: each candidate's throughput over 256 MB in memory, one core.

    python benchmarks/checkpoint_save.py                 # tiny and 1.2 GB, 5 repeats
    python benchmarks/checkpoint_save.py --repeat 3 --large-gb 1.0 --folder /scratch/me   # on the cluster's disk
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bigscience_ops.checkpoints import layout, manifest  # noqa: E402

TINY = [21.2e6 / 4] * 4 + [59.1e6 / 4] * 4 + [40e3] * 3  # bytes per file: 4 layer/engine files, 4 optimizer, 3 small


def hash_table(mb: int = 256) -> list[tuple[str, float]]:
    """(name, GB/s) of each candidate over `mb` MB in memory, 8 MiB updates, best of 3."""
    import xxhash

    candidates = {"sha256": hashlib.sha256, "blake2b": hashlib.blake2b, "md5": hashlib.md5,
                  "xxh3_64": xxhash.xxh3_64, "xxh3_128 (chosen)": xxhash.xxh3_128}
    try:
        import blake3

        candidates["blake3"] = blake3.blake3
    except ImportError:
        pass
    data = memoryview(os.urandom(mb << 20))
    out = []
    for name, make in candidates.items():
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            digest = make()
            for i in range(0, len(data), manifest.CHUNK):
                digest.update(data[i:i + manifest.CHUNK])
            digest.hexdigest()
            best = min(best, time.perf_counter() - start)
        out.append((name, len(data) / best / 1e9))
    return out


def states(sizes: list[float]) -> list[dict]:
    """One state dict per file, a float32 tensor of about that many bytes (random: nothing compresses)."""
    return [{"tensor": torch.randn(max(1, int(size) // 4))} for size in sizes]


def save(folder: Path, files: list[dict]) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for i, state in enumerate(files):
        path = folder / f"layer_{i:02d}-model_states.pt"
        torch.save(state, path)
        paths.append(path)
    return paths


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class TimedWriter(manifest.HashingWriter):
    """The trainer's hashing writer, also counting the seconds spent hashing."""

    def __init__(self, handle) -> None:
        super().__init__(handle)
        self.hashing = 0.0

    def write(self, data) -> int:
        written = self.handle.write(data)
        start = time.perf_counter()
        self.digest.update(memoryview(data)[:written])
        self.hashing += time.perf_counter() - start
        self.size += written
        return written


def one_round(root: Path, files: list[dict], n: int) -> dict[str, float]:
    """One plain save, then one commit as the trainer makes it, with its parts timed."""
    plain = root / f"plain{n}" / "global_step1"
    out = {"save": timed(lambda: save(plain, files))}
    shutil.rmtree(plain.parent)
    folder = root / f"commit{n}" / "global_step1"
    folder.mkdir(parents=True)
    records, hashing, fsync = {}, 0.0, 0.0
    start = time.perf_counter()
    for i, state in enumerate(files):
        path = folder / f"layer_{i:02d}-model_states.pt"
        with open(path, "wb") as handle:
            writer = TimedWriter(handle)
            torch.save(state, writer)
            handle.flush()
            synced = time.perf_counter()
            os.fsync(handle.fileno())
            fsync += time.perf_counter() - synced
        records[path.name] = writer.record()
        hashing += writer.hashing
    manifest.commit(folder, manifest.Manifest(folder.name, 1, "", "bench", {"tensor": 1, "pipeline": 1, "data": 1,
                                                                             "zero_stage": 0, "precision": "fp32"},
                                              True, records, time.time()))
    layout.write_latest(folder.parent, folder.name)
    out.update({"commit": time.perf_counter() - start, "hash": hashing, "fsync": fsync,
                "re-read": timed(lambda: [manifest.hash_file(folder / rel) for rel in records])})
    assert all(manifest.hash_file(folder / rel) == rec for rel, rec in records.items())
    shutil.rmtree(folder.parent)
    return out


def measure(root: Path, name: str, sizes: list[float], repeat: int) -> dict[str, float]:
    files = states(sizes)
    total = sum(f["tensor"].numel() * 4 for f in files)
    rounds = [one_round(root, files, n) for n in range(repeat)]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    base = med["save"]
    print(f"\n{name}: {len(files)} files, {total / 1e6:,.1f} MB, median of {repeat}")
    for key in ("save", "commit", "hash", "fsync", "re-read"):
        print(f"  {key:16s} {med[key] * 1e3:9.1f} ms   {med[key] / base:6.3f}x the save")
    verdict = "met" if med["hash"] <= 0.05 * base else "NOT met"
    print(f"  hash / save = {med['hash'] / base * 100:.2f}% (target <= 5%: {verdict}); commit / save = "
          f"{med['commit'] / base:.3f}x, of which fsync {med['fsync'] / base * 100:.1f}% of the save; commit without "
          f"fsync / save = {(med['commit'] - med['fsync']) / base:.3f}x")
    return med


def trainer_saves(root: Path) -> list[float]:
    """The trainer's own save times (ms) for the tiny experiment, 2 ranks, a save each of 6 iterations."""
    import dataclasses
    import re
    import subprocess

    from bigscience_ops.config.loading import load_experiment, to_dict
    from bigscience_ops.launch.local import free_port
    from bigscience_ops.launch.render import deepspeed_config

    repo = Path(__file__).resolve().parents[1]
    out = root / "trainer"
    exp = load_experiment("tiny", repo / "trainings")
    exp = dataclasses.replace(
        exp, checkpoint=dataclasses.replace(exp.checkpoint, save_interval=1, save_schedule=[], exit_interval=6,
                                            kill_switch_path=None),
        paths=dataclasses.replace(exp.paths, output=str(out), checkpoints=str(out / "checkpoints"),
                                  tensorboard=str(out / "tb"), logs=str(out / "logs")))
    out.mkdir(parents=True)
    import json

    (out / "experiment.json").write_text(json.dumps(to_dict(exp)))
    (out / "ds_config.json").write_text(json.dumps(deepspeed_config(exp)))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    argv = [sys.executable, "-m", "bigscience_ops.trainer", "--experiment", str(out / "experiment.json"),
            "--deepspeed-config", str(out / "ds_config.json"), "--synthetic-data"]
    procs = [subprocess.Popen(argv, cwd=repo, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for r in range(2)]
    stdout = procs[0].communicate(timeout=900)[0]
    procs[1].wait(timeout=60)
    return [float(ms) for ms in re.findall(r"successfully saved checkpoint at iteration\s+\d+ .*\(([\d.]+) ms\)", stdout)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--large-gb", type=float, default=1.2)
    parser.add_argument("--folder", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--no-trainer", action="store_true", help="leave out the trainer's own tiny saves")
    args = parser.parse_args(argv)
    print("hash throughput, one core, 256 MB in memory:")
    for name, rate in hash_table():
        print(f"  {name:18s} {rate:6.2f} GB/s")
    root = Path(tempfile.mkdtemp(prefix="bsops-bench-save-", dir=args.folder))
    try:
        tiny = measure(root, "tiny", TINY, args.repeat)
        per = args.large_gb * 1e9 / 26
        measure(root, "large", [per] * 26, args.repeat)
        if not args.no_trainer:
            saves = trainer_saves(root)
            median = statistics.median(saves)
            print(f"\nthe trainer's saves at tiny (2 CPU ranks, PP=2; ms): {', '.join(f'{s:.0f}' for s in saves)}; "
                  f"median {median:.1f} ms")
            share = tiny["hash"] * 1e3 / median
            print(f"  hash / the trainer's save = {share * 100:.2f}% (target <= 5%: {'met' if share <= 0.05 else 'NOT met'})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
