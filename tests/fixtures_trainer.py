"""Fixtures for the trainer tests: a small experiment, a launcher of real trainer ranks, TensorBoard readers.

Runs are launched as torchrun starts the job script's (`launch`: the ranks of `python -m
bigscience_ops.trainer`), on generated data (--synthetic-data) unless
`synthetic=False`: the runs whose tokens `bsops samples` must reproduce train on the bundled corpus
(`bundled_corpus`, `small_experiment(corpus=...)`), and their stdout is appended to main_log.txt as
the job script does (`append_main_log`).

A rank would spend about 3.5 s of CPU importing torch, torch._dynamo and DeepSpeed before its first step:
`ranks` forks them from a server that has imported those once (rank_server.py). Building each rank's
engine still costs about a second, so fixtures launch independent runs `concurrently`, two at a time,
and each test module shares its runs between its checks.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from bigscience_ops.config.loading import load_experiment, to_dict
from bigscience_ops.launch.local import free_port

from bigscience_ops.schema import DataSource, Experiment, SaveRange
from bigscience_ops.launch.render import deepspeed_config
from tests import rank_server

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
LAUNCH_SLOTS = int(os.environ.get("BSOPS_TEST_LAUNCH_SLOTS", "2"))
"""Independent launches run side by side (BSOPS_TEST_LAUNCH_SLOTS=1: one after another)."""
K, T = TypeVar("K"), TypeVar("T")


def concurrently(jobs: dict[K, Callable[[], T]]) -> dict[K, T]:
    """name -> result of each job (a launch, or a chain of launches in one run folder), run LAUNCH_SLOTS at a
    time in the order given (put the longest first). Every job ends before the first failure is raised."""
    with ThreadPoolExecutor(max_workers=LAUNCH_SLOTS) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
    return {name: future.result() for name, future in futures.items()}


CORPUS_VOCAB = 8192  # the bundled tokenizer's vocabulary


def small_experiment(out: Path, corpus: str | None = None, **sections: dict) -> Experiment:
    """tiny, shrunk to a 2-layer 64-wide GPT that runs 28 steps with a rampup 4 -> 8 in seconds; with `corpus`
    (a prefix of the bundled corpus) it trains on that with the bundled tokenizer's vocabulary."""
    exp = load_experiment("tiny", REPO / "trainings")
    out = Path(out)
    if corpus is not None:
        sections = {**sections, "model": {"vocab_size": CORPUS_VOCAB, **sections.get("model", {})},
                    "data": {"blend": [DataSource(prefix=corpus)], **sections.get("data", {})}}
    base = {
        "model": dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, max_position_embeddings=32,
                      vocab_size=256, ffn_hidden_size=256),
        "batch": dict(global_batch_size=8, micro_batch_size=2,
                      rampup=dataclasses.replace(exp.batch.rampup, start=4, increment=2, samples=40)),
        "train": dict(samples=200, seed=1234, precision="fp32"),
        "lr_schedule": dict(warmup_samples=40),
        "logging": dict(log_interval=2, eval_interval=10, eval_iters=2),
        "checkpoint": dict(save_interval=10, save_schedule=[], exit_interval=None, exit_duration_in_mins=25,
                           kill_switch_path=str(out / "kill-switch")),
        "paths": dict(output=str(out), checkpoints=str(out / "checkpoints"), tensorboard=str(out / "tensorboard"),
                      logs=str(out / "logs")),
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    changes = {name: dataclasses.replace(getattr(exp, name), **values) for name, values in base.items()}
    return dataclasses.replace(exp, **changes)


def write_run(exp: Experiment, out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.json").write_text(json.dumps(to_dict(exp), indent=2))
    (out / "ds_config.json").write_text(json.dumps(deepspeed_config(exp), indent=2))
    return out


def launch(out: Path, nproc: int, env: dict | None = None, timeout: float = 300,
           synthetic: bool = True) -> subprocess.CompletedProcess:
    """The trainer's `nproc` ranks on the experiment written in `out`."""
    argv = ["-m", "bigscience_ops.trainer", "--experiment", str(Path(out) / "experiment.json"),
            "--deepspeed-config", str(Path(out) / "ds_config.json"), *(["--synthetic-data"] if synthetic else [])]
    return ranks(argv, nproc, env, timeout)


def ranks(args: list[str], nproc: int, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python ARGS` as `nproc` ranks of one process group, started as `torchrun --standalone` starts them: RANK,
    LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, OMP_NUM_THREADS=1 for more than
    one, one stdout and one stderr for all. Without torchrun's agent, which costs each launch as much CPU as a
    rank's start: the launch tests run the job script's torchrun. As the agent does, the first rank to fail ends
    the others (after a grace to write their own errors): its exit status is the launch's.

    The ranks are forks of this worker's rank server (rank_server.py), which has imported torch and DeepSpeed
    once, unless `env` changes what a fresh interpreter reads at its start (PYTHONPATH, say) or
    BSOPS_TEST_FRESH_RANKS=1: then each is a new interpreter."""
    port = free_port()  # below the ephemeral range: no gloo or other launch can take it before rank 0 listens
    common = _rank_env()
    common.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(nproc),
                   "LOCAL_WORLD_SIZE": str(nproc)})
    if nproc > 1:
        common.setdefault("OMP_NUM_THREADS", "1")
    common.update(env or {})
    argv = [sys.executable, *args]
    server = None if os.environ.get("BSOPS_TEST_FRESH_RANKS") == "1" else _rank_server()
    forked = server is not None and args[0] in ("-m", "-c") and rank_server.same_start(common, server.env)
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "out", "a+") as out, \
            open(Path(tmp) / "err", "a+") as err:  # appended to by every rank
        procs = []
        for r in range(nproc):
            rank_env = {**common, "RANK": str(r), "LOCAL_RANK": str(r)}
            procs.append(server.start(args, rank_env, REPO, out.name, err.name) if forked else
                         subprocess.Popen(argv, cwd=REPO, env=rank_env, stdout=out, stderr=err, text=True))
        status, hung = _wait(procs, time.monotonic() + timeout)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if hung:
        pytest.fail(f"the launch hung for {timeout} s; the stacks its processes were at are in its stderr\n"
                    f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-20000:]}")
    return subprocess.CompletedProcess(argv, status, stdout, stderr)


def _rank_env() -> dict[str, str]:
    """What every rank starts with, and the rank server: this environment on the CPU, unbuffered, without the job
    start time a test of the job script may have set."""
    env = {k: v for k, v in os.environ.items() if k != "BSOPS_JOB_START_EPOCH"}
    return {**env, "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}


class RankServer:
    """This worker's rank_server.py, started at its first launch and ended with the worker."""

    def __init__(self) -> None:
        self.env = _rank_env()
        self._proc = subprocess.Popen([sys.executable, rank_server.__file__], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, cwd=REPO, env=self.env, text=True)
        self._lock = threading.Lock()  # launches run `concurrently`, and one request waits for its reply

    def ask(self, request: dict) -> dict:
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            reply = self._proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"the rank server ended (exit {self._proc.wait()}); its errors are in the worker's stderr")
        return json.loads(reply)

    def start(self, args: list[str], env: dict, cwd: Path, out: str, err: str) -> ForkedRank:
        request = {"argv": args, "env": env, "cwd": str(cwd), "out": out, "err": err}
        return ForkedRank(self, self.ask({"start": request})["pid"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        self._proc.wait(timeout=60)


class ForkedRank:
    """A rank the server forked, with what _wait and _kill use of a Popen."""

    def __init__(self, server: RankServer, pid: int) -> None:
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.ask({"poll": self.pid})["status"]
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.1)
        return self.returncode


_server: RankServer | None = None
_server_lock = threading.Lock()


def _rank_server() -> RankServer:
    global _server
    with _server_lock:
        if _server is None:
            _server = RankServer()
            atexit.register(_server.close)
        return _server


FAILURE_GRACE_S = 10


def _wait(procs: list[subprocess.Popen | ForkedRank], deadline: float) -> tuple[int, bool]:
    """(the first failing rank's exit status or 0, whether the launch hung) once every rank has ended."""
    failed_at, status = None, 0
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and (codes := [p.returncode for p in procs if p.returncode not in (None, 0)]):
            failed_at, status = now, codes[0]
        if failed_at is not None and now > failed_at + FAILURE_GRACE_S:
            _kill(procs, stacks=False)
        elif now > deadline:
            _kill(procs, stacks=True)
            return status, True
        time.sleep(0.2)
    if failed_at is None:
        status = next((p.returncode for p in procs if p.returncode), 0)
    return status, False


def _kill(procs: list[subprocess.Popen | ForkedRank], stacks: bool) -> None:
    """SIGKILL to every rank and its DataLoader workers; with `stacks`, first SIGUSR2 to each, one at a time so that
    their stacks do not interleave, and a second each to write them (trainer/stacks.py)."""
    everyone = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(proc.pid)
            everyone += [p, *p.children(recursive=True)]
    if stacks:
        for p in everyone:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGUSR2)
                time.sleep(1)
    for p in everyone:
        with contextlib.suppress(psutil.Error):
            p.kill()
    for proc in procs:
        proc.wait()


def run_ok(out: Path, nproc: int, env: dict | None = None, synthetic: bool = True) -> subprocess.CompletedProcess:
    proc = launch(out, nproc, env, synthetic=synthetic)
    assert proc.returncode == 0, f"trainer exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def append_main_log(exp: Experiment, proc: subprocess.CompletedProcess) -> Path:
    """The launch's output appended to the run's main_log.txt, as the job script appends each task's."""
    path = Path(exp.paths.logs) / "main_log.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(proc.stdout)
    return path


@pytest.fixture(scope="session")
def bundled_corpus(tmp_path_factory) -> str:
    """The bundled corpus built into a folder of the session (about a second): its prefix."""
    from bigscience_ops.data.corpus import ensure_bundled_corpus

    return ensure_bundled_corpus(tmp_path_factory.mktemp("corpus"))


def scalars(tensorboard_dir: Path, tag: str) -> dict[int, float]:
    """step -> value of one TensorBoard tag over every event file of the folder (later files win)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[int, float] = {}
    for path in sorted(glob.glob(str(Path(tensorboard_dir) / "events.out.tfevents.*")), key=os.path.getmtime):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out.update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("global_step")) for p in (Path(out) / "checkpoints").glob("global_step*"))


def whole_and_resumed(tmp_path_factory, prefix: str, make_exp, steps: int, stop_at: int, nproc: int = 2
                      ) -> dict[str, tuple[Path, list[subprocess.CompletedProcess]]]:
    """{"whole": `steps` uninterrupted, "resumed": `stop_at` steps then resumed to `steps`}: each run's
    folder and launches; `make_exp(out, exit_interval)` gives the experiment of one launch."""
    def chain(out: Path, exits: list[int]) -> tuple[Path, list[subprocess.CompletedProcess]]:
        procs = []
        for exit_interval in exits:
            write_run(make_exp(out, exit_interval), out)
            procs.append(run_ok(out, nproc))
        return out, procs

    folders = {name: tmp_path_factory.mktemp(f"{prefix}_{name}") for name in ("whole", "resumed")}
    return concurrently({"resumed": lambda: chain(folders["resumed"], [stop_at, steps]),
                         "whole": lambda: chain(folders["whole"], [steps])})


GOLDEN_SAVE_SCHEDULE = [SaveRange(until=6, interval=2), SaveRange(until=20, interval=5)]


@pytest.fixture(scope="session")
def golden_run(tmp_path_factory) -> tuple[Experiment, Path, subprocess.CompletedProcess]:
    """The fixed tiny config trained uninterrupted with PP=2 and a multi-range save schedule."""
    out = tmp_path_factory.mktemp("golden")
    exp = small_experiment(out, checkpoint=dict(save_schedule=GOLDEN_SAVE_SCHEDULE, save_interval=10))
    write_run(exp, out)
    return exp, out, run_ok(out, 2)


SPIKE_AT = 45  # the iteration spiked_run trains on random labels
# What else spiked_run injects (faults.py), far enough apart for the health checks' trailing windows, and the
# iteration each finding must name: a run of skipped or slow lines is an alert at its third line (HealthConfig's
# skipped_lines and slow_lines).
INJECTED = {"nan": 20, "skipped": 26, "grad-norm": 30, "slow": 37, "loss-spike": SPIKE_AT}
SPIKED_ENV = {"BSOPS_CORRUPT_AT": str(SPIKE_AT), "BSOPS_NAN_AT": "20", "BSOPS_SCALE_GRAD_AT": "24-26:inf,30:1000",
              "BSOPS_SLOW_AT": "35-37:1", "BSOPS_RECORD_TOKENS_AT": f"3,12,{SPIKE_AT + 1}"}


def spiked_experiment(out: Path, corpus: str) -> Experiment:
    """tiny shrunk on the bundled corpus, 66 steps logged one line each, a validation at 50 and at the end. The LR
    is 2x tiny's so that by SPIKE_AT the loss (about 6.2) is well below log(vocab) and a batch of random labels
    (about 10.4) stands out (higher LRs give grad-norm excursions of their own here)."""
    return small_experiment(out, corpus, optimizer=dict(lr=2e-3), train=dict(samples=500),
                            logging=dict(log_interval=1, eval_interval=50))


@pytest.fixture(scope="session")
def spiked_run(tmp_path_factory, bundled_corpus) -> tuple[Experiment, Path, subprocess.CompletedProcess]:
    """spiked_experiment trained with SPIKED_ENV's faults: a NaN loss, three overflowing steps, a grad-norm
    explosion, a slow node for three steps and random labels at SPIKE_AT (the watchdog's health checks and the
    rollback read it), recording its tokens at 3, 12 and SPIKE_AT + 1; copy it before changing it."""
    out = tmp_path_factory.mktemp("spiked")
    exp = spiked_experiment(out, bundled_corpus)
    write_run(exp, out)
    proc = run_ok(out, 2, env=SPIKED_ENV, synthetic=False)
    append_main_log(exp, proc)
    return exp, out, proc


@pytest.fixture()
def single_rank_group():
    """A one-process gloo group on a free loopback port, for code that calls collectives; the signal
    handlers the code under test installs (SIGUSR1, SIGTERM) are put back afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    dist.destroy_process_group()
