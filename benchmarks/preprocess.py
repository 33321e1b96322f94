"""Benchmark: `bsops preprocess` against Megatron's pure-Python GPT-2 BPE pipeline, side by side.

Baseline: what Megatron-DeepSpeed's tools/preprocess_data.py does per line with GPT2BPETokenizer:
text-mode jsonl reading, `json.loads`, OpenAI's byte-level BPE in pure Python (encoder.py's
algorithm with its regex, as megatron/tokenizer/gpt2_tokenization.py runs it, with its lru caches),
EOD appended, each document written to the .bin as a numpy array; the .idx in the same format.
bsops: `preprocess()` with 1 worker, on tiktoken and on fastokens (the default backend, with its
1% cross-check against tiktoken); then fastokens with 1..N workers (N: the cores available) on the
corpus repeated to --scale-mb, where a run's fixed costs no longer decide the ratio.

Corpora: the bundled KJV corpus (prose, 1189 documents of ~3.6 KB), and the Python
standard library's sources (code: indentation runs, punctuation, documents from 0.1 to 300 KB).
For each it prints MB/s, the ratio bsops 1 worker / baseline (per core), the ratio N workers /
1 worker (and against N), checks that every run's .bin/.idx bytes equal the baseline's (the
workers' runs: 1 worker's), and breaks bsops' single-worker time down by stage.

    python benchmarks/preprocess.py                 # KJV (4.1 MB) and 10 MB of code
    python benchmarks/preprocess.py --mb 4          # quicker
    python benchmarks/preprocess.py --input FILE.jsonl   # also a corpus of yours ('text' key)
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


# --- the baseline: Megatron's GPT-2 BPE in pure Python ---------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def get_pairs(word: tuple[str, ...]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in zip(word, word[1:])}


class MegatronGPT2BPE:
    """OpenAI's encoder.py algorithm as Megatron-DeepSpeed's GPT2Tokenizer runs it (caches included)."""

    def __init__(self, vocab_file: str, merges_file: str, max_token_len_cache: int = 9) -> None:
        import regex

        with open(vocab_file, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_file, encoding="utf-8") as f:
            merges = [tuple(m.split()) for m in f.read().split("\n")[1:-1]]
        self.bpe_ranks = dict(zip(merges, range(len(merges))))
        self.byte_encoder = bytes_to_unicode()
        self.pat = regex.compile(GPT2_PATTERN)
        self.max_token_len_cache = max_token_len_cache
        self.eod = self.encoder["<|endoftext|>"]
        self.bpe = lru_cache(1_000_000)(self._bpe)
        self.normalize_token_and_cache = lru_cache(1_000_000)(self.normalize_token)

    def _bpe(self, token: str) -> str:
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        return " ".join(word)

    def normalize_token(self, token: str) -> list[str]:
        token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
        return self.bpe(token).split(" ")

    def encode(self, text: str) -> list[int]:
        tokens: list[str] = []
        for token in self.pat.findall(text):
            if len(token) <= self.max_token_len_cache:
                tokens.extend(self.normalize_token_and_cache(token))
            else:
                tokens.extend(self.normalize_token(token))
        return [self.encoder.get(t, 0) for t in tokens]


def run_baseline(src: Path, prefix: str, tok: MegatronGPT2BPE) -> tuple[float, float]:
    """Megatron's loop with one process: read, parse, tokenize, append EOD, write; wall and CPU seconds."""
    from bigscience_ops.data.indexed import write_index

    dtype = np.dtype(np.uint16)  # best_fitting_dtype(50257)
    sizes: list[int] = []
    t0, c0 = time.perf_counter(), cpu_seconds()
    with open(src, encoding="utf-8") as fin, open(prefix + ".bin", "wb") as fbin:
        for line in fin:
            ids = tok.encode(json.loads(line)["text"])
            if not ids:
                continue
            ids.append(tok.eod)
            fbin.write(np.array(ids, dtype=dtype).tobytes(order="C"))
            sizes.append(len(ids))
    write_index(prefix + ".idx", dtype, np.array(sizes, dtype=np.int32), np.arange(len(sizes) + 1))
    return time.perf_counter() - t0, cpu_seconds() - c0


# --- corpora ---------------------------------------------------------------------------------

def make_kjv(path: Path, mb: float) -> None:
    """The bundled corpus once (4.1 MB; repeating it would hand the baseline's caches a free ride)."""
    with lzma.open(REPO / "corpus" / "kjv.jsonl.xz", "rb") as f:
        path.write_bytes(f.read())


def make_code(path: Path, mb: float) -> None:
    """Python standard library sources, one file per document, up to `mb` MB of jsonl."""
    root = Path(os.__file__).parent
    budget = mb * 2**20
    with open(path, "w", encoding="utf-8") as out:
        for f in sorted(root.rglob("*.py")):
            if budget <= 0:
                break
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            line = json.dumps({"text": text, "path": str(f.relative_to(root))}) + "\n"
            out.write(line)
            budget -= len(line)


# --- bsops -----------------------------------------------------------------------------------

def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children (the workers)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_bsops(src: Path, prefix: str, workers: int, backend: str = "auto") -> tuple[float, float]:
    """Wall and CPU seconds (all processes) of preprocess() as `bsops preprocess` runs it (a fastokens
    run cross-checks 1% of the text with tiktoken); the tokenizers are built beforehand."""
    from bigscience_ops.data.preprocess import preprocess
    from bigscience_ops.data.tokenizer import resolve_tokenizer

    t0, c0 = time.perf_counter(), cpu_seconds()
    preprocess([src], prefix, resolve_tokenizer("gpt2", backend=backend), ("text",), append_eod=True,
               workers=workers)
    return time.perf_counter() - t0, cpu_seconds() - c0


def stage_profile(src: Path) -> dict[str, float]:
    """bsops' single-worker work split by stage, timed over the whole file."""
    from bigscience_ops.data.preprocess import CHECK_FRACTION, CHUNK_BYTES
    from bigscience_ops.data.tokenizer import CrossCheck, build_tokenizer, reference_tokenizer, resolve_tokenizer

    spec = resolve_tokenizer("gpt2")
    tok = build_tokenizer(spec)
    check = CrossCheck(reference_tokenizer(spec), CHECK_FRACTION)
    eod = tok.eod
    t = dict.fromkeys(("read and split lines", "utf-8 decode + json.loads", f"tokenize ({tok.backend})",
                       f"cross-check {CHECK_FRACTION:.0%} ({check.reference.backend})",
                       "EOD + uint16 + write"), 0.0)
    with open(src, "rb") as f, open(os.devnull, "wb") as sink:
        while True:
            t0 = time.perf_counter()
            data = f.read(CHUNK_BYTES)
            if not data:
                break
            data += f.readline()
            lines = data.split(b"\n")
            t1 = time.perf_counter()
            texts = [json.loads(line.decode("utf-8"))["text"] for line in lines if line]
            t2 = time.perf_counter()
            ids, lengths = tok.encode_batch(texts)
            t3 = time.perf_counter()
            assert check.first_mismatch(texts, ids, lengths) is None
            t4 = time.perf_counter()
            sink.write(np.insert(ids, np.cumsum(lengths), eod).astype(np.uint16).tobytes())
            (lengths + 1).astype(np.int32)
            t5 = time.perf_counter()
            for k, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                t[k] += dt
    return t


def same_bytes(a: str, b: str) -> bool:
    return all(Path(a + ext).read_bytes() == Path(b + ext).read_bytes() for ext in (".bin", ".idx"))


def bench(name: str, src: Path, tmp: Path, baseline_tok: MegatronGPT2BPE, max_workers: int, repeat: int,
          scale_mb: float) -> None:
    mb = src.stat().st_size / 2**20
    with open(src, "rb") as f:
        docs = sum(1 for _ in f)
    print(f"\n{name}: {mb:.1f} MB, {docs} documents; best of 2 (baseline) and {repeat} (bsops) runs, "
          "CPU of all processes")
    base_prefix = str(tmp / f"{name}_megatron")
    base_runs = []
    for _ in range(2):
        baseline_tok.bpe.cache_clear()  # each run starts with Megatron's caches cold, as a fresh process
        baseline_tok.normalize_token_and_cache.cache_clear()
        base_runs.append(run_baseline(src, base_prefix, baseline_tok))
    base_s, base_cpu = min(r[0] for r in base_runs), min(r[1] for r in base_runs)
    print(f"  {'Megatron pure-Python GPT-2 BPE, 1 process':<40} {base_s:7.2f} s {mb / base_s:6.2f} MB/s "
          f"(CPU {base_cpu:5.2f} s)")
    prefix = str(tmp / f"{name}_tiktoken")
    runs = [run_bsops(src, prefix, 1, "tiktoken") for _ in range(repeat)]
    secs, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
    if not same_bytes(prefix + "_text_document", base_prefix):
        raise SystemExit(f"{name}: bsops --tokenizer-backend tiktoken .bin/.idx bytes differ from the baseline's")
    print(f"  {'bsops --tokenizer-backend tiktoken':<40} {secs:7.2f} s {mb / secs:6.2f} MB/s (CPU {cpu:5.2f} s)"
          f"  {base_s / secs:5.2f}x baseline per core (CPU: {base_cpu / cpu:5.2f}x)")
    prefix = str(tmp / f"{name}_fastokens")
    runs = [run_bsops(src, prefix, 1) for _ in range(repeat)]
    secs, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
    if not same_bytes(prefix + "_text_document", base_prefix):
        raise SystemExit(f"{name}: bsops (fastokens) .bin/.idx bytes differ from the baseline's")
    print(f"  {'bsops (fastokens, 1% cross-checked)':<40} {secs:7.2f} s {mb / secs:6.2f} MB/s (CPU {cpu:5.2f} s)"
          f"  {base_s / secs:5.2f}x baseline per core (CPU: {base_cpu / cpu:5.2f}x)")
    # Workers: on the corpus repeated to scale_mb, so that a run's fixed costs (forking the pool,
    # the last chunk) do not decide the ratio; the same bytes for every worker count.
    big = tmp / f"{name}_x.jsonl"
    copies = max(1, round(scale_mb / mb))
    with open(big, "wb") as out:
        for _ in range(copies):
            out.write(src.read_bytes())
    big_mb = mb * copies
    print(f"  workers, on the corpus {copies} times over ({big_mb:.0f} MB):")
    one_s = one_cpu = None
    for workers in range(1, max_workers + 1):
        prefix = str(tmp / f"{name}_x_w{workers}")
        runs = [run_bsops(big, prefix, workers) for _ in range(repeat)]
        secs, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
        if workers > 1 and not same_bytes(prefix + "_text_document", str(tmp / f"{name}_x_w1_text_document")):
            raise SystemExit(f"{name}: bsops --workers {workers} .bin/.idx bytes differ from --workers 1's")
        one_s, one_cpu = one_s or secs, one_cpu or cpu
        extra = "" if workers == 1 else (f"  {one_s / secs:4.2f}x 1 worker = {one_s / secs / workers:4.2f} x N; "
                                         f"CPU {cpu / one_cpu:4.2f}x 1 worker's")
        print(f"  {f'bsops (fastokens) --workers {workers}':<40} {secs:7.2f} s {big_mb / secs:6.1f} MB/s "
              f"(CPU {cpu:5.2f} s){extra}")
    print("  .bin/.idx bytes identical to the baseline's: yes (every worker count: identical to 1 worker's)")
    stages = stage_profile(src)
    total = sum(stages.values())
    print(f"  bsops 1 worker by stage ({total:.2f} s, {mb / total:.1f} MB/s):")
    for stage, secs in stages.items():
        print(f"    {stage:<28} {secs:6.2f} s {100 * secs / total:5.1f}%  ({mb / secs:7.1f} MB/s alone)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=10, help="size of the generated code corpus")
    ap.add_argument("--input", type=Path, default=None, help="also this jsonl file (a 'text' key)")
    ap.add_argument("--max-workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeat", type=int, default=3, help="bsops runs per setting (best wall time kept)")
    ap.add_argument("--scale-mb", type=float, default=400, help="size the workers are measured on")
    args = ap.parse_args()
    from bigscience_ops.data.tokenizer import (build_tokenizer, gpt2_files_from_package, reference_tokenizer,
                                               resolve_tokenizer)

    baseline_tok = MegatronGPT2BPE(*gpt2_files_from_package())  # loading not timed, as Megatron's rates
    t0 = time.perf_counter()
    for backend in ("auto", "tiktoken"):  # cached for the runs; forked workers inherit them
        build_tokenizer(resolve_tokenizer("gpt2", backend=backend))
    reference_tokenizer(resolve_tokenizer("gpt2"))
    print(f"bsops tokenizer builds + checks against tokenizers: {time.perf_counter() - t0:.2f} s "
          "(once per run, not in the figures below)")
    load = os.getloadavg()[0]
    print(f"{len(os.sched_getaffinity(0))} cores, load average {load:.1f} at start "
          f"({'the machine is shared: ratios are within this run' if load > 0.5 else 'idle'})")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        corpora = [("kjv", make_kjv), ("python-stdlib", make_code)]
        for name, make in corpora:
            make(tmp / f"{name}.jsonl", args.mb)
            bench(name, tmp / f"{name}.jsonl", tmp, baseline_tok, args.max_workers, args.repeat, args.scale_mb)
        if args.input is not None:
            bench(args.input.stem, args.input, tmp, baseline_tok, args.max_workers, args.repeat, args.scale_mb)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)


if __name__ == "__main__":
    main()
