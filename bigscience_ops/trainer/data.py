"""Training data for the trainer: micro-batches in Megatron's sample order, fed to the engine.

Which samples a step reads (the datasets and their sizes, the index arithmetic) is sampling.py's, shared
with `bsops samples` so the command and the trainer cannot drift. Megatron's pretraining sampler
walks the dataset in order: the step that starts after `consumed` samples reads samples consumed,
consumed + 1, ...; micro-step k of data-parallel rank r reads [consumed + k * mbs * dp + r * mbs, + mbs).
The order depends only on `consumed`, so a resumed run reads exactly what the uninterrupted run would
have read.

Because every global batch size is a multiple of micro_batch_size x DP, the micro-batches of one
rank form one sequence whatever the rampup: after resuming at `consumed`, micro-batch j reads
[consumed + j * mbs * dp + r * mbs, + mbs). `consumed` need not be a multiple of mbs x dp: a run
that changes DP at a node-schedule phase resumes wherever the old layout stopped, as Megatron's does.
`MicroBatchFeed` walks that sequence with DataLoader workers (`data.num_workers`), pinned memory
and non-blocking copies to the GPU, so the next micro-batches are ready before the step asks.

Curriculum learning truncates each sample to the step's sequence length (Megatron-DeepSpeed's
get_batch: tokens, labels and loss mask cut to the first `seqlen` positions); the rest of the
sample is not used, and the next step still starts at the next sample.

Every micro-batch is checked before the model sees it: each token id it feeds must be in [0, token_limit)
(the model's padded vocabulary, which the datasets carry: sampling.build_datasets). The launch's pre-flight
checked the data as it was then; data changed since (or never checked: a run started by hand) would otherwise
reach the embedding as `IndexError: index out of range in self` with no word of where. A bad id stops the
rank with a TokenOutOfVocabulary naming the dataset's prefix, the document and the token's offset in it.
The check is one min/max over the micro-batch's ids on the host (benchmarks/token_check.py: well under 1%
of a step).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from itertools import count
from typing import Protocol

import numpy as np
import torch

from bigscience_ops.trainer.errors import TrainerError
from bigscience_ops.trainer.sampling import micro_batch_indices
from bigscience_ops.trainer.stacks import serve_stack_dumps


class TokenDataset(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> np.ndarray: ...  # seq_length + 1 token ids


class TokenOutOfVocabulary(TrainerError):
    """A micro-batch holds a token id the model has no embedding row for: where it is in the data, in one line.
    `where`: the dataset's TokenPlace (prefix, document, offset), or words for data without one."""

    def __init__(self, where: object, value: int, limit: int, sample: int, micro_batch: int, dp_rank: int) -> None:
        self.where, self.value, self.limit, self.sample = where, value, limit, sample
        prefix = getattr(where, "prefix", None)
        verify = f"bsops data verify {shlex.quote(prefix)}" if prefix is not None else "bsops data verify PREFIX"
        super().__init__(
            f"data: {where} holds token id {value}, which the model cannot embed: ids must be in [0, {limit}) "
            f"(model.vocab_size padded); the data changed after the launch's check, or was made with another "
            f"tokenizer: `{verify}` lists every such token (micro-batch {micro_batch} of data-parallel rank "
            f"{dp_rank}, sample {sample})")


MicroBatch = tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]  # tokens, (labels, loss mask): (mbs, seq) each


def collate(samples: Sequence[np.ndarray]) -> MicroBatch:
    """Samples of seq_length + 1 token ids -> (tokens, (labels, loss mask)); host tensors."""
    tokens = torch.from_numpy(np.stack([np.asarray(sample, dtype=np.int64) for sample in samples]))
    labels = tokens[:, 1:].contiguous()
    loss_mask = torch.ones(labels.shape, dtype=torch.float32)
    return tokens[:, :-1].contiguous(), (labels, loss_mask)


def truncate(batch: MicroBatch, seqlen: int | None) -> MicroBatch:
    """The micro-batch cut to its first `seqlen` positions (curriculum learning); None or longer: unchanged."""
    tokens, (labels, mask) = batch
    if seqlen is None or seqlen >= tokens.shape[1]:
        return batch
    return (tokens[:, :seqlen].contiguous(), (labels[:, :seqlen].contiguous(), mask[:, :seqlen].contiguous()))


def bad_token(batch: MicroBatch, limit: int) -> tuple[int, int, int] | None:
    """(row, position in the sample, id) of the first token id of `batch` outside [0, limit), else None. Position
    0 is the first token fed, position p > 0 is label p - 1 (the sample's token p)."""
    tokens, (labels, _) = batch
    low, high = torch.aminmax(labels)
    first_low, first_high = torch.aminmax(tokens[:, 0])  # the labels hold every other token of the sample
    if min(int(low), int(first_low)) >= 0 and max(int(high), int(first_high)) < limit:
        return None
    sample = torch.cat([tokens[:, :1], labels], dim=1)
    row, position = (int(x) for x in ((sample < 0) | (sample >= limit)).nonzero()[0])
    return row, position, int(sample[row, position])


def step_micro_batches(dataset: TokenDataset, consumed: int, num_micro_batches: int, micro_batch_size: int,
                       dp_rank: int, dp_size: int) -> Iterator:
    """The micro-batches this data-parallel rank reads in the step that starts after `consumed` samples."""
    for k in range(num_micro_batches):
        yield collate([dataset[i] for i in micro_batch_indices(consumed, k, micro_batch_size, dp_rank, dp_size,
                                                               len(dataset))])


class MicroBatchSampler:
    """Index lists of one rank's micro-batches in Megatron's order, after `consumed` samples, forever."""

    def __init__(self, num_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int, consumed: int) -> None:
        self.n, self.mbs, self.rank, self.dp, self.consumed = num_samples, micro_batch_size, dp_rank, dp_size, consumed

    def __iter__(self) -> Iterator[list[int]]:
        for j in count():
            yield micro_batch_indices(self.consumed, j, self.mbs, self.rank, self.dp, self.n)


def _set_up_worker(worker_id: int) -> None:
    """DataLoader worker set-up: SIGUSR2 writes its stacks, as the trainer's (stacks.py; the worker was
    forked with the signal blocked and without the thread that takes it), and it gets SIGKILL when
    its trainer process ends, however it ends.

    A failed rank leaves with os._exit (train.py); without this its workers would linger until their
    next liveness check. SIGTERM ends it only when its trainer sends it (`_end_on_trainers_sigterm`).
    """
    _end_on_trainers_sigterm()  # first: the threads started from here on inherit the blocked signal
    serve_stack_dumps()
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _end_on_trainers_sigterm() -> None:
    """SIGTERM from the worker's trainer (shutting its workers down) ends the worker, as torch's own handler
    does; from anyone else it is ignored. scancel and the time limit send SIGTERM to every process of the
    job: a worker that died of it would fail the trainer's step instead of letting it save and exit. Only
    sigwaitinfo tells the sender, so one thread takes the signal, blocked everywhere else."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def take() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == os.getppid():
                os._exit(0)

    threading.Thread(target=take, name="bsops-sigterm", daemon=True).start()


class MicroBatchFeed:
    """One rank's micro-batches from `consumed` samples on, prepared off the critical path.

    DataLoader workers (`num_workers`; 0 reads in this process) collate ahead of the step into
    pinned memory on CUDA, and `take` copies them to `device` without blocking. A step takes exactly
    its micro-batches: `finish` reads what the engine left, so the next step starts where Megatron's does.
    """

    def __init__(self, dataset: TokenDataset, consumed: int, micro_batch_size: int, dp_rank: int, dp_size: int,
                 num_workers: int, device: torch.device, token_limit: int | None = None) -> None:
        """`token_limit`: every id fed must be below it; default the dataset's own `token_limit` (the model's padded
        vocabulary, set by sampling.build_datasets)."""
        self.device = device
        self.seen_seqlen: int | None = None
        self.dataset = dataset
        self.token_limit = token_limit if token_limit is not None else getattr(dataset, "token_limit", None)
        self._read = 0  # micro-batches drawn from the loader so far (taken or skipped)
        sampler = MicroBatchSampler(len(dataset), micro_batch_size, dp_rank, dp_size, consumed)
        self.sampler = sampler
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers,
            pin_memory=device.type == "cuda", prefetch_factor=4 if num_workers else None,
            worker_init_fn=_set_up_worker if num_workers else None)
        self._batches = iter(self.loader)

    def _to_device(self, batch: MicroBatch) -> MicroBatch:
        if self.device.type == "cpu":
            return batch
        tokens, (labels, mask) = batch
        return (tokens.to(self.device, non_blocking=True),
                (labels.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)))

    def take(self, num_micro_batches: int, seqlen: int | None = None) -> Iterator[MicroBatch]:
        """The next `num_micro_batches` micro-batches, cut to `seqlen` positions when given, on the device.

        `seen_seqlen` is the length of the last micro-batch handed out: what the model was fed.
        """
        for _ in range(num_micro_batches):
            batch = truncate(next(self._batches), seqlen)
            self._read += 1
            self._check(batch)
            batch = self._to_device(batch)
            self.seen_seqlen = batch[0].shape[1]
            yield batch

    def _check(self, batch: MicroBatch) -> None:
        """TokenOutOfVocabulary when the micro-batch just read holds an id outside [0, token_limit)."""
        if self.token_limit is None:
            return
        found = bad_token(batch, self.token_limit)
        if found is None:
            return
        row, position, value = found
        s = self.sampler
        sample = micro_batch_indices(s.consumed, self._read - 1, s.mbs, s.rank, s.dp, s.n)[row]
        locate = getattr(self.dataset, "locate", None)
        where = locate(sample, position) if locate is not None else f"sample {sample}, token {position}"
        raise TokenOutOfVocabulary(where, value, self.token_limit, sample, self._read, s.rank)

    def skip(self, num_micro_batches: int) -> None:
        """Drop the next `num_micro_batches` micro-batches unread (a skipped iteration's), so the next `take`
        reads on after them. The workers go on as they are: forking new ones from a trainer whose collective
        and writer threads run could deadlock the child on a lock one of them held."""
        for _ in range(num_micro_batches):
            next(self._batches)
            self._read += 1

    def close(self) -> None:
        """End the workers now, through the DataLoader's own shutdown (a sentinel, no signal). Left to the
        interpreter's exit, multiprocessing ends them with SIGTERM, which a worker tells from Slurm's only by
        its sender: when scancel's SIGTERM is pending at that moment the two merge into one, the worker keeps
        waiting and its trainer's exit with it (seen on the test cluster under load)."""
        shutdown = getattr(self._batches, "_shutdown_workers", None)  # absent with num_workers 0
        if shutdown is not None:
            shutdown()

    def finish(self, step: Iterator[MicroBatch]) -> None:
        """Consume what the step did not read (the engine reads them all; this keeps the order if not)."""
        for _ in step:
            pass
