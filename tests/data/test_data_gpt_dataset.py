"""GPT dataset: samples against a plain-Python transcription of Megatron's algorithm, splits, blends, cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bigscience_ops.data import gpt_dataset as gd
from bigscience_ops.data import index_mappings as im
from bigscience_ops.data.errors import DataError
from bigscience_ops.data.indexed import IndexedDataset
from tests.fixtures_data import write_indexed


def reference_samples(sizes: list[int], docs: list[list[int]], first: int, end: int, num_samples: int,
                      seq_length: int, seed: int) -> list[list[int]]:
    """Megatron's GPT dataset written out with Python loops: what the trainer must see, in order."""
    tokens_per_epoch = sum(sizes[first:end])
    num_epochs = 0
    while True:
        num_epochs += 1
        if (num_epochs * tokens_per_epoch - 1) // seq_length >= num_samples:
            break
    rng = np.random.RandomState(seed=seed)
    separate = False
    if num_epochs > 1:
        from_full = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate = num_samples - from_full < int(0.95 * per_epoch)

    def doc_order(epochs: int) -> list[int]:
        order = np.array([d for _ in range(epochs) for d in range(first, end)], dtype=np.int32)
        rng.shuffle(order)  # the same RNG call sequence as Megatron's
        return order.tolist()

    order = doc_order(num_epochs - 1) + doc_order(1) if separate else doc_order(num_epochs)
    # Megatron's sample_idx walk, one document at a time.
    total = (num_epochs * tokens_per_epoch - 1) // seq_length
    starts = [(0, 0)]
    d, off = 0, 0
    while len(starts) <= total:
        remaining = seq_length + 1
        while remaining != 0:
            length = sizes[order[d]] - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - 1
                remaining = 0
            else:
                d, off = d + 1, 0
        starts.append((d, off))
    samples = []
    for (df, of), (dl, ol) in zip(starts[:-1], starts[1:]):
        if df == dl:
            samples.append(docs[order[df]][of:ol + 1])
        else:
            s = docs[order[df]][of:]
            for k in range(df + 1, dl):
                s = s + docs[order[k]]
            samples.append(s + docs[order[dl]][:ol + 1])
    shuffled_count = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length if separate else total
    first_part = np.arange(shuffled_count, dtype=np.uint32)
    rng.shuffle(first_part)
    shuffle = first_part.tolist()
    if shuffled_count != total:
        rest = np.arange(shuffled_count, total, dtype=np.uint32)
        rng.shuffle(rest)
        shuffle += rest.tolist()
    return [samples[i] for i in shuffle]


def make_corpus(tmp_path: Path, n_docs: int = 40, seed: int = 0, name: str = "corpus") -> tuple[str, list[list[int]]]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n_docs):
        n = int(rng.integers(1, 30)) if i % 7 else int(rng.integers(30, 80))
        docs.append([int(x) for x in rng.integers(0, 50000, n)] + [50256])
    docs[3] = [50256]  # a one-token document
    return write_indexed(tmp_path / name, docs), docs


@pytest.mark.parametrize("seq_length,num_samples,seed", [
    (8, 10, 1234),     # one epoch
    (5, 200, 7),       # several epochs, last one nearly full
    (16, 90, 3),       # several epochs, last epoch shuffled separately
    (1, 30, 0),        # every token starts a sample
    (64, 40, 99),      # samples longer than most documents
])
def test_samples_match_plain_python_reference(tmp_path, seq_length, num_samples, seed):
    prefix, docs = make_corpus(tmp_path)
    indexed = IndexedDataset(prefix)
    ds = gd.GPTDataset("train", indexed, 2, 37, num_samples, seq_length, seed)
    ref = reference_samples([len(d) for d in docs], docs, 2, 37, num_samples, seq_length, seed)
    assert len(ds) == len(ref) >= num_samples
    for i in range(len(ds)):
        got = ds[i]
        assert got.dtype == np.int64 and got.shape == (seq_length + 1,)
        assert got.tolist() == ref[i], f"sample {i}"


def test_empty_documents_are_skipped_like_megatron(tmp_path):
    docs = [[1, 2, 3], [], [4, 5], [], [], [6, 7, 8, 9], [10]]
    prefix = write_indexed(tmp_path / "gaps", docs)
    ds = gd.GPTDataset("train", IndexedDataset(prefix), 0, len(docs), 20, 3, 5)
    ref = reference_samples([len(d) for d in docs], docs, 0, len(docs), 20, 3, 5)
    assert [ds[i].tolist() for i in range(len(ds))] == ref


def test_sample_idx_chunking_gives_same_result(tmp_path, monkeypatch):
    _, docs = make_corpus(tmp_path, n_docs=60)
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    whole = im.build_index_mappings(sizes, 0, 60, 300, 7, 11)
    monkeypatch.setattr(im, "SAMPLE_CHUNK", 5)
    chunked = im.build_index_mappings(sizes, 0, 60, 300, 7, 11)
    for a, b in zip(whole, chunked):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("split,n,expected", [
    ("949,50,1", 1000, [0, 949, 999, 1000]),
    ("98/2/0", 100, [0, 98, 100, 100]),
    ("100", 10, [0, 10, 10, 10]),
    ("1,1,1", 10, [0, 4, 7, 10]),  # Megatron moves the rounding shortfall to the front
    ("969,30,1", 1189, [0, 1152, 1188, 1189]),
])
def test_split_boundaries_round_like_megatron(split, n, expected):
    assert gd.split_boundaries(split, n) == expected


@pytest.mark.parametrize("bad", ["a,b,c", "1,2,3,4", "-1,2,0", "0,0,0"])
def test_bad_split_is_rejected(bad):
    with pytest.raises(DataError, match="split"):
        gd.parse_split(bad)


def test_train_valid_test_split_proportions_and_none(tmp_path):
    prefix, docs = make_corpus(tmp_path, n_docs=100)
    train, valid, test = gd.build_train_valid_test_datasets([(1.0, prefix)], "80,20,0", 8, 1, (50, 10, 5))
    assert test is None
    assert (train.first_doc, train.end_doc) == (0, 80)
    assert (valid.first_doc, valid.end_doc) == (80, 100)
    assert len(train) >= 50 and len(valid) >= 10
    train_tokens = set(np.concatenate([d for d in docs[:80]]).tolist())
    valid_only = set(np.concatenate(docs[80:]).tolist()) - train_tokens - {50256}
    seen_in_train = set(np.concatenate([train[i] for i in range(len(train))]).tolist())
    assert not (valid_only & seen_in_train)


def test_blend_proportions_hold_at_every_prefix():
    weights = [0.5, 0.3, 0.2]
    ds_index, sample_index = gd.build_blend_indices(weights, [10_000] * 3, 20_000)
    counts = np.zeros(3)
    for n, i in enumerate(ds_index, 1):
        counts[i] += 1
        assert np.all(np.abs(counts - np.array(weights) * n) <= 1.0), n
    for i in range(3):  # each dataset's samples are served in order, each once
        np.testing.assert_array_equal(sample_index[ds_index == i], np.arange((ds_index == i).sum()))


def test_blend_windowing_matches_one_window(monkeypatch):
    a = gd.build_blend_indices([3.0, 1.0, 0.5], [5000, 5000, 5000], 9000)
    monkeypatch.setattr(gd, "BLEND_WINDOW", 37)
    b = gd.build_blend_indices([3.0, 1.0, 0.5], [5000, 5000, 5000], 9000)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_blend_exhausted_dataset_drops_out():
    ds_index, sample_index = gd.build_blend_indices([0.5, 0.5], [10, 1000], 500)
    assert (ds_index == 0).sum() == 10
    assert sample_index[ds_index == 0].max() == 9


def test_blended_datasets_serve_weighted_samples(tmp_path):
    pa, docs_a = make_corpus(tmp_path, n_docs=50, seed=1, name="a")
    pb, docs_b = make_corpus(tmp_path, n_docs=50, seed=2, name="b")
    train, valid, test = gd.build_train_valid_test_datasets([(2.0, pa), (1.0, pb)], "90,10,0", 8, 5, (300, 30, 0))
    assert test is None
    assert len(train) == 300 and len(valid) == 30
    assert abs((train.dataset_index == 0).sum() - 200) <= 1
    for k in (0, 1, 150, 299):
        i, j = int(train.dataset_index[k]), int(train.dataset_sample_index[k])
        np.testing.assert_array_equal(train[k], train.datasets[i][j])
        assert train[k].shape == (9,)
    # each blended dataset holds Megatron's share with its 0.5% margin
    assert len(train.datasets[0]) >= 201 and len(train.datasets[1]) >= 101


def test_index_cache_is_reused_and_keyed(tmp_path):
    prefix, _ = make_corpus(tmp_path)
    first = gd.build_train_valid_test_datasets([(1.0, prefix)], "90,10,0", 8, 1, (40, 4, 0))
    assert first[0].built and first[1].built
    cached = sorted(tmp_path.glob("corpus_*_indexmap_*.npy"))
    assert len(cached) == 6
    mtimes = {p: p.stat().st_mtime_ns for p in cached}
    again = gd.build_train_valid_test_datasets([(1.0, prefix)], "90,10,0", 8, 1, (40, 4, 0))
    assert not again[0].built and not again[1].built
    assert {p: p.stat().st_mtime_ns for p in cached} == mtimes
    np.testing.assert_array_equal(first[0][5], again[0][5])
    # a different split, seed or sample count builds new files beside the old ones
    gd.build_train_valid_test_datasets([(1.0, prefix)], "80,20,0", 8, 1, (40, 4, 0))
    gd.build_train_valid_test_datasets([(1.0, prefix)], "90,10,0", 8, 2, (40, 4, 0))
    assert len(list(tmp_path.glob("corpus_*_indexmap_*.npy"))) == 6 + 6 + 6
    assert not list(tmp_path.glob("*.lock")) and not list(tmp_path.glob("*.tmp-*"))


def test_cache_dir_holds_the_indices(tmp_path):
    prefix, _ = make_corpus(tmp_path / "data")
    cache = tmp_path / "cache"
    train, _, _ = gd.build_train_valid_test_datasets([(1.0, prefix)], "100,0,0", 8, 1, (10, 0, 0), str(cache))
    assert len(list(cache.glob("*_train_indexmap_*.npy"))) == 3
    assert not list((tmp_path / "data").glob("*.npy"))
    assert train[0].shape == (9,)


def test_concurrent_builders_share_one_build(tmp_path):
    prefix, _ = make_corpus(tmp_path)
    indexed = IndexedDataset(prefix)
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: gd.load_or_build_index_mappings(indexed, "train", 0, 40, 30, 8, 1), range(4)))
    assert sum(r[3] for r in results) == 1
    for r in results[1:]:
        np.testing.assert_array_equal(r[2], results[0][2])


def test_num_epochs_matches_megatron_loop():
    for tokens, seq, n in [(100, 10, 9), (100, 10, 10), (7, 3, 50), (2, 1, 0), (1000, 2048, 1)]:
        epochs = 0
        while True:
            epochs += 1
            if (epochs * tokens - 1) // seq >= n:
                break
        assert im.num_epochs_needed(tokens, seq, n) == epochs
    with pytest.raises(DataError, match="tokens"):
        im.num_epochs_needed(1, 8, 10)
