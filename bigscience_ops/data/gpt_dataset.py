"""The GPT dataset the trainer reads, with Megatron's semantics and index files.

Documents of an indexed dataset are split into train/valid/test ranges by a string such as
"949,50,1" (Megatron's rounding). Within a range, each epoch is every document once; the documents
of all epochs are shuffled together (doc_idx), concatenated (each already ends with EOD), and cut into
samples of seq_length + 1 tokens that overlap by one token and cross document boundaries
(sample_idx); the samples are then shuffled (shuffle_idx). With the same seed the three arrays are
identical to Megatron-DeepSpeed's `_build_index_mappings` (same RNG calls, same values), but they
are built with numpy in O(chunk) extra memory instead of a per-token C++ loop and 2-D `mgrid` copies.

Several prefixes are blended by weight: each split asks dataset i for ceil(N * w_i * 1.005)
samples (Megatron's margin) and interleaves them so that after any n samples dataset i has served
w_i * n of them to within one sample.

Index files are cached next to the data (or in `cache_dir`) and reused when the document range,
the data's token count, num_samples, seq_length and seed all match; building is done by one
process under a lock (flock, or a lock file where the filesystem lacks flock), straight into the
files in bounded memory (see index_files.py); the others wait and load.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np

from bigscience_ops.data.errors import DataError
from bigscience_ops.data.indexed import IndexedDataset

INDEX_VERSION = 1  # part of the cache key; bump when the index layout or algorithm changes
CUTOFF_LAST_EPOCH = 0.95  # Megatron's: a last epoch under 95% full is shuffled separately
SAMPLE_CHUNK = 1 << 24  # doc_idx entries handled at once when building sample_idx
BLEND_WINDOW = 1 << 22  # samples interleaved at once when building blend indices
BLEND_MARGIN = 1.005  # Megatron asks each blended dataset for 0.5% more samples than its share


# --- splits and sizes ------------------------------------------------------------------------

def parse_split(split: str) -> list[float]:
    """Megatron's split string ("949,50,1" or "98/2/0", missing parts 0) as three fractions."""
    sep = "," if "," in split else "/"
    try:
        parts = [float(s) for s in split.split(sep)]
    except ValueError:
        raise DataError(f"split {split!r} is not numbers; allowed: up to three numbers such as '949,50,1'") from None
    if len(parts) > 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise DataError(f"split {split!r}: need up to three non-negative numbers with a positive sum, "
                        "such as '949,50,1'")
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    return [p / total for p in parts]


def split_boundaries(split: str, num_docs: int) -> list[int]:
    """Document index boundaries [0, train_end, valid_end, num_docs], rounded as Megatron rounds."""
    index = [0]
    for fraction in parse_split(split):
        index.append(index[-1] + int(round(fraction * float(num_docs))))
    diff = index[-1] - num_docs
    return [index[0]] + [i - diff for i in index[1:]]


def num_epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Fewest epochs whose tokens give num_samples samples (each needs seq_length new tokens, +1 once)."""
    if tokens_per_epoch <= 1:
        raise DataError(f"the documents hold {tokens_per_epoch} tokens; at least 2 are needed for a sample")
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


# --- the three index arrays ------------------------------------------------------------------

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


# --- caching ---------------------------------------------------------------------------------

def index_cache_base(prefix: str, name: str, first_doc: int, end_doc: int, num_docs: int, tokens: int,
                     num_samples: int, seq_length: int, seed: int, cache_dir: str | None) -> Path:
    """Megatron-like file name plus a key of what the indices depend on beyond its parameters."""
    key = hashlib.sha1(f"v{INDEX_VERSION} docs {first_doc}:{end_doc} of {num_docs} tokens {tokens}".encode())
    stem = f"{Path(prefix).name}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_{key.hexdigest()[:12]}"
    folder = Path(cache_dir) if cache_dir is not None else Path(prefix).parent
    return folder / stem


def load_or_build_index_mappings(indexed: IndexedDataset, name: str, first_doc: int, end_doc: int,
                                 num_samples: int, seq_length: int, seed: int,
                                 cache_dir: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """The three arrays (memory-mapped from the cache) and whether they were built now."""
    tokens = int(indexed.sizes[first_doc:end_doc].sum(dtype=np.int64))
    base = index_cache_base(indexed.prefix, name, first_doc, end_doc, len(indexed), tokens,
                            num_samples, seq_length, seed, cache_dir)
    paths = [Path(f"{base}_{part}_idx.npy") for part in ("doc", "sample", "shuffle")]
    built = False
    if not all(p.is_file() for p in paths):
        from bigscience_ops.data.index_files import write_index_mappings
        from bigscience_ops.data.locks import build_lock

        with build_lock(Path(f"{base}.lock"), lambda: all(p.is_file() for p in paths)) as build:
            if build:  # else another process built them meanwhile
                write_index_mappings(indexed.sizes, first_doc, end_doc, num_samples, seq_length, seed,
                                     (paths[0], paths[1], paths[2]))
                built = True
    doc_idx, sample_idx, shuffle_idx = (np.load(p, mmap_mode="r", allow_pickle=False) for p in paths)
    return doc_idx, sample_idx, shuffle_idx, built


# --- datasets --------------------------------------------------------------------------------

class GPTDataset:
    """Samples of seq_length + 1 tokens from documents [first_doc, end_doc) of one indexed dataset."""

    def __init__(self, name: str, indexed: IndexedDataset, first_doc: int, end_doc: int, num_samples: int,
                 seq_length: int, seed: int, cache_dir: str | None = None) -> None:
        if not 0 <= first_doc < end_doc <= len(indexed):
            raise DataError(f"document range [{first_doc}, {end_doc}) is empty or outside the "
                            f"{len(indexed)} documents of {indexed.prefix}")
        self.name, self.indexed, self.seq_length = name, indexed, seq_length
        self.first_doc, self.end_doc = first_doc, end_doc
        self.doc_idx, self.sample_idx, self.shuffle_idx, self.built = load_or_build_index_mappings(
            indexed, name, first_doc, end_doc, num_samples, seq_length, seed, cache_dir)

    def __len__(self) -> int:
        # Sample i spans [sample_idx[i], sample_idx[i + 1]].
        return self.sample_idx.shape[0] - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        j = int(self.shuffle_idx[i])
        doc_f, off_f = (int(x) for x in self.sample_idx[j])
        doc_l, off_l = (int(x) for x in self.sample_idx[j + 1])
        get = self.indexed.get
        if doc_f == doc_l:
            sample = get(int(self.doc_idx[doc_f]), offset=off_f, length=off_l - off_f + 1)
            return sample.astype(np.int64)
        parts = [get(int(self.doc_idx[doc_f]), offset=off_f)]
        parts += [get(int(self.doc_idx[d])) for d in range(doc_f + 1, doc_l)]
        parts.append(get(int(self.doc_idx[doc_l]), length=off_l + 1))
        return np.concatenate(parts).astype(np.int64)


def build_blend_indices(weights: list[float], sizes: list[int], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Which dataset and which of its samples serves each of `size` blended samples.

    Dataset i's j-th sample is due at time (j + 0.5) / w_i; samples are served in order of due time
    (ties: lower dataset index), so after any n samples dataset i has served w_i * n to within one.
    A dataset with no samples left drops out and the others continue.
    """
    w = np.asarray(weights, dtype=np.float64)
    if len(w) != len(sizes) or len(w) == 0 or (w < 0).any() or w.sum() <= 0:
        raise DataError(f"blend weights {list(weights)} must be non-negative, one per dataset, with a positive sum")
    if len(w) > 255:
        raise DataError(f"at most 255 datasets can be blended; got {len(w)}")
    w = w / w.sum()
    if size > sum(sizes):
        raise DataError(f"blend of {size} samples asked of datasets holding {sum(sizes)} samples in all")
    dataset_index = np.empty(size, dtype=np.uint8)
    sample_index = np.empty(size, dtype=np.int64)
    served = np.zeros(len(w), dtype=np.int64)
    filled = 0
    t = 0.0
    while filled < size:
        t += BLEND_WINDOW
        due_ds, due_j, due_t = [], [], []
        for i, wi in enumerate(w):
            if wi == 0 or served[i] >= sizes[i]:
                continue
            hi = min(sizes[i], max(int(served[i]), math.ceil(t * wi - 0.5)))
            js = np.arange(served[i], hi, dtype=np.int64)
            due_ds.append(np.full(len(js), i, dtype=np.uint8))
            due_j.append(js)
            due_t.append((js + 0.5) / wi)
        if not due_ds:  # every weighted dataset ran out: serve the rest from any with samples left
            w = np.array([1.0 if served[i] < sizes[i] else 0.0 for i in range(len(w))])
            continue
        ds, js, ts = np.concatenate(due_ds), np.concatenate(due_j), np.concatenate(due_t)
        order = np.lexsort((ds, ts))[:size - filled]
        n = len(order)
        dataset_index[filled:filled + n] = ds[order]
        sample_index[filled:filled + n] = js[order]
        np.add.at(served, ds[order], 1)
        filled += n
    return dataset_index, sample_index


class BlendedDataset:
    """Several datasets served in proportion to their weights."""

    def __init__(self, datasets: list[GPTDataset], weights: list[float], size: int) -> None:
        self.datasets = datasets
        self.weights = list(weights)
        self.dataset_index, self.dataset_sample_index = build_blend_indices(
            weights, [len(d) for d in datasets], size)

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.datasets[int(self.dataset_index[i])][int(self.dataset_sample_index[i])]


SPLIT_NAMES = ("train", "valid", "test")


def build_train_valid_test_datasets(
    prefixes: list[tuple[float, str]],
    split: str,
    seq_length: int,
    seed: int,
    num_samples: tuple[int, int, int],
    cache_dir: str | None = None,
) -> tuple[GPTDataset | BlendedDataset | None, GPTDataset | BlendedDataset | None,
           GPTDataset | BlendedDataset | None]:
    """Train, valid and test datasets over weighted prefixes; None where a split has no documents.

    One prefix: each split is a GPTDataset with at least num_samples[i] samples (whole epochs, as
    Megatron's). Several: each prefix's split holds ceil(num_samples[i] * w * 1.005) samples and
    the blend serves exactly num_samples[i] (or, when that is 0, one pass over all of them).
    """
    if not prefixes:
        raise DataError("no data prefixes given; need at least one (weight, prefix)")
    if len(num_samples) != 3 or any(n < 0 for n in num_samples):
        raise DataError(f"num_samples must be three non-negative counts (train, valid, test); got {num_samples}")
    weights = [float(w) for w, _ in prefixes]
    if any(w <= 0 for w in weights):
        raise DataError(f"blend weights must be positive; got {weights}")
    total_w = sum(weights)
    parse_split(split)
    single = len(prefixes) == 1
    per_split: list[list[tuple[float, GPTDataset]]] = [[], [], []]
    for weight, prefix in prefixes:
        indexed = IndexedDataset(prefix)
        bounds = split_boundaries(split, len(indexed))
        for s, name in enumerate(SPLIT_NAMES):
            if bounds[s + 1] <= bounds[s]:
                continue
            wanted = num_samples[s] if single else math.ceil(num_samples[s] * weight / total_w * BLEND_MARGIN)
            ds = GPTDataset(name, indexed, bounds[s], bounds[s + 1], wanted, seq_length, seed, cache_dir)
            per_split[s].append((weight, ds))
    out: list[GPTDataset | BlendedDataset | None] = []
    for s in range(3):
        parts = per_split[s]
        if not parts:
            out.append(None)
        elif single:
            out.append(parts[0][1])
        else:
            size = num_samples[s] or sum(len(d) for _, d in parts)
            out.append(BlendedDataset([d for _, d in parts], [w for w, _ in parts], size))
    return out[0], out[1], out[2]
