"""bsops preprocess: ids, bad lines with file and line numbers, --strict, compression, workers, CLI."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.data.errors import BadInputError
from bigscience_ops.data.indexed import IndexedDataset
from bigscience_ops.data.preprocess import Limits, Listener, preprocess
from bigscience_ops.data.tokenizer import resolve_tokenizer

GOOD = ["First document.", "Ünïcödé and emoji 😀 here", "  whitespace   runs\n\n\tend", "x"]

# (raw line, problem kind) for each kind of unusable line
BAD_LINES = [
    (b'{"text": "unterminated}\n', "malformed-json"),
    (b"\n", "malformed-json"),
    (b'["a", "list"]\n', "not-an-object"),
    (b'{"content": "wrong key"}\n', "missing-key"),
    (b'{"text": 12}\n', "not-a-string"),
    (b'{"text": null}\n', "not-a-string"),
    (b'{"text": "bad \xc3\x28 bytes"}\n', "invalid-utf8"),
    (b'{"text": "lone \\udc80 surrogate"}\n', "invalid-utf8"),
    (b'{"text": ""}\n', "empty"),
]


def good_line(text: str) -> bytes:
    return (json.dumps({"text": text, "meta": {"id": 1}}, ensure_ascii=False) + "\n").encode()


def write_mixed(path: Path) -> dict[int, str]:
    """GOOD documents with every BAD_LINES entry between them; returns {line number: kind}."""
    expected = {}
    with open(path, "wb") as f:
        lineno = 0
        for i, (raw, kind) in enumerate(BAD_LINES):
            f.write(good_line(GOOD[i % len(GOOD)]))
            f.write(raw)
            lineno += 2
            expected[lineno] = kind
    return expected


@pytest.fixture(scope="module")
def spec():
    return resolve_tokenizer("gpt2")


def test_ids_equal_gpt2tokenizerfast_plus_eod(tmp_path, spec, hf_gpt2):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(good_line(t) for t in GOOD))
    result = preprocess([src], str(tmp_path / "out"), spec, append_eod=True)
    ds = IndexedDataset(result.outputs["text"])
    assert ds.dtype == np.uint16
    assert [ds[i].tolist() for i in range(len(ds))] == [hf_gpt2(t)["input_ids"] + [50256] for t in GOOD]
    assert result.docs_in == len(GOOD) and result.docs_out == {"text": len(GOOD)}
    assert result.tokens_out["text"] == ds.num_tokens
    assert result.bytes_in == src.stat().st_size
    assert result.problem_counts == {} and result.problems_file is None


def test_each_bad_line_is_counted_with_file_and_line(tmp_path, spec):
    src = tmp_path / "mixed.jsonl"
    expected = write_mixed(src)
    result = preprocess([src], str(tmp_path / "out"), spec, append_eod=True)
    assert {p.line: p.kind for p in result.problems} == expected
    assert all(p.path == str(src) for p in result.problems)
    kinds = [k for _, k in BAD_LINES]
    assert result.problem_counts == {k: kinds.count(k) for k in set(kinds)}
    assert result.docs_in == 2 * len(BAD_LINES)
    assert result.docs_out["text"] == len(BAD_LINES) == len(IndexedDataset(result.outputs["text"]))
    assert result.lines_dropped == len(BAD_LINES) - kinds.count("empty")
    assert result.lines_dropped + result.problem_counts["empty"] + result.docs_out["text"] == result.docs_in
    listed = [json.loads(line) for line in Path(result.problems_file).read_text().splitlines()]
    assert [(p["line"], p["kind"]) for p in listed] == sorted(expected.items())


@pytest.mark.parametrize("raw,kind", BAD_LINES)
def test_strict_stops_at_first_bad_line(tmp_path, spec, raw, kind):
    src = tmp_path / "one_bad.jsonl"
    src.write_bytes(good_line("fine") + good_line("also fine") + raw + good_line("after"))
    with pytest.raises(BadInputError) as err:
        preprocess([src], str(tmp_path / "out"), spec, strict=True)
    assert (err.value.path, err.value.line, err.value.kind) == (str(src), 3, kind)
    assert not list(tmp_path.glob("out_*.idx")) and not list(tmp_path.glob("out_*.bin"))


def _compress(kind: str, plain: Path) -> Path:
    """plain compressed as `kind`; xz-blocks: many independent blocks, as `xz -T N` writes them."""
    out = plain.with_name(plain.name + {"gz": ".gz", "xz": ".xz", "xz-blocks": ".xz", "zst": ".zst"}[kind])
    if kind == "gz":
        out.write_bytes(gzip.compress(plain.read_bytes()))
    elif kind == "xz":
        out.write_bytes(lzma.compress(plain.read_bytes()))
    elif kind == "xz-blocks":
        subprocess.run(["xz", "-kf", "-T2", "--block-size=24KiB", str(plain)], check=True, timeout=60)
    else:
        subprocess.run(["zstd", "-qf", str(plain), "-o", str(out)], check=True, timeout=60)
    return out


@pytest.fixture(scope="module")
def mixed_corpus(tmp_path_factory, spec):
    """~250 KB of documents of varied sizes with every kind of bad line, and its output from 1 worker."""
    d = tmp_path_factory.mktemp("kinds")
    plain = d / "m.jsonl"
    write_mixed(plain)
    with open(plain, "ab") as f:
        for i in range(1200):
            f.write(good_line(f"line {i} ünï <|endoftext|> " * (i % 23) + "x" * (i % 5)))
    ref = preprocess([plain], str(d / "ref"), spec, append_eod=True)
    return plain, ref


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kind", ["jsonl", "gz", "xz", "xz-blocks", "zst"])
def test_every_input_kind_and_worker_count_writes_identical_bytes(tmp_path, spec, monkeypatch, mixed_corpus,
                                                                  kind, workers):
    import bigscience_ops.data.pipeline as pp

    plain, ref = mixed_corpus
    src = tmp_path / plain.name  # compressed copies are written next to it
    src.write_bytes(plain.read_bytes())
    if kind != "jsonl":
        src = _compress(kind, src)
    monkeypatch.setattr(pp, "CHUNK_BYTES", 20_000)  # a dozen chunks (or xz spans) per worker
    from bigscience_ops.data import xz

    spans = []
    real_spans = xz.spans
    monkeypatch.setattr(xz, "spans", lambda *a: spans.extend(real_spans(*a)) or real_spans(*a))
    r = preprocess([src], str(tmp_path / "out"), spec, append_eod=True, workers=workers)
    assert r.mode == ("sequential" if workers == 1 else "chunks")
    # Workers decode a multi-block .xz block by block; one worker reads it as one stream.
    assert len(spans) > 5 if (kind, workers) == ("xz-blocks", 2) else spans == []
    for ext in (".bin", ".idx"):
        assert Path(r.outputs["text"] + ext).read_bytes() == Path(ref.outputs["text"] + ext).read_bytes()
    assert (r.docs_in, r.problem_counts) == (ref.docs_in, ref.problem_counts)
    assert [(p.line, p.kind) for p in r.problems] == [(p.line, p.kind) for p in ref.problems]
    assert all(p.path == str(src) for p in r.problems)


def test_several_inputs_and_keys(tmp_path, spec):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"text": "alpha", "title": "A"}) + "\n")
    b.write_text(json.dumps({"text": "beta", "title": "B"}) + "\n" + json.dumps({"text": "gamma"}) + "\n")
    r = preprocess([a, b], str(tmp_path / "out"), spec, json_keys=("text", "title"))
    assert set(r.outputs) == {"text", "title"} and r.docs_out == {"text": 2, "title": 2}
    assert [(p.path, p.line, p.kind) for p in r.problems] == [(str(b), 2, "missing-key")]
    assert len(IndexedDataset(r.outputs["title"])) == 2


def test_cli_preprocess_progress_and_merge(tmp_path):
    src = tmp_path / "in.jsonl"
    write_mixed(src)
    with open(src, "ab") as f:
        for i in range(250):
            f.write(good_line(f"more text {i}"))
    runner = CliRunner()
    res = runner.invoke(main, ["preprocess", "--input", str(src), "--tokenizer", "gpt2", "--append-eod",
                               "--tokenizer-backend", "fastokens",  # auto takes tiktoken for an input this small
                               "--output-prefix", str(tmp_path / "p"), "--log-interval", "100"])
    assert res.exit_code == 0, res.output
    assert re.search(r"^Processed \d+ documents \([\d.]+ docs/s, [\d.]+ MB/s\)\.$", res.stderr, re.M)
    assert f"{src}:2: malformed-json" in res.stderr
    assert "documents in 268, out 259, dropped 8" in res.stdout  # + 1 empty document
    assert re.search(r"^tokenizer fastokens:encoder.json, tokens uint16\ncross-checked [1-9]\d* documents "
                     r"against tiktoken:encoder: identical ids$", res.stdout, re.M), res.stdout
    res = runner.invoke(main, ["preprocess", "--input", str(src), "--tokenizer", "gpt2",
                               "--output-prefix", str(tmp_path / "s"), "--strict"])
    assert res.exit_code == 2 and f"{src}:2: malformed-json" in res.stderr
    one = str(tmp_path / "p_text_document")
    for command in ("merge-datasets", "merge-data"):  # merge-data: the former name, kept as an alias
        res = runner.invoke(main, [command, "--input-prefix", one, "--input-prefix", one,
                                   "--output-prefix", str(tmp_path / command)])
        assert res.exit_code == 0, res.output
        assert len(IndexedDataset(tmp_path / command)) == 2 * 259
        assert ("merge-data is now merge-datasets" in res.stderr) == (command == "merge-data")
    assert not re.search(r"^ +merge-data ", runner.invoke(main, ["--help"]).output, re.M)  # the old name is hidden


def test_ctrl_c_never_leaves_a_complete_looking_index(tmp_path):
    src = tmp_path / "big.jsonl"
    line = good_line("many words " * 400)
    src.write_bytes(line * 6000)  # ~26 MB: several seconds of work for the slowest backend
    prefix = tmp_path / "out"
    bsops = str(Path(sys.executable).with_name("bsops"))
    proc = subprocess.Popen([bsops, "preprocess", "--input", str(src), "--tokenizer-backend", "tokenizers",
                             "--tokenizer", "gpt2", "--output-prefix", str(prefix), "--append-eod"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            # Ctrl-C's signal as a terminal sends it, even where pytest runs as a background job
                            # (which inherits SIGINT ignored, and Python then keeps it ignored).
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def writing() -> bool:  # tokens are reaching the temporary .bin: the cut lands mid-write, whatever the speed
        return any(p.stat().st_size > 0 for p in tmp_path.glob("out_text_document.bin.tmp-*"))

    deadline = time.monotonic() + 60
    while not writing() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writing() and proc.poll() is None, "the preprocess never started writing, or already ended"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not (tmp_path / "out_text_document.idx").exists()
    assert not (tmp_path / "out_text_document.bin").exists()
    assert not list(tmp_path.glob("*.tmp-*"))


def test_progress_bar_on_a_terminal_and_megatron_lines_otherwise(tmp_path: Path, repo_root: Path) -> None:
    import os
    import pty

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(300)))
    bsops = str(Path(sys.executable).with_name("bsops"))
    argv = [bsops, "preprocess", "--input", str(source), "--tokenizer", str(repo_root / "corpus" / "tokenizer.json"),
            "--append-eod", "--log-interval", "100"]
    leader, follower = pty.openpty()
    with open(leader, "rb", buffering=0, closefd=True) as terminal:
        proc = subprocess.run(argv + ["--output-prefix", str(tmp_path / "tty")], stderr=follower,
                              stdout=subprocess.PIPE, timeout=120)
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = terminal.read(4096)
            except OSError:  # the terminal is closed once everything was read
                break
            if not chunk:
                break
            shown += chunk
    assert proc.returncode == 0
    assert b"\r[" in shown and b"100.0%" in shown and b"Processed" not in shown
    piped = subprocess.run(argv + ["--output-prefix", str(tmp_path / "pipe")], capture_output=True, text=True,
                           timeout=120)
    assert piped.returncode == 0 and "\r[" not in piped.stderr
    assert re.search(r"Processed \d+ documents \([\d.]+ docs/s, [\d.]+ MB/s\)\.", piped.stderr), piped.stderr


@pytest.mark.parametrize("name,workers", [("m.jsonl", 1), ("m.jsonl", 2), ("m.jsonl.gz", 2)])
def test_small_chunks_keep_bytes_and_line_numbers(tmp_path, spec, monkeypatch, name, workers):
    """Chunks cut mid-file (read by the workers for plain files) give the same output and line numbers."""
    import bigscience_ops.data.pipeline as pp

    src = tmp_path / "m.jsonl"
    expected = write_mixed(src)
    with open(src, "ab") as f:
        for i in range(300):
            f.write(good_line(f"line {i} " * (i % 7 + 1)))
        f.write(b'{"text": "no newline at the end"}')
    if name.endswith(".gz"):
        (tmp_path / name).write_bytes(gzip.compress(src.read_bytes()))
    whole = preprocess([src], str(tmp_path / "whole"), spec, append_eod=True)
    monkeypatch.setattr(pp, "CHUNK_BYTES", 300)  # ~40 chunks; cut only in the main process
    seen, used = [], []
    cut = preprocess([tmp_path / name], str(tmp_path / "cut"), spec, append_eod=True, workers=workers,
                     listener=Listener(progress=seen.append, workers=used.append))
    assert {p.line: p.kind for p in cut.problems} == expected
    assert cut.docs_in == whole.docs_in == 2 * len(BAD_LINES) + 301
    for ext in (".bin", ".idx"):
        assert Path(cut.outputs["text"] + ext).read_bytes() == Path(whole.outputs["text"] + ext).read_bytes()
    assert len(seen) > 10 and seen[-1].fraction == 1.0
    assert [p.fraction for p in seen] == sorted(p.fraction for p in seen)
    assert used == [cut.workers] and used[0].asked == workers  # heard once, before any work


@pytest.mark.parametrize("workers", [1, 2])
def test_every_backend_writes_the_same_bytes_and_fastokens_runs_are_cross_checked(tmp_path, workers):
    src = tmp_path / "m.jsonl"
    write_mixed(src)
    with open(src, "ab") as f:
        for i in range(400):
            f.write(good_line(f"line {i} <|endoftext|> ünï " * (i % 9)))
    written = {}
    for backend in ("tokenizers", "tiktoken", "fastokens"):
        r = preprocess([src], str(tmp_path / backend), resolve_tokenizer("gpt2", backend=backend),
                       append_eod=True, workers=workers, limits=Limits(check_fraction=0.2))
        assert r.tokenizer.startswith(backend)
        written[backend] = [Path(r.outputs["text"] + ext).read_bytes() for ext in (".bin", ".idx")]
        assert r.problem_counts["empty"] == 1 + 400 // 9 + 1  # write_mixed's one, and i % 9 == 0
        if backend == "fastokens":  # about a fifth of the text, in every worker, all identical
            assert r.reference.startswith("tiktoken") and 60 < r.cross_checked < 200
        else:
            assert r.reference is None and r.cross_checked == 0
    assert written["tokenizers"] == written["tiktoken"] == written["fastokens"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_cross_check_difference_stops_the_run_naming_the_line(tmp_path, monkeypatch, workers):
    """A fastokens id that differs from the reference's (simulated) stops the run; nothing is written."""
    from bigscience_ops.data.errors import TokenizerError
    from bigscience_ops.data.tokenizer import FastokensTokenizer

    real = FastokensTokenizer.encode_batch

    def one_wrong_id(self, texts):
        ids, lengths = real(self, texts)
        ids = ids.copy()
        for i, text in enumerate(texts):
            if text.startswith("odd one"):
                ids[int(lengths[:i + 1].sum()) - 1] += 1
        return ids, lengths

    monkeypatch.setattr(FastokensTokenizer, "encode_batch", one_wrong_id)
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(good_line(f"document {i}") for i in range(50)) + good_line("odd one out")
                    + b"".join(good_line(f"document {i}") for i in range(50)))
    with pytest.raises(TokenizerError, match=rf"{src}:51: the fastokens:\S+ tokenizer and the reference "
                                             r"tiktoken:\S+ disagree .*first difference at id 2: \[\d+\] vs \[\d+\]"):
        preprocess([src], str(tmp_path / "out"), resolve_tokenizer("gpt2", backend="fastokens"), workers=workers,
                   limits=Limits(check_fraction=1.0))
    assert not list(tmp_path.glob("out_*.bin")) and not list(tmp_path.glob("out_*.idx"))
    # Turned off, the same run goes through (and writes the wrong id: the check is what stands guard).
    r = preprocess([src], str(tmp_path / "out"), resolve_tokenizer("gpt2", backend="fastokens"), workers=workers,
                   limits=Limits(check_fraction=0.0))
    assert r.reference is None and r.docs_out == {"text": 101}


def test_workers_spill_folder_is_removed_after_a_run_and_after_a_failure(tmp_path, spec, monkeypatch):
    import tempfile

    spills = tmp_path / "tmp"
    spills.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spills))
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(good_line(f"document {i} " * 50) for i in range(2000)))
    monkeypatch.setattr("bigscience_ops.data.pipeline.CHUNK_BYTES", 4096)  # ~200 chunks, each a file
    whole = preprocess([src], str(tmp_path / "one"), spec, append_eod=True)
    two = preprocess([src], str(tmp_path / "two"), spec, append_eod=True, workers=2)
    for ext in (".bin", ".idx"):
        assert Path(two.outputs["text"] + ext).read_bytes() == Path(whole.outputs["text"] + ext).read_bytes()
    assert list(spills.iterdir()) == []
    src.write_bytes(src.read_bytes() + b"not json\n")
    with pytest.raises(BadInputError):
        preprocess([src], str(tmp_path / "bad"), spec, workers=2, strict=True)
    assert list(spills.iterdir()) == [] and not list(tmp_path.glob("bad_*"))


def _gz(path: Path, data: bytes) -> None:
    path.write_bytes(gzip.compress(data))


def _xz(path: Path, data: bytes) -> None:
    path.write_bytes(lzma.compress(data))


DATA_HOSTILE = {
    # (make the input and the output folder state, extra args, what the error says)
    "a .gz that is not gzip": (lambda t: (t / "in.jsonl.gz").write_bytes(b"plain text\n"), "in.jsonl.gz",
                               "not a complete gzip file"),
    "a truncated .gz": (lambda t: (_gz(t / "x.jsonl.gz", b"".join(good_line(os.urandom(2000).hex()) for _ in range(20))),
                                   (t / "in.jsonl.gz").write_bytes((t / "x.jsonl.gz").read_bytes()[:300])),
                        "in.jsonl.gz", "not a complete gzip file"),
    "a truncated .xz": (lambda t: (_xz(t / "x.jsonl.xz", b"".join(good_line(os.urandom(2000).hex()) for _ in range(20))),
                                   (t / "in.jsonl.xz").write_bytes((t / "x.jsonl.xz").read_bytes()[:300])),
                        "in.jsonl.xz", "not a complete xz file"),
    "an .xz that is gzip": (lambda t: _gz(t / "in.jsonl.xz", good_line("z")), "in.jsonl.xz", "not a complete xz file"),
    "an output .bin that is a folder": (lambda t: ((t / "in.jsonl").write_bytes(good_line("a")),
                                                  (t / "out_text_document.bin").mkdir()), "in.jsonl", "is a folder"),
    "an output .idx that is a folder": (lambda t: ((t / "in.jsonl").write_bytes(good_line("a")),
                                                  (t / "out_text_document.idx").mkdir()), "in.jsonl", "is a folder"),
    "the input named like its own output": (lambda t: (t / "out_text_document.bin").write_bytes(good_line("a")),
                                            "out_text_document.bin", "would be overwritten"),
    "an input folder with no input file": (lambda t: (t / "in.jsonl").mkdir(), "in.jsonl", "holds no input file"),
    "a glob that matches nothing": (lambda t: None, "shard_*.jsonl.gz", "matches no file"),
    "a missing input": (lambda t: None, "in.jsonl", "does not exist"),
}


@pytest.mark.parametrize("case", sorted(DATA_HOSTILE))
def test_hostile_data_files_are_one_clear_error_and_nothing_is_overwritten(case, tmp_path):
    make, name, expected = DATA_HOSTILE[case]
    make(tmp_path)
    before = {p.name: (p.read_bytes() if p.is_file() else None) for p in tmp_path.iterdir()}
    res = CliRunner().invoke(main, ["preprocess", "--input", str(tmp_path / name), "--tokenizer", "gpt2",
                                    "--output-prefix", str(tmp_path / "out")])
    errors = [line for line in res.output.splitlines() if line.lower().startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "Traceback" not in res.output and "Aborted" not in res.output
    assert expected in errors[0], errors[0]
    assert {p.name: (p.read_bytes() if p.is_file() else None) for p in tmp_path.iterdir()} == before


def test_workers_are_capped_at_the_cores_and_the_pieces_of_work(tmp_path, monkeypatch):
    """cap_workers: plain inputs give one piece per CHUNK_BYTES (at least one each), compressed ones up to
    COMPRESSED_MAX_RATIO times their size; never more workers than cores, never fewer than one."""
    import bigscience_ops.data.pipeline as pp
    from bigscience_ops.data import preprocess as pre
    from bigscience_ops.data.shards import plan_shards

    monkeypatch.setattr(pp, "CHUNK_BYTES", 1000)
    (tmp_path / "a.jsonl").write_bytes(b"x" * 2500)  # 3 pieces
    (tmp_path / "b.jsonl").write_bytes(b"")  # 1
    (tmp_path / "c.jsonl.gz").write_bytes(b"z" * 20)  # 20 * 64 / 1000 -> 2
    shards = plan_shards([tmp_path / n for n in ("a.jsonl", "b.jsonl", "c.jsonl.gz")], str(tmp_path / "o"), False)
    monkeypatch.setattr(pre, "available_cores", lambda: 64)
    assert pre.cap_workers(10 ** 6, shards) == pre.Workers(10 ** 6, 6, 64, 6)
    assert pre.cap_workers(4, shards) == pre.Workers(4, 4, 64, 6) and not pre.cap_workers(4, shards).capped
    monkeypatch.setattr(pre, "available_cores", lambda: 2)
    assert pre.cap_workers(10 ** 6, shards).used == 2 and pre.cap_workers(10 ** 6, []).used == 1
    assert pre.Workers(10 ** 6, 2, 2, 6).line().startswith("--workers 1000000 capped to 2:")
    assert 1 <= pre.available_cores() <= (os.cpu_count() or 1)
