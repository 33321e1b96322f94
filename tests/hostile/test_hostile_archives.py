"""Hostile inputs to `bsops preprocess` and `bsops merge-datasets`, as one table.

Each case is a clear refusal (a typed error whose fields name the file, the line or the datasets; from
the CLI exit code 2, one error line, no traceback; no output written) or a correct result (values
and bytes checked against the same text given plainly): never a traceback, a hang (every case runs
under an alarm) or a silently wrong result. The bombs are also run as `bsops preprocess` processes
whose peak memory is measured; benchmarks/preprocess_bombs.py runs the 1.5 GiB and 1 GiB ones.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
import os
import signal
import struct
import subprocess
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bigscience_ops.cli import main
from bigscience_ops.data import errors, inputs
from bigscience_ops.data.preprocess import Limits, preprocess
from bigscience_ops.data.shards import merge_checked
from bigscience_ops.data.tokenizer import resolve_tokenizer
from tests.fixtures_data import BOMB_LIMIT, write_indexed

REPO = Path(__file__).resolve().parents[2]
GOOD = b"".join(b'{"text": "document %d says hello"}\n' % i for i in range(40))
LIMIT = 4096  # --max-document-bytes of the table's runs
ZEROS = b"0" * (1 << 20)  # a bomb's line: 256 times the limit, without a newline


def _random_lines(n: int) -> bytes:
    """Lines that compress to about half: a multi-block .xz of them has a block every 16 KiB or so."""
    return b"".join(b'{"text": "%s"}\n' % os.urandom(40).hex().encode() for _ in range(n))
SPEC = resolve_tokenizer("gpt2")


def _zst(data: bytes, checksum: bool = True) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(write_checksum=checksum).compress(data)


def _xz_blocks(data: bytes, block: str = "16KiB") -> bytes:
    """`data` as a multi-block .xz, as `xz -T N` writes it."""
    return subprocess.run(["xz", "-c", "-T2", f"--block-size={block}"], input=data, capture_output=True,
                          check=True, timeout=60).stdout


def _write(name: str, data: bytes | Callable[[], bytes]) -> Callable[[Path], None]:
    def make(t: Path) -> None:
        path = t / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data() if callable(data) else data)
    return make


def _all(*makers: Callable[[Path], object]) -> Callable[[Path], None]:
    def make(t: Path) -> None:
        for m in makers:
            m(t)
    return make


def _link(name: str, target: str) -> Callable[[Path], None]:
    def make(t: Path) -> None:
        (t / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, t / name)
    return make


def _fifo(name: str) -> Callable[[Path], None]:
    def make(t: Path) -> None:
        (t / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(t / name)
    return make


def _zst_reserved_bit(data: bytes) -> bytes:
    raw = bytearray(_zst(data))
    raw[4] |= 0x08  # the frame header descriptor's reserved bit
    return bytes(raw)


def _zst_reserved_block(data: bytes) -> bytes:
    raw = bytearray(_zst(data, checksum=False))
    d = raw[4]
    at = 5 + (0 if d & 0x20 else 1) + (0, 1, 2, 4)[d & 3] + ((0, 2, 4, 8)[d >> 6] or (d >> 5 & 1))
    raw[at] |= 0x06  # block type 3
    return bytes(raw)


def _flip(data: bytes, at: int) -> bytes:
    raw = bytearray(data)
    raw[at] ^= 0xFF
    return bytes(raw)


def _xz_lying_footer(data: bytes) -> bytes:
    """A valid .xz whose footer says its index is 16 GiB long (its CRC fixed, so only the size is wrong)."""
    raw = bytearray(lzma.compress(data))
    raw[-8:-4] = struct.pack("<I", 0xFFFFFFFF)
    raw[-12:-8] = struct.pack("<I", zlib.crc32(bytes(raw[-8:-2])))
    return bytes(raw)


def _exactly(size: int) -> bytes:
    """A document line of exactly `size` bytes, newline not counted."""
    head = b'{"text": "'
    return head + b"x" * (size - len(head) - 2) + b'"}\n'


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth + b"\n" + b'{"text": ' + b"[" * depth + b"]" * depth + b"}\n"


def _hide_zstandard(mp: pytest.MonkeyPatch) -> None:
    real = inputs._have
    mp.setattr(inputs, "_have", lambda m: m != "zstandard" and real(m))


def _set(target: str, value: object) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda mp: mp.setattr(target, value)


def _plain_reference(t: Path, data: bytes) -> tuple[bytes, bytes]:
    """The .bin/.idx of `data` given as a plain jsonl (the bytes every valid form must give)."""
    (t / "ref").mkdir(exist_ok=True)
    (t / "ref" / "plain.jsonl").write_bytes(data)
    r = preprocess([t / "ref" / "plain.jsonl"], str(t / "ref" / "out"), SPEC)
    return _pair(r.outputs["text"])


def _pair(prefix: str | Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def _same_as(data: bytes, docs: int | None = None) -> Callable[[Path, object], None]:
    """The run gave the bytes `data` gives as a plain file (and `docs` documents)."""
    def check(t: Path, r) -> None:
        assert _pair(r.outputs["text"]) == _plain_reference(t, data)
        if docs is not None:
            assert r.docs_out == {"text": docs}
    return check


def _holds(**expected: object) -> Callable[[Path, object], None]:
    """The result's fields have these values."""
    def check(t: Path, r) -> None:
        assert {k: getattr(r, k) for k in expected} == expected
    return check


def _short_detail(r) -> None:
    assert len(r.problems[0].detail) < 400, r.problems[0].detail[:1000]


def _listed(r, n: int) -> None:
    assert len(Path(r.problems_file).read_bytes().splitlines()) == n


def _counts(docs: int, **counts: int) -> Callable[[Path, object], None]:
    def check(t: Path, r) -> None:
        assert r.docs_out == {"text": docs} and r.problem_counts == {k.replace("_", "-"): n for k, n in counts.items()}
    return check


@dataclasses.dataclass(frozen=True)
class Case:
    make: Callable[[Path], object]  # writes the inputs into the test's folder
    inputs: tuple[str, ...]  # relative to that folder; for merges, dataset prefixes
    error: type[errors.DataError] | None = None  # the refusal expected...
    fields: Callable[[Path], dict] = lambda t: {}  # ...with these fields
    check: Callable[[Path, object], None] | None = None  # or what the result holds
    workers: int = 1
    per_input: bool = False
    keys: tuple[str, ...] = ("text",)
    limit: int = LIMIT
    prefix: str = "out/run"
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    merge: bool = False


def _too_large(name: str, line: int) -> Callable[[Path], dict]:
    return lambda t: {"path": str(t / name), "line": line}


def _damaged(name: str, kind: str) -> Callable[[Path], dict]:
    return lambda t: {"path": str(t / name), "kind": kind}


def _not_corpus(name: str, what: str) -> Callable[[Path], dict]:
    return lambda t: {"path": str(t / name), "what": what}


def _loop_tree(t: Path) -> None:
    """in/top.jsonl, in/sub/s.jsonl and in/sub/loop -> .. (a symlink loop)."""
    (t / "in" / "sub").mkdir(parents=True)
    (t / "in" / "top.jsonl").write_bytes(GOOD)
    (t / "in" / "sub" / "s.jsonl").write_bytes(GOOD)
    os.symlink("..", t / "in" / "sub" / "loop")


def _two_links_to_one_folder(t: Path) -> None:
    (t / "real").mkdir()
    (t / "real" / "r.jsonl").write_bytes(GOOD)
    (t / "in").mkdir()
    os.symlink("../real", t / "in" / "l1")
    os.symlink("../real", t / "in" / "l2")


def _earlier_run_in_folder(t: Path) -> None:
    """in/ with two shards (one with a bad line) and what an earlier per-input run wrote next to them."""
    (t / "in").mkdir()
    (t / "in" / "a.jsonl").write_bytes(GOOD)
    (t / "in" / "b.jsonl").write_bytes(GOOD + b"not json\n")
    preprocess([t / "in"], str(t / "in" / "old"), SPEC, output_per_input=True)
    assert (t / "in" / "old_b_problems.jsonl").is_file() and (t / "in" / "old_a.preprocess.json").is_file()


def _dataset(t: Path, name: str, tokenizer: str = "gpt2", special_text: str = "plain") -> None:
    """t/ds/p_NAME_text_document, recorded (--output-per-input), from GOOD."""
    (t / "src" / name).mkdir(parents=True)
    (t / "src" / name / f"{name}.jsonl").write_bytes(GOOD)
    preprocess([t / "src" / name], str(t / "ds" / "p"), resolve_tokenizer(tokenizer, special_text=special_text),
               output_per_input=True)


def _ds(name: str) -> str:
    return f"ds/p_{name}_text_document"


def _resumes(t: Path, r) -> None:
    """A second run with the output prefix inside the input folder keeps every finished part, same bytes."""
    again = preprocess([t / "in"], str(t / "in" / "run"), SPEC, output_per_input=r.shards > 0 and not r.outputs)
    assert again.shards == r.shards and again.docs_in == r.docs_in
    if r.outputs:
        assert _pair(again.outputs["text"]) == _pair(r.outputs["text"])
    else:
        assert again.resumed == r.shards and again.mode == "resumed"


def _merged_with_warning(t: Path, r) -> None:
    assert r.unrecorded == [str(t / "bare_text_document")]
    assert len(np.fromfile(f"{r.prefix}.bin", np.uint16)) > 0


CASES: dict[str, Case] = {
    # --- bombs: a line longer than the limit stops the run at its line, wherever the bytes come from
    "zst bomb: a 1 MiB line of zeros": Case(_write("b.jsonl.zst", lambda: _zst(GOOD + ZEROS)), ("b.jsonl.zst",),
                                           errors.DocumentTooLargeError, _too_large("b.jsonl.zst", 41)),
    "zst bomb, 2 workers": Case(_write("b.jsonl.zst", lambda: _zst(GOOD + ZEROS + GOOD)), ("b.jsonl.zst",),
                                errors.DocumentTooLargeError, _too_large("b.jsonl.zst", 41), workers=2),
    "zst bomb read by the zstd command": Case(_write("b.jsonl.zst", lambda: _zst(GOOD + ZEROS)), ("b.jsonl.zst",),
                                              errors.DocumentTooLargeError, _too_large("b.jsonl.zst", 41),
                                              patch=_hide_zstandard),
    "xz bomb, one block": Case(_write("b.jsonl.xz", lambda: lzma.compress(GOOD + ZEROS)), ("b.jsonl.xz",),
                               errors.DocumentTooLargeError, _too_large("b.jsonl.xz", 41)),
    "xz bomb across many blocks, spans in 2 workers": Case(
        _write("b.jsonl.xz", lambda: _xz_blocks(GOOD + ZEROS + GOOD)), ("b.jsonl.xz",), errors.DocumentTooLargeError,
        _too_large("b.jsonl.xz", 41), workers=2, patch=_set("bigscience_ops.data.pipeline.CHUNK_BYTES", 32 << 10)),
    "xz bomb, a block over what a worker holds: one stream": Case(
        _write("b.jsonl.xz", lambda: _xz_blocks(GOOD + ZEROS + GOOD, "512KiB")), ("b.jsonl.xz",),
        errors.DocumentTooLargeError, _too_large("b.jsonl.xz", 41), workers=2,
        patch=_set("bigscience_ops.data.pipeline.XZ_WORKER_BLOCK_BYTES", 64 << 10)),
    "gz bomb": Case(_write("b.jsonl.gz", lambda: gzip.compress(GOOD + ZEROS)), ("b.jsonl.gz",),
                    errors.DocumentTooLargeError, _too_large("b.jsonl.gz", 41)),
    "plain: a 1 MiB line of NULs": Case(_write("b.jsonl", GOOD + b"\0" * len(ZEROS) + b"\n" + GOOD), ("b.jsonl",),
                                        errors.DocumentTooLargeError, _too_large("b.jsonl", 41)),
    "plain, cut inside the long line": Case(
        _write("b.jsonl", GOOD * 40 + ZEROS + b"\n" + GOOD), ("b.jsonl",), errors.DocumentTooLargeError,
        _too_large("b.jsonl", 1601), patch=_set("bigscience_ops.data.pipeline.CHUNK_BYTES", 16 << 10)),
    "plain, 2 workers, a long line mid-file": Case(
        _write("b.jsonl", GOOD * 40 + ZEROS + b"\n" + GOOD * 40), ("b.jsonl",), errors.DocumentTooLargeError,
        _too_large("b.jsonl", 1601), workers=2, patch=_set("bigscience_ops.data.pipeline.CHUNK_BYTES", 16 << 10)),
    "whole shards in workers, a bomb in the third": Case(
        _all(*(_write(f"in/s{i}.jsonl.zst", lambda i=i: _zst(GOOD + (ZEROS if i == 2 else b""))) for i in range(4))),
        ("in",), errors.DocumentTooLargeError, _too_large("in/s2.jsonl.zst", 41), workers=2),
    "a line exactly at the limit is taken": Case(_write("b.jsonl.gz", lambda: gzip.compress(GOOD + _exactly(LIMIT))),
                                                 ("b.jsonl.gz",), check=_counts(41)),
    "a line one byte over the limit is not": Case(
        _write("b.jsonl.gz", lambda: gzip.compress(GOOD + _exactly(LIMIT + 1))), ("b.jsonl.gz",),
        errors.DocumentTooLargeError, _too_large("b.jsonl.gz", 41)),
    "gz of a million blank lines: counted, listed up to the cap": Case(
        _write("b.jsonl.gz", lambda: gzip.compress(b"\n" * (1 << 20))), ("b.jsonl.gz",),
        check=lambda t, r: _holds(problem_counts={"malformed-json": 1 << 20}, problems_unlisted=(1 << 20) - 1000,
                                  docs_in=1 << 20)(t, r) or _listed(r, 1000),
        patch=_set("bigscience_ops.data.shards.LISTED_PER_SHARD", 1000)),
    # --- cut short: refused, whatever the compression
    "truncated gz": Case(_write("t.jsonl.gz", lambda: gzip.compress(GOOD * 20)[:-30]), ("t.jsonl.gz",),
                         errors.DamagedInputError, _damaged("t.jsonl.gz", "gzip")),
    "truncated xz": Case(_write("t.jsonl.xz", lambda: lzma.compress(GOOD * 20)[:-30]), ("t.jsonl.xz",),
                         errors.DamagedInputError, _damaged("t.jsonl.xz", "xz")),
    "truncated multi-block xz, 2 workers": Case(
        _write("t.jsonl.xz", lambda: _xz_blocks(_random_lines(1500))[:40_000]), ("t.jsonl.xz",),
        errors.DamagedInputError, _damaged("t.jsonl.xz", "xz"), workers=2),
    "truncated zst, cut mid-block": Case(_write("t.jsonl.zst", lambda: _zst(GOOD * 20)[:-60]), ("t.jsonl.zst",),
                                         errors.DamagedInputError, _damaged("t.jsonl.zst", "zstd")),
    "truncated zst, cut in the checksum": Case(_write("t.jsonl.zst", lambda: _zst(GOOD * 20)[:-2]), ("t.jsonl.zst",),
                                               errors.DamagedInputError, _damaged("t.jsonl.zst", "zstd")),
    "truncated zst, 2 workers": Case(_write("t.jsonl.zst", lambda: _zst(GOOD * 20)[:-60]), ("t.jsonl.zst",),
                                     errors.DamagedInputError, _damaged("t.jsonl.zst", "zstd"), workers=2),
    "zst of two frames, the second cut short": Case(
        _write("t.jsonl.zst", lambda: _zst(GOOD) + _zst(GOOD * 5)[:-40]), ("t.jsonl.zst",),
        errors.DamagedInputError, _damaged("t.jsonl.zst", "zstd")),
    "truncated zst read by the zstd command": Case(
        _write("t.jsonl.zst", lambda: _zst(GOOD * 20)[:-60]), ("t.jsonl.zst",), errors.DamagedInputError,
        _damaged("t.jsonl.zst", "zstd"), patch=_hide_zstandard),
    # --- damaged headers and data
    "gz that is plain text": Case(_write("c.jsonl.gz", GOOD), ("c.jsonl.gz",), errors.DamagedInputError,
                                  _damaged("c.jsonl.gz", "gzip")),
    "gz with a wrong CRC": Case(_write("c.jsonl.gz", lambda: _flip(gzip.compress(GOOD), -6)), ("c.jsonl.gz",),
                                errors.DamagedInputError, _damaged("c.jsonl.gz", "gzip")),
    "gz with garbage after its member": Case(_write("c.jsonl.gz", lambda: gzip.compress(GOOD) + b"garbage"),
                                             ("c.jsonl.gz",), errors.DamagedInputError, _damaged("c.jsonl.gz", "gzip")),
    "xz that is gzip": Case(_write("c.jsonl.xz", lambda: gzip.compress(GOOD)), ("c.jsonl.xz",),
                            errors.DamagedInputError, _damaged("c.jsonl.xz", "xz")),
    "xz whose footer says its index is 16 GiB, 2 workers": Case(
        _write("c.jsonl.xz", lambda: _xz_lying_footer(GOOD)), ("c.jsonl.xz",), errors.DamagedInputError,
        _damaged("c.jsonl.xz", "xz"), workers=2),
    "xz with a damaged block, spans in 2 workers": Case(
        _write("c.jsonl.xz", lambda: _flip(_xz_blocks(_random_lines(1500)), 30_000)), ("c.jsonl.xz",),
        errors.DamagedInputError, _damaged("c.jsonl.xz", "xz"), workers=2,
        patch=_set("bigscience_ops.data.pipeline.CHUNK_BYTES", 32 << 10)),
    "zst that is gzip": Case(_write("c.jsonl.zst", lambda: gzip.compress(GOOD)), ("c.jsonl.zst",),
                             errors.DamagedInputError, _damaged("c.jsonl.zst", "zstd")),
    "zst with the reserved header bit": Case(_write("c.jsonl.zst", lambda: _zst_reserved_bit(GOOD)), ("c.jsonl.zst",),
                                             errors.DamagedInputError, _damaged("c.jsonl.zst", "zstd")),
    "zst with a block of reserved type": Case(_write("c.jsonl.zst", lambda: _zst_reserved_block(GOOD * 5)),
                                              ("c.jsonl.zst",), errors.DamagedInputError,
                                              _damaged("c.jsonl.zst", "zstd")),
    "zst with a damaged block": Case(_write("c.jsonl.zst", lambda: _flip(_zst(GOOD * 20), 60)), ("c.jsonl.zst",),
                                     errors.DamagedInputError, _damaged("c.jsonl.zst", "zstd")),
    "zst with garbage after its frame": Case(_write("c.jsonl.zst", lambda: _zst(GOOD) + b"garbage!"),
                                             ("c.jsonl.zst",), errors.DamagedInputError,
                                             _damaged("c.jsonl.zst", "zstd")),
    # --- concatenated streams: the whole text
    "gz of two members": Case(_write("k.jsonl.gz", lambda: gzip.compress(GOOD) + gzip.compress(GOOD)),
                              ("k.jsonl.gz",), check=_same_as(GOOD * 2, 80)),
    "xz of two streams with padding, 2 workers": Case(
        _write("k.jsonl.xz", lambda: _xz_blocks(GOOD * 30) + b"\0" * 8 + lzma.compress(GOOD)), ("k.jsonl.xz",),
        check=_same_as(GOOD * 31, 31 * 40), workers=2, patch=_set("bigscience_ops.data.pipeline.CHUNK_BYTES", 8 << 10)),
    "zst of two frames and a skippable one": Case(
        _write("k.jsonl.zst", lambda: _zst(GOOD) + struct.pack("<II", 0x184D2A5E, 5) + b"skip!" + _zst(GOOD, False)),
        ("k.jsonl.zst",), check=_same_as(GOOD * 2, 80)),
    "zst of two frames through the zstd command": Case(
        _write("k.jsonl.zst", lambda: _zst(GOOD) + _zst(GOOD)), ("k.jsonl.zst",), check=_same_as(GOOD * 2, 80),
        patch=_hide_zstandard),
    # --- empty files: an empty jsonl is no documents; an empty compressed file is not a complete one
    "empty jsonl": Case(_write("e.jsonl", b""), ("e.jsonl",), check=_counts(0)),
    "empty gz": Case(_write("e.jsonl.gz", b""), ("e.jsonl.gz",), errors.DamagedInputError,
                     _damaged("e.jsonl.gz", "gzip")),
    "empty xz": Case(_write("e.jsonl.xz", b""), ("e.jsonl.xz",), errors.DamagedInputError,
                     _damaged("e.jsonl.xz", "xz")),
    "empty zst": Case(_write("e.jsonl.zst", b""), ("e.jsonl.zst",), errors.DamagedInputError,
                      _damaged("e.jsonl.zst", "zstd")),
    # --- lines: each unusable one counted by kind, the others kept
    "NUL bytes: raw in a line, escaped in a text": Case(
        _write("l.jsonl", GOOD + b'{"text": "a\0b"}\n' + b'{"text": "a\\u0000b"}\n'), ("l.jsonl",),
        check=_counts(41, malformed_json=1)),
    "invalid UTF-8 and a lone surrogate": Case(
        _write("l.jsonl", GOOD + b'{"text": "\xff\xfe"}\n{"text": "\\udc80"}\n'), ("l.jsonl",),
        check=_counts(40, invalid_utf8=2)),
    "JSON lines that are not objects": Case(_write("l.jsonl", GOOD + b'[1]\n3\n"s"\nnull\ntrue\n'), ("l.jsonl",),
                                            check=_counts(40, not_an_object=5)),
    "text of the wrong type": Case(
        _write("l.jsonl", GOOD + b'{"text": 1}\n{"text": []}\n{"text": {}}\n{"text": true}\n{"text": null}\n'),
        ("l.jsonl",), check=_counts(40, not_a_string=5)),
    "JSON nested 100000 deep": Case(_write("l.jsonl", GOOD + _nested(100_000)), ("l.jsonl",),
                                    check=_counts(40, malformed_json=2), limit=1 << 20),
    "a missing key beside a 1 MiB key name": Case(
        _write("l.jsonl", GOOD + b'{"' + b"k" * (1 << 20) + b'": 1}\n'), ("l.jsonl",), limit=2 << 20,
        check=lambda t, r: _holds(problem_counts={"missing-key": 1})(t, r) or _short_detail(r)),
    "a byte-order mark and blank lines": Case(_write("l.jsonl", b"\xef\xbb\xbf" + GOOD + b"   \n\t\n"), ("l.jsonl",),
                                              check=_counts(39, malformed_json=3)),
    "CRLF line ends": Case(_write("l.jsonl", GOOD.replace(b"\n", b"\r\n")), ("l.jsonl",), check=_same_as(GOOD, 40)),
    "no newline at the end": Case(_write("l.jsonl.zst", lambda: _zst(GOOD.rstrip(b"\n"))), ("l.jsonl.zst",),
                                  check=_same_as(GOOD, 40)),
    # --- folders and globs: each file once, never a loop, a FIFO, a device
    "a glob ** through a symlink loop": Case(_loop_tree, ("in/**/*.jsonl",),
                                             check=_holds(shards=2, docs_in=80)),
    "a symlink loop, one output per input": Case(
        _loop_tree, ("in/**/*.jsonl",), per_input=True,
        check=lambda t, r: _holds(shard_outputs=[str(t / "out/run_s"), str(t / "out/run_top")])(t, r)),
    "two links to one folder": Case(_two_links_to_one_folder, ("in/**/*.jsonl",),
                                    check=_holds(shards=1, docs_in=40)),
    "a link to a file the folder holds": Case(
        _all(_write("in/a.jsonl", GOOD), _link("in/b.jsonl", "a.jsonl")), ("in",),
        check=_holds(shards=1, docs_in=40)),
    "a hard link to a file the folder holds": Case(
        _all(_write("in/a.jsonl", GOOD), lambda t: os.link(t / "in/a.jsonl", t / "in/b.jsonl")), ("in",),
        check=_holds(shards=1, docs_in=40)),
    "a link to /dev/zero in a folder": Case(_all(_write("in/a.jsonl", GOOD), _link("in/z.jsonl", "/dev/zero")),
                                            ("in",), errors.NotCorpusError, _not_corpus("in/z.jsonl",
                                                                                        "character-device")),
    "a link to /dev/zero given": Case(_link("z.jsonl", "/dev/zero"), ("z.jsonl",), errors.NotCorpusError,
                                      _not_corpus("z.jsonl", "character-device")),
    "a FIFO in a folder": Case(_all(_write("in/a.jsonl", GOOD), _fifo("in/f.jsonl")), ("in",), errors.NotCorpusError,
                               _not_corpus("in/f.jsonl", "fifo")),
    "a FIFO given": Case(_fifo("f.jsonl.gz"), ("f.jsonl.gz",), errors.NotCorpusError,
                         _not_corpus("f.jsonl.gz", "fifo")),
    "a FIFO a glob matches": Case(_all(_write("in/a.jsonl", GOOD), _fifo("in/f.jsonl")), ("in/*.jsonl",),
                                  errors.NotCorpusError, _not_corpus("in/f.jsonl", "fifo")),
    "a broken link in a folder": Case(_all(_write("in/a.jsonl", GOOD), _link("in/gone.jsonl.gz", "nowhere.gz")),
                                      ("in",), errors.NotCorpusError, _not_corpus("in/gone.jsonl.gz", "broken-link")),
    "a folder named like a shard": Case(_all(_write("in/a.jsonl", GOOD), _write("in/b.jsonl/x", b"")), ("in",),
                                        errors.NotCorpusError, _not_corpus("in/b.jsonl", "folder")),
    "a link to itself given": Case(_link("self.jsonl", "self.jsonl"), ("self.jsonl",), errors.NotCorpusError,
                                   _not_corpus("self.jsonl", "unreadable")),
    "a FIFO where a part's record goes is replaced, never read": Case(
        _all(_write("in/a.jsonl", GOOD), _fifo("out/run_a.preprocess.json")), ("in",), per_input=True,
        check=_holds(shards=1, resumed=0, docs_in=40)),
    # --- two inputs, one output: refused before anything is written
    "the same file given twice": Case(_write("a.jsonl", GOOD), ("a.jsonl", "a.jsonl"), errors.InputConflictError,
                                      lambda t: {"first": str(t / "a.jsonl"), "second": str(t / "a.jsonl")}),
    "a folder and a file in it": Case(_write("in/a.jsonl", GOOD), ("in", "in/a.jsonl"), errors.InputConflictError,
                                      lambda t: {"first": str(t / "in/a.jsonl"), "second": str(t / "in/a.jsonl")}),
    "a file and a link to it given": Case(_all(_write("a.jsonl", GOOD), _link("b.jsonl", "a.jsonl")),
                                          ("a.jsonl", "b.jsonl"), errors.InputConflictError,
                                          lambda t: {"first": str(t / "a.jsonl"), "second": str(t / "b.jsonl")}),
    "per input: en.jsonl and en.jsonl.gz": Case(
        _all(_write("in/en.jsonl", GOOD), _write("in/en.jsonl.gz", lambda: gzip.compress(GOOD))), ("in",),
        errors.InputConflictError, lambda t: {"first": str(t / "in/en.jsonl"), "second": str(t / "in/en.jsonl.gz")},
        per_input=True),
    "per input: a stem and a key that spell another's output": Case(
        _all(_write("in/a.jsonl", b'{"text": "x", "b_text": "y"}\n'),
             _write("in/a_b.jsonl", b'{"text": "x", "b_text": "y"}\n')), ("in",), errors.InputConflictError,
        lambda t: {"first": str(t / "in/a.jsonl"), "second": str(t / "in/a_b.jsonl")}, per_input=True,
        keys=("text", "b_text")),
    # --- bsops' own files are never inputs
    "an earlier run's records and problem lists in the folder": Case(
        _earlier_run_in_folder, ("in",), check=_holds(shards=2, docs_in=81)),
    "a run record given": Case(_earlier_run_in_folder, ("in/old_a.preprocess.json",), errors.NotCorpusError,
                               _not_corpus("in/old_a.preprocess.json", "run-record")),
    "a dataset's record given": Case(_earlier_run_in_folder, ("in/old_a_text_document.dataset.json",),
                                     errors.NotCorpusError,
                                     _not_corpus("in/old_a_text_document.dataset.json", "dataset-record")),
    "a problems list given": Case(_earlier_run_in_folder, ("in/old_b_problems.jsonl",), errors.NotCorpusError,
                                  _not_corpus("in/old_b_problems.jsonl", "problems-list")),
    "a dataset's .idx given": Case(_earlier_run_in_folder, ("in/old_a_text_document.idx",), errors.NotCorpusError,
                                   _not_corpus("in/old_a_text_document.idx", "dataset")),
    "a glob * over datasets and temporaries": Case(
        _all(_earlier_run_in_folder, _write("in/x.bin.tmp-99999", b"junk"), _write("in/y_problems.jsonl.tmp-1", b"j")),
        ("in/*",), check=_holds(shards=2, docs_in=81)),
    "a corpus file named like a problems list is read": Case(
        _write("in/math_problems.jsonl", GOOD), ("in",), check=_holds(docs_in=40, shards=1)),
    "an output prefix inside the input folder resumes": Case(
        _all(_write("in/a.jsonl", GOOD), _write("in/b.jsonl.gz", lambda: gzip.compress(GOOD + b"bad\n"))), ("in",),
        prefix="in/run", per_input=True, check=_resumes),
    "an output prefix inside the input folder, one output": Case(
        _all(_write("in/a.jsonl", GOOD), _write("in/b.jsonl.gz", lambda: gzip.compress(GOOD + b"bad\n"))), ("in",),
        prefix="in/run", check=_resumes),
    # --- merge-datasets: made the same way, or refused
    "merge: other tokenizers": Case(
        lambda t: (_dataset(t, "a"), _dataset(t, "b", str(REPO / "corpus" / "tokenizer.json"))),
        (_ds("a"), _ds("b")), errors.IncompatibleDatasetsError, lambda t: {"field": "tokenizers"}, merge=True),
    "merge: other special text": Case(lambda t: (_dataset(t, "a"), _dataset(t, "b", special_text="token")),
                                      (_ds("a"), _ds("b")), errors.IncompatibleDatasetsError,
                                      lambda t: {"field": "special texts"}, merge=True),
    "merge: other token dtypes": Case(
        lambda t: (write_indexed(t / "u16", [[1, 2]], np.uint16), write_indexed(t / "i32", [[1]], np.int32)),
        ("u16", "i32"), errors.IncompatibleDatasetsError, lambda t: {"field": "token dtypes"}, merge=True),
    "merge: a dataset without a record is merged and named": Case(
        lambda t: (_dataset(t, "a"), write_indexed(t / "bare_text_document", [[1, 2]])),
        (_ds("a"), "bare_text_document"), check=_merged_with_warning, merge=True),
}


def _ran_inputs(t: Path, case: Case) -> list[str]:
    return [str(t / name) for name in case.inputs]


def _cli_argv(t: Path, case: Case) -> list[str]:
    if case.merge:
        return ["merge-datasets", *(a for p in _ran_inputs(t, case) for a in ("--input-prefix", p)),
                "--output-prefix", str(t / "merged-cli")]
    argv = ["preprocess", *(a for p in _ran_inputs(t, case) for a in ("--input", p)), "--tokenizer", "gpt2",
            "--workers", str(case.workers), "--max-document-bytes", str(case.limit), "--json-keys", *case.keys,
            "--output-prefix", str(t / case.prefix) + "-cli"]
    return argv + (["--output-per-input"] if case.per_input else [])


def _run(t: Path, case: Case):
    if case.merge:
        return merge_checked(_ran_inputs(t, case), str(t / "merged"))
    return preprocess(_ran_inputs(t, case), str(t / case.prefix), SPEC, json_keys=case.keys, workers=case.workers,
                      output_per_input=case.per_input, limits=Limits(max_document_bytes=case.limit))


def _outputs(t: Path) -> set[str]:
    """Final outputs (datasets, problem lists, records) and temporaries anywhere under t, links not followed."""
    found = set()
    for folder, _, files in os.walk(t):
        for name in files:
            ours = (".bin", ".idx", "_problems.jsonl", ".preprocess.json", ".dataset.json")
            if name.endswith(ours) or ".tmp-" in name:
                found.add(os.path.relpath(os.path.join(folder, name), t))
    return found


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """A TimeoutError instead of a hang (a FIFO opened for reading waits forever for a writer)."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_the_table_holds_every_kind_of_hostile_input():
    assert len(CASES) >= 35
    refused = [c for c in CASES.values() if c.error is not None]
    assert {c.error for c in refused} == {errors.DocumentTooLargeError, errors.DamagedInputError,
                                          errors.NotCorpusError, errors.InputConflictError,
                                          errors.IncompatibleDatasetsError}
    assert all((c.error is None) != (c.check is None) for c in CASES.values())


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_input_is_refused_clearly_or_gives_the_right_result(name, tmp_path, monkeypatch):
    case = CASES[name]
    case.make(tmp_path)
    if case.patch is not None:
        case.patch(monkeypatch)
    before = _outputs(tmp_path)
    with _deadline(60):
        if case.check is not None:
            case.check(tmp_path, _run(tmp_path, case))
            return
        with pytest.raises(case.error) as raised:
            _run(tmp_path, case)
        for field, value in case.fields(tmp_path).items():
            assert getattr(raised.value, field) == value, (field, raised.value)
        _nothing_written(tmp_path, before)
        res = CliRunner().invoke(main, _cli_argv(tmp_path, case))
    lines = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "Traceback" not in res.output and (res.exception is None or isinstance(res.exception, SystemExit))
    _nothing_written(tmp_path, before)


def _nothing_written(t: Path, before: set[str]) -> None:
    """No output and no temporary appeared; only parts a rerun resumes from (in PREFIX.shards/) may have."""
    new = _outputs(t) - before
    assert not [p for p in new if ".tmp-" in p or ".shards/" not in p], sorted(new)


def test_a_finished_shard_of_a_refused_run_is_kept_and_the_rerun_refuses_at_the_same_line(tmp_path):
    """Shards finished before the bomb's are kept for the rerun (their records), never merged; none is a temporary."""
    case = CASES["whole shards in workers, a bomb in the third"]
    case.make(tmp_path)
    for _ in range(2):
        with pytest.raises(errors.DocumentTooLargeError) as raised:
            _run(tmp_path, case)
        assert (raised.value.path, raised.value.line) == (str(tmp_path / "in/s2.jsonl.zst"), 41)
    left = _outputs(tmp_path)
    assert not [p for p in left if ".tmp-" in p] and not [p for p in left if p.startswith("out/run_")]
    assert {Path(p).name.split("-")[0] for p in left if p.endswith(".preprocess.json")} <= {"s0", "s1", "s3"}


def test_folders_report_links_read_once_and_side_files_left_out(tmp_path):
    _earlier_run_in_folder(tmp_path)
    os.symlink("a.jsonl", tmp_path / "in" / "c.jsonl")
    found = inputs.find_inputs([tmp_path / "in"])
    assert [p.name for p in found.files] == ["a.jsonl", "b.jsonl"]
    assert [(p.name, q.name) for p, q in found.links] == [("c.jsonl", "a.jsonl")]
    assert sorted(p.name for p in found.side_files) == ["old_a.preprocess.json", "old_a_text_document.dataset.json",
                                                        "old_b.preprocess.json", "old_b_problems.jsonl",
                                                        "old_b_text_document.dataset.json"]
    res = CliRunner().invoke(main, ["preprocess", "--input", str(tmp_path / "in"), "--tokenizer", "gpt2",
                                    "--output-prefix", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    notes = [line for line in res.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 2 and str(tmp_path / "in" / "c.jsonl") in notes[0] and "5 file(s)" in notes[1]


def test_merge_datasets_names_a_dataset_without_a_record(tmp_path):
    _dataset(tmp_path, "a")
    write_indexed(tmp_path / "bare_text_document", [[1, 2]])
    res = CliRunner().invoke(main, ["merge-datasets", "--input-prefix", str(tmp_path / _ds("a")), "--input-prefix",
                                    str(tmp_path / "bare_text_document"), "--output-prefix", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(tmp_path / "bare_text_document") in warnings[0]


@pytest.mark.parametrize("value,expected", [("4096", 4096), ("64KiB", 64 << 10), ("64MiB", 64 << 20),
                                            ("1GiB", 1 << 30), ("2MB", 2_000_000), ("0", None), ("-1", None),
                                            ("64XB", None), ("2TiB", None), ("", None)])
def test_max_document_bytes_option(tmp_path, value, expected):
    (tmp_path / "in.jsonl").write_bytes(GOOD)
    res = CliRunner().invoke(main, ["preprocess", "--input", str(tmp_path / "in.jsonl"), "--tokenizer", "gpt2",
                                    "--max-document-bytes", value, "--output-prefix", str(tmp_path / "out")])
    assert res.exit_code == (0 if expected else 2), res.output
    if expected is None:
        assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("bomb,workers", [("zst", 1), ("zst", 2), ("xz", 1), ("xz", 2)])
def test_bombs_are_refused_in_bounded_memory(bombs, tmp_path, bomb, workers):
    """A 512 MiB line (.zst) and a 200 MiB block of zeros (.xz, decoded as a span by two workers): refused at the
    line where they start, with the peak RSS of bsops and its workers far below the bomb's size (measured)."""
    from benchmarks.preprocess_bombs import bsops_argv, peak_rss

    path = bombs[bomb]
    code, peak, stderr = peak_rss(bsops_argv([path], tmp_path / "out", workers, "--max-document-bytes",
                                             str(BOMB_LIMIT)), timeout_s=120)
    errors_shown = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors_shown) == 1 and f"{path}:1001:" in errors_shown[0], stderr
    assert peak < 200 << 20, f"peak RSS {peak / 2**20:.0f} MiB"
    assert not list(tmp_path.iterdir())


def test_a_worker_holds_one_span_piece_at_a_time(tmp_path):
    """span_pieces hands on pieces of about the asked size, never the span whole, and the lines are all there; a
    line over the maximum that crosses pieces stops it with its index as soon as it passes the maximum."""
    from bigscience_ops.data import xz

    data = b"".join(b'{"text": "%s"}\n' % (b"w" * (i % 300)) for i in range(20_000))
    path = tmp_path / "m.jsonl.xz"
    path.write_bytes(_xz_blocks(data, "1MiB"))
    blocks = xz.blocks(str(path))
    assert len(blocks) > 2
    pieces = list(xz.span_pieces(str(path), blocks, 0, len(blocks), piece=64 << 10))
    assert b"".join(pieces) == data and len(pieces) > 20
    assert max(len(p) for p in pieces) < (64 << 10) + 400 and all(p.endswith(b"\n") for p in pieces)
    long = data[:50_000].rsplit(b"\n", 1)[0] + b"\n"
    path.write_bytes(_xz_blocks(long + b"x" * 500_000 + b"\n" + data, "64KiB"))
    blocks = xz.blocks(str(path))
    got = []
    with pytest.raises(inputs.LineTooLong) as raised:  # the span where it starts: after the lines before it
        for piece in xz.span_pieces(str(path), blocks, 0, len(blocks), piece=16 << 10, max_line=100_000):
            got.append(piece)
    assert b"".join(got) == long and raised.value.index == long.count(b"\n")
    for first in (1, 2, 3):  # spans that start inside it skip into it and give nothing (the first one refuses)
        assert list(xz.span_pieces(str(path), blocks, first, len(blocks), piece=16 << 10, max_line=100_000)) == []


def test_a_zst_frame_walk_is_quick_and_counts_frames(tmp_path):
    from bigscience_ops.data import zst

    path = tmp_path / "a.zst"
    path.write_bytes(_zst(GOOD * 500) + _zst(b"") + struct.pack("<II", 0x184D2A50, 0) + _zst(GOOD, False))
    with open(path, "rb") as f:
        f.seek(7)
        assert zst.check_frames(f, str(path)) == 3 and f.tell() == 7


def test_line_chunks_keep_a_long_line_whole_and_stop_one_over_the_maximum():
    """A long line is gathered in one growing buffer (4000 reads of it: copies linear in its length, where each
    read used to copy all of it again); over the maximum it stops at once with its line's index."""
    import io

    data = b"x" * (4 << 20) + b"\nend\n"
    chunks = list(inputs.line_chunks(io.BytesIO(data), 1000))
    assert chunks == [data]  # whole lines: the long one and what its last read held
    with pytest.raises(inputs.LineTooLong) as raised:
        list(inputs.line_chunks(io.BytesIO(b"a\nb\n" + data), 1000, max_line=1 << 20))
    assert raised.value.index == 2


def test_a_glob_walk_matches_glob_on_an_ordinary_tree(tmp_path):
    import glob

    for name in ("a/x.jsonl", "a/b/y.jsonl", "a/b/c/z.json", "a/.hidden/h.jsonl", "a/.h.jsonl", "top.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    for pattern in ("**/*.jsonl", "a/**", "a/*/*.jsonl", "*/b/**/*.json*", "a/.*", "a/[bx]*", "**"):
        full = str(tmp_path / pattern)
        files = sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p))
        assert sorted(p for p in inputs._glob(full) if os.path.isfile(p)) == files and files, pattern


def test_a_damaged_input_error_survives_a_worker(tmp_path):
    """Every typed error a worker raises comes back to the main process with its fields (pickled)."""
    import pickle

    for err in (errors.DocumentTooLargeError("p", 3, 10), errors.DamagedInputError("p", "xz", "d"),
                errors.NotCorpusError("p", "fifo", "d"), errors.InputConflictError("a", "b", "r"),
                errors.IncompatibleDatasetsError("tokenizers", {"a": "x", "b": "y"})):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and vars(back) == vars(err) and str(back) == str(err)


def test_json_dumps_of_problems_stays_one_line_per_problem(tmp_path):
    """A problem's detail never breaks the problems file's one-object-per-line format."""
    (tmp_path / "in.jsonl").write_bytes(b'{"a\\nb": 1}\n' + b'{"text": "\xff"}\n')
    r = preprocess([tmp_path / "in.jsonl"], str(tmp_path / "out"), SPEC)
    listed = [json.loads(line) for line in Path(r.problems_file).read_text().splitlines()]
    assert [p["kind"] for p in listed] == ["missing-key", "invalid-utf8"]


def test_the_bomb_helpers_write_what_they_say(tmp_path):
    from benchmarks.preprocess_bombs import HEAD, write_gz_bomb

    path = write_gz_bomb(tmp_path / "g.jsonl.gz", 3 << 20)
    assert path.stat().st_size < 100_000
    with gzip.open(path) as f:
        assert f.read(len(HEAD)) == HEAD and len(f.read()) == 3 << 20
