"""The .bin/.idx pair: byte layout Megatron's MMapIndexedDataset reads, round trip, merge, atomic writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bigscience_ops.data.errors import DataError, DataFormatError
from bigscience_ops.data.indexed import (IndexedDataset, IndexedDatasetWriter, best_fitting_dtype,
                                         merge_datasets)
from tests.fixtures_data import read_like_megatron, write_indexed

DOCS = [[5, 6, 7], [], [42], list(range(1000)), [65499, 0, 1]]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_round_trip_with_empty_and_one_token_documents(tmp_path, dtype):
    prefix = write_indexed(tmp_path / "ds", DOCS, dtype)
    got_dtype, items, doc_idx = read_like_megatron(prefix)
    assert got_dtype == np.dtype(dtype)
    assert [i.tolist() for i in items] == DOCS
    np.testing.assert_array_equal(doc_idx, np.arange(len(DOCS) + 1))
    ds = IndexedDataset(prefix)
    assert len(ds) == len(DOCS) and ds.num_tokens == sum(map(len, DOCS))
    assert [ds[i].tolist() for i in range(len(ds))] == DOCS
    assert ds.get(3, offset=10, length=5).tolist() == [10, 11, 12, 13, 14]
    assert ds.get(3, offset=998).tolist() == [998, 999]
    assert ds.pointers.tolist() == (np.array([0, 3, 3, 4, 1004]) * np.dtype(dtype).itemsize).tolist()


def test_empty_dataset_round_trips(tmp_path):
    prefix = write_indexed(tmp_path / "none", [])
    assert len(IndexedDataset(prefix)) == 0
    assert read_like_megatron(prefix)[2].tolist() == [0]


def test_dtype_follows_megatron_rule():
    assert best_fitting_dtype(50257) == np.uint16
    assert best_fitting_dtype(8192) == np.uint16
    assert best_fitting_dtype(65500) == np.int32
    assert best_fitting_dtype(250880) == np.int32


def test_truncated_or_mismatched_pair_is_refused(tmp_path):
    prefix = write_indexed(tmp_path / "ds", DOCS)
    data = Path(prefix + ".bin").read_bytes()
    Path(prefix + ".bin").write_bytes(data[:-2])
    with pytest.raises(DataFormatError, match="truncated"):
        IndexedDataset(prefix)
    Path(prefix + ".idx").write_bytes(b"NOTMAGIC!" + b"\0" * 40)
    with pytest.raises(DataFormatError, match="magic"):
        IndexedDataset(prefix)
    with pytest.raises(DataFormatError, match="does not exist"):
        IndexedDataset(tmp_path / "missing")


def test_interrupted_write_leaves_old_pair_and_no_temporaries(tmp_path):
    prefix = write_indexed(tmp_path / "ds", [[1, 2, 3]])
    with pytest.raises(KeyboardInterrupt):
        with IndexedDatasetWriter(prefix, np.uint16) as w:
            w.add_document([9, 9, 9, 9])
            assert [x.tolist() for x in IndexedDataset(prefix)] == [[1, 2, 3]]  # old pair untouched meanwhile
            raise KeyboardInterrupt
    assert [x.tolist() for x in IndexedDataset(prefix)] == [[1, 2, 3]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.bin", "ds.idx"]


def test_merge_concatenates_in_order(tmp_path):
    a = write_indexed(tmp_path / "a", DOCS[:2])
    b = write_indexed(tmp_path / "b", DOCS[2:])
    out = merge_datasets([a, b], str(tmp_path / "merged"))
    dtype, items, doc_idx = read_like_megatron(out)
    assert [i.tolist() for i in items] == DOCS
    np.testing.assert_array_equal(doc_idx, np.arange(len(DOCS) + 1))
    c = write_indexed(tmp_path / "c", [[1]], np.int32)
    with pytest.raises(DataError, match="dtypes"):
        merge_datasets([a, c], str(tmp_path / "bad"))
    with pytest.raises(DataError, match="also an input"):
        merge_datasets([a, b], a)


@pytest.mark.parametrize("copy", ["copy_file_range", "sendfile"])
def test_writer_appends_token_files_in_the_kernel_between_arrays(tmp_path, monkeypatch, copy):
    """add_file (the workers' chunks) and add_documents interleave into the same bytes as arrays alone."""
    import os

    if copy == "sendfile":  # a filesystem or kernel without copy_file_range: the fallback
        def unsupported(*_args):
            raise OSError(95, "Operation not supported")
        monkeypatch.setattr(os, "copy_file_range", unsupported)
    parts = [np.array(d, dtype=np.uint16) for d in DOCS]
    with IndexedDatasetWriter(tmp_path / "arrays", np.uint16) as w:
        for part in parts:
            w.add_documents(part, [part.size])
    with IndexedDatasetWriter(tmp_path / "mixed", np.uint16) as w:
        for i, part in enumerate(parts):
            if i % 2:
                w.add_documents(part, [part.size])
            else:
                part.tofile(tmp_path / f"part{i}")
                w.add_file(tmp_path / f"part{i}", [part.size])
        assert w.num_docs == len(DOCS) and w.num_tokens == sum(map(len, DOCS))
        with pytest.raises(DataError, match=r"part0 holds 6 bytes but the sizes add up to 4 uint16 tokens"):
            w.add_file(tmp_path / "part0", [4])
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"mixed{ext}").read_bytes() == (tmp_path / f"arrays{ext}").read_bytes()
