"""Benchmark: `bsops eval run tiny --latest` on the bundled example, and the memory of bits per byte on a 100 MB source.

Two measurements, each against what the issue asks (issue 32):

  time     `bsops eval run EXP --latest` of the bundled example (corpus/eval/: kjv_last_word and kjv_two_choice
           through lm-eval, bits per byte on kjv_epistles and kjv_revelation) on a trained `tiny` run, in tiny's
           own layout (PP=2, two CPU processes), as a fresh `bsops` process: the wall time, `--repeat` times,
           against the limit of a minute on 2 cores, and the CPU time of all its processes (what other work
           on the machine does not change). Without `--run` a run is trained first
           (`bsops launch tiny --local`, a few minutes). The experiment evaluated is `base: tiny` with the
           bundled example as its `eval:` section and the run's checkpoints; its results and TensorBoard files
           go to a temp folder, never into the run given.
  memory   peak RSS of scoring a generated held-out source of `--mb` MB (KJV chapters, `--doc-kb` KB documents,
           every document scored: no docs_per_source cap) with bits per byte (ops/evaluate/bpb.py), against a
           baseline measured in the same run: the same scoring of a 1 MB source. Each in a fresh process. bpb.py
           streams, so both peaks should be nearly the same; the growth is printed against the source's size.
           The model is a unigram model over the bundled tokenizer (token frequencies of every 10th training
           chapter of tiny, numpy), a Scorer that costs next to nothing, so the time and memory are bpb.py's and the
           harness's own: reading, tokenizing, windowing and batching.

    python benchmarks/eval.py                              # both; trains tiny first
    python benchmarks/eval.py --run runs/tiny              # both, on an existing tiny run folder
    python benchmarks/eval.py --only memory --mb 100       # memory only (no run needed)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVAL = {
    "tasks": ["corpus/eval/kjv_last_word.yaml", "corpus/eval/kjv_two_choice.yaml"],
    "sources": {"kjv_epistles": "corpus/eval/kjv_epistles.jsonl", "kjv_revelation": "corpus/eval/kjv_revelation.jsonl"},
}
LIMIT_SECONDS = 60.0  # issue 32: `bsops eval` of tiny's bundled example in under a minute on 2 cores
BASELINE_MB = 1


def _bsops() -> str:
    return shutil.which("bsops", path=str(Path(sys.executable).parent)) or "bsops"


def _offline_env(root: Path) -> dict[str, str]:
    """No network, no cache of the user's: lm-eval reads the local jsonl through `datasets`."""
    env = {**os.environ, "HF_HOME": str(root / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "BSOPS_RUNS_INDEX": str(root / "runs-index.jsonl")}
    env.pop("SLURM_CONF", None)
    for name in [n for n in env if n.startswith("SLURM_")]:  # a `bsops eval` inside a job would go through srun
        env.pop(name)
    return env


def _cores(argv: list[str], cores: int) -> list[str]:
    """ARGV pinned to the first CORES cores when the machine has more (taskset), so the limit is the issue's."""
    if cores and (os.cpu_count() or 1) > cores and shutil.which("taskset"):
        return ["taskset", "-c", f"0-{cores - 1}", *argv]
    return argv


def _train(root: Path, env: dict[str, str]) -> Path:
    out = root / "trained"
    began = time.perf_counter()
    done = subprocess.run([_bsops(), "launch", "tiny", "--local", "--out", str(out)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"bsops launch tiny --local exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    print(f"trained tiny in {time.perf_counter() - began:.0f} s: {out}")
    return out


def _latest(checkpoints: Path) -> str:
    latest = checkpoints / "latest"
    if not latest.is_file():
        sys.exit(f"{checkpoints} has no `latest` file: give --run a trained tiny run folder "
                 "(or leave it out to train one)")
    return latest.read_text().strip()


def time_eval(run: Path, root: Path, repeat: int, cores: int) -> float:
    """Median wall time of `bsops eval run bench-eval --latest`, bench-eval being tiny with the bundled example."""
    env = _offline_env(root)
    checkpoints = run / "checkpoints"
    tag = _latest(checkpoints)
    trainings = root / "trainings"
    trainings.mkdir(exist_ok=True)
    output = root / "eval-run"
    experiment = {"base": "tiny", "paths": {"output": str(output), "checkpoints": str(checkpoints)}, "eval": EVAL}
    (trainings / "bench-eval.yaml").write_text(json.dumps(experiment, indent=1) + "\n")  # JSON is YAML
    env["BSOPS_TRAININGS"] = str(trainings)
    argv = _cores([_bsops(), "eval", "run", "bench-eval", "--latest"], cores)
    times = []
    for i in range(repeat):
        shutil.rmtree(output / "eval", ignore_errors=True)
        began, cpu = time.perf_counter(), _children_cpu()
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        times.append(time.perf_counter() - began)
        if done.returncode != 0:
            sys.exit(f"{' '.join(argv)} exited {done.returncode}: {(done.stdout + done.stderr)[-4000:]}")
        print(f"  run {i + 1}: {times[-1]:.1f} s wall, {_children_cpu() - cpu:.1f} s of CPU (all its processes; "
              f"load average {os.getloadavg()[0]:.1f})")
    result_file = output / "eval" / f"{tag}.json"
    _print_result(result_file, done.stdout)
    return statistics.median(times)


def _children_cpu() -> float:
    """User + system seconds of the finished child processes (and theirs: torchrun's ranks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _print_result(path: Path, stdout: str) -> None:
    if not path.is_file():
        print(f"(no result file {path}; the command printed:)\n{stdout[-3000:]}")
        return
    result = json.loads(path.read_text())
    rows = []
    for task, values in sorted(result.get("results", {}).items()):
        for key, value in sorted(values.items()):
            if isinstance(value, (int, float)) and "_stderr" not in key and key != "sample_len":
                rows.append((f"{task}/{key.removesuffix(',none')}", value))
    for source, values in sorted(result.get("bsops", {}).get("bits_per_byte", {}).items()):
        rows.append((f"{source}/bits_per_byte", values["bits_per_byte"]))
    bsops = result.get("bsops", {})
    print(f"  {path.name}: step {bsops.get('step')}, evaluation itself {bsops.get('seconds', float('nan')):.1f} s "
          f"(the rest of the wall time: start-up of bsops, torchrun, torch, lm-eval)")
    for name, value in rows:
        print(f"    {name:<32} {value:.4f}")


# --- memory of bits per byte --------------------------------------------------------------------------------------

def write_source(path: Path, megabytes: int, doc_kb: int) -> int:
    """A jsonl source of about MEGABYTES MB: documents of DOC_KB KB of consecutive KJV chapters, the corpus repeated."""
    import lzma

    with lzma.open(REPO / "corpus" / "kjv.jsonl.xz", "rt", encoding="utf-8") as f:
        chapters = [json.loads(line)["text"] for line in f]
    target, written, i, n = megabytes << 20, 0, 0, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            parts, size = [], 0
            while size < doc_kb << 10:
                parts.append(chapters[i % len(chapters)])
                size += len(parts[-1])
                i += 1
            line = json.dumps({"id": f"doc{n}", "text": "\n".join(parts)}, ensure_ascii=False) + "\n"
            out.write(line)
            written += len(line.encode())
            n += 1
    return n


class UnigramScorer:
    """A unigram model as bsops' Scorer: log p(token) from token counts of tiny's training chapters (add-one)."""

    def __init__(self, tokenizer, max_length: int = 128) -> None:
        import lzma

        import numpy as np

        self.max_length, self.vocab_size, self.eod = max_length, tokenizer.vocab_size, tokenizer.eod
        counts = np.ones(self.vocab_size, dtype=np.float64)
        with lzma.open(REPO / "corpus" / "kjv.jsonl.xz", "rt", encoding="utf-8") as f:
            for line in list(f)[:1129:10]:  # every 10th of tiny's training documents (data.split 949,50,1 of 1189)
                np.add.at(counts, tokenizer.encode_array(json.loads(line)["text"]), 1)
        self.logp = np.log(counts / counts.sum())
        self.best = int(counts.argmax())

    def score(self, items):
        import numpy as np

        out = []
        for _, continuation in items:
            ids = np.asarray(continuation)
            out.append((float(self.logp[ids].sum()), bool((ids == self.best).all())))
        return out

    def next_tokens(self, contexts):
        return [self.best] * len(contexts)

    def close(self) -> None:
        pass


def score_source(path: str) -> None:
    """(In a fresh process.) Bits per byte of every document of PATH; print a JSON line with the peak RSS."""
    from bigscience_ops.data.corpus import TOKENIZER_FILE
    from bigscience_ops.data.tokenizer import TokenizerSpec, build_tokenizer
    from bigscience_ops.ops.evaluate.bpb import bits_per_byte
    from bigscience_ops.ops.evaluate.harness import BsopsLM

    tokenizer = build_tokenizer(TokenizerSpec("json", json_file=str(TOKENIZER_FILE), backend="tokenizers"))
    lm = BsopsLM(UnigramScorer(tokenizer), tokenizer, batch_size=8)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    result = bits_per_byte(path, lm, docs=10**9 - 1)
    print(json.dumps({"seconds": time.perf_counter() - began, "before_kb": before,
                      "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "bits_per_byte": result.bits_per_byte, "documents": result.documents, "bytes": result.bytes,
                      "tokens": result.tokens}))


def memory(root: Path, megabytes: int, doc_kb: int) -> None:
    rows = []
    for mb in (BASELINE_MB, megabytes):
        path = root / f"source-{mb}mb.jsonl"
        docs = write_source(path, mb, doc_kb)
        done = subprocess.run([sys.executable, __file__, "--score-source", str(path)], capture_output=True, text=True,
                              timeout=3600, cwd=root, env=_offline_env(root))
        if done.returncode != 0:
            sys.exit(f"scoring {path} exited {done.returncode}: {done.stderr[-3000:]}")
        rows.append((mb, path.stat().st_size, docs, json.loads(done.stdout.strip().splitlines()[-1])))
        path.unlink()
    print(f"{'source':>8} {'docs':>6} {'tokens':>10} {'bits/byte':>9} {'seconds':>8} {'RSS before':>11} "
          f"{'peak RSS':>9}")
    for mb, size, docs, r in rows:
        print(f"{size / 2**20:>5.1f} MB {docs:>6} {r['tokens']:>10} {r['bits_per_byte']:>9.4f} {r['seconds']:>8.1f} "
              f"{r['before_kb'] / 1024:>8.0f} MB {r['peak_kb'] / 1024:>6.0f} MB")
    (_, small, _, base), (_, large, _, big) = rows
    growth = (big["peak_kb"] - base["peak_kb"]) * 1024
    print(f"peak RSS grows by {growth / 2**20:.2f} MB for {(large - small) / 2**20:.0f} MB more source "
          f"({growth / (large - small):.1%} of it): {'bounded' if growth < 0.05 * (large - small) else 'NOT bounded'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("time", "memory"), default=None, help="run one measurement only")
    parser.add_argument("--run", type=Path, default=None, help="a trained tiny run folder (default: train one)")
    parser.add_argument("--repeat", type=int, default=2, help="`bsops eval` runs (the median is shown)")
    parser.add_argument("--cores", type=int, default=2, help="cores `bsops eval` may use (taskset; 0: all)")
    parser.add_argument("--mb", type=int, default=100, help="size of the large held-out source, MB")
    parser.add_argument("--doc-kb", type=int, default=32, help="size of each of its documents, KB")
    parser.add_argument("--dir", type=Path, default=None, help="where to work (default: a temp folder)")
    parser.add_argument("--score-source", help=argparse.SUPPRESS)  # the memory measurement's child process
    args = parser.parse_args()
    if args.score_source:
        score_source(args.score_source)
        return
    root = Path(tempfile.mkdtemp(prefix="bsops-eval-bench-", dir=args.dir))
    try:
        if args.only in (None, "time"):
            run = args.run.resolve() if args.run else _train(root, _offline_env(root))
            print(f"bsops eval run --latest of the bundled example on {run} ({args.cores or 'all'} cores, "
                  f"{os.cpu_count()} on the machine):")
            seconds = time_eval(run, root, args.repeat, args.cores)
            print(f"bsops eval: {seconds:.1f} s (median of {args.repeat}; "
                  f"{'under' if seconds < LIMIT_SECONDS else 'OVER'} the {LIMIT_SECONDS:.0f} s limit)")
        if args.only in (None, "memory"):
            memory(root, args.mb, args.doc_kb)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
