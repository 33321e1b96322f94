"""Benchmark: `bsops preprocess` against decompression bombs, peak memory of the whole process tree.

Each bomb is a few kilobytes on disk: a few valid lines, then a gigabyte or more of zeros with no
newline (one "line" of a gigabyte). Before the bounds, the 1.5 GiB .xz block grew the workers past
9 GB with no output, and the 1 GiB .zst line ran until killed (each read re-copied the long line).
Now each is refused at --max-document-bytes (64 MiB by default), naming the file and the line.

Printed per bomb and worker count: the exit code, the error's file:line, the peak RSS of
`bsops preprocess` and its workers (the largest of them: getrusage(RUSAGE_CHILDREN) of a wrapper
process), the seconds, and that peak as a ratio of a baseline measured in the same run (the same
command on a small valid file). The target: every bomb refused (exit 2) under 1 GB.

    python benchmarks/preprocess_bombs.py            # the 1.5 GiB .xz block and the 1 GiB .zst line, ~1 minute
    python benchmarks/preprocess_bombs.py --quick    # 256 MiB bombs, a few seconds

The bombs are written in a temporary folder (the .xz one takes ~6 s per GiB to compress) and removed.
The functions that write them are also the tests' (tests/fixtures_data.py).
"""

from __future__ import annotations

import argparse
import gzip
import lzma
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HEAD = b"".join(b'{"text": "a valid document %d"}\n' % i for i in range(1000))  # the bomb's line is 1001
PIECE = 1 << 20
# Runs the command given in argv and prints its exit code and the peak RSS (KiB) of its process tree's largest
# process: the command and its workers are this process's only children.
_WRAPPER = ("import resource, subprocess, sys; "
            "r = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, "
            "timeout=float(sys.argv[1])); sys.stderr.buffer.write(r.stderr); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def _zeros(size: int) -> Iterator[bytes]:
    block = b"0" * PIECE
    while size > 0:
        yield block[:min(size, PIECE)]
        size -= PIECE


def write_xz_bomb(path: Path, size: int, head: bytes = HEAD) -> Path:
    """`head` as one .xz stream, then `size` bytes of zeros as one block of a second stream: a multi-block .xz
    whose second block's uncompressed size (in its index) is `size`. Written a megabyte at a time."""
    with open(path, "wb") as f:
        if head:
            f.write(lzma.compress(head, preset=0))
        comp = lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=0)
        for piece in _zeros(size):
            f.write(comp.compress(piece))
        f.write(comp.flush())
    return path


def write_zst_bomb(path: Path, size: int, head: bytes = HEAD) -> Path:
    """`head`, then `size` bytes of zeros with no newline, as one .zst frame (with its checksum)."""
    import zstandard

    with open(path, "wb") as f, zstandard.ZstdCompressor(level=1, write_checksum=True).stream_writer(f) as w:
        w.write(head)
        for piece in _zeros(size):
            w.write(piece)
    return path


def write_gz_bomb(path: Path, size: int, head: bytes = HEAD) -> Path:
    """`head`, then `size` bytes of zeros with no newline, as one gzip member."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(head)
        for piece in _zeros(size):
            f.write(piece)
    return path


def peak_rss(argv: list[str], timeout_s: float = 600) -> tuple[int, int, str]:
    """(exit code, peak RSS in bytes of the largest process of argv's tree, its stderr) of one run of argv."""
    r = subprocess.run([sys.executable, "-c", _WRAPPER, str(timeout_s)] + argv, capture_output=True, text=True,
                       timeout=timeout_s + 60)
    code, kib = r.stdout.split()
    return int(code), int(kib) * 1024, r.stderr


def bsops_argv(inputs: list[Path], prefix: Path, workers: int, *extra: str) -> list[str]:
    bsops = str(Path(sys.executable).with_name("bsops"))
    return [bsops, "preprocess", *(a for i in inputs for a in ("--input", str(i))), "--tokenizer", "gpt2",
            "--append-eod", "--workers", str(workers), "--output-prefix", str(prefix), *extra]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB bombs instead of 1.5 GiB and 1 GiB")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    xz_size, zst_size = (256 << 20, 256 << 20) if args.quick else (3 << 29, 1 << 30)
    with tempfile.TemporaryDirectory(prefix="bsops-bombs-") as tmp:
        d = Path(tmp)
        made = time.monotonic()
        bombs = {
            f".xz, a {xz_size / 2**30:.2g} GiB block": write_xz_bomb(d / "block.jsonl.xz", xz_size),
            f".zst, a {zst_size / 2**30:.2g} GiB line": write_zst_bomb(d / "line.jsonl.zst", zst_size),
            f".gz, a {zst_size / 2**30:.2g} GiB line": write_gz_bomb(d / "line.jsonl.gz", zst_size),
        }
        print(f"bombs written in {time.monotonic() - made:.1f} s: "
              + ", ".join(f"{p.name} {p.stat().st_size / 1024:.0f} KiB" for p in bombs.values()))
        valid = d / "valid.jsonl"
        valid.write_bytes(HEAD * 20)
        _, base, _ = peak_rss(bsops_argv([valid], d / "base", 1))
        print(f"baseline: a valid 0.6 MB file, peak RSS {base / 2**20:.0f} MiB\n")
        print(f"{'bomb':28} {'workers':>7} {'exit':>4} {'peak RSS':>10} {'x base':>7} {'s':>6}  error names")
        worst = 0
        for name, path in bombs.items():
            for workers in args.workers:
                t = time.monotonic()
                code, peak, err = peak_rss(bsops_argv([path], d / "out", workers))
                seconds = time.monotonic() - t
                worst = max(worst, peak)
                named = next((line.split(": ")[1] for line in err.splitlines() if line.startswith("error:")), "-")
                print(f"{name:28} {workers:7} {code:4} {peak / 2**20:7.0f} MiB {peak / base:7.2f} {seconds:6.1f}  "
                      f"{named.replace(str(d) + os.sep, '')}")
        print(f"\nworst peak RSS {worst / 2**20:.0f} MiB (target: under 1024 MiB)")


if __name__ == "__main__":
    main()
