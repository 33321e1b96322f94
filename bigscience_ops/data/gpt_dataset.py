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
files in bounded memory (index_files.py; index_mappings.py holds Megatron's in-memory reference);
the others wait and load. A reader that must never write beside the data (`bsops samples`) passes
`ReadOnlyIndices`: the trainer's files are read where they are whole, anything else is built in the
user's cache (`user_index_cache`), one folder per dataset.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bigscience_ops.data.errors import DataError
from bigscience_ops.data.index_files import write_index_mappings
from bigscience_ops.data.index_mappings import index_plan
from bigscience_ops.data.indexed import IndexedDataset
from bigscience_ops.data.locks import build_lock

INDEX_VERSION = 1  # part of the cache key; bump when the index layout or algorithm changes
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


# --- caching ---------------------------------------------------------------------------------

def index_cache_base(prefix: str, name: str, first_doc: int, end_doc: int, num_docs: int, tokens: int,
                     num_samples: int, seq_length: int, seed: int, cache_dir: str | None) -> Path:
    """Megatron-like file name plus a key of what the indices depend on beyond its parameters."""
    key = hashlib.sha1(f"v{INDEX_VERSION} docs {first_doc}:{end_doc} of {num_docs} tokens {tokens}".encode())
    stem = f"{Path(prefix).name}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_{key.hexdigest()[:12]}"
    folder = Path(cache_dir) if cache_dir is not None else Path(prefix).parent
    return folder / stem


@dataclass(frozen=True)
class ReadOnlyIndices:
    """Where a reader that never writes beside the data (`bsops samples`) finds the index files: where the trainer
    writes them (`trainer_dir`: the run's data.cache_dir; None: beside each dataset), read only, when all three are
    there and whole; else in `cache` (`user_index_cache()`), loaded or built there."""

    trainer_dir: str | None
    cache: Path


def user_index_cache() -> Path:
    """$BSOPS_CACHE_DIR/indices, else $XDG_CACHE_HOME/bsops/indices, else ~/.cache/bsops/indices."""
    root = os.environ.get("BSOPS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "bsops")
    return Path(root) / "indices"


def _user_cache_base(cache: Path, indexed: IndexedDataset, trainer_base: Path, first_doc: int, end_doc: int) -> Path:
    """The trainer's file name in a folder of the dataset's own (its name and a hash of its absolute path), with a
    hash of the documents' sizes (all the indices depend on) added: two datasets never share or clash."""
    where = hashlib.sha1(os.path.realpath(indexed.prefix).encode()).hexdigest()[:12]
    sizes = np.ascontiguousarray(indexed.sizes[first_doc:end_doc])
    digest = hashlib.blake2b(sizes.dtype.str.encode(), digest_size=8)
    digest.update(memoryview(sizes).cast("B"))
    return cache / f"{Path(indexed.prefix).name}-{where}" / f"{trainer_base.name}_{digest.hexdigest()}"


def _whole(paths: list[Path], shapes: list[tuple[int, ...]]) -> tuple[np.ndarray, ...] | None:
    """The three arrays memory-mapped, or None unless each is a plain file holding an integer array of its shape."""
    if not all(p.is_file() for p in paths):
        return None
    try:
        arrays = tuple(np.load(p, mmap_mode="r", allow_pickle=False) for p in paths)
    except (OSError, ValueError, EOFError):
        return None
    if any(a.shape != shape or a.dtype.kind not in "iu" for a, shape in zip(arrays, shapes)):
        return None
    return arrays


def _shapes(indexed: IndexedDataset, first_doc: int, end_doc: int, num_samples: int,
            seq_length: int) -> list[tuple[int, ...]]:
    """The shapes of doc_idx, sample_idx and shuffle_idx for these parameters (index_plan's epochs)."""
    tokens_per_epoch, num_epochs, _, _ = index_plan(indexed.sizes, first_doc, end_doc, num_samples, seq_length)
    total = (num_epochs * tokens_per_epoch - 1) // seq_length
    return [(num_epochs * (end_doc - first_doc),), (total + 1, 2), (total,)]


def load_or_build_index_mappings(indexed: IndexedDataset, name: str, first_doc: int, end_doc: int,
                                 num_samples: int, seq_length: int, seed: int,
                                 cache_dir: str | ReadOnlyIndices | None = None
                                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """The three arrays (memory-mapped from the cache) and whether they were built now. With ReadOnlyIndices
    nothing is written where the trainer writes: its files are read when whole, else the user cache is used."""
    tokens = int(indexed.sizes[first_doc:end_doc].sum(dtype=np.int64))
    trainer_dir = cache_dir.trainer_dir if isinstance(cache_dir, ReadOnlyIndices) else cache_dir
    base = index_cache_base(indexed.prefix, name, first_doc, end_doc, len(indexed), tokens,
                            num_samples, seq_length, seed, trainer_dir)
    paths = [Path(f"{base}_{part}_idx.npy") for part in ("doc", "sample", "shuffle")]
    ready = lambda: all(p.is_file() for p in paths)  # noqa: E731
    if isinstance(cache_dir, ReadOnlyIndices):
        shapes = _shapes(indexed, first_doc, end_doc, num_samples, seq_length)
        found = _whole(paths, shapes)
        if found is not None:
            return (*found, False)
        base = _user_cache_base(cache_dir.cache, indexed, base, first_doc, end_doc)
        paths = [Path(f"{base}_{part}_idx.npy") for part in ("doc", "sample", "shuffle")]
        ready = lambda: _whole(paths, shapes) is not None  # noqa: E731  a torn file is built again
    built = False
    if not ready():
        with build_lock(Path(f"{base}.lock"), ready) as build:
            if build:  # else another process built them meanwhile
                write_index_mappings(indexed.sizes, first_doc, end_doc, num_samples, seq_length, seed,
                                     (paths[0], paths[1], paths[2]))
                built = True
    doc_idx, sample_idx, shuffle_idx = (np.load(p, mmap_mode="r", allow_pickle=False) for p in paths)
    return doc_idx, sample_idx, shuffle_idx, built


# --- datasets --------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenPlace:
    """Where one token of a sample is: the dataset's prefix, the document (its index in the .idx) and the token's
    offset inside it."""

    prefix: str
    document: int
    offset: int

    def __str__(self) -> str:
        return f"{self.prefix}: document {self.document}, token {self.offset}"


class GPTDataset:
    """Samples of seq_length + 1 tokens from documents [first_doc, end_doc) of one indexed dataset.

    `token_limit`: the ids a sample may hold are below it (the model's padded vocabulary; None: not known). The
    trainer's feed checks every micro-batch against it and names the token by `locate`."""

    def __init__(self, name: str, indexed: IndexedDataset, first_doc: int, end_doc: int, num_samples: int,
                 seq_length: int, seed: int, cache_dir: str | ReadOnlyIndices | None = None,
                 token_limit: int | None = None) -> None:
        if not 0 <= first_doc < end_doc <= len(indexed):
            raise DataError(f"document range [{first_doc}, {end_doc}) is empty or outside the "
                            f"{len(indexed)} documents of {indexed.prefix}")
        self.name, self.indexed, self.seq_length, self.token_limit = name, indexed, seq_length, token_limit
        self.first_doc, self.end_doc = first_doc, end_doc
        self.doc_idx, self.sample_idx, self.shuffle_idx, self.built = load_or_build_index_mappings(
            indexed, name, first_doc, end_doc, num_samples, seq_length, seed, cache_dir)

    def __len__(self) -> int:
        # Sample i spans [sample_idx[i], sample_idx[i + 1]].
        return self.sample_idx.shape[0] - 1

    def pieces(self, i: int) -> list[tuple[int, int, int]]:
        """(document, first token, token count) of each document sample i is cut from, in order: seq_length + 1
        tokens that may cross document boundaries (`__getitem__` reads them; `bsops samples` shows them)."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        j = int(self.shuffle_idx[i])
        doc_f, off_f = (int(x) for x in self.sample_idx[j])
        doc_l, off_l = (int(x) for x in self.sample_idx[j + 1])
        doc = lambda d: int(self.doc_idx[d])  # noqa: E731
        if doc_f == doc_l:
            return [(doc(doc_f), off_f, off_l - off_f + 1)]
        sizes = self.indexed.sizes
        out = [(doc(doc_f), off_f, int(sizes[doc(doc_f)]) - off_f)]
        out += [(doc(d), 0, int(sizes[doc(d)])) for d in range(doc_f + 1, doc_l)]
        out.append((doc(doc_l), 0, off_l + 1))
        return out

    def __getitem__(self, i: int) -> np.ndarray:
        parts = [self.indexed.get(doc, offset=offset, length=length) for doc, offset, length in self.pieces(i)]
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.int64)

    def locate(self, i: int, position: int) -> TokenPlace:
        """Where token `position` (0 to seq_length) of sample i lies in the data: its dataset, document and offset."""
        left = position
        for doc, offset, length in self.pieces(i):
            if left < length:
                return TokenPlace(self.indexed.prefix, doc, offset + left)
            left -= length
        raise IndexError(f"position {position} is beyond sample {i}'s {self.seq_length + 1} tokens")


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
        limits = {d.token_limit for d in datasets}
        self.token_limit = limits.pop() if len(limits) == 1 else None  # one model: one limit for all
        self.dataset_index, self.dataset_sample_index = build_blend_indices(
            weights, [len(d) for d in datasets], size)

    def __len__(self) -> int:
        return len(self.dataset_index)

    def source(self, i: int) -> tuple[int, int]:
        """(which dataset, which of its samples) blended sample i is."""
        return int(self.dataset_index[i]), int(self.dataset_sample_index[i])

    def __getitem__(self, i: int) -> np.ndarray:
        dataset, sample = self.source(i)
        return self.datasets[dataset][sample]

    def locate(self, i: int, position: int) -> TokenPlace:
        dataset, sample = self.source(i)
        return self.datasets[dataset].locate(sample, position)


SPLIT_NAMES = ("train", "valid", "test")


def build_train_valid_test_datasets(
    prefixes: list[tuple[float, str]],
    split: str,
    seq_length: int,
    seed: int,
    num_samples: tuple[int, int, int],
    cache_dir: str | ReadOnlyIndices | None = None,
    token_limit: int | None = None,
) -> tuple[GPTDataset | BlendedDataset | None, GPTDataset | BlendedDataset | None,
           GPTDataset | BlendedDataset | None]:
    """Train, valid and test datasets over weighted prefixes; None where a split has no documents.

    One prefix: each split is a GPTDataset with at least num_samples[i] samples (whole epochs, as
    Megatron's). Several: each prefix's split holds ceil(num_samples[i] * w * 1.005) samples and
    the blend serves exactly num_samples[i] (or, when that is 0, one pass over all of them). `token_limit`: the
    ids a sample may hold are below it (GPTDataset; the trainer's feed checks them).
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
            ds = GPTDataset(name, indexed, bounds[s], bounds[s + 1], wanted, seq_length, seed, cache_dir, token_limit)
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
