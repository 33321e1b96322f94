"""Starting the evaluation ranks: the checks that need no rank, and the argv that starts them.

`checkpoint` is what every start checks first (`bsops eval` before torchrun, each rank again in a
Slurm job, `lm_eval --model bsops`): the checkpoints are the run's own (`same_run`: the run id in the
checkpoints folder, and in the checkpoint's manifest, is the run folder's), the folder `global_step<N>`
is complete (its manifest is committed, checkpoints/manifest.py; or, saved before manifests, its
bsops.json is there and its step is not newer than the one `latest` names), the layout asked for fits
the model, and every layer file the ranks will read is a plain file whose zip directory (what
torch.save writes) is readable, so a missing or cut-short file is one line here, not a failure inside a
rank. `run_local` starts the ranks on this machine with `torchrun --standalone`, their output streamed
through; Ctrl-C or SIGTERM ends the whole process tree (launch/processes.py, the one stop of a local
job). `worker_argv` is the `python -m ...` part the Slurm template runs under srun + torchrun.

No torch here: `bsops eval` imports this module to refuse a bad request at once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bigscience_ops.checkpoints import layout
from bigscience_ops.launch import jobs, processes
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.ops.evaluate import EvalError

WORKER_MODULE = "bigscience_ops.ops.evaluate.worker"
STOP_GRACE_S = 30
"""After Ctrl-C or SIGTERM, how long torchrun's process group has to end before it is killed."""


@dataclass(frozen=True)
class Target:
    """The checkpoint to evaluate and the layout to score it in."""

    tag: str
    step: int
    path: Path
    meta: dict
    saved_tensor: int
    saved_pipeline: int
    tensor: int
    pipeline: int

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline

    @property
    def num_layers(self) -> int:
        return int(self.meta["model"]["num_layers"])


def _not_as_saved(found) -> str:
    """Why a checkpoint folder with a manifest is not complete: the manifest cannot be read, or the first file that is
    not there at its recorded size; without a manifest, a save in progress or one that did not finish."""
    from bigscience_ops.checkpoints import manifest

    try:
        committed = found.manifest()
    except CheckpointError as exc:
        return " ".join(str(exc).split())
    if committed is None:
        return "no committed manifest: a save in progress, or one that did not finish"
    bad = manifest.verify(found.path, committed, hashes=False).mismatches
    return f"{bad[0]}: changed since its save" if bad else "its files changed while they were read"


def checkpoint(exp, step: int, tensor: int | None = None, pipeline: int | None = None,
               check_files: bool = True) -> Target:
    """The complete checkpoint `global_step<step>` of `exp`'s run, in its own layout or TP=`tensor` / PP=`pipeline`.

    Raises EvalError naming the folder and what is wrong: checkpoints of another run (same_run), no `latest`, a
    step newer than `latest` (a save in progress), a missing folder or bsops.json, a bsops.json of another trainer,
    a layout the model cannot take, a layer file missing or cut short (with `check_files`).
    """
    checkpoints = Path(exp.paths.checkpoints)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise EvalError(f"step {step!r} is not a checkpoint step; allowed: a whole number >= 0")
    run_id = same_run(exp)
    try:
        saved = layout.list_checkpoints(checkpoints)
        committed = {c.step for c in layout.complete_checkpoints(checkpoints)}
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    try:
        last = layout.latest_step(checkpoints)
    except CheckpointError:
        last = None  # a torn `latest` names nothing: a committed checkpoint is complete whatever it says
    older = {c.step for c in saved if last is not None and c.step <= last and c.saved_before_manifests()}
    complete = ", ".join(str(s) for s in sorted(committed | older)) or "none"
    tag = f"global_step{step}"
    found = next((c for c in saved if c.step == step), None)
    if found is None:
        if last is None and not committed:
            raise EvalError(f"{checkpoints}: no 'latest' file and no committed checkpoint, so nothing to evaluate "
                            f"(folders there: {', '.join(c.tag for c in saved[-5:]) or 'none'})")
        raise EvalError(f"{checkpoints}: no checkpoint {tag}; complete steps: {complete}")
    if step not in committed and step not in older:
        if found.refusal() is None and not (found.path / layout.META).is_file():
            raise EvalError(f"{found.path / layout.META}: missing; a save in progress, or one that did not finish "
                            f"(no committed manifest); complete steps: {complete}")
        if last is not None and step > last and found.saved_before_manifests():
            raise EvalError(f"{checkpoints / tag}: step {step} is newer than the one 'latest' names ({last}): a save "
                            f"in progress, or one that did not finish; complete steps: {complete}")
        why = found.refusal() or _not_as_saved(found)
        raise EvalError(f"{found.path}: not a complete checkpoint ({why}); complete steps: {complete}")
    try:
        meta = found.meta()
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    _same_run_in_manifest(exp, found, run_id)
    model, parallel = meta.get("model"), meta.get("parallel")
    ok = (isinstance(model, dict) and isinstance(parallel, dict)
          and all(isinstance(model.get(k), int) for k in ("num_layers", "num_attention_heads", "hidden_size",
                                                             "ffn_hidden_size", "padded_vocab_size", "seq_length"))
          and all(isinstance(parallel.get(k), int) and parallel[k] >= 1 for k in ("tensor", "pipeline"))
          and isinstance(meta.get("experiment", {}).get("model", {}).get("vocab_size"), int))
    if not ok:
        raise EvalError(f"{found.path / layout.META}: lacks model sizes, parallel.tensor/pipeline or "
                        "experiment.model.vocab_size; not written by this version of bsops' trainer")
    target = Target(tag, step, found.path, meta, parallel["tensor"], parallel["pipeline"],
                    parallel["tensor"] if tensor is None else tensor,
                    parallel["pipeline"] if pipeline is None else pipeline)
    check_layout(target)
    if check_files:
        check_layer_files(target, range(target.num_layers + 2))
    return target


def same_run(exp) -> str | None:
    """The run id of `exp`'s run (results.run_id_of), once its checkpoints are known to be the run's: EvalError,
    naming both ids and both folders, when <paths.checkpoints>/bsops-run-id is not <paths.output>/bsops-run-id (a
    record whose paths.checkpoints names another run's folder), or when either file cannot be read. None when
    neither folder has an id (a run from before run ids: nothing to compare)."""
    output, checkpoints = Path(exp.paths.output), Path(exp.paths.checkpoints)
    try:
        mine, theirs = layout.run_id(output), layout.run_id(checkpoints)
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    if mine is not None and theirs is not None and mine != theirs:
        raise EvalError(f"{checkpoints}: these checkpoints are run {theirs}'s ({checkpoints / layout.RUN_ID}), not "
                        f"this run's {mine} ({output / layout.RUN_ID}); allowed: paths.checkpoints naming the "
                        "folder this run's trainer saved into (a result of them would be filed as this run's)")
    return mine or theirs


def _same_run_in_manifest(exp, found: layout.Checkpoint, run_id: str | None) -> None:
    """EvalError when the checkpoint's manifest (checkpoints/manifest.py, where the checkpoint has one) names a run
    other than `run_id`."""
    if run_id is None:
        return
    try:
        committed = found.manifest()
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    named = committed.run_id if committed is not None else ""
    if named and named != run_id:
        raise EvalError(f"{found.path}: its manifest names run {named}, not this run's {run_id} "
                        f"({Path(exp.paths.output) / layout.RUN_ID}); allowed: a checkpoint this run saved")


def check_layout(target: Target) -> None:
    """Refuse a TP/PP the model cannot be split into (TP must divide the heads and the MLP width)."""
    model = target.meta["model"]
    heads, ffn = model["num_attention_heads"], model["ffn_hidden_size"]
    for name, value in (("tensor", target.tensor), ("pipeline", target.pipeline)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise EvalError(f"--{name} {value!r}: allowed: a whole number >= 1")
    if heads % target.tensor or ffn % target.tensor:
        allowed = [t for t in range(1, heads + 1) if heads % t == 0 and ffn % t == 0]
        raise EvalError(f"--tensor {target.tensor}: the model's {heads} attention heads and MLP width {ffn} must "
                        f"split evenly over TP ranks; allowed: {', '.join(map(str, allowed))}")
    layers = model["num_layers"] + 3  # the embedding, the blocks, the final LayerNorm, the tied head
    if target.pipeline > layers - 1:
        raise EvalError(f"--pipeline {target.pipeline}: the model has {model['num_layers']} blocks; allowed: 1 to "
                        f"{layers - 1} stages")


def layer_file(path: Path, index: int, tensor: int, rank: int) -> Path:
    """DeepSpeed's file of pipeline layer `index` for TP rank `rank` of a checkpoint written with TP=`tensor`."""
    if tensor == 1:
        return Path(path) / f"layer_{index:02d}-model_states.pt"
    return Path(path) / f"layer_{index:02d}-model_{rank:02d}-model_states.pt"


def check_layer_files(target: Target, layers) -> None:
    """Every TP shard of each layer in `layers` is a plain file with a readable zip directory (torch.save's format)."""
    problems = []
    for index in layers:
        for rank in range(target.saved_tensor):
            file = layer_file(target.path, index, target.saved_tensor, rank)
            if file.is_symlink() or not file.is_file():
                problems.append(f"{file.name} is missing" if not file.exists() and not file.is_symlink()
                                else f"{file.name} is not a plain file")
                continue
            try:
                with zipfile.ZipFile(file) as archive:
                    archive.infolist()
            except (zipfile.BadZipFile, OSError, ValueError) as exc:
                problems.append(f"{file.name} is unreadable ({type(exc).__name__}: {exc}; cut short?)")
    if problems:
        raise EvalError(f"{target.path}: {problems[0]}"
                        + (f" (and {len(problems) - 1} more layer file problems)" if len(problems) > 1 else "")
                        + f"; the checkpoint is torn or incomplete (expected {target.num_layers + 2} layers x "
                          f"TP={target.saved_tensor} files); evaluate another step")


def experiment_record(exp) -> str:
    """The experiment the ranks read (their --experiment file), resolved: an edit of the YAML after this is written
    changes nothing of the evaluation (as the trainer reads its run's experiment.json)."""
    from bigscience_ops.config.loading import to_dict

    return json.dumps(to_dict(exp), indent=1) + "\n"


def worker_argv(experiment: str, step: int, tensor: int | None = None, pipeline: int | None = None,
                trainings_dir: Path | str | None = None, cwd: Path | str | None = None,
                log_samples: bool = False, keep_cache: bool = False) -> list[str]:
    """`-m bigscience_ops.ops.evaluate.worker ...`: what torchrun runs (after its own options) on every node."""
    argv = ["-m", WORKER_MODULE, "--experiment", str(experiment), "--step", str(int(step))]
    if trainings_dir is not None:
        argv += ["--trainings-dir", str(trainings_dir)]
    if tensor is not None:
        argv += ["--tensor", str(int(tensor))]
    if pipeline is not None:
        argv += ["--pipeline", str(int(pipeline))]
    if cwd is not None:
        argv += ["--cwd", str(cwd)]
    if log_samples:
        argv.append("--log-samples")
    if keep_cache:
        argv.append("--keep-cache")
    return argv


def torchrun_argv(nproc: int, worker: list[str]) -> list[str]:
    """`torchrun --standalone --nproc-per-node N <worker>`, with this interpreter's torchrun."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={int(nproc)}",
            "--max-restarts=0", *_module_args(worker)]


def _module_args(worker: list[str]) -> list[str]:
    """torchrun takes a module as `-m MODULE args` (its `--module` flag then the name)."""
    if worker[:1] == ["-m"]:
        return ["--module", *worker[1:]]
    return worker


def run_local(exp, step: int, tensor: int | None = None, pipeline: int | None = None,
              trainings_dir: Path | str | None = None, experiment: str | None = None,
              env: dict[str, str] | None = None, log_samples: bool = False, keep_cache: bool = False,
              ranks_stdout_to_stderr: bool = False) -> int:
    """Evaluate `global_step<step>` of `exp` on this machine: checks first (EvalError), then TP x PP ranks under
    torchrun, their output streamed through (less torchrun's own report of a failed rank: AgentNoise). Returns 0
    when the result file is written, EXIT_ERROR when a rank said why it failed (its one `error: ...` line), else
    torchrun's exit code.

    No time limit; Ctrl-C (or SIGTERM) stops every rank: torchrun's process group gets SIGTERM, then SIGKILL
    after STOP_GRACE_S, and KeyboardInterrupt is raised again once it has ended. The ranks read `exp` itself
    (written resolved to a temporary experiment.json, as the trainer reads its run's), unless `experiment` names
    the experiment (a name or YAML file, found with `trainings_dir`). With `ranks_stdout_to_stderr`, the ranks'
    progress lines go to stderr too (stdout is the command's JSON).
    """
    import tempfile
    import threading

    target = checkpoint(exp, step, tensor, pipeline)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if target.world_size > 1:
        child_env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bsops-eval-") as tmp:
        record = None
        if experiment is None:
            record = (Path(tmp) / "experiment.json", experiment_record(exp))
            experiment = str(record[0])
        worker = worker_argv(experiment, step, tensor, pipeline, trainings_dir, Path.cwd(), log_samples, keep_cache)
        ranks = Ranks(f"eval {target.tag}", tuple(torchrun_argv(target.world_size, worker)), record)
        job = jobs.run_job(ranks, LocalRanks(child_env, ranks_stdout_to_stderr))  # its own process group: one stop
        noise = AgentNoise(sys.stderr)
        reader = threading.Thread(target=noise.pump, args=(LocalRanks.piped(job.proc),), daemon=True)
        reader.start()
        try:
            with processes.raising_on([signal.SIGTERM], _Terminated):
                code = job.wait()
        except BaseException:
            job.stop(STOP_GRACE_S)
            raise
        finally:
            reader.join(timeout=10)
    return EXIT_ERROR if code != 0 and noise.errors else code


@dataclass(frozen=True)
class Ranks:
    """The eval ranks of one checkpoint on this machine, described once: torchrun's argv and the experiment record
    they read, (path, text) written first (None: they read a name or YAML file)."""

    name: str
    argv: tuple[str, ...]
    record: tuple[Path, str] | None = None


@dataclass(frozen=True)
class LocalRanks:
    """The local executor of the eval ranks (launch/jobs.Executor; the Slurm one is jobs.SlurmScripts with
    jobscript.EvalJob): write the record, then start torchrun in a process group of its own, its stderr piped for
    AgentNoise; the handle (processes.LocalJob) stops all of it."""

    env: dict[str, str]
    stdout_to_stderr: bool = False
    """The ranks' stdout joins their stderr in the one pipe AgentNoise reads (else it is this process's stdout)."""

    def write(self, job: Ranks) -> Path:
        if job.record is None:
            return Path.cwd()
        path, text = job.record
        path.write_text(text, encoding="utf-8")
        return path

    def start(self, job: Ranks, script: Path, started: jobs.Started = lambda kind, job_id: None) -> processes.LocalJob:
        if self.stdout_to_stderr:  # one pipe for both, stderr into stdout's
            proc = processes.start(job.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        else:
            proc = processes.start(job.argv, env=self.env, stderr=subprocess.PIPE, text=True)
        handle = processes.LocalJob(proc, job.name)
        started("eval", handle.job_id)
        return handle

    @staticmethod
    def piped(proc: subprocess.Popen):
        """The ranks' pipe `start` made: their stderr, or with stdout_to_stderr both."""
        return proc.stderr if proc.stderr is not None else proc.stdout


EXIT_ERROR = 2
"""run_local's exit code when a rank said why it failed (an `error: ...` line): the request cannot be evaluated."""


class AgentNoise:
    """The ranks' stderr passed through line by line, less what torchrun's agent adds when a rank fails or it is
    stopped: its log lines (`E1127 08:22:28.628000 29777 torch/distributed/elastic/...`, also when they follow a
    rank's progress bar on the same line) and the ChildFailedError traceback and summary, which only repeat that
    a rank exited non-zero, after the rank's own `error: ...` line. Anything else, a rank's traceback included, is
    written as it came."""

    AGENT_LOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S*torch/distributed/(elastic/|run\.py)")

    def __init__(self, out) -> None:
        self.out = out
        self.errors = 0  # `error: ` lines of the ranks
        self._traceback: list[str] | None = None
        self._done = False  # the agent's failure report has begun: the rest is its summary

    def pump(self, stream) -> None:
        for line in stream:
            self.line(line)
        self.flush()

    def line(self, line: str) -> None:
        if self._done:
            return
        if agent := self.AGENT_LOG.search(line):  # at the start, or after a rank's progress bar (no newline)
            if agent.start() > 0:
                self._write(line[:agent.start()] + "\n")
            return
        if self._traceback is not None:
            self._traceback.append(line)
            if line[:1] not in (" ", "\t") and not line.startswith("Traceback"):
                block, self._traceback = self._traceback, None
                if "ChildFailedError" in line or any("torch/distributed/run.py" in b for b in block):
                    self._done = True
                else:
                    self._write("".join(block))
            return
        if line.startswith("Traceback (most recent call last):"):
            self._traceback = [line]
            return
        if line.startswith("error: "):
            self.errors += 1
        self._write(line)

    def flush(self) -> None:
        if self._traceback:
            self._write("".join(self._traceback))
            self._traceback = None

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


class _Terminated(KeyboardInterrupt):
    """SIGTERM while waiting: handled as Ctrl-C is."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(f"stopped by {sig.name}")


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to torchrun's process group (torchrun passes it to the ranks), then SIGKILL after `grace_s` to it and
    to every process below it: torchrun starts each rank in a session of its own (processes.stop_tree, the one stop
    of a local job)."""
    processes.stop_tree(proc, grace_s)

