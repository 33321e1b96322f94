"""The trainer's datasets write their index files where data.cache_dir says, not beside read-only data; the feed checks
every token id it hands the model against the vocabulary, and names a bad one by dataset, document and offset."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bigscience_ops.data.gpt_dataset import TokenPlace
from bigscience_ops.schema import DataSource
from bigscience_ops.trainer.data import MicroBatchFeed, TokenOutOfVocabulary
from bigscience_ops.trainer.sampling import SyntheticDataset, build_datasets
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


# ----------------------------------------------------------------------------- every fed token checked

def _spoil(prefix: str, document: int, offset: int, value: int) -> None:
    """One token of the .bin changed in place, as data changed after the launch's check would be."""
    from bigscience_ops.data.indexed import IndexedDataset

    indexed = IndexedDataset(prefix)
    at = int(indexed.pointers[document]) + offset * indexed.dtype.itemsize
    with open(f"{prefix}.bin", "r+b") as f:
        f.seek(at)
        f.write(np.array([value], dtype=indexed.dtype).tobytes())


def _experiment(tmp_path, blend: list[DataSource]):
    exp = small_experiment(tmp_path / "run")  # model.vocab_size 256, padded to 256
    return dataclasses.replace(exp, data=dataclasses.replace(exp.data, blend=blend, split="100,0,0"),
                               parallel=dataclasses.replace(exp.parallel, pipeline=1))  # one rank


def _fed_until_refused(feed, limit: int = 1000):
    """The micro-batches a feed handed out before it refused one, and the refusal."""
    fed = 0
    with pytest.raises(TokenOutOfVocabulary) as info:
        for _ in range(limit):
            list(feed.take(1))
            fed += 1
    return fed, info.value


@pytest.mark.parametrize("value", [300, 256, -1])
def test_a_fed_token_outside_the_vocabulary_stops_the_feed_naming_dataset_document_and_offset(tmp_path, value):
    """Built from good data, then changed on disk (after the launch's check): the feed refuses the micro-batch that
    holds the changed token, before the model sees it, and names where it is; every micro-batch before it is fed."""
    dtype = np.int16 if value < 0 else np.uint16
    prefix = write_indexed(tmp_path / "c_text_document", [[(i * 7 + j) % 200 + 1 for j in range(20 + i % 7)]
                                                           for i in range(60)], dtype=dtype)
    train, _, _ = build_datasets(_experiment(tmp_path, [DataSource(prefix=prefix)]), (400, 0, 0), synthetic=False)
    assert train.token_limit == 256
    _spoil(prefix, 13, 5, value)
    fed, refused = _fed_until_refused(MicroBatchFeed(train, 0, 2, 0, 1, 0, torch.device("cpu")))
    assert refused.where == TokenPlace(prefix, 13, 5) and refused.value == value and refused.limit == 256
    assert [d for d, _, _ in train.pieces(refused.sample)].count(13) == 1 and "\n" not in str(refused)
    first = min(i for i in range(len(train)) if 13 in [d for d, _, _ in train.pieces(i)])
    assert fed == first // 2  # Megatron's order from 0 samples: micro-batch k reads samples 2k and 2k + 1


def test_a_blend_names_the_dataset_the_token_is_in_and_a_skipped_step_is_not_checked(tmp_path):
    docs = [[(i * 5 + j) % 200 + 1 for j in range(30)] for i in range(40)]
    first = write_indexed(tmp_path / "a_text_document", docs)
    second = write_indexed(tmp_path / "b_text_document", docs)
    exp = _experiment(tmp_path, [DataSource(prefix=first, weight=1.0), DataSource(prefix=second, weight=1.0)])
    train, _, _ = build_datasets(exp, (200, 0, 0), synthetic=False)
    for document in range(40):
        _spoil(second, document, 0, 4000)  # every document of the second dataset starts with an id beyond it
    fed, refused = _fed_until_refused(MicroBatchFeed(train, 0, 1, 0, 1, 0, torch.device("cpu")))
    assert refused.where.prefix == second and refused.where.offset == 0 and refused.value == 4000
    assert train.source(fed)[0] == 1  # the blend's second dataset served that sample
    feed = MicroBatchFeed(train, 0, 1, 0, 1, 0, torch.device("cpu"))
    feed.skip(fed + 1)  # train.skip_iterations over it: skipped micro-batches are not fed, so not refused
    later, refused = _fed_until_refused(feed)
    assert refused.sample > fed  # the next refusal is a later sample's


def test_generated_sequences_pass_the_check_and_the_limit_can_be_given(tmp_path):
    feed = MicroBatchFeed(SyntheticDataset(40, 8, 97, seed=3), 0, 2, 0, 1, 0, torch.device("cpu"))
    assert feed.token_limit == 97 and len(list(feed.take(5))) == 5
    feed = MicroBatchFeed(SyntheticDataset(40, 8, 97, seed=3), 0, 2, 0, 1, 0, torch.device("cpu"), token_limit=50)
    _, refused = _fed_until_refused(feed)
    assert refused.limit == 50 and refused.value >= 50 and "generated sequence" in str(refused.where)


@pytest.mark.slow  # a real trainer rank (forked from the rank server: a few seconds)
def test_the_trainer_stops_on_a_token_that_changed_after_the_check_with_one_error_line(tmp_path):
    """The issue's: data changed after the launch's check reached the embedding as `IndexError: index out of range
    in self` after 30 s. The rank now stops before its first step with one line naming the token, and exit 2."""
    from bigscience_ops.schedule.run import run_schedule
    from bigscience_ops.trainer.sampling import dataset_sizes, micro_batch_indices
    from tests.fixtures_trainer import launch, write_run

    prefix = write_indexed(tmp_path / "d_text_document", [[(i * 3 + j) % 250 + 1 for j in range(40)]
                                                           for i in range(80)])
    exp = _experiment(tmp_path, [DataSource(prefix=prefix)])
    train, _, _ = build_datasets(exp, dataset_sizes(exp, run_schedule(exp)), synthetic=False)  # the trainer's
    sample = micro_batch_indices(0, 0, exp.batch.micro_batch_size, 0, 1, len(train))[0]
    place = train.locate(sample, 3)  # the 4th token of the first sample of the first step
    _spoil(prefix, place.document, place.offset, 9000)
    proc = launch(write_run(exp, tmp_path / "run"), 1, synthetic=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"{prefix}: document {place.document}, token {place.offset} holds token id 9000" in errors[0]
    assert " iteration " not in proc.stdout  # no iteration line: no step was taken
