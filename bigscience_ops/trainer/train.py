"""The training loop: Megatron's pretrain() on DeepSpeed's PipelineEngine, configured by one Experiment.

Per step: the global batch size comes from the rampup (`BatchSchedule.batch_size_at(consumed)`),
which sets the number of micro-batches; the step's LR is `LRSchedule.lr_at(samples the scheduler
has seen)`, advanced by the batch size after every applied step (Megatron's AnnealingLR.step);
the step reads Megatron's sample order (data.step_micro_batches). Whether and why to stop is
decided in one place, before the first iteration and after every one (stopping.py: the end, the
exit interval, a node phase boundary, the kill switch, SIGUSR1/SIGTERM, the exit duration measured
from the Slurm job start BSOPS_JOB_START_EPOCH); every stop saves (checkpointing.Checkpointer), then exits.
A step whose gradients are not finite (a NaN or inf loss, an overflow) is skipped, not applied, on
every precision path (DeepSpeed's ZeRO, bf16 and fp16 optimizers do it; pipeline_engine.py guards plain
fp32): it is logged as Megatron's skipped (and NaN) iteration. Log lines and TensorBoard scalars: metrics.py.
With TP > 1 the pipeline runs on DeepSpeed's (pipe, data, model) topology and every layer holds
this rank's Megatron shards (tensor_parallel.py).

Devices: on GPUs the local GPU is selected before the process group exists, the group serves both
devices (`cpu:gloo,cuda:nccl`), and every tensor the trainer hands to a collective is created on
the engine's device (`self.device`). A collective that waits longer than
`parallel.collective_timeout_minutes` aborts its process (NCCL async error handling).

Failures: a rank that raises writes its error to stderr (the job script appends it to
main_log.txt) and exits at once, without the final barrier its peers could never reach; the
peers' collectives then fail (gloo: connection closed) or time out (NCCL), and srun
--kill-on-bad-exit ends the other nodes. BSOPS_FAIL_AT="RANK:ITERATION" injects such a failure
(tests and fire drills): that rank raises before training iteration ITERATION.
A rank that hangs shows where: SIGUSR2 writes the Python stack of each of its threads to its stderr
(stacks.py, set up by __main__.py before torch loads).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from bigscience_ops import sizing
from bigscience_ops.checkpoints import universal
from bigscience_ops.checkpoints import layout
from bigscience_ops.checkpoints.layout import CheckpointError
from bigscience_ops.config.loading import to_dict
from bigscience_ops.errors import BsopsError
from bigscience_ops.schedule.run import RunSchedule, run_schedule
from bigscience_ops.schedule.batch_lr import LRSchedule, in_skip_range
from bigscience_ops.schema import Experiment
from bigscience_ops.sizing import GPTShape
from bigscience_ops.trainer import checkpointing as ckpt
from bigscience_ops.trainer import pipeline_engine
from bigscience_ops.trainer.data import MicroBatchFeed
from bigscience_ops.trainer.errors import TrainerError
from bigscience_ops.trainer.faults import Faults, corrupted, raise_if_injected, recorded, slow_down
from bigscience_ops.trainer.metrics import Metrics, StepRecord
from bigscience_ops.trainer.report import Board, peak_tflops
from bigscience_ops.trainer.sampling import TaskLayout, build_datasets, dataset_sizes, seqlen_at
from bigscience_ops.trainer.stopping import FINISHED, Stopper, any_rank, kill_switch_path

_IMPORT_TIME = time.time()


@dataclass
class TrainState:
    """Everything a checkpoint must restore besides weights, optimizer and RNG."""

    iteration: int = 0
    consumed_train_samples: int = 0
    consumed_valid_samples: int = 0
    lr_scheduler_samples: int = 0  # samples of applied steps: AnnealingLR's num_steps
    skipped_iterations: int = 0
    consumed_train_tokens: int = 0  # at the length each step trained on (curriculum learning)
    lr_scheduler_tokens: int = 0  # tokens of applied steps: AnnealingLR's num_tokens
    lr_warmup_end_tokens: int | None = None  # tokens when the sample warmup ended (token-based decay)

    @classmethod
    def from_meta(cls, state: dict, seq_length: int) -> TrainState:
        """The state a checkpoint recorded; one written before tokens were counted gets them at full length."""
        out = cls(**state)
        if "consumed_train_tokens" not in state:
            out.consumed_train_tokens = out.consumed_train_samples * seq_length
            out.lr_scheduler_tokens = out.lr_scheduler_samples * seq_length
        return out


def _print(*lines: str) -> None:
    if dist.get_rank() == 0:
        for line in lines:
            print(line, flush=True)


def _job_start_epoch() -> float:
    value = os.environ.get("BSOPS_JOB_START_EPOCH")
    if value:
        try:
            return float(value)
        except ValueError:
            raise TrainerError(f"BSOPS_JOB_START_EPOCH: got {value!r}; expected seconds since the epoch") from None
    return _IMPORT_TIME


def _lr_schedule_dict(s: LRSchedule) -> dict:
    return dataclasses.asdict(s)


class Trainer:
    def __init__(self, exp: Experiment, ds_config: dict, synthetic_data: bool = False,
                 device: torch.device | None = None, schedule: RunSchedule | None = None) -> None:
        self.exp = exp
        self.ds_config = ds_config
        self.synthetic_data = synthetic_data
        self.device = device or torch.device("cpu")
        self.peak_tflops = peak_tflops(exp.estimate.peak_tflops, self.device)
        # The schedules the plan showed, computed by the same function (or handed over already built).
        self.run_schedule = schedule or run_schedule(exp)
        self.schedule = self.run_schedule.batch
        self.lr = self.run_schedule.lr  # replaced by the checkpoint's on resume unless lr_schedule.override_on_resume
        self.curriculum = self.run_schedule.curriculum
        self.skip_ranges = list(self.run_schedule.skip_ranges)
        self._engine_seqlen: int | None = None  # the activation shape the pipeline engine last exchanged
        self.faults = Faults.from_env()  # the debug switches (faults.py); unset, they change nothing
        self.train_iters = self.run_schedule.train_iters
        self.shape = GPTShape.from_experiment(exp)
        self.params = sizing.count_parameters(exp.model, exp.parallel.tensor, exp.parallel.pipeline).total
        self.flops_per_token = sizing.model_flops_per_token(exp.model, self.params)
        self.state = TrainState()
        self.checkpoints = Path(exp.paths.checkpoints)
        self.output = Path(exp.paths.output) if exp.paths.output else None
        self.debug_folder = Path(exp.paths.output or self.checkpoints.parent) / "debug"  # BSOPS_RECORD_TOKENS_AT
        self.job_start = _job_start_epoch()

    # ------------------------------------------------------------------ set-up

    def _check_layout(self) -> None:
        """Whole replicas; a DP that splits every batch size this task can still meet (from the resumed position
        to the training's end or the next node phase); with a node schedule, the phase's number of processes."""
        exp, world = self.exp, dist.get_world_size()
        model_parallel = exp.parallel.tensor * exp.parallel.pipeline
        if world % model_parallel:
            raise TrainerError(f"parallel: tensor x pipeline = {exp.parallel.tensor} x {exp.parallel.pipeline} = "
                               f"{model_parallel}; must divide the {world} processes")
        self.dp = world // model_parallel
        resume = ckpt.find_resume(self.checkpoints)
        done = int(resume.meta["iteration"]) if resume is not None else 0
        phase = self.run_schedule.phase_of_iteration(done)
        self.next_phase = self.run_schedule.next_phase(done)
        gpn = exp.slurm.gpus_per_node
        if exp.slurm.node_schedule and world != phase.nodes * gpn:
            raise TrainerError(f"slurm.node_schedule: the run resumes at iteration {done} in {phase.describe()}: "
                               f"{phase.nodes} x {gpn} = {phase.nodes * gpn} processes, but this task has {world}; "
                               f"launch it at the phase's size (bsops launch and the array tasks pick it)")
        last = min(self.train_iters, self.next_phase.first_step - 1 if self.next_phase else self.train_iters)
        mbs = exp.batch.micro_batch_size
        for step_gbs in self.schedule.sizes_of_steps(done + 1, last):
            if step_gbs % (mbs * self.dp):
                raise TrainerError(f"batch: global batch size {step_gbs} (steps {done + 1} to {last}) is not divisible "
                                   f"by micro_batch_size x DP = {mbs} x {self.dp}; run `bsops plan {exp.name}` for "
                                   "valid node counts")

    def _build_engine(self, resume: ckpt.Resume | None = None) -> None:
        recorded = resume.meta.get("kernels") if resume is not None else None  # a resumed run keeps its kernels
        built = pipeline_engine.build(self.exp, self.ds_config, self.shape, self.dp, self.device, self.faults,
                                      self.schedule.batch_size_at(0), recorded if isinstance(recorded, dict) else None)
        self.engine, self.ds_state, self.tp, self.loss_fn = built.engine, built.state, built.tp, built.loss_fn
        self.kernels = built.kernels
        _print(self.kernels.describe())  # once, rank 0: each fused op's implementation (and its timings on CUDA)
        self.dp_rank = self.engine.grid.get_data_parallel_id()
        self.stage = self.engine.stage_id
        if self.dp_rank == 0:  # Megatron's line, from every (tensor, pipeline) rank of the first replica
            line = (f" > number of parameters on (tensor, pipeline) model parallel rank ({self.tp.rank}, {self.stage}): "
                    f"{built.parameters}")
            sys.stdout.write(line + "\n")  # one write: lines of concurrent ranks do not interleave
            sys.stdout.flush()

    def _build_data(self) -> None:
        exp = self.exp  # the sizes and datasets `bsops samples` builds too (sampling.py)
        self.train_ds, self.valid_ds, _ = build_datasets(exp, dataset_sizes(exp, self.run_schedule),
                                                         self.synthetic_data)
        if self.train_ds is None:
            raise TrainerError(f"data.split: got {exp.data.split!r}; the training split is empty")

    def _build_feeds(self) -> None:
        """Micro-batch feeds from the resumed position; only the stages that read data (first, last) get one."""
        e, exp = self.engine, self.exp
        reads = e.is_first_stage() or e.is_last_stage()

        def feed(dataset, consumed: int) -> MicroBatchFeed | None:
            if not reads or dataset is None:
                return None
            # A DataLoader iterator draws its base seed from the default generator, which dropout uses: keep
            # that generator where the checkpoint (or the seed) left it, or a resumed run's masks would shift.
            rng = torch.get_rng_state()
            built = MicroBatchFeed(dataset, consumed, exp.batch.micro_batch_size, self.dp_rank, self.dp,
                                   exp.data.num_workers, self.device)
            torch.set_rng_state(rng)
            return built

        self.train_feed = feed(self.train_ds, self.state.consumed_train_samples)
        self.valid_feed = feed(self.valid_ds, self.state.consumed_valid_samples) if exp.logging.eval_iters else None

    def _build_outputs(self) -> None:
        """The metrics (log lines; TensorBoard on rank 0) and the checkpointer, which saves the engine."""
        log = self.exp.logging
        is_writer = dist.get_rank() == 0 and log.tensorboard
        board = Board(self.exp.paths.tensorboard if is_writer else None, log.tensorboard_queue_size)
        self.metrics = Metrics(board, _print, train_iters=self.train_iters, log_interval=log.log_interval,
                               flops_per_token=self.flops_per_token, peak_tflops=self.peak_tflops,
                               world_size=dist.get_world_size(), curriculum=self.curriculum is not None)
        self.checkpointer = ckpt.Checkpointer(self.checkpoints, self.run_schedule.saves, self.ds_state,
                                              self._checkpoint_meta, self._manifest_about, self.metrics, self.faults.killer)

    def _find_resume(self) -> ckpt.Resume | None:
        """The checkpoint to resume from, checked against this model before anything is built.

        Written with another TP/PP/DP layout (its bsops.json says which), it is converted once to
        DeepSpeed's universal checkpoint (rank 0 converts, the others wait) and the engine is configured
        to load that; what cannot be converted is refused here, before any engine exists.
        """
        resume = ckpt.find_resume(self.checkpoints)
        self.reshape = None
        if resume is None:
            return None
        p = self.exp.parallel
        if resume.meta.get("weights_only"):  # a warm start: layer files numbered over the whole model, any PP/DP
            ckpt.check_compatible(resume, dataclasses.asdict(self.shape), p.tensor,
                                  resume.meta.get("parallel", {}).get("pipeline", p.pipeline))
            return resume
        new = universal.Layout(p.tensor, p.pipeline, self.dp, p.zero_stage)
        self.reshape = universal.reshape_plan(resume.path, resume.meta, dataclasses.asdict(self.shape), new,
                                              self.exp.model.vocab_size)
        if self.reshape is not None:
            rows = self.shape.padded_vocab_size
            _print(f"> {resume.path} was written with {self.reshape.old}; resuming with {self.reshape.new}")
            if dist.get_rank() == 0:
                universal.convert(resume.path, rows, workers=max(1, min(8, (os.cpu_count() or 2) // 2)), log=_print)
                universal.fit_vocabulary(universal.universal_path(resume.path), rows)
            else:
                universal.wait_ready(resume.path, rows)
            checkpoint = {**self.ds_config.get("checkpoint", {}), "load_universal": True}
            self.ds_config = {**self.ds_config, "checkpoint": checkpoint}
        return resume

    def _resume(self, resume: ckpt.Resume | None) -> None:
        if resume is None:
            _print(f"> no checkpoint in {self.checkpoints}: starting from scratch")
            if dist.get_rank() == 0:  # a new run: its checkpoints are not an earlier run's (backup, retention)
                self._name_run(layout.new_run_id(self.checkpoints))
            return
        if resume.meta.get("weights_only"):  # bsops warm-start: weights only, fresh schedules, optimizer and data
            load_path = self.ds_state.load(self.checkpoints, resume.tag, weights_only=True)
            if load_path is None:
                raise CheckpointError(f"{resume.path}: DeepSpeed could not load its weights")
            self.checkpointer.resumed_at(0)
            if dist.get_rank() == 0:  # a new run from another's weights
                self._name_run(layout.new_run_id(self.checkpoints))
            _print(f"> warm start from {resume.path} (weights only): iteration 0, consumed samples 0")
            return
        tag = resume.tag if self.reshape is None else universal.universal_path(resume.path).name
        load_path = self.ds_state.load(self.checkpoints, tag)
        if load_path is None:
            raise CheckpointError(f"{resume.path}: DeepSpeed could not load it")
        meta = resume.meta
        self.state = TrainState.from_meta(meta["state"], self.exp.model.seq_length)
        saved_lr = LRSchedule(**meta["lr_schedule"])
        if saved_lr != self.lr:
            if self.exp.lr_schedule.override_on_resume:
                _print(f"> lr schedule overridden on resume: checkpoint {saved_lr}, now {self.lr}")
            else:
                _print(f"> lr schedule from the checkpoint ({saved_lr}); the config's differs ({self.lr}); "
                       "set lr_schedule.override_on_resume to use the config's")
                self.lr = saved_lr
        if self.reshape is not None:  # rank r of another layout is another place in the grid
            _print(f"> RNG states of {resume.path} not restored: written with {self.reshape.old}")
        elif not ckpt.load_rng(resume.path, dist.get_rank()):
            _print(f"> {resume.path} has no RNG state for this rank (another world size): RNG reseeded")
        self.checkpointer.resumed_at(self.state.iteration)
        if dist.get_rank() == 0 and self.output is not None and self._recorded_run_id() is None:
            self._name_run(layout.ensure_run_id(self.checkpoints))  # a run folder from before it recorded the id
        _print(f"> resumed from {resume.path}: iteration {self.state.iteration}, "
               f"consumed samples {self.state.consumed_train_samples}")

    # ------------------------------------------------------------------ checkpoints

    def _recorded_run_id(self) -> str | None:
        try:
            return layout.run_id(self.output)
        except CheckpointError:
            return None  # damaged: written again from the checkpoints' own

    def _name_run(self, run_id: str) -> None:
        """The run folder records the id its checkpoints carry: readers compare the two (eval, backup)."""
        if self.output is not None:
            layout.write_run_id(self.output, run_id)

    def _manifest_about(self) -> dict:
        """What a checkpoint's manifest says it is, besides its files and iteration."""
        p, t = self.exp.parallel, self.exp.train
        return {"run_id": layout.run_id(self.checkpoints) or "", "experiment": self.exp.name, "optimizer": True,
                "layout": {"tensor": p.tensor, "pipeline": p.pipeline, "data": self.dp, "zero_stage": p.zero_stage,
                           "precision": t.precision}}

    def _checkpoint_meta(self) -> dict:
        """bsops.json of a checkpoint of the current state (rank 0 writes it)."""
        return {
            "iteration": self.state.iteration,
            "consumed_train_samples": self.state.consumed_train_samples,
            "consumed_tokens": self.state.consumed_train_tokens,
            "state": dataclasses.asdict(self.state),
            "lr_schedule": _lr_schedule_dict(self.lr),
            "model": dataclasses.asdict(self.shape),
            "parallel": {"tensor": self.exp.parallel.tensor, "pipeline": self.exp.parallel.pipeline, "data": self.dp},
            "experiment": to_dict(self.exp),
            "kernels": self.kernels.record(),
        }

    # ------------------------------------------------------------------ steps

    def seqlen_at(self, step: int) -> int:
        """Sequence length step `step` (1-based) trains on: the curriculum's, else model.seq_length."""
        return seqlen_at(self.run_schedule, step)

    def _activation_shape(self, seqlen: int) -> None:
        """The pipeline engine caches the activation shape it exchanges between stages; a new length resets it."""
        if self._engine_seqlen is not None and self._engine_seqlen != seqlen:
            self.engine.reset_activation_shape()
        self._engine_seqlen = seqlen

    def _scheduled_lr(self) -> float:
        s = self.state
        return self.lr.lr_at(s.lr_scheduler_samples, s.lr_scheduler_tokens, s.lr_warmup_end_tokens or 0)

    def train_step(self) -> tuple[float, bool, int, int]:
        """One optimizer step: (loss, applied, global batch size, sequence length)."""
        s, e = self.state, self.engine
        gbs = self.schedule.batch_size_at(s.consumed_train_samples)
        seqlen = self.seqlen_at(s.iteration + 1)  # Megatron: update_difficulty(iteration + 1)
        e.set_train_batch_size(gbs)
        self._activation_shape(seqlen)
        self.ds_state.set_learning_rate(self._scheduled_lr())
        data = self.train_feed.take(e.micro_batches, seqlen) if self.train_feed is not None else None
        loss = float(e.train_batch(data_iter=self._with_faults(data, s.iteration + 1)))
        if hasattr(self.loss_fn, "iteration"):
            self.loss_fn.iteration = 0  # validation is never faulted
        if self.train_feed is not None:
            self.train_feed.finish(data)
        applied = self.ds_state.step_applied()
        s.iteration += 1
        s.consumed_train_samples += gbs
        s.consumed_train_tokens += gbs * seqlen
        if applied:
            s.lr_scheduler_samples += gbs
            s.lr_scheduler_tokens += gbs * seqlen
            if s.lr_warmup_end_tokens is None and s.lr_scheduler_samples >= self.lr.warmup_samples:
                s.lr_warmup_end_tokens = s.lr_scheduler_tokens
        else:
            s.skipped_iterations += 1
        # Megatron's scheduler steps right after the optimizer: the LR logged is the next step's.
        self.ds_state.set_learning_rate(self._scheduled_lr())
        return loss, applied, gbs, seqlen

    def _with_faults(self, data, iteration: int):
        """The step's micro-batches as the debug switches want them fed (faults.py); unchanged when none is set.
        Tokens are recorded by the first stage of TP rank 0, once per data-parallel rank."""
        f = self.faults
        if data is not None and iteration in f.record_tokens and self.stage == 0 and self.tp.rank == 0:
            data = recorded(data, self.debug_folder, iteration, self.dp_rank)
        if data is not None and iteration in f.corrupt:
            data = corrupted(data, self.exp.model.vocab_size, iteration)
        if hasattr(self.loss_fn, "iteration"):  # BSOPS_NAN_AT, BSOPS_SCALE_GRAD_AT: the loss knows the step
            self.loss_fn.iteration = iteration
        slow_down(f, iteration)
        return data

    def skip_step(self) -> None:
        """An iteration of train.skip_iterations: its samples count as consumed (the next step reads on
        after them), the model, optimizer and LR schedule do not move (Megatron's --skip-train-iteration-range;
        unlike Megatron, the iteration and consumed-sample counters advance, so the run's length is unchanged)."""
        s = self.state
        if not in_skip_range(s.iteration, self.skip_ranges):  # the first of its range
            end = next(b for a, b in self.skip_ranges if a <= s.iteration + 1 <= b)
            _print(f"> skipping iterations {s.iteration + 1} to {end} (train.skip_iterations): "
                   "their data is consumed, no update is made")
        gbs = self.schedule.batch_size_at(s.consumed_train_samples)
        seqlen = self.seqlen_at(s.iteration + 1)
        s.iteration += 1
        s.consumed_train_samples += gbs
        s.consumed_train_tokens += gbs * seqlen
        if self.train_feed is not None:  # the same feed reads on past them: no new DataLoader workers mid-run
            self.train_feed.skip(self._micro_batches(gbs))

    def _micro_batches(self, gbs: int) -> int:
        """Micro-batches this rank reads in a step of global batch size `gbs`."""
        return gbs // (self.exp.batch.micro_batch_size * self.dp)

    def evaluate(self) -> float | None:
        exp, e = self.exp, self.engine
        if exp.logging.eval_iters == 0 or self.valid_ds is None:
            return None
        gbs = self.schedule.batch_size_at(self.state.consumed_train_samples)
        micro = self._micro_batches(gbs)
        self._activation_shape(exp.model.seq_length)  # validation reads whole samples, as Megatron's
        losses = []
        for _ in range(exp.logging.eval_iters):
            data = self.valid_feed.take(micro) if self.valid_feed is not None else None
            losses.append(float(e.eval_batch(data, num_micro_batches=micro)))
            if self.valid_feed is not None:
                self.valid_feed.finish(data)
            self.state.consumed_valid_samples += gbs
        return sum(losses) / len(losses)

    def params_norm(self) -> float:
        """L2 norm of all parameters, each counted once: the tied copy on the last stage is left out, and
        parameters replicated over TP count on TP rank 0 only."""
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        tied = set()
        if self.exp.parallel.pipeline > 1 and self.engine.is_last_stage():
            tied = {id(p) for m in self.engine.module.tied_modules.values() for p in m.parameters()}
        for p in self.engine.module.parameters():
            replica = self.tp.rank != 0 and not getattr(p, "tensor_model_parallel", False)
            if id(p) not in tied and not replica:
                total += p.detach().double().pow(2).sum()
        if self.dp_rank != 0:  # data-parallel replicas hold the same parameters
            total.zero_()
        dist.all_reduce(total)
        return float(total.sqrt())

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        exp = self.exp
        kill_switch = kill_switch_path(exp.checkpoint)
        if any_rank(self.device, kill_switch is not None and kill_switch.exists())[0]:
            _print(f"> kill switch {kill_switch} exists: exiting without training")
            return 0
        ckpt.resolve_resume(self.checkpoints, _print)  # `latest` names a verified checkpoint, or there is none
        self._check_layout()
        resume = self._find_resume()
        self.stopper = Stopper(exp.checkpoint, self.train_iters, self.next_phase, self.job_start, self.device)
        self._build_engine(resume)
        self._build_data()
        self._build_outputs()
        self._resume(resume)
        self._build_feeds()
        # The task's layout, read back by `bsops samples` (sampling.TaskLayout) to map its iterations to ranks.
        p = exp.parallel
        _print(TaskLayout(exp.name, self.params, p.tensor, p.pipeline, self.dp, exp.batch.micro_batch_size,
                          self.synthetic_data, self.train_iters, self.state.iteration).line())
        reason = self._loop()
        self.checkpointer.save(self.state.iteration)
        self.metrics.close()
        for feed in (self.train_feed, self.valid_feed):
            if feed is not None:
                feed.close()
        _print(f"> {reason} at iteration {self.state.iteration}")
        return 0

    def _loop(self) -> str:
        """Train until the stopper gives a reason; returns it."""
        s, log = self.state, self.exp.logging
        fault = self.faults.fail
        reason = self.stopper.reason(s.iteration, s.consumed_train_samples, stepped=False)
        while reason is None:
            raise_if_injected(fault, s.iteration + 1)
            if in_skip_range(s.iteration + 1, self.skip_ranges):
                self.skip_step()
            else:
                self._train_iteration()
            it = s.iteration
            if log.eval_iters > 0 and it % log.eval_interval == 0 and it < self.train_iters:
                self._validate(it)
            self.checkpointer.step_done(it)
            reason = self.stopper.reason(it, s.consumed_train_samples, stepped=True)
        if reason == FINISHED and log.eval_iters > 0:
            self._validate(s.iteration)
        return reason

    def _train_iteration(self) -> None:
        """One timed optimizer step, handed to the metrics."""
        start = time.time()
        loss, applied, gbs, seqlen = self.train_step()
        elapsed = time.time() - start
        self.metrics.step(self._step_record(loss, applied, gbs, seqlen, elapsed), self.params_norm)

    def _validate(self, it: int) -> None:
        start = time.time()
        loss = self.evaluate()
        if loss is not None:
            self.metrics.validation(it, loss, self.state.consumed_train_samples, time.time() - start)

    def _step_record(self, loss: float, applied: bool, gbs: int, seqlen: int, elapsed: float) -> StepRecord:
        """What the metrics need of a trained iteration, read off the engine right after its step."""
        s, ds = self.state, self.ds_state
        if self.train_feed is not None and self.train_feed.seen_seqlen is not None:
            seqlen = self.train_feed.seen_seqlen  # the length the model was fed
        return StepRecord(
            iteration=s.iteration, loss=loss, applied=applied, global_batch_size=gbs, seqlen=seqlen, elapsed=elapsed,
            learning_rate=ds.learning_rate(),
            grad_norm=ds.grad_norm() if applied else None,  # Megatron logs none for a skipped update
            loss_scale=ds.loss_scale(),
            consumed_samples=s.consumed_train_samples, consumed_tokens=s.consumed_train_tokens)


def _report_failure(exc: BaseException) -> None:
    """The error of this rank as one write to stderr (the job script appends it to main_log.txt)."""
    where = f"rank {dist.get_rank()}/{dist.get_world_size()}" if dist.is_initialized() else "rank ?"
    text = "".join(traceback.format_exception(exc))
    sys.stdout.flush()
    sys.stderr.write(f"error: training failed on {where} (host {os.uname().nodename}, pid {os.getpid()}): "
                     f"{type(exc).__name__}: {exc}\n{text}")
    sys.stderr.flush()


def run(exp: Experiment, ds_config: dict, synthetic_data: bool = False) -> int:
    """Train on this rank. Success ends with a barrier so no rank tears the group down early; an error
    propagates at once (no barrier in a `finally`: the peers of a failed rank could never reach it)."""
    device = pipeline_engine.init_distributed(exp.slurm.device if torch.cuda.is_available() else "cpu",
                              exp.parallel.collective_timeout_minutes)
    code = Trainer(exp, ds_config, synthetic_data, device).run()
    dist.barrier()
    dist.destroy_process_group()
    return code


def main(argv: list[str] | None = None) -> int:
    import argparse

    from bigscience_ops.config.loading import from_dict

    parser = argparse.ArgumentParser(prog="python -m bigscience_ops.trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", required=True, type=Path, help="the resolved experiment.json bsops render wrote")
    parser.add_argument("--deepspeed-config", required=True, type=Path, help="the ds_config.json bsops render wrote")
    parser.add_argument("--synthetic-data", action="store_true",
                        help="train on generated token sequences instead of data.blend (tests and benchmarks)")
    args = parser.parse_args(argv)
    try:
        exp = from_dict(json.loads(args.experiment.read_text(encoding="utf-8")), str(args.experiment))
        ds_config = json.loads(args.deepspeed_config.read_text(encoding="utf-8"))
        return run(exp, ds_config, args.synthetic_data)
    except BsopsError as exc:
        code = 2
        sys.stdout.flush()
        print(f"error: {exc}", file=sys.stderr, flush=True)
    except BaseException as exc:  # noqa: BLE001 - every failure must end this rank now, whatever it is
        code = 1
        _report_failure(exc)
    if dist.is_initialized() and dist.get_world_size() > 1:
        # Leave now: a normal interpreter exit tears down the process group, and with NCCL that can
        # wait on the collectives of peers that will never come. torchrun sees the exit and stops the rest.
        os._exit(code)
    return code
