"""Training data for the trainer: the GPT datasets, and micro-batches in Megatron's sample order.

Megatron's pretraining sampler walks the dataset in order: the step that starts after `consumed`
samples reads samples consumed, consumed + 1, ...; micro-step k of data-parallel rank r reads
[consumed + k * mbs * dp + r * mbs, + mbs). The order depends only on `consumed`, so a resumed run
reads exactly what the uninterrupted run would have read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np
import torch


class TokenDataset(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> np.ndarray: ...  # seq_length + 1 token ids


class SyntheticDataset:
    """Generated token sequences with learnable structure, for tests and benchmarks.

    Each sample follows a fixed random successor table (token -> next token) with 10% random
    tokens mixed in, so the loss falls quickly from log(vocab). Sample i depends only on
    (seed, i): any process computes the same sample.
    """

    def __init__(self, num_samples: int, seq_length: int, vocab_size: int, seed: int, split: int = 0) -> None:
        self.num_samples, self.seq_length, self.vocab_size = num_samples, seq_length, vocab_size
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


def build_datasets(exp, num_samples: tuple[int, int, int], synthetic: bool) -> tuple:
    """(train, valid, test) datasets; a split may be None when the data split leaves it empty."""
    m = exp.model
    if synthetic:
        train, valid, test = num_samples
        return tuple(SyntheticDataset(max(n, 1), m.seq_length, m.vocab_size, exp.train.seed, split)
                     for split, n in enumerate((train, valid, test)))
    from bigscience_ops.data.gpt_dataset import build_train_valid_test_datasets

    prefixes = [(src.weight, src.prefix) for src in exp.data.blend]
    return build_train_valid_test_datasets(prefixes, exp.data.split, m.seq_length, exp.train.seed, num_samples)


def _micro_batch(dataset: TokenDataset, start: int, size: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    n = len(dataset)
    rows = np.stack([np.asarray(dataset[(start + i) % n], dtype=np.int64) for i in range(size)])
    tokens = torch.from_numpy(rows)
    labels = tokens[:, 1:].contiguous()
    loss_mask = torch.ones(labels.shape, dtype=torch.float32)
    return tokens[:, :-1].contiguous(), (labels, loss_mask)


def step_micro_batches(dataset: TokenDataset, consumed: int, num_micro_batches: int, micro_batch_size: int,
                       dp_rank: int, dp_size: int) -> Iterator:
    """The micro-batches this data-parallel rank reads in the step that starts after `consumed` samples."""
    for k in range(num_micro_batches):
        yield _micro_batch(dataset, consumed + (k * dp_size + dp_rank) * micro_batch_size, micro_batch_size)


def sample_indices(consumed: int, num_micro_batches: int, micro_batch_size: int, dp_rank: int, dp_size: int) -> Sequence[int]:
    """The dataset indices `step_micro_batches` reads, in order (for tests)."""
    return [consumed + (k * dp_size + dp_rank) * micro_batch_size + i
            for k in range(num_micro_batches) for i in range(micro_batch_size)]
