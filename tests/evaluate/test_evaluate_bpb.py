"""Bits per byte of a held-out source (bpb.py): lm-eval's rolling windows made lazily, and a hostile source's bad
lines counted, named and skipped without changing what the good documents give.

The Scorer here is a stand-in that answers a fixed function of each window, so the numbers are exact
arithmetic; agreement with lm-eval's own bits_per_byte on a real model is in test_evaluate_harness.py.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from bigscience_ops.data.corpus import TOKENIZER_FILE
from bigscience_ops.data.tokenizer import TokenizerSpec, build_tokenizer
from bigscience_ops.ops.evaluate import EvalError, bpb, harness


class WindowScorer:
    """A Scorer whose log-likelihood of a window is a fixed function of its tokens; it records the windows."""

    max_length, vocab_size, eod = 8, 8192, 0

    def __init__(self) -> None:
        self.windows: list[tuple[list[int], list[int]]] = []

    def score(self, items):
        self.windows += items
        return [(-sum(0.001 * t + 0.5 for t in cont) - 0.01 * len(ctx), False) for ctx, cont in items]

    def next_tokens(self, contexts):
        return [0 for _ in contexts]


def _lm(scorer=None) -> harness.BsopsLM:
    tokenizer = build_tokenizer(TokenizerSpec("json", json_file=str(TOKENIZER_FILE), backend="tokenizers"))
    return harness.BsopsLM(scorer or WindowScorer(), tokenizer, batch_size=2)


GOOD = ["In the beginning God created the heaven and the earth.", "Jesus wept.",
        "And the evening and the morning were the first day. " * 5, "Ünïcödé: naïve café, 中文 😀"]


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def _line(value) -> bytes:
    return json.dumps(value).encode("utf-8") + b"\n"


def test_windows_are_lm_evals_rolling_windows():
    for max_length in (1, 2, 3, 5, 8, 32):
        for n in range(0, 3 * max_length + 4):
            tokens = list(range(100, 100 + n))
            assert list(bpb.windows(np.array(tokens, dtype=np.uint32), 7, max_length)) == \
                harness.rolling_windows(tokens, 7, max_length), (max_length, n)


def test_bits_per_byte_is_total_bits_over_total_bytes(tmp_path):
    source = _write(tmp_path / "s.jsonl", [_line({"text": t}) for t in GOOD])
    lm = _lm()
    got = bpb.bits_per_byte(source, lm, docs=10)
    ids = [lm.tok_encode(t) for t in GOOD]
    windows = [w for i in ids for w in harness.rolling_windows(i, lm.eot_token_id, 8)]
    assert sorted(map(str, lm.scorer.windows)) == sorted(map(str, windows))  # each window scored once
    nats = -sum(ll for ll, _ in WindowScorer().score(windows))
    n_bytes = sum(len(t.encode("utf-8")) for t in GOOD)
    assert (got.documents, got.bytes, got.tokens, got.skipped) == (4, n_bytes, sum(map(len, ids)), 0)
    assert got.nats == pytest.approx(nats, rel=1e-12)
    assert got.bits_per_byte == pytest.approx(nats / n_bytes / math.log(2), rel=1e-12)
    capped = bpb.bits_per_byte(source, _lm(), docs=2)
    assert (capped.documents, capped.bytes) == (2, sum(len(t.encode("utf-8")) for t in GOOD[:2]))


def test_a_hostile_source_is_reported_and_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(bpb, "MAX_LINE", 4096)
    lines = [
        _line({"text": GOOD[0]}),
        b'{"text": "torn in the mid\n',  # 2: a write cut short
        b'{"text": "caf\xe9 latin-1"}\n',  # 3: not UTF-8
        _line({"text": "x" * 10_000}),  # 4: over MAX_LINE
        _line({"body": "the text is under another key"}),  # 5
        b"\n",  # blank: not a line to report
        _line({"text": GOOD[1]}),
        _line(["a", "list"]),  # 8
        _line({"text": 42}),  # 9
        _line({"text": ""}),  # 10
        b'{"text": "lone \\ud800 surrogate"}\n',  # 11
        b"[" * 100_000 + b"\n",  # 12: over MAX_LINE too
        b"[" * 4000 + b"\n",  # 13: deeper than json can nest
        _line({"text": GOOD[2]}),
        b'{"text": "the last line, cut sh',  # 15, no end of line
    ]
    source = _write(tmp_path / "hostile.jsonl", lines)
    got = bpb.bits_per_byte(source, _lm(), docs=100)
    clean = bpb.bits_per_byte(_write(tmp_path / "clean.jsonl", [_line({"text": t}) for t in GOOD[:3]]), _lm())
    assert (got.documents, got.bytes, got.tokens, got.nats) == (clean.documents, clean.bytes, clean.tokens, clean.nats)
    assert got.bits_per_byte == clean.bits_per_byte and got.documents == 3
    assert got.skipped == 11
    assert [p.split(": ")[0] for p in got.problems] == [f"{source}:{n}" for n in (2, 3, 4, 5, 8)]
    assert len(got.problems) == bpb.SHOWN_PROBLEMS
    assert got.to_dict()["skipped"] == 11 and json.loads(json.dumps(got.to_dict())) == got.to_dict()
    assert bpb.bits_per_byte(source, _lm(), docs=100, max_bad=11).skipped == 11  # within eval.max_bad_lines
    with pytest.raises(bpb.BadLines) as failed:  # one more than it allows: the source fails, every bad line counted
        bpb.bits_per_byte(source, _lm(), docs=100, max_bad=10)
    assert "11 line(s)" in str(failed.value) and f"{source}:2" in str(failed.value)


def test_a_source_that_cannot_be_scored_is_an_error(tmp_path):
    with pytest.raises(EvalError, match="cannot be opened"):
        bpb.bits_per_byte(tmp_path / "missing.jsonl", _lm())
    with pytest.raises(EvalError, match="not a plain file"):
        bpb.bits_per_byte(tmp_path, _lm())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(EvalError, match="not a plain file"):  # never blocks on a FIFO
        bpb.bits_per_byte(fifo, _lm())
    empty = _write(tmp_path / "empty.jsonl", [_line({"text": ""}), b"not json\n"])
    with pytest.raises(EvalError, match="no document"):
        bpb.bits_per_byte(empty, _lm())


def test_reading_stops_at_the_cap(tmp_path):
    """Only the lines before the docs_per_source-th document are read: a large source is never read whole."""
    source = tmp_path / "big.jsonl"
    with open(source, "wb") as f:
        f.write(_line({"text": GOOD[0]}) + _line({"text": GOOD[1]}))
        f.write(b"\xff" * (1 << 20) + b"\n")  # bad, but after the cap: never read, never reported
    got = bpb.bits_per_byte(source, _lm(), docs=2)
    assert (got.documents, got.skipped) == (2, 0)
