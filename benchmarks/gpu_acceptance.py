"""The GPU acceptance command: what a release must do on one GPU, in one run of a few minutes, as one table.

Checks (each a row or rows of pass/fail with its figures; `--only` picks some):

  env         the GPU, driver, Python, torch, CUDA, DeepSpeed, Triton, transformers, lm-eval versions
  matrix      precision (fp32, bf16, fp16) x ZeRO stage (0, 1): `bsops launch NAME --local` of a shrunk tiny
              (PP=1, one GPU) as a job array of two tasks, the second resuming from the first's checkpoint,
              beside the same experiment trained uninterrupted (one task); passes when both exit 0, the
              second task resumed from the first's save, every iteration was logged once, the loss scale of
              the first line is the wrapper's (4096 for fp16, else 1) and the resumed run's losses equal the
              uninterrupted run's (figure: the largest relative difference; GPUs may differ in the last bits)
  eval        `bsops eval` of the bf16 ZeRO-0 run's last checkpoint against lm-eval's own `hf` backend on
              `bsops convert`'s export, both in bf16, on tiny's bundled tasks: at most 2% of the answers differ
              (bf16 rounding flips near-ties), the other metrics within 1e-2 relative
  kernels     the kernel tests (tests/kernels/test_kernels_*.py) compiled for the GPU, 8 pytest-xdist workers
  throughput  benchmarks/train_throughput.py at gpt2-124m and 760m: the trainer against the plain PyTorch
              loop and the compiled plain loop (figures: each one's MFU and the trainer's ratios)

    python benchmarks/gpu_acceptance.py [--out DIR] [--only env,matrix,eval,kernels,throughput]
                                        [--device cuda|cpu] [--budget-s 480] [--dry-run]

`--device cpu` rehearses the env, matrix and eval checks on a CPU (fp32 and bf16; fp16 needs a GPU), smaller and
slower. The table is printed and written to DIR/acceptance.md with DIR/acceptance.json; benchmarks/gpu.sh runs
this with the wheels the GPU machine lacks (see benchmarks/RESULTS.md). Exit status: 0 when every row passed,
1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKS = ("env", "matrix", "eval", "kernels", "throughput")
PRECISIONS = ("fp32", "bf16", "fp16")
INITIAL_SCALE = 2.0**12  # render.deepspeed_config's initial_scale_power
LOSS_TOLERANCE = 1e-3
ACC_FLIPS, METRIC_TOLERANCE = 0.02, 1e-2  # eval: answers that may differ in bf16, relative tolerance of the rest
ITERATION = re.compile(r"^ iteration\s+(\d+)/\s*\d+ \|.*?\| lm loss: ([0-9.eE+-]+|nan|inf) \| loss scale: ([0-9.eE+-]+) \|")


@dataclasses.dataclass
class Row:
    check: str
    what: str
    ok: bool | None  # None: not run (skipped, with why in `figures`)
    figures: str = ""
    seconds: float = 0.0


def table(rows: list[Row], header: str = "") -> str:
    """The rows as one Markdown table, with a closing line of counts."""
    mark = {True: "pass", False: "FAIL", None: "skip"}
    lines = [header] if header else []
    lines += ["| check | what | result | figures | s |", "|---|---|---|---|---:|"]
    for r in rows:
        figures = r.figures.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.check} | {r.what} | {mark[r.ok]} | {figures} | {r.seconds:.0f} |")
    passed, failed = sum(r.ok is True for r in rows), sum(r.ok is False for r in rows)
    lines.append(f"\n{passed} passed, {failed} failed, {sum(r.ok is None for r in rows)} skipped")
    return "\n".join(lines) + "\n"


def parse_only(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--only {value!r}: unknown check(s) {unknown}; choose from {', '.join(CHECKS)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_acceptance.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "acceptance")),
                        help="folder for the runs, logs and the table (default: $OUT, else ./acceptance)")
    parser.add_argument("--only", type=parse_only, default=CHECKS, help=f"comma-separated: {','.join(CHECKS)}")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--budget-s", type=int, default=480, help="stop starting checks past this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s {args.budget_s}: must be a positive number of seconds")
    return args


# ----------------------------------------------------------------------------- running things

def bsops(*args: str, cwd: Path, timeout: float, log: Path) -> subprocess.CompletedProcess:
    """`bsops ARGS` in `cwd`, output kept in `log`. This repository is importable and `bsops` and `torchrun` are on
    the PATH of what it starts (the job script calls both): a source tree on a machine where bsops is not
    installed runs as it would installed."""
    shims = Path(tempfile.gettempdir()) / f"bsops-acceptance-bin-{os.getpid()}"
    shim = shims / "bsops"
    if not shim.exists():  # written once, before the matrix's threads start their launches
        shims.mkdir(exist_ok=True)
        staged = shims / ".bsops"
        staged.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "from bigscience_ops.cli import main; main()" "$@"\n')
        staged.chmod(0o755)
        staged.rename(shim)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])),
           "PATH": os.pathsep.join([str(shims), str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    return run([str(shim), *args], cwd=cwd, timeout=timeout, log=log, env=env)


def run(argv: list[str], *, cwd: Path, timeout: float, log: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        proc = subprocess.CompletedProcess(argv, 124, out, f"timed out after {timeout:.0f} s")
    log.write_text(f"$ {' '.join(argv)}\n{proc.stdout}\n--- stderr\n{proc.stderr}\nexit {proc.returncode}\n")
    return proc


def losses(log_text: str) -> dict[int, tuple[float, float]]:
    """iteration -> (lm loss, loss scale) of each Megatron line."""
    out = {}
    for line in log_text.splitlines():
        m = ITERATION.match(line)
        if m:
            out[int(m[1])] = (float(m[2]), float(m[3]))
    return out


def max_rel_diff(a: dict[int, tuple[float, float]], b: dict[int, tuple[float, float]]) -> float:
    return max((abs(a[k][0] - b[k][0]) / max(abs(b[k][0]), 1e-12) for k in b if k in a), default=float("inf"))


# ----------------------------------------------------------------------------- the checks

def check_env(args, deadline: float) -> list[Row]:
    code = ("import sys, torch; from importlib.metadata import version as v\n"
            "def ver(n):\n    try: return v(n)\n    except Exception: return 'absent'\n"
            "gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'\n"
            "print(gpu, '| python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda,"
            " *[f'| {n} {ver(n)}' for n in ('deepspeed', 'triton', 'transformers', 'lm_eval')])")
    start = time.time()
    proc = run([sys.executable, "-c", code], cwd=REPO, timeout=60, log=args.out / "logs" / "env.txt")
    ok = proc.returncode == 0 and (args.device == "cpu" or "no GPU" not in proc.stdout)
    return [Row("env", "versions", ok, proc.stdout.strip() or proc.stderr.strip()[-300:], time.time() - start)]


def experiment_yaml(precision: str, zero: int, device: str, whole: bool) -> str:
    """tiny on one process (PP=1), shorter: two array tasks (the second resuming) unless `whole`."""
    samples, exit_interval = (640, 40) if device == "cpu" else (1200, 60)  # 61 or 98 steps, tiny's rampup first
    return "\n".join([
        "base: tiny",
        f"description: acceptance {precision} ZeRO-{zero} {'uninterrupted' if whole else 'two array tasks'}",
        f"parallel: {{pipeline: 1, zero_stage: {zero}}}",
        f"train: {{precision: {precision}, samples: {samples}}}",
        f"checkpoint: {{save_interval: 1000, exit_interval: {'null' if whole else exit_interval}}}",
        "logging: {log_interval: 1, eval_interval: 1000, eval_iters: 0}",
        f"slurm: {{device: {'gpu' if device == 'cuda' else 'cpu'}, nodes: 1, gpus_per_node: 1, array: {1 if whole else 2}}}",
        ""])


def _matrix_cell(args, precision: str, zero: int, project: Path, timeout: float) -> Row:
    start = time.time()
    names = {kind: f"acc-{precision}-z{zero}-{kind}" for kind in ("array", "whole")}
    procs = {}
    for kind, name in names.items():
        shutil.rmtree(project / "runs" / name, ignore_errors=True)  # an earlier acceptance run's: never judged again
        (project / "trainings" / f"{name}.yaml").write_text(experiment_yaml(precision, zero, args.device, kind == "whole"))
        procs[kind] = bsops("launch", name, "--local", cwd=project, timeout=timeout,
                            log=args.out / "logs" / f"matrix-{name}.txt")
    what = f"{precision} ZeRO-{zero}: 2 array tasks vs 1"
    failed = [f"{kind} exit {p.returncode}" for kind, p in procs.items() if p.returncode != 0]
    if failed:
        return Row("matrix", what, False, f"{', '.join(failed)} (logs/matrix-acc-{precision}-z{zero}-*.txt)",
                   time.time() - start)
    logs = {kind: (project / "runs" / name / "logs" / "main_log.txt") for kind, name in names.items()}
    texts = {kind: path.read_text(errors="replace") if path.exists() else "" for kind, path in logs.items()}
    lines = {kind: losses(text) for kind, text in texts.items()}
    whole, array = lines["whole"], lines["array"]
    resumed = re.search(r"resumed from \S*global_step(\d+)", texts["array"])
    scale = whole[min(whole)][1] if whole else float("nan")
    expected_scale = INITIAL_SCALE if precision == "fp16" else 1.0
    diff = max_rel_diff(array, whole)
    problems = []
    if not resumed:
        problems.append("task 2 did not resume")
    if not whole or sorted(array) != sorted(whole) or sorted(whole) != list(range(1, max(whole) + 1)):
        problems.append(f"iterations logged: {len(array)} vs {len(whole)}")
    if scale != expected_scale:
        problems.append(f"loss scale {scale:g}, expected {expected_scale:g}")
    if not diff <= LOSS_TOLERANCE:
        problems.append(f"losses differ by {diff:.2e} relative")
    figures = (f"resumed at {resumed[1] if resumed else '-'}, {len(whole)} iterations, loss scale {scale:g}, "
               f"max rel loss diff {diff:.1e}")
    return Row("matrix", what, not problems, figures + ("; " + "; ".join(problems) if problems else ""),
               time.time() - start)


def check_matrix(args, deadline: float) -> list[Row]:
    project = args.out / "project"
    (project / "trainings").mkdir(parents=True, exist_ok=True)
    bsops("--version", cwd=project, timeout=60, log=args.out / "logs" / "bsops-version.txt")  # the shim, once
    cells = [(p, z) for p in PRECISIONS for z in (0, 1)]
    rows, jobs = [], {}
    timeout = max(30.0, deadline - time.time())
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cells)) as pool:
        for precision, zero in cells:
            if precision == "fp16" and args.device == "cpu":
                rows.append(Row("matrix", f"fp16 ZeRO-{zero}", None, "fp16 needs a GPU"))
                continue
            jobs[(precision, zero)] = pool.submit(_matrix_cell, args, precision, zero, project, timeout)
    rows += [jobs[key].result() for key in cells if key in jobs]
    return rows


def check_eval(args, deadline: float) -> list[Row]:
    """bsops eval against lm-eval's hf backend on the export, both bf16, on the bf16 ZeRO-0 run of `matrix`."""
    start = time.time()
    project, name = args.out / "project", "acc-bf16-z0-whole"
    if not (project / "runs" / name / "checkpoints" / "latest").exists():
        return [Row("eval", "bsops eval vs hf (bf16)", None, f"no checkpoint of {name}: run the matrix check first")]
    timeout = max(30.0, deadline - time.time())
    export = args.out / "export-bf16"
    logs = args.out / "logs"
    convert = bsops("convert", name, "--out", str(export), "--dtype", "bfloat16", "--overwrite", cwd=project,
                    timeout=timeout, log=logs / "eval-convert.txt")
    ours = bsops("eval", "run", name, "--latest", cwd=project, timeout=timeout, log=logs / "eval-bsops.txt")
    if convert.returncode or ours.returncode:
        return [Row("eval", "bsops eval vs hf (bf16)", False, f"convert exit {convert.returncode}, eval exit "
                    f"{ours.returncode} (logs/eval-*.txt)", time.time() - start)]
    result = sorted((project / "runs" / name / "eval").glob("global_step*.json"))[-1]
    code = ("import json, sys\n"
            "from lm_eval.models.huggingface import HFLM\n"
            "from bigscience_ops.ops.evaluate import driver\n"
            "tasks = json.loads(sys.argv[2])\n"
            "hf = HFLM(pretrained=sys.argv[1], batch_size=8, device=sys.argv[3], dtype='bfloat16')\n"
            "print(json.dumps(driver.run_tasks(hf, tasks)['results']))\n")
    ours_json = json.loads(result.read_text())
    tasks = _bundled_tasks()
    hf = run([sys.executable, "-c", code, str(export), json.dumps(tasks), args.device], cwd=REPO, timeout=timeout,
             log=logs / "eval-hf.txt", env={**os.environ, "PYTHONPATH": str(REPO)})
    if hf.returncode:
        return [Row("eval", "bsops eval vs hf (bf16)", False, f"hf exit {hf.returncode} (logs/eval-hf.txt)",
                    time.time() - start)]
    theirs = json.loads(hf.stdout.strip().splitlines()[-1])
    rows = []
    for task, metrics in theirs.items():
        n = max(ours_json.get("n-samples", {}).get(task, {}).get("effective", 1), 1)
        worst, flipped, ok = 0.0, 0, True
        for key, value in metrics.items():
            mine = ours_json["results"].get(task, {}).get(key)
            if not isinstance(value, float) or "stderr" in key or mine is None:
                continue
            if key.startswith(("acc,", "acc_norm,")):  # bf16 rounding flips near-ties: at most 2% of the answers
                flipped = max(flipped, round(abs(mine - value) * n))
                ok = ok and flipped <= max(1, ACC_FLIPS * n)
            else:
                worst = max(worst, abs(mine - value) / max(abs(value), 1e-12))
                ok = ok and worst <= METRIC_TOLERANCE
        rows.append(Row("eval", f"{task}: bsops vs hf (bf16)", ok,
                        f"{flipped} of {n} answers differ; max rel diff of the rest {worst:.1e}", time.time() - start))
    return rows or [Row("eval", "bsops eval vs hf (bf16)", False, "no metric compared", time.time() - start)]


def _bundled_tasks() -> list[str]:
    """tiny's eval.tasks (corpus/eval/)."""
    return [str(REPO / "corpus" / "eval" / f"{name}.yaml") for name in ("kjv_last_word", "kjv_two_choice")]


def check_kernels(args, deadline: float) -> list[Row]:
    if args.device == "cpu":
        return [Row("kernels", "kernel tests compiled", None, "needs a GPU (the suite runs them interpreted)")]
    start = time.time()
    env = {**os.environ, "TRITON_INTERPRET": "0", "BSOPS_KERNEL_DEVICE": "cuda"}
    proc = run([sys.executable, "-m", "pytest", "-q", "--noconftest", "-o", "addopts=", "-p", "no:cacheprovider",
                "-n", "8", *[str(p) for p in sorted((REPO / "tests" / "kernels").glob("test_kernels_*.py"))]],
               cwd=REPO, timeout=max(30.0, min(240.0, deadline - time.time())), log=args.out / "logs" / "kernels.txt",
               env=env)
    summary = next((line for line in reversed(proc.stdout.splitlines()) if " passed" in line or " failed" in line), "")
    return [Row("kernels", "kernel tests compiled", proc.returncode == 0, summary.strip("= "), time.time() - start)]


def check_throughput(args, deadline: float) -> list[Row]:
    if args.device == "cpu":
        return [Row("throughput", "trainer vs plain loops", None, "needs a GPU")]
    rows = []
    for model in ("gpt2-124m", "760m"):
        start = time.time()
        proc = run([sys.executable, str(REPO / "benchmarks" / "train_throughput.py"), "--device", "cuda", "--model", model],
                   cwd=REPO, timeout=max(30.0, min(300.0, deadline - time.time())),
                   log=args.out / "logs" / f"throughput-{model}.txt")
        ratios = [float(x) for x in re.findall(r"ratio[^0-9]*([0-9.]+)x?", proc.stdout)]
        mfu = re.findall(r"MFU[^0-9]*([0-9.]+ ?%)", proc.stdout)
        ok = proc.returncode == 0 and bool(ratios) and min(ratios) >= 1.0
        rows.append(Row("throughput", f"{model}: trainer / plain loops", ok,
                        f"ratios {', '.join(f'{r:.2f}' for r in ratios) or '-'}; MFU {', '.join(mfu) or '-'}",
                        time.time() - start))
    return rows


RUNNERS = {"env": check_env, "matrix": check_matrix, "eval": check_eval, "kernels": check_kernels,
           "throughput": check_throughput}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        for name in args.only:
            print(name)
        print(f"device {args.device}, budget {args.budget_s} s, out {args.out}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    deadline = start + args.budget_s
    rows: list[Row] = []
    for name in args.only:
        if time.time() > deadline:
            rows.append(Row(name, "not started", False, f"over the {args.budget_s} s budget"))
            continue
        print(f"== {name}", flush=True)
        try:
            got = RUNNERS[name](args, deadline)
        except Exception as exc:  # noqa: BLE001 - one check's failure is a row, the others still run
            got = [Row(name, "crashed", False, f"{type(exc).__name__}: {exc}")]
        for row in got:
            print(f"   {row.what}: {({True: 'pass', False: 'FAIL', None: 'skip'})[row.ok]} {row.figures}", flush=True)
        rows += got
    header = (f"GPU acceptance, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(start))}, device {args.device}, "
              f"{time.time() - start:.0f} s; `python benchmarks/gpu_acceptance.py --only {','.join(args.only)}`\n")
    text = table(rows, header)
    (args.out / "acceptance.md").write_text(text)
    (args.out / "acceptance.json").write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    print(text)
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
