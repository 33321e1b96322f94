"""The trainer's datasets write their index files where data.cache_dir says, not beside read-only data."""

from __future__ import annotations

import dataclasses

from bigscience_ops.schema import DataSource
from bigscience_ops.trainer.data import build_datasets
from tests.fixtures_data import write_indexed
from tests.fixtures_trainer import small_experiment


def test_index_files_go_to_cache_dir(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    prefix = write_indexed(data / "corpus_text_document", [[i % 200 + 1] * (20 + i % 7) for i in range(60)])
    before = sorted(p.name for p in data.iterdir())
    exp = small_experiment(tmp_path / "run")
    exp = dataclasses.replace(exp, data=dataclasses.replace(exp.data, blend=[DataSource(prefix=prefix)],
                                                            split="90,10,0", cache_dir=str(cache)))
    train, valid, _ = build_datasets(exp, (40, 8, 0), synthetic=False)
    assert len(train) >= 40 and len(valid) >= 8
    assert sorted(p.name for p in data.iterdir()) == before  # nothing written beside the data
    assert len([p for p in cache.rglob("*") if p.is_file()]) >= 3  # doc, sample and shuffle index of a split
