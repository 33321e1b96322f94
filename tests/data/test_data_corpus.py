"""The bundled corpus: licence stated, built with no download, reused, and served to the tiny experiment."""

from __future__ import annotations

import json
import lzma

import numpy as np

from bigscience_ops.data.corpus import CORPUS_FILE, TOKENIZER_FILE, ensure_bundled_corpus
from bigscience_ops.data.gpt_dataset import build_train_valid_test_datasets
from bigscience_ops.data.indexed import IndexedDataset
from bigscience_ops.data.tokenizer import HFTokenizer, TokenizerSpec


def test_corpus_is_small_and_licensed(repo_root):
    assert CORPUS_FILE.stat().st_size < 3_000_000
    readme = (repo_root / "corpus" / "README.md").read_text()
    assert "public domain" in readme.lower()
    assert "build/" in (repo_root / "corpus" / ".gitignore").read_text()


def test_build_reuse_and_content(tmp_path):
    prefix = ensure_bundled_corpus(tmp_path)
    assert prefix == str(tmp_path / "tiny_text_document")
    ds = IndexedDataset(prefix)
    assert len(ds) == 1189 and ds.dtype == np.uint16
    idx_mtime = (tmp_path / "tiny_text_document.idx").stat().st_mtime_ns
    assert ensure_bundled_corpus(tmp_path) == prefix
    assert (tmp_path / "tiny_text_document.idx").stat().st_mtime_ns == idx_mtime
    record = json.loads((tmp_path / "tiny_text_document.dataset.json").read_text())
    assert record["documents"] == 1189 and record["max_id"] == int(ds.tokens.max())
    (tmp_path / "tiny_text_document.dataset.json").unlink()  # a build from before records: built again, with one
    assert ensure_bundled_corpus(tmp_path) == prefix
    assert (tmp_path / "tiny_text_document.dataset.json").is_file()
    with lzma.open(CORPUS_FILE, "rt", encoding="utf-8") as f:
        first = json.loads(f.readline())["text"]
    tok = HFTokenizer(TokenizerSpec("json", json_file=str(TOKENIZER_FILE)))
    tokens = ds[0].tolist()
    assert tokens[-1] == tok.eod == 0
    assert tok.decode(tokens[:-1]) == first
    assert int(max(ds.tokens.max(), 0)) < 8192


def test_tiny_experiment_reads_samples(tmp_path):
    prefix = ensure_bundled_corpus(tmp_path)
    train, valid, test = build_train_valid_test_datasets([(1.0, prefix)], "949,50,1", 128, 1234, (6400, 64, 16))
    assert len(train) >= 6400 and len(valid) >= 64 and len(test) >= 16
    sample = train[0]
    assert sample.shape == (129,) and sample.dtype == np.int64


def test_build_without_flock(tmp_path, monkeypatch):
    from bigscience_ops.data import locks

    monkeypatch.setattr(locks, "try_flock", lambda f: False)  # as on a filesystem without flock
    prefix = ensure_bundled_corpus(tmp_path)
    assert len(IndexedDataset(prefix)) == 1189
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_text_document.bin", "tiny_text_document.dataset.json",
                                                          "tiny_text_document.idx"]  # the dataset and its record
