"""Megatron's three GPT index arrays built in memory: the epoch plan, doc_idx, sample_idx, shuffle_idx.

With the same seed the arrays are identical to Megatron-DeepSpeed's `_build_index_mappings` (same
RNG calls, same values), built with numpy in O(chunk) extra memory instead of a per-token C++ loop.
This is the reference: index_files.py writes the same bytes straight into .npy files in bounded
memory for the trainer, and takes its epoch plan (`index_plan`) from here.
"""

from __future__ import annotations

import numpy as np

from bigscience_ops.data.errors import DataError

CUTOFF_LAST_EPOCH = 0.95  # Megatron's: a last epoch under 95% full is shuffled separately
SAMPLE_CHUNK = 1 << 24  # doc_idx entries handled at once when building sample_idx


def num_epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Fewest epochs whose tokens give num_samples samples (each needs seq_length new tokens, +1 once)."""
    if tokens_per_epoch <= 1:
        raise DataError(f"the documents hold {tokens_per_epoch} tokens; at least 2 are needed for a sample")
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


def build_doc_idx(first_doc: int, end_doc: int, num_epochs: int, rng: np.random.RandomState,
                  separate_last_epoch: bool) -> np.ndarray:
    """Every document of [first_doc, end_doc) once per epoch, shuffled (int32, as Megatron's)."""
    if separate_last_epoch and num_epochs > 1:
        head = build_doc_idx(first_doc, end_doc, num_epochs - 1, rng, False)
        tail = build_doc_idx(first_doc, end_doc, 1, rng, False)
        return np.concatenate((head, tail))
    n = end_doc - first_doc
    doc_idx = np.empty(num_epochs * n, dtype=np.int32)
    documents = np.arange(first_doc, end_doc, dtype=np.int32)
    for e in range(num_epochs):
        doc_idx[e * n:(e + 1) * n] = documents
    rng.shuffle(doc_idx)
    return doc_idx


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, num_epochs: int,
                     tokens_per_epoch: int) -> np.ndarray:
    """(num_samples + 1, 2) array of (position in doc_idx, token offset) where each sample starts.

    Sample k spans tokens [k * seq_length, (k + 1) * seq_length] of the concatenated documents;
    its end is the next sample's start. A position is given by the document holding that token,
    as Megatron's helpers.cpp records it (so empty documents are never named, except at 0).
    """
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    dtype = np.int32 if len(doc_idx) < np.iinfo(np.int32).max else np.int64
    sample_idx = np.zeros((num_samples + 1, 2), dtype=dtype)  # row 0 stays (0, 0)
    L = seq_length
    base = 0  # tokens before the current chunk of doc_idx
    # Buffers reused across chunks: fresh pages cost more than the arithmetic on them.
    chunk = min(SAMPLE_CHUNK, len(doc_idx))
    size_buf = np.empty(chunk, dtype=sizes.dtype)
    ends_buf = np.empty(chunk, dtype=np.int64)
    ceil_buf = np.empty(chunk, dtype=np.int64)
    for start in range(0, len(doc_idx), SAMPLE_CHUNK):
        first_k = -(-base // L)  # first sample start at or after this chunk's first token
        if first_k > num_samples:
            break
        n = min(SAMPLE_CHUNK, len(doc_idx) - start)
        doc_sizes = np.take(sizes, doc_idx[start:start + n], out=size_buf[:n])
        ends = np.cumsum(doc_sizes, dtype=np.int64, out=ends_buf[:n])
        ends += base
        # Sample starts k * L inside document j: ceil(start_j / L) <= k < ceil(end_j / L), and
        # start_j is end_{j-1}, so the counts are differences of one ceil-divided array.
        ceil_ends = np.add(ends, L - 1, out=ceil_buf[:n])
        ceil_ends //= L
        counts = np.diff(ceil_ends, prepend=first_k)
        holder = np.repeat(np.arange(n, dtype=np.int64), counts)  # document of each k
        ks = np.arange(first_k, first_k + len(holder), dtype=np.int64)
        keep = slice(1 if first_k == 0 else 0, max(0, min(len(holder), num_samples + 1 - first_k)))
        ks, holder = ks[keep], holder[keep]
        if len(ks):
            rows = slice(int(ks[0]), int(ks[0]) + len(ks))  # consecutive samples
            sample_idx[rows, 0] = holder + start
            sample_idx[rows, 1] = ks * L - (ends[holder] - doc_sizes[holder])
        base = int(ends[-1]) if n else base
    return sample_idx


def build_shuffle_idx(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    """[0, num_samples) shuffled, then [num_samples, total_size) shuffled, as Megatron's."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def index_plan(sizes: np.ndarray, first_doc: int, end_doc: int, num_samples: int,
               seq_length: int) -> tuple[int, int, bool, int]:
    """tokens_per_epoch, num_epochs, separate_last_epoch, samples from the full epochs (Megatron's)."""
    if seq_length < 1:
        raise DataError(f"seq_length must be >= 1; got {seq_length}")
    if num_samples < 0:
        raise DataError(f"num_samples must be >= 0; got {num_samples}")
    tokens_per_epoch = int(sizes[first_doc:end_doc].sum(dtype=np.int64))
    num_epochs = num_epochs_needed(tokens_per_epoch, seq_length, num_samples)
    separate_last_epoch = False
    from_full_epochs = 0
    if num_epochs > 1:
        from_full_epochs = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        last_epoch_samples = num_samples - from_full_epochs
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate_last_epoch = last_epoch_samples < int(CUTOFF_LAST_EPOCH * per_epoch)
    return tokens_per_epoch, num_epochs, separate_last_epoch, from_full_epochs


def build_index_mappings(sizes: np.ndarray, first_doc: int, end_doc: int, num_samples: int,
                         seq_length: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """doc_idx, sample_idx, shuffle_idx for documents [first_doc, end_doc), as Megatron builds them."""
    tokens_per_epoch, num_epochs, separate_last_epoch, from_full_epochs = index_plan(
        sizes, first_doc, end_doc, num_samples, seq_length)
    rng = np.random.RandomState(seed=seed)
    doc_idx = build_doc_idx(first_doc, end_doc, num_epochs, rng, separate_last_epoch)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
    total = sample_idx.shape[0] - 1
    shuffle_idx = build_shuffle_idx(from_full_epochs if separate_last_epoch else total, total, rng)
    return doc_idx, sample_idx, shuffle_idx
