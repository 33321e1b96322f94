"""The trainer's metrics: every log line about progress and every TensorBoard scalar it writes.

The Trainer reads what a trained iteration produced off the engine (a `StepRecord`) and hands it
over; `Metrics` writes that iteration's scalars, keeps the logging window (the loss of the applied
steps since the last line, NaN and skipped steps, time) and, every `log_interval` iterations, prints
Megatron's iteration line averaged over the window (its skipped and NaN counts are the window's, as
Megatron's: the watchdog reads a run of lines with skipped steps as overflows that go on). Validation
and checkpoint saves report here too. The formats and tags are report.py's; nothing here touches the
engine or torch.distributed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from bigscience_ops.run.iterations import IterationStats, iteration_line
from bigscience_ops.trainer.report import Board, mfu, perplexity, validation_lines


@dataclass(frozen=True)
class StepRecord:
    """One trained iteration (skipped ones have none), read right after its optimizer step."""

    iteration: int
    loss: float
    applied: bool  # False when the optimizer skipped the update (fp16 overflow)
    global_batch_size: int
    seqlen: int  # the sequence length the model was fed
    elapsed: float  # seconds the step took
    learning_rate: float  # the next step's, as Megatron logs it
    grad_norm: float | None
    loss_scale: float
    consumed_samples: int
    consumed_tokens: int


@dataclass
class Window:
    """The iterations since the last iteration line; the line shows their averages."""

    loss: float = 0.0  # summed over applied steps with a finite loss
    count: int = 0  # applied steps with a finite loss
    time: float = 0.0  # seconds over all iterations
    iters: int = 0
    nan: int = 0  # steps whose loss was not finite
    skipped: int = 0  # steps whose update was skipped (a non-finite gradient, fp16's overflow)

    def add(self, loss: float, applied: bool, elapsed: float) -> None:
        is_nan = not math.isfinite(loss)
        if applied and not is_nan:
            self.loss += loss
            self.count += 1
        self.nan += int(is_nan)
        self.skipped += int(not applied)
        self.time += elapsed
        self.iters += 1


class Metrics:
    """Log lines (through `echo`, which prints on rank 0) and TensorBoard scalars (through `board`)."""

    def __init__(self, board: Board, echo: Callable[..., None], *, train_iters: int, log_interval: int,
                 flops_per_token: float, peak_tflops: float | None, world_size: int, curriculum: bool) -> None:
        self.board = board
        self.echo = echo
        self.train_iters = train_iters
        self.log_interval = log_interval
        self.flops_per_token = flops_per_token
        self.peak_tflops = peak_tflops
        self.world_size = world_size
        self.curriculum = curriculum
        self.window = Window()

    def step(self, r: StepRecord, params_norm: Callable[[], float]) -> None:
        """A trained iteration's scalars; on a log iteration also params norm (`params_norm()` is a
        collective: every rank calls it on the same iterations) and the line, which closes the window."""
        self.window.add(r.loss, r.applied, r.elapsed)
        b, it, consumed, gbs, seq, world = (self.board, r.iteration, r.consumed_samples, r.global_batch_size,
                                            r.seqlen, self.world_size)
        b.scalar("consumed tokens", r.consumed_tokens, it, consumed)
        if self.curriculum:
            b.scalar("curriculum seqlen", seq, it, consumed)
        b.scalar("learning-rate", r.learning_rate, it, consumed)
        b.scalar("batch-size", gbs, it, consumed)
        b.scalar("lm loss", r.loss, it, consumed)
        b.scalar("loss-scale", r.loss_scale, it, consumed)
        b.scalar("grad-norm", r.grad_norm, it, consumed)
        b.scalar("iteration-time", r.elapsed, it, consumed)
        b.scalar("samples per second", gbs / r.elapsed, it, consumed)
        step_tflops = gbs * seq * self.flops_per_token / r.elapsed / world / 1e12
        b.scalar("TFLOPs per GPU", step_tflops, it, consumed)
        b.scalar("MFU", mfu(step_tflops, self.peak_tflops), it, consumed)  # left out when the peak is unknown
        if it % self.log_interval:
            return
        norm = params_norm()
        b.scalar("params-norm", norm, it, consumed)
        w = self.window
        per_iter = w.time / max(w.iters, 1)
        tokens_per_s = gbs * seq / per_iter
        self.echo(iteration_line(IterationStats(
            iteration=it, train_iters=self.train_iters, consumed_samples=consumed, consumed_tokens=r.consumed_tokens,
            elapsed_ms=per_iter * 1000.0, learning_rate=r.learning_rate, global_batch_size=gbs,
            lm_loss=w.loss / w.count if w.count else None, loss_scale=r.loss_scale, grad_norm=r.grad_norm,
            params_norm=norm, skipped=w.skipped, nan=w.nan, samples_per_second=gbs / per_iter,
            tflops=tokens_per_s * self.flops_per_token / world / 1e12,
            mfu=mfu(tokens_per_s * self.flops_per_token / world / 1e12, self.peak_tflops),
            curriculum_seqlen=seq if self.curriculum else None)))
        self.window = Window()

    def validation(self, iteration: int, loss: float, consumed_samples: int, elapsed: float) -> None:
        self.echo(*validation_lines(iteration, loss))
        self.board.scalar("lm loss validation", loss, iteration, consumed_samples)
        self.board.scalar("lm loss validation ppl", perplexity(loss), iteration, consumed_samples)
        self.board.scalar("eval-time", elapsed, iteration)

    def checkpoint_saved(self, iteration: int, folder: object, elapsed: float) -> None:
        self.board.scalar("save-checkpoint-time", elapsed, iteration)
        self.echo(f"  successfully saved checkpoint at iteration {iteration:7d} to {folder} ({elapsed * 1000:.1f} ms)")

    def close(self) -> None:
        self.board.flush()
        self.board.close()
