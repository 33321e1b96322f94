"""Benchmark: `bsops status`, `info` and `logs` on hostile main_log.txt files against a normal one, side by side.

A crashed node on NFS leaves hundreds of MB of NUL bytes at the end of main_log.txt, and a process can
print a line of hundreds of MB without a line break; reading the end of the log used to grow with the
square of that last line (64 MB of NULs: 112 s). Every reader now reads a fixed number of bytes from the
end (bigscience_ops/run/log.py), so the three commands must answer in the same time whatever the log ends
with: under 2 s. Four logs of one experiment, each in a run folder of its own:

  normal  iteration lines only, as large as the single-line log (`--mb`)
  line    a few iteration lines, then one line of `--mb` MB without a line break
  nuls    a few iteration lines, then `--nul-mb` MB of NUL bytes (written, not a sparse hole)
  small   a few iteration lines (the baseline: the commands' start-up)

Each command runs as a fresh `bsops` process (what the hourly job and the on-call person run), `--repeat`
times; the median wall time is printed per command and log, with its ratio to the small log's. `status`
runs with a stand-in squeue (no cluster needed) that shows the run's recorded array RUNNING, so it reads
the log twice: for progress (alerts.stall_minutes) and for training health (the tail of iteration lines).

    python benchmarks/log_tail.py                   # 300 MB line, 256 MB of NULs
    python benchmarks/log_tail.py --mb 64 --nul-mb 64 --repeat 1   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

ITERATION = (" iteration {i:8d}/  311541 | consumed samples:    153013584 | elapsed time per iteration (ms): 42000.0 | "
             "learning rate: 5.997E-05 | global batch size:  2048 | lm loss: 2.291E+00 | loss scale: 1.0 | "
             "grad norm: 0.300 | number of skipped iterations:   0 | number of nan iterations:   0 | "
             "samples per second: 48.762 | TFLOPs: 150.00 |\n")
COMMANDS = {
    "status": ["status", "{exp}", "--no-email", "alerts.stall_minutes=60", "--timeout", "10"],
    "info": ["info", "{exp}"],
    "logs": ["logs", "{exp}", "-n", "20"],
}
SQUEUE = """#!/bin/bash
# A stand-in squeue: the run's recorded array 4242, task 1, RUNNING; records end with this query's terminator.
d=$'\\x1f'
t=${{SQUEUE_FORMAT##*$d}}
printf '%s\\n' "4242_1${{d}}4242${{d}}1${{d}}4243${{d}}bench${{d}}RUNNING${{d}}None${{d}}p${{d}}1${{d}}n1${{d}}\
0:10:00${{d}}20:00:00${{d}}{start}${{d}}{start}${{d}}(null)${{d}}{name}${{d}}$t"
"""


def _write_lines(path: Path, count: int, first: int = 1) -> None:
    with open(path, "ab") as f:
        for start in range(first, first + count, 10_000):
            f.write("".join(ITERATION.format(i=i) for i in range(start, min(start + 10_000, first + count)))
                    .encode())


def _write_filler(path: Path, megabytes: int, byte: bytes) -> None:
    block = byte * (1 << 20)
    with open(path, "ab") as f:
        for _ in range(megabytes):
            f.write(block)


def _prepare(root: Path, mb: int, nul_mb: int) -> dict[str, str]:
    """One experiment per log in root/trainings, each with its run folder, a recorded launch and its log."""
    trainings = root / "trainings"
    trainings.mkdir()
    names = {}
    for case in ("small", "normal", "line", "nuls"):
        name = f"bench-{case}"
        run = root / "runs" / name
        (run / "logs").mkdir(parents=True)
        (trainings / f"{name}.yaml").write_text(f"base: tiny\npaths: {{output: {json.dumps(str(run))}}}\n")
        (run / "task-ledger.jsonl").write_text(json.dumps(
            {"event": "launch", "job_id": "4242", "nodes": "", "iteration": 0, "time": time.time()}) + "\n")
        log = run / "logs" / "main_log.txt"
        _write_lines(log, 500)
        if case == "normal":
            _write_lines(log, (mb << 20) // len(ITERATION), first=501)
        elif case == "line":
            _write_filler(log, mb, b"x")
        elif case == "nuls":
            _write_filler(log, nul_mb, b"\0")
        names[case] = name
    return names


def _bin(root: Path, names: dict[str, str]) -> Path:
    """A folder of stand-in squeue scripts, one per experiment name, chosen by the BENCH_NAME variable."""
    folder = root / "bin"
    folder.mkdir()
    start = (datetime.now() - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S")
    script = folder / "squeue"
    script.write_text(SQUEUE.format(start=start, name="$BENCH_NAME"))
    script.chmod(0o755)
    return folder


def _time(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(repeat):
        began = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
        times.append(time.perf_counter() - began)
        code = done.returncode
        if code not in (0, 1):  # status exits 1 on an alert: the watchdog worked
            sys.exit(f"{' '.join(argv)} exited {code}: {done.stderr.decode(errors='replace')[-2000:]}")
    return statistics.median(times), code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="size of the single line (and of the normal log), MB")
    parser.add_argument("--nul-mb", type=int, default=256, help="NUL bytes at the end of the NUL log, MB")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command and log (the median is shown)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the logs (default: a temp folder)")
    args = parser.parse_args()
    bsops = shutil.which("bsops", path=str(Path(sys.executable).parent)) or "bsops"
    root = Path(tempfile.mkdtemp(prefix="bsops-log-tail-", dir=args.dir))
    try:
        began = time.perf_counter()
        names = _prepare(root, args.mb, args.nul_mb)
        sizes = {case: (root / "runs" / name / "logs" / "main_log.txt").stat().st_size for case, name in names.items()}
        print(f"logs written in {time.perf_counter() - began:.1f} s: "
              + ", ".join(f"{case} {size / 2**20:.1f} MiB" for case, size in sizes.items()))
        env = {**os.environ, "PATH": f"{_bin(root, names)}:{Path(sys.executable).parent}:{os.environ['PATH']}",
               "BSOPS_TRAININGS": str(root / "trainings")}
        env.pop("SLURM_CONF", None)
        cases = list(names)
        print(f"{'command':<8}" + "".join(f"{case:>16}" for case in cases) + "   (median of "
              f"{args.repeat}; seconds, x the small log)")
        worst = 0.0
        for command, template in COMMANDS.items():
            row = []
            for case in cases:
                argv = [bsops, *(word.format(exp=names[case]) for word in template)]
                seconds, _ = _time(argv, {**env, "BENCH_NAME": names[case]}, args.repeat)
                row.append(seconds)
                if case != "small":
                    worst = max(worst, seconds)
            print(f"{command:<8}" + "".join(f"{s:>9.2f} x{s / row[0]:<5.1f}" for s in row))
        print(f"slowest answer on a large log: {worst:.2f} s ({'under' if worst < 2 else 'OVER'} the 2 s limit)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
