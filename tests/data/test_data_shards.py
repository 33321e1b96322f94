"""Many shards: whole shards in workers, one output per input, merging, and resuming an interrupted run."""

from __future__ import annotations

import gzip
import json
import lzma
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.data.errors import DataError
from bigscience_ops.data.indexed import IndexedDataset
from bigscience_ops.data.preprocess import _busy_fraction, preprocess
from bigscience_ops.data.tokenizer import resolve_tokenizer
from tests.fixtures_data import read_like_megatron

KINDS = (".jsonl", ".jsonl.gz", ".jsonl.xz", ".jsonl.zst")


def _doc(i: int) -> bytes:
    return (json.dumps({"text": f"shard text {i} " + "wörd " * (i % 40)}, ensure_ascii=False) + "\n").encode()


def write_shards(folder: Path, count: int, docs: int = 60, bad_every: int = 0) -> bytes:
    """`count` shards of `docs` lines, cycling through the input kinds; returns their concatenated jsonl."""
    import zstandard

    folder.mkdir(parents=True, exist_ok=True)
    whole = b""
    for s in range(count):
        lines = [_doc(s * docs + i) for i in range(docs)]
        if bad_every:
            lines[bad_every] = b"not json\n"
        data = b"".join(lines)
        whole += data
        kind = KINDS[s % len(KINDS)]
        packed = {".jsonl": lambda d: d, ".jsonl.gz": gzip.compress, ".jsonl.xz": lzma.compress,
                  ".jsonl.zst": zstandard.ZstdCompressor().compress}[kind](data)
        (folder / f"part_{s:02d}{kind}").write_bytes(packed)
    return whole


def pair(prefix: str | Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


@pytest.fixture(scope="module")
def spec():
    return resolve_tokenizer("gpt2")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_folder_of_shards_equals_their_concatenation_with_per_file_line_numbers(tmp_path, spec, workers):
    whole = write_shards(tmp_path / "in", 8, bad_every=3)
    (tmp_path / "all.jsonl").write_bytes(whole)
    ref = preprocess([tmp_path / "all.jsonl"], str(tmp_path / "ref"), spec)
    r = preprocess([tmp_path / "in"], str(tmp_path / "out"), spec, workers=workers)
    assert r.mode == ("sequential" if workers == 1 else "shards") and r.shards == 8 and r.resumed == 0
    assert pair(r.outputs["text"]) == pair(ref.outputs["text"])
    assert r.docs_in == ref.docs_in and r.docs_out == ref.docs_out and r.tokens_out == ref.tokens_out
    # Each bad line is named by its own shard and its line there.
    listed = [json.loads(line) for line in Path(r.problems_file).read_text().splitlines()]
    assert [(Path(p["path"]).name, p["line"]) for p in listed] == [(f"part_{s:02d}{KINDS[s % 4]}", 4)
                                                                    for s in range(8)]
    assert not (tmp_path / "out.shards").exists()  # the parts are gone once merged


def test_output_per_input_then_merge_datasets_equals_one_run(tmp_path, spec):
    whole = write_shards(tmp_path / "in", 5)
    (tmp_path / "all.jsonl").write_bytes(whole)
    ref = preprocess([tmp_path / "all.jsonl"], str(tmp_path / "ref"), spec)
    runner = CliRunner()
    res = runner.invoke(main, ["preprocess", "--input", str(tmp_path / "in" / "part_*"), "--tokenizer", "gpt2",
                               "--append-eod", "--output-per-input", "--workers", "2",
                               "--output-prefix", str(tmp_path / "out" / "web")])
    assert res.exit_code == 0, res.output
    prefixes = [str(tmp_path / "out" / f"web_part_{s:02d}_text_document") for s in range(5)]
    assert all(Path(p + ".idx").is_file() for p in prefixes)
    res = runner.invoke(main, ["merge-datasets", "--input", str(tmp_path / "out"),
                               "--output-prefix", str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    assert pair(tmp_path / "merged") == pair(ref.outputs["text"])
    # As Megatron's MMapIndexedDataset reads it: every document, in order, with doc_idx 0..N.
    dtype, items, doc_idx = read_like_megatron(str(tmp_path / "merged"))
    ds = IndexedDataset(ref.outputs["text"])
    assert [i.tolist() for i in items] == [ds[i].tolist() for i in range(len(ds))]
    assert doc_idx.tolist() == list(range(len(ds) + 1)) and dtype == ds.dtype
    # Its record (merged from the inputs' records) is the one-output run's: same tokenizer, counts, largest id.
    record = json.loads(Path(f"{tmp_path / 'merged'}.dataset.json").read_text())
    assert record == json.loads(Path(f"{ref.outputs['text']}.dataset.json").read_text())
    assert record["max_id"] == max(json.loads(Path(f"{p}.dataset.json").read_text())["max_id"] for p in prefixes)


def test_a_merge_with_an_unrecorded_input_records_no_tokenizer_and_the_largest_id(tmp_path, spec):
    """The largest id of an input without a record comes from a scan; the merged record names no tokenizer."""
    from tests.fixtures_data import write_indexed

    write_shards(tmp_path / "in", 1)
    recorded = preprocess([tmp_path / "in"], str(tmp_path / "a"), spec).outputs["text"]
    bare = write_indexed(tmp_path / "bare_text_document", [[5, 60000, 7], [1]])  # Megatron's: no record
    res = CliRunner().invoke(main, ["merge-datasets", "--input-prefix", recorded, "--input-prefix", bare,
                                    "--output-prefix", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    assert f"warning: {bare} has no bsops record" in res.stderr
    record = json.loads((tmp_path / "m.dataset.json").read_text())
    assert record["tokenizer"] is None and record["max_id"] == 60000  # above GPT-2's ids (EOD 50256)
    assert record["documents"] == len(IndexedDataset(recorded)) + 2


def test_a_changed_shard_is_redone_and_the_others_are_kept(tmp_path, spec):
    write_shards(tmp_path / "in", 4)
    first = preprocess([tmp_path / "in"], str(tmp_path / "out"), spec, output_per_input=True)
    records = {p: p.stat().st_mtime_ns for p in (tmp_path).glob("out_*.preprocess.json")}
    assert len(records) == 4 and first.resumed == 0
    changed = tmp_path / "in" / "part_02.jsonl.xz"
    changed.write_bytes(lzma.compress(b"".join(_doc(1000 + i) for i in range(7))))
    again = preprocess([tmp_path / "in"], str(tmp_path / "out"), spec, output_per_input=True)
    assert again.resumed == 3 and again.docs_in == 3 * 60 + 7
    assert len(IndexedDataset(tmp_path / "out_part_02_text_document")) == 7
    kept = {p: p.stat().st_mtime_ns for p in records}
    assert [p.name for p in records if kept[p] != records[p]] == ["out_part_02.preprocess.json"]
    own = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("out_*_text_document.dataset.json")}
    assert len(own) == 4 and own["out_part_02_text_document.dataset.json"]["documents"] == 7  # each output's record
    # Another tokenizer setting (no EOD) redoes them all.
    other = preprocess([tmp_path / "in"], str(tmp_path / "out"), spec, append_eod=False, output_per_input=True)
    assert other.resumed == 0


def test_a_run_stopped_before_its_merge_only_merges_when_rerun(tmp_path, spec, monkeypatch):
    import bigscience_ops.data.shards as shards_mod

    whole = write_shards(tmp_path / "in", 3)
    (tmp_path / "all.jsonl").write_bytes(whole)

    def stop(self, work):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(shards_mod.Merger, "finish", stop)
        with pytest.raises(KeyboardInterrupt):
            preprocess([tmp_path / "in"], str(tmp_path / "out"), spec)
    assert len(list((tmp_path / "out.shards").glob("*.preprocess.json"))) == 3
    assert not list(tmp_path.glob("out_text_document.*"))
    r = preprocess([tmp_path / "in"], str(tmp_path / "out"), spec)
    assert (r.resumed, r.mode, r.docs_in) == (3, "resumed", 180)
    assert pair(r.outputs["text"]) == pair(preprocess([tmp_path / "all.jsonl"], str(tmp_path / "ref"), spec)
                                          .outputs["text"])


def test_two_inputs_that_would_share_an_output_are_refused(tmp_path, spec):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "en.jsonl").write_bytes(_doc(1))
    with pytest.raises(DataError, match=r"inputs .*a/en.jsonl and .*b/en.jsonl would both be written to .*out_en_"):
        preprocess([tmp_path / "a", tmp_path / "b"], str(tmp_path / "out"), spec, output_per_input=True)


def test_busy_fraction_of_a_longest_first_schedule():
    assert _busy_fraction([10] * 64, 64) == 1.0
    assert _busy_fraction([10] * 65, 64) == pytest.approx(65 / 128)
    assert _busy_fraction([100, 1, 1, 1], 2) == pytest.approx(103 / 200)
    assert _busy_fraction([5, 4, 3, 3, 3], 2) == pytest.approx(18 / 20)  # as the pool runs them: 5+3, 4+3+3


def test_an_interrupted_run_resumes_without_redoing_finished_shards(tmp_path, monkeypatch):
    """A real run killed (SIGKILL) once two shards are recorded; the rerun keeps every finished part,
    untouched, and the final bytes equal an uninterrupted run's."""
    whole = write_shards(tmp_path / "in", 8, docs=400)
    (tmp_path / "all.jsonl").write_bytes(whole)
    bsops = str(Path(sys.executable).with_name("bsops"))
    argv = [bsops, "preprocess", "--input", str(tmp_path / "in"), "--tokenizer", "gpt2", "--append-eod",
            "--output-prefix", str(tmp_path / "out")]
    # The slowest backend: the run is still busy with later shards when the kill lands.
    proc = subprocess.Popen(argv + ["--tokenizer-backend", "tokenizers"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    work = tmp_path / "out.shards"
    deadline = time.monotonic() + 120
    while len(list(work.glob("*.preprocess.json"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=60)
    records = sorted(p.name for p in work.glob("*.preprocess.json"))
    assert 2 <= len(records) < 8, records
    assert not (tmp_path / "out_text_document.idx").exists()
    assert list(tmp_path.glob("*.tmp-*")) or list(work.glob("*.tmp-*"))  # the kill left temporaries behind

    import bigscience_ops.data.shards as shards_mod

    redone = []
    real_init = shards_mod.ShardSink.__init__

    def spy(self, shard, *args):
        redone.append(Path(shard.part).name + ".preprocess.json")
        real_init(self, shard, *args)

    monkeypatch.setattr(shards_mod.ShardSink, "__init__", spy)
    r = preprocess([tmp_path / "in"], str(tmp_path / "out"), resolve_tokenizer("gpt2"))
    assert r.resumed == len(records) and sorted(redone + records) == sorted(
        f"{n}.preprocess.json" for n in (Path(x.part).name for x in shards_mod.plan_shards(
            sorted((tmp_path / "in").iterdir()), str(tmp_path / "out"), False)))
    assert set(redone).isdisjoint(records)
    ref = preprocess([tmp_path / "all.jsonl"], str(tmp_path / "ref"), resolve_tokenizer("gpt2"))
    assert pair(r.outputs["text"]) == pair(ref.outputs["text"])
    assert not work.exists() and not list(tmp_path.glob("*.tmp-*"))


def test_a_part_record_whose_settings_lack_a_field_is_no_record_to_a_merge(tmp_path, spec):
    """A part record edited by hand (settings without `kind`) is not read as one: the merge warns as for a dataset
    without a record, instead of a traceback."""
    write_shards(tmp_path / "in", 2)
    preprocess([tmp_path / "in"], str(tmp_path / "out"), spec, output_per_input=True)
    prefixes = [str(tmp_path / f"out_part_{s:02d}_text_document") for s in range(2)]
    Path(f"{prefixes[1]}.dataset.json").unlink()  # only the part record tells how it was made now
    part = tmp_path / "out_part_01.preprocess.json"
    record = json.loads(part.read_text())
    del record["settings"]["kind"]
    part.write_text(json.dumps(record))
    res = CliRunner().invoke(main, ["merge-datasets", "--input-prefix", prefixes[0], "--input-prefix", prefixes[1],
                                    "--output-prefix", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    assert f"warning: {prefixes[1]} has no bsops record" in res.stderr
    assert json.loads((tmp_path / "m.dataset.json").read_text())["tokenizer"] is None
