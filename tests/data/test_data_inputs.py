"""Finding inputs (folders, globs) and reading them decompressed: every decoder gives the file's own bytes."""

from __future__ import annotations

import gzip
import lzma
import random
import subprocess
import zlib

import pytest

from bigscience_ops.data import inputs, xz
from bigscience_ops.data.errors import DataError


def test_folders_and_globs_expand_sorted_by_name(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    for name in ("b.jsonl.gz", "a.jsonl", "c.json", "d.jsonl.xz", "e.jsonl.zst", "notes.txt", "f.jsonl.bz2"):
        (folder / name).write_bytes(b"")
    (folder / "sub").mkdir()
    (folder / "sub" / "g.jsonl").write_bytes(b"")
    names = [p.name for p in inputs.expand_inputs([folder])]
    assert names == ["a.jsonl", "b.jsonl.gz", "c.json", "d.jsonl.xz", "e.jsonl.zst"]
    assert [p.name for p in inputs.expand_inputs([str(folder / "*.jsonl.?z")])] == ["b.jsonl.gz", "d.jsonl.xz"]
    assert [p.name for p in inputs.expand_inputs([str(tmp_path / "**" / "*.jsonl")])] == ["a.jsonl", "g.jsonl"]
    # Explicit files keep the order given, before and after a folder.
    got = inputs.expand_inputs([folder / "c.json", str(folder / "sub"), folder / "a.jsonl"])
    assert [p.name for p in got] == ["c.json", "g.jsonl", "a.jsonl"]
    with pytest.raises(DataError, match=r"input glob '.*nothing_\*\.jsonl' matches no file"):
        inputs.expand_inputs([str(tmp_path / "nothing_*.jsonl")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"input folder .*empty holds no input file; allowed: \*\.jsonl"):
        inputs.expand_inputs([tmp_path / "empty"])


@pytest.mark.parametrize("name,stem", [("en_00.jsonl.gz", "en_00"), ("x.JSONL.ZST", "x"), ("a.b.json", "a.b"),
                                       ("plain.jsonl", "plain"), ("odd.txt", "odd.txt")])
def test_shard_stem(name, stem):
    assert inputs.shard_stem(f"/data/{name}") == stem


def _text(n: int = 400, seed: int = 0) -> bytes:
    rnd = random.Random(seed)
    return b"".join(b'{"text": "%s"}\n' % (b"w%d " % i * rnd.choice([1, 30, 900])) for i in range(n))


def _read_all(path, monkeypatch=None) -> bytes:
    with open(path, "rb") as raw:
        reader = inputs.open_decoded(path, raw)
        with reader:
            return b"".join(inputs.line_chunks(reader, 1000))


@pytest.mark.parametrize("without", [None, "isal", "zstandard"])
def test_each_decoder_and_its_fallback_reads_the_files_bytes(tmp_path, monkeypatch, without):
    data = _text()
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(data[:5000]) + gzip.compress(data[5000:]))  # two members, as `cat a.gz b.gz`
    zst = tmp_path / "a.jsonl.zst"
    subprocess.run(["zstd", "-q", "-o", str(zst), "-"], input=data, check=True, timeout=60)
    xzf = tmp_path / "a.jsonl.xz"
    xzf.write_bytes(lzma.compress(data))
    if without is not None:
        real = inputs._have
        monkeypatch.setattr(inputs, "_have", lambda m: m != without and real(m))
    for path in (gz, zst, xzf):
        chunks = []
        with open(path, "rb") as raw, inputs.open_decoded(path, raw) as reader:
            chunks = list(inputs.line_chunks(reader, 1000))
        assert b"".join(chunks) == data
        assert all(c.endswith(b"\n") for c in chunks) and len(chunks) > 10
    notes = inputs.decoder_notes([gz, zst, xzf])
    assert [n.split()[0] for n in notes] == ([] if without is None else [without])


def test_a_line_longer_than_a_chunk_stays_whole_and_a_last_line_without_newline_is_kept(tmp_path):
    data = b"short\n" + b"x" * 5000 + b"\nend without newline"
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(data))
    with open(path, "rb") as raw, inputs.open_decoded(path, raw) as reader:
        chunks = list(inputs.line_chunks(reader, 1000))
    assert chunks == [b"short\n", b"x" * 5000 + b"\n", b"end without newline"]


@pytest.fixture(scope="module")
def multi_block(tmp_path_factory):
    """A multi-block .xz (xz -T2 with small blocks) with lines longer than a block, a second stream after
    stream padding, and no newline at the very end."""
    d = tmp_path_factory.mktemp("xz")
    rnd = random.Random(1)
    data = b"".join((b"x%d " % i * (rnd.choice([2, 20, 1000, 20000]) // 4 + 1)) + b"\n" for i in range(600))
    src = d / "t.jsonl"
    src.write_bytes(data)
    subprocess.run(["xz", "-kf", "-T2", "--block-size=16KiB", str(src)], check=True, timeout=120)
    tail = b"tail line\nno newline at the end"
    path = d / "two.jsonl.xz"
    path.write_bytes((d / "t.jsonl.xz").read_bytes() + b"\0" * 8 + lzma.compress(tail))
    return path, data + tail


@pytest.mark.parametrize("target", [1, 16 << 10, 100_000, 1 << 30])
def test_xz_spans_together_give_every_line_once(multi_block, target):
    path, data = multi_block
    blocks = xz.blocks(str(path))
    assert len(blocks) > 20 and blocks[-1].end == len(data)
    spans = xz.spans(blocks, target)
    pieces = [xz.read_span(str(path), blocks, a, b) for a, b in spans]
    assert b"".join(pieces) == data
    assert all(p.endswith(b"\n") for p in pieces[:-1] if p)  # whole lines in every span


def test_a_damaged_xz_block_or_index_is_an_error(multi_block, tmp_path):
    path, _ = multi_block
    raw = bytearray(path.read_bytes())
    blocks = xz.blocks(str(path))
    bad = tmp_path / "bad.jsonl.xz"
    raw[blocks[3].offset + 40] ^= 0xFF  # inside block 3's compressed data
    bad.write_bytes(bytes(raw))
    with pytest.raises((lzma.LZMAError, zlib.error)):
        xz.read_span(str(bad), xz.blocks(str(bad)), 3, 4)
    bad.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="not a complete xz file"):
        xz.blocks(str(bad))


def test_a_missing_decoder_is_named_once_on_stderr_and_the_bytes_stay_the_same(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from bigscience_ops.cli import main

    data = _text(300)
    for i in range(3):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"s{i}.jsonl.gz").write_bytes(gzip.compress(data[i * 1000:(i + 1) * 1000 + 5000]))
    argv = ["preprocess", "--input", str(tmp_path / "in"), "--tokenizer", "gpt2", "--append-eod"]
    with_isal = CliRunner().invoke(main, argv + ["--output-prefix", str(tmp_path / "a")])
    real = inputs._have
    monkeypatch.setattr(inputs, "_have", lambda m: m != "isal" and real(m))
    without = CliRunner().invoke(main, argv + ["--output-prefix", str(tmp_path / "b")])
    assert with_isal.exit_code == 0 and without.exit_code == 0, without.output
    assert "note:" not in with_isal.stderr
    assert [line for line in without.stderr.splitlines() if line.startswith("note:")] == [
        "note: isal is not installed: .gz inputs are read with Python's gzip, about 3x slower "
        "(pip install 'bigscience-ops[corpus]')"]
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"a_text_document{ext}").read_bytes() == (tmp_path / f"b_text_document{ext}").read_bytes()


def test_a_folder_of_datasets_gives_no_scan_cache_as_input(tmp_path, monkeypatch):
    """A dataset's kept scan (PREFIX.maxid, over 64 MiB) is bsops' side file: a glob over the folder leaves it out;
    a corpus file that only shares the suffix is read."""
    import numpy as np

    from bigscience_ops.data import binding

    from tests.fixtures_data import write_indexed

    monkeypatch.setattr(binding, "FULL_HASH_BYTES", 0)  # sampled, as a large .bin: its scan is kept beside it
    prefix = write_indexed(tmp_path / "d_text_document", [[1, 2, 3]])
    binding.checked_max_id(prefix, np.uint16)
    (tmp_path / "notes.maxid").write_bytes(b'{"text": "not a cache"}\n')
    found = inputs.find_inputs([str(tmp_path / "*")])
    assert [p.name for p in found.files] == ["notes.maxid"]
    assert sorted(p.name for p in found.side_files) == ["d_text_document.bin", "d_text_document.idx",
                                                         "d_text_document.maxid"]
