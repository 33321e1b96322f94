"""Benchmark: `bsops preprocess` at corpus scale, side by side with Megatron's pure-Python GPT-2 BPE.

Baseline: what Megatron-DeepSpeed's tools/preprocess_data.py does per line with GPT2BPETokenizer:
text-mode jsonl reading, `json.loads`, OpenAI's byte-level BPE in pure Python (encoder.py's
algorithm with its regex, as megatron/tokenizer/gpt2_tokenization.py runs it, with its lru caches),
EOD appended, each document written to the .bin as a numpy array; the .idx in the same format. It
runs on a 4 MB sample of the corpus (at ~4 MB/s, the whole corpus would take minutes); every
ratio is per CPU second, the unit Megatron's and bsops' workers share.

Corpus: the Python standard library's sources (code, one file per document) and the bundled KJV
(prose), interleaved and repeated to --scale-mb, as one large file and as --shards shards, each
plain, .gz (isal, level 1), .xz (`xz -T0 -1`, multi-block) and .zst (`zstd -T0`). What it prints:

  1. start-up: CPU seconds `bsops preprocess` spends before its first document, on a 0.25 MB file
     (target < 0.3), and the whole run's CPU;
  2. per input kind, layout and worker count: wall time, MB/s of jsonl, CPU of the main process and
     of the workers, MB per CPU second and the ratio to Megatron's; N workers against 1 (target:
     >= 0.8 x N on a quiet machine); every .bin/.idx compared with the plain single-worker one;
  3. the decoders alone (MB/s of jsonl per core);
  4. a model of the pipeline built from those measurements, predicting the rate at 16, 64 and 128
     cores per configuration, and which stage limits it there.

    python benchmarks/preprocess.py              # 400 MB, 64 shards: about 5 minutes on 2 quiet cores
    python benchmarks/preprocess.py --quick      # 40 MB, 64 shards: a smoke test, about 1 minute
    python benchmarks/preprocess.py --input F.jsonl   # your corpus (a 'text' key) instead of the built one

The machine's load average is printed at the start and the end: timings taken under load (other
processes on the cores) understate the scaling; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
KINDS = ("jsonl", "gz", "xz", "zst")
SUFFIX = {"jsonl": ".jsonl", "gz": ".jsonl.gz", "xz": ".jsonl.xz", "zst": ".jsonl.zst"}
CORES = (2, 16, 64, 128)


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


# --- corpus ----------------------------------------------------------------------------------

def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children (the workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def cpu_split() -> tuple[float, float]:
    """(this process, its waited-for children) CPU seconds."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def base_lines() -> list[bytes]:
    """Python standard library sources (one file per document) and the KJV's books, interleaved."""
    root = Path(os.__file__).parent
    code = []
    for f in sorted(root.rglob("*.py")):
        try:
            code.append((json.dumps({"text": f.read_text(encoding="utf-8")}) + "\n").encode())
        except (UnicodeDecodeError, OSError):
            continue
    with lzma.open(REPO / "corpus" / "kjv.jsonl.xz", "rb") as f:
        prose = f.read().splitlines(keepends=True)
    lines = []
    for i in range(max(len(code), len(prose))):
        lines += code[i:i + 1] + prose[i:i + 1]
    return lines


def build_corpus(folder: Path, mb: float, shards: int, source: Path | None) -> tuple[Path, list[Path]]:
    """One large jsonl of about `mb` MB and the same lines cut into `shards` files of about equal size."""
    lines = source.read_bytes().splitlines(keepends=True) if source else base_lines()
    big = folder / "big.jsonl"
    budget = mb * 2**20
    with open(big, "wb") as out:
        while budget > 0:
            for line in lines:
                out.write(line)
                budget -= len(line)
                if budget <= 0:
                    break
    (folder / "shards").mkdir()
    paths = [folder / "shards" / f"part_{i:03d}.jsonl" for i in range(shards)]
    size, i, written = big.stat().st_size, 0, 0
    outs = [open(p, "wb") for p in paths]
    with open(big, "rb") as f:
        for line in f:
            outs[min(i, shards - 1)].write(line)
            written += len(line)
            i = written * shards // size
    for o in outs:
        o.close()
    return big, paths


def compress(kind: str, src: Path) -> Path:
    out = src.with_name(src.name.replace(".jsonl", SUFFIX[kind]))
    if kind == "gz":
        try:
            from isal import igzip as gzip_mod
        except ImportError:
            import gzip as gzip_mod
        with open(src, "rb") as f, gzip_mod.open(out, "wb", compresslevel=1) as g:
            shutil.copyfileobj(f, g, 1 << 20)
    elif kind == "xz":
        subprocess.run(["xz", "-T0", "-1", "-kfq", str(src)], check=True, timeout=3600)
    elif kind == "zst":
        subprocess.run(["zstd", "-T0", "-qf", str(src), "-o", str(out)], check=True, timeout=3600)
    return out


def sample(big: Path, out: Path, mb: float) -> Path:
    """Every k-th line of the corpus up to `mb` MB: distinct text, as Megatron's caches would meet it."""
    with open(big, "rb") as f:
        lines = f.readlines()
    step = max(1, int(sum(map(len, lines)) / (mb * 2**20)))
    with open(out, "wb") as o:
        budget = mb * 2**20
        for line in lines[::step]:
            if budget <= 0:
                break
            o.write(line)
            budget -= len(line)
    return out


# --- bsops -----------------------------------------------------------------------------------

def run_bsops(inputs: list[Path], prefix: str, workers: int, backend: str = "auto") -> dict:
    """Wall, main-process and worker CPU seconds of preprocess() as `bsops preprocess` runs it (a
    fastokens run cross-checks 1% of the text with tiktoken); the tokenizers are built beforehand."""
    from bigscience_ops.data.preprocess import preprocess
    from bigscience_ops.data.tokenizer import resolve_tokenizer

    t0, (m0, c0) = time.perf_counter(), cpu_split()
    r = preprocess(inputs, prefix, resolve_tokenizer("gpt2", backend=backend), ("text",), append_eod=True,
                   workers=workers)
    m1, c1 = cpu_split()
    return {"wall": time.perf_counter() - t0, "main": m1 - m0, "workers": c1 - c0, "mb": r.bytes_in / 2**20,
            "mode": r.mode, "out": r.outputs["text"], "tokenizer": r.tokenizer}


def same_bytes(a: str, b: str) -> bool:
    return all(Path(a + ext).read_bytes() == Path(b + ext).read_bytes() for ext in (".bin", ".idx"))


def startup(folder: Path, runs: int) -> tuple[list[float], list[float]]:
    """`bsops preprocess` on a 0.25 MB file in fresh processes: (start-up CPU s, whole-run CPU s) per run."""
    with lzma.open(REPO / "corpus" / "kjv.jsonl.xz", "rb") as f:
        data = f.read(1 << 18)
    small = folder / "small.jsonl"
    small.write_bytes(data[:data.rfind(b"\n") + 1])
    bsops = str(Path(sys.executable).with_name("bsops"))
    argv = [bsops, "preprocess", "--input", str(small), "--tokenizer", "gpt2", "--append-eod",
            "--output-prefix", str(folder / "small")]
    subprocess.run(argv, capture_output=True, check=True, timeout=300)  # fills the user cache if empty
    starts, totals = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        starts.append(float(out.split("start-up ")[1].split()[0]))
        totals.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return starts, totals


def decoder_rates(files: dict[str, Path]) -> dict[str, float]:
    """MB/s of jsonl per core of each decoder alone, over the large compressed files."""
    from bigscience_ops.data import xz
    from bigscience_ops.data.inputs import open_decoded

    def rate(read) -> float:
        c0 = time.process_time()
        n = read()
        return n / 2**20 / max(time.process_time() - c0, 1e-9)

    def drain(path: Path, opener) -> int:
        n = 0
        with open(path, "rb") as raw, opener(path, raw) as r:
            while chunk := r.read(1 << 21):
                n += len(chunk)
        return n

    import gzip

    rates = {"gz (isal)": rate(lambda: drain(files["gz"], open_decoded)),
             "gz (Python's gzip)": rate(lambda: drain(files["gz"], lambda p, raw: gzip.GzipFile(fileobj=raw))),
             "zst (zstandard)": rate(lambda: drain(files["zst"], open_decoded)),
             "xz (lzma, one stream)": rate(lambda: drain(files["xz"], open_decoded))}
    blocks = xz.blocks(str(files["xz"]))
    rates[f"xz (a block at a time, {len(blocks)} blocks)"] = rate(
        lambda: sum(len(xz.read_span(str(files["xz"]), blocks, a, b)) for a, b in xz.spans(blocks, 1)))
    return rates


# --- the pipeline model ----------------------------------------------------------------------

def busy_fraction(shards: int, workers: int) -> float:
    from bigscience_ops.data.preprocess import _busy_fraction

    return _busy_fraction([1] * shards, workers)


def main_work(kind: str, shards: int | None) -> str:
    """What the main process does per MB in a configuration (its limit's name in the model)."""
    if shards is not None:
        return "the main process (appending finished parts; none with --output-per-input)"
    if kind in ("gz", "zst"):
        return "the main process (decompressing, handing chunks out, appending tokens)"
    return "the main process (cutting chunks, appending tokens)"


def predict(run: dict, cores: int, shards: int | None, kind: str = "jsonl") -> tuple[float, str]:
    """MB/s at `cores` cores from one run's CPU per MB: the main process is one core (it reads or
    decompresses, hands chunks out and appends results), the workers share every core with it, and
    whole shards keep only as many workers busy as a longest-first schedule allows."""
    main, work = run["main"] / run["mb"], run["workers"] / run["mb"]  # CPU s per MB
    limits = {main_work(kind, shards): 1 / main if main > 0 else float("inf")}
    if shards is None:
        limits["CPU (workers and main)"] = cores / (main + work)
    else:
        busy = busy_fraction(shards, cores)
        name = "CPU (workers and main)" if busy > 0.99 else f"the shard count ({shards} whole shards leave workers idle)"
        limits[name] = busy * cores / (main + work)
    bottleneck = min(limits, key=limits.get)
    return limits[bottleneck], bottleneck


def print_model(runs: dict, shards: int, max_workers: int) -> None:
    print(f"\npipeline model: MB/s predicted from the {max_workers}-worker runs' CPU per MB (CPU time, so "
          "load changes it little; 'measured' is wall time under this run's load). The main process is one "
          "core; the workers share all cores with it; storage is assumed to keep up (the output is ~1/2 the "
          "jsonl's size)")
    print(f"  {'configuration':<22} {'main ms/MB':>10} {'workers ms/MB':>13} {'measured':>9} "
          + " ".join(f"{f'{c} cores':>9}" for c in CORES) + "   limited at 128 cores by")
    for (kind, layout), run in runs.items():
        n = shards if layout == "shards" else None
        preds = [predict(run, c, n, kind) for c in CORES]
        print(f"  {kind + ', ' + ('one file' if n is None else f'{n} shards'):<22} {1000 * run['main'] / run['mb']:10.1f} "
              f"{1000 * run['workers'] / run['mb']:13.1f} {run['mb'] / run['wall']:9.1f} "
              + " ".join(f"{p[0]:9.0f}" for p in preds) + f"   {preds[-1][1]}")
        steps = [(c, predict(run, c, n, kind)[1]) for c in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
        changes = [(c, b) for i, (c, b) in enumerate(steps) if i == 0 or b != steps[i - 1][1]]
        meet = (run["main"] + run["workers"]) / run["main"] if run["main"] > 0 else float("inf")
        print(f"  {'':<22} " + "; then ".join(f"{b} from {c} core{'s' if c > 1 else ''}" for c, b in changes)
              + f" (the CPU and main-process limits meet at {meet:.0f} cores)")


# --- main ------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-mb", type=float, default=400, help="size of the corpus (MB of jsonl)")
    ap.add_argument("--shards", type=int, default=64, help="shards the corpus is also cut into")
    ap.add_argument("--max-workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeat", type=int, default=1, help="bsops runs per setting (best wall time kept)")
    ap.add_argument("--input", type=Path, default=None, help="your jsonl ('text' key) instead of the built corpus")
    ap.add_argument("--quick", action="store_true", help="40 MB: a smoke test of every line, about a minute")
    ap.add_argument("--workdir", type=Path, default=None, help="where the corpus goes (default: $TMPDIR)")
    args = ap.parse_args()
    if args.quick:
        args.scale_mb = min(args.scale_mb, 40)
    load = os.getloadavg()
    print(f"{len(os.sched_getaffinity(0))} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start"
          + ("" if load[0] < 0.5 else " (the machine is busy: scaling ratios are understated)"))
    from bigscience_ops.data.tokenizer import (build_tokenizer, gpt2_files_from_package, reference_tokenizer,
                                               resolve_tokenizer)

    with tempfile.TemporaryDirectory(dir=args.workdir) as d:
        tmp = Path(d)
        starts, totals = startup(tmp, 5)
        print(f"\nstart-up before the first document, `bsops preprocess` on a 0.25 MB file (5 runs, user cache warm): "
              f"median {statistics.median(starts):.2f} CPU s (min {min(starts):.2f}; target < 0.3), whole run "
              f"{statistics.median(totals):.2f} CPU s")
        for backend in ("auto", "tiktoken"):  # built once; forked workers inherit them
            build_tokenizer(resolve_tokenizer("gpt2", backend=backend))
        reference_tokenizer(resolve_tokenizer("gpt2"))

        t0 = time.perf_counter()
        big, shard_paths = build_corpus(tmp, args.scale_mb, args.shards, args.input)
        files = {"jsonl": big}
        shard_files = {"jsonl": shard_paths}
        for kind in KINDS[1:]:
            files[kind] = compress(kind, big)
            shard_files[kind] = [compress(kind, p) for p in shard_paths]
        mb = big.stat().st_size / 2**20
        print(f"\ncorpus: {mb:.0f} MB of jsonl, one file and {args.shards} shards, each plain, "
              + ", ".join(f"{k} ({files[k].stat().st_size / 2**20:.0f} MB)" for k in KINDS[1:])
              + f"; made in {time.perf_counter() - t0:.0f} s")

        baseline_tok = MegatronGPT2BPE(*gpt2_files_from_package())  # loading not timed, as Megatron's rates
        small = sample(big, tmp / "sample.jsonl", 4)
        base_s, base_cpu = run_baseline(small, str(tmp / "megatron"), baseline_tok)
        small_mb = small.stat().st_size / 2**20
        ours = run_bsops([small], str(tmp / "sample_bsops"), 1, backend="fastokens")
        if not same_bytes(ours["out"], str(tmp / "megatron")):
            raise SystemExit("bsops' .bin/.idx on the sample differ from Megatron's")
        megatron_rate = small_mb / base_cpu
        print(f"\nMegatron's pure-Python GPT-2 BPE, 1 process, on a {small_mb:.1f} MB sample: "
              f"{megatron_rate:.2f} MB per CPU s; bsops (fastokens) on the same sample: "
              f"{small_mb / (ours['main'] + ours['workers']):.1f} MB per CPU s = "
              f"{base_cpu / (ours['main'] + ours['workers']):.1f}x; bytes identical")

        print(f"\n{'input':<16} {'workers':>7} {'mode':<10} {'wall s':>7} {'MB/s':>7} {'main CPU':>9} "
              f"{'workers CPU':>11} {'MB/CPU s':>9} {'x Megatron':>10}  {'x 1 worker':>10}")
        reference = None
        model_runs: dict = {}
        scaling: dict = {}
        for layout in ("file", "shards"):
            for kind in KINDS:
                inputs = [files[kind]] if layout == "file" else shard_files[kind]
                one = None
                for workers in range(1, args.max_workers + 1):
                    prefix = str(tmp / f"out_{layout}_{kind}_{workers}")
                    runs = [run_bsops(inputs, prefix, workers) for _ in range(args.repeat)]
                    r = min(runs, key=lambda x: x["wall"])
                    if reference is None:
                        reference = r["out"]
                    elif not same_bytes(r["out"], reference):
                        raise SystemExit(f"{layout} {kind} --workers {workers}: .bin/.idx differ from the "
                                         "plain single-worker run's")
                    elif r["out"] != reference:
                        for ext in (".bin", ".idx"):
                            os.unlink(r["out"] + ext)
                    one = one or r
                    cpu = r["main"] + r["workers"]
                    scale = "" if workers == 1 else (f"{one['wall'] / r['wall']:5.2f}x = "
                                                     f"{one['wall'] / r['wall'] / workers:4.2f} x N")
                    name = f"{kind}, " + ("1 file" if layout == "file" else f"{args.shards} shards")
                    print(f"{name:<16} {workers:>7} {r['mode']:<10} {r['wall']:7.2f} {r['mb'] / r['wall']:7.1f} "
                          f"{r['main']:9.2f} {r['workers']:11.2f} {r['mb'] / cpu:9.1f} "
                          f"{r['mb'] / cpu / megatron_rate:10.1f}  {scale}", flush=True)
                    model_runs[(kind, layout)] = r
                    scaling[(kind, layout, workers)] = r["wall"]
        print("every .bin/.idx above: identical to the plain single-worker run's")
        if args.max_workers > 1:
            one, many = scaling[("jsonl", "file", 1)], scaling[("jsonl", "file", args.max_workers)]
            load_now = os.getloadavg()[0]
            print(f"scaling, one plain file: {args.max_workers} workers = {one / many:.2f}x one worker = "
                  f"{one / many / args.max_workers:.2f} x N (target >= 0.8 x N on a quiet machine; load average "
                  f"now {load_now:.2f})")

        print("\ndecoders alone (MB/s of jsonl per core):")
        for name, rate in decoder_rates(files).items():
            print(f"  {name:<36} {rate:8.0f}")
        print_model(model_runs, args.shards, args.max_workers)
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")


if __name__ == "__main__":
    main()
