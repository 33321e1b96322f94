"""Which samples a training step reads: the datasets, Megatron's sample order, and the layout each task logs.

The trainer (data.py's feeds) and `bsops samples` (views/samples.py) both map an iteration to its
samples through these functions, so the command shows what the trainer read by construction:

- `dataset_sizes` and `build_datasets`: the train/valid/test datasets with the sizes the trainer asks for
  (the GPT dataset's index files depend on them);
- `micro_batch_positions`/`_indices`: Megatron's pretraining sampler: the step that starts after `consumed`
  samples reads consumed, consumed + 1, ...; micro-batch k of data-parallel rank r reads
  [consumed + (k * dp + r) * mbs, + mbs), modulo the dataset's length;
- `seqlen_at`: the sequence length a step trains on (curriculum learning truncates each sample);
- `TaskLayout`: the line a task logs when it starts ("> training ...: TP=1 PP=2 DP=2, micro batch size 2,
  on data.blend, ..."), written by the trainer and read back by `bsops samples` to know a past iteration's
  DP, micro-batch size and data.

numpy only: `bsops samples` imports this without torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bigscience_ops.schedule.run import RunSchedule
from bigscience_ops.schema import Experiment
from bigscience_ops.sizing import padded_vocab_size


class SyntheticDataset:
    """Generated token sequences with learnable structure, for tests and benchmarks.

    Each sample follows a fixed random successor table (token -> next token) with 10% random
    tokens mixed in, so the loss falls quickly from log(vocab). Sample i depends only on
    (seed, i): any process computes the same sample.
    """

    def __init__(self, num_samples: int, seq_length: int, vocab_size: int, seed: int, split: int = 0) -> None:
        self.num_samples, self.seq_length, self.vocab_size = num_samples, seq_length, vocab_size
        self.token_limit = vocab_size  # the ids it makes are below it (the trainer's feed checks them all the same)
        self.seed, self.split = seed, split
        self.successor = np.random.default_rng(seed).integers(0, vocab_size, size=vocab_size)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.split, index])
        out = np.empty(self.seq_length + 1, dtype=np.int64)
        out[0] = rng.integers(self.vocab_size)
        noise = rng.random(self.seq_length) < 0.1
        random_tokens = rng.integers(0, self.vocab_size, size=self.seq_length)
        for t in range(self.seq_length):
            out[t + 1] = random_tokens[t] if noise[t] else self.successor[out[t]]
        return out

    def locate(self, i: int, position: int) -> str:
        return f"generated sequence {i} (--synthetic-data), token {position}"


def dataset_sizes(exp: Experiment, schedule: RunSchedule) -> tuple[int, int, int]:
    """(train, valid, test) samples the trainer asks of the datasets: train.samples (or every step's full batch),
    a validation run's samples at every eval_interval and at the end, and one run's for test."""
    gbs, log = schedule.batch.global_batch_size, exp.logging
    train = exp.train.samples if exp.train.samples is not None else schedule.train_iters * gbs
    valid = (schedule.train_iters // log.eval_interval + 1) * log.eval_iters * gbs
    return train, valid, log.eval_iters * gbs


def build_datasets(exp: Experiment, num_samples: tuple[int, int, int], synthetic: bool, indices=None) -> tuple:
    """(train, valid, test) datasets; a split may be None when the data split leaves it empty. `indices` (a
    gpt_dataset.ReadOnlyIndices, for `bsops samples`) reads the index files the trainer wrote and writes none there.
    Each dataset's `token_limit` is the model's padded vocabulary: the trainer's feed checks every token id
    against it before the model sees it (data.MicroBatchFeed)."""
    m = exp.model
    if synthetic:
        train, valid, test = num_samples
        return tuple(SyntheticDataset(max(n, 1), m.seq_length, m.vocab_size, exp.train.seed, split)
                     for split, n in enumerate((train, valid, test)))
    from bigscience_ops.data.gpt_dataset import build_train_valid_test_datasets

    prefixes = [(src.weight, src.prefix) for src in exp.data.blend]
    return build_train_valid_test_datasets(
        prefixes, exp.data.split, m.seq_length, exp.train.seed, num_samples,
        cache_dir=exp.data.cache_dir if indices is None else indices,
        token_limit=padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, exp.parallel.tensor))


def micro_batch_positions(consumed: int, k: int, micro_batch_size: int, dp_rank: int, dp_size: int) -> range:
    """Global sample positions (samples consumed before each) of micro-batch k of data-parallel rank `dp_rank`,
    counted from the step that starts after `consumed` samples (k may run past that step: the next steps'
    micro-batches continue the sequence)."""
    start = consumed + (k * dp_size + dp_rank) * micro_batch_size
    return range(start, start + micro_batch_size)


def micro_batch_indices(consumed: int, k: int, micro_batch_size: int, dp_rank: int, dp_size: int,
                        num_samples: int) -> list[int]:
    """The dataset indices of those positions: they wrap around a dataset of `num_samples`."""
    return [p % num_samples for p in micro_batch_positions(consumed, k, micro_batch_size, dp_rank, dp_size)]


def sample_indices(consumed: int, num_micro_batches: int, micro_batch_size: int, dp_rank: int,
                   dp_size: int) -> Sequence[int]:
    """The consumed-sample positions one rank reads in a step, in order (before the modulo; for tests)."""
    return [consumed + (k * dp_size + dp_rank) * micro_batch_size + i
            for k in range(num_micro_batches) for i in range(micro_batch_size)]


def seqlen_at(schedule: RunSchedule, step: int) -> int:
    """Sequence length step `step` (1-based) trains on: the curriculum's, else model.seq_length."""
    return schedule.curriculum.seqlen_at(step) if schedule.curriculum is not None else schedule.seq_length


@dataclass(frozen=True)
class TaskLayout:
    """How one task of the run trains: its logged start line, read back to map its iterations to ranks."""

    name: str
    parameters: int
    tensor: int
    pipeline: int
    data: int  # data-parallel size
    micro_batch_size: int
    synthetic: bool  # trained on generated sequences (--synthetic-data), not on data.blend
    train_iters: int
    start: int  # the iteration the task resumed from (it trains start + 1, ...)

    def line(self) -> str:
        data = "generated sequences (--synthetic-data)" if self.synthetic else "data.blend"
        return (f"> training {self.name}: {self.parameters} parameters, TP={self.tensor} PP={self.pipeline} "
                f"DP={self.data}, micro batch size {self.micro_batch_size}, on {data}, {self.train_iters} "
                f"iterations, starting at {self.start}")


_LAYOUT = re.compile(r"> training (?P<name>.+): (?P<parameters>\d+) parameters, TP=(?P<tensor>\d+) "
                     r"PP=(?P<pipeline>\d+) DP=(?P<data>\d+), micro batch size (?P<mbs>\d+), on (?P<on>.+), "
                     r"(?P<iters>\d+) iterations, starting at (?P<start>\d+)")


class LayoutLineError(ValueError):
    """A task's start line whose numbers no task can have (a micro batch size or a parallel size of 0, a number
    of thousands of digits): a torn or hostile log line, reported and skipped by its readers."""


_AT_LEAST_ONE = {"tensor": "TP", "pipeline": "PP", "data": "DP", "mbs": "micro batch size"}
_MAX_DIGITS = 30  # no count of a run has more; int() of thousands of digits is refused (and slow)


def parse_layout_line(line: str) -> TaskLayout | None:
    """The TaskLayout of a task's start line (after srun's "0: " label where the log has one), or None for any
    other line. Raises LayoutLineError for a start line whose TP, PP, DP or micro batch size is below 1, or
    whose numbers are too long to be a run's."""
    found = _LAYOUT.search(line)
    if found is None:
        return None
    g = found.groupdict()
    numbers = ("parameters", "tensor", "pipeline", "data", "mbs", "iters", "start")
    long = [key for key in numbers if len(g[key]) > _MAX_DIGITS]
    if long:
        raise LayoutLineError(f"task start line: {long[0]} has {len(g[long[0]])} digits; allowed: at most "
                              f"{_MAX_DIGITS}")
    low = [(label, g[key]) for key, label in _AT_LEAST_ONE.items() if int(g[key]) < 1]
    if low:
        raise LayoutLineError(f"task start line: {low[0][0]} {low[0][1]}; allowed: 1 or more")
    return TaskLayout(g["name"], int(g["parameters"]), int(g["tensor"]), int(g["pipeline"]), int(g["data"]),
                      int(g["mbs"]), "--synthetic-data" in g["on"], int(g["iters"]), int(g["start"]))
