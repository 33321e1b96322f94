"""jsonl[.gz|.xz] -> Megatron indexed datasets `{prefix}_{key}_document.bin/.idx`.

Each input line is one JSON object; each `--json-keys` key's string is one document. A line that
cannot be used (invalid UTF-8, malformed JSON, not an object, a missing key, a non-string value)
is dropped for every key; a key whose text is empty gives no document for that key only, and the
line's other keys still give theirs (as Megatron's tools/preprocess_data.py does). Each problem is
counted by kind and recorded with its file and line number in `{prefix}_problems.jsonl`; with
`strict=True` the first one stops the run instead.

A literal special token (`<|endoftext|>`) inside a document is plain text unless the tokenizer spec
says otherwise (see `tokenizer.py`), so the bytes equal Megatron's on any text.

The main process cuts the inputs into chunks of whole lines; `workers` processes read (plain files)
or receive (compressed ones) each chunk, parse and tokenize it, and the main process writes the
results in order. A worker leaves a chunk's tokens in a file of a temporary folder and the main
process appends it with a kernel copy, so it stays nearly idle and N workers use N cores. Outputs
appear only when complete (see `indexed.IndexedDatasetWriter`).

A chunk's documents are tokenized in one batch call. When the backend is fastokens, about
`check_fraction` of the text is also encoded by the reference tokenizer (tiktoken, or tokenizers)
and compared; a difference stops the run, naming the file and line, and writes nothing.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bigscience_ops.data.errors import BadInputError, DataError, TokenizerError
from bigscience_ops.data.indexed import IndexedDatasetWriter, best_fitting_dtype
from bigscience_ops.data.tokenizer import (CrossCheck, Tokenizer, TokenizerSpec, build_tokenizer,
                                           reference_tokenizer)

PROBLEM_KINDS = ("invalid-utf8", "malformed-json", "not-an-object", "missing-key", "not-a-string", "empty")
LINE_PROBLEMS = PROBLEM_KINDS[:-1]  # these drop the whole line; "empty" drops one key's document
CHUNK_BYTES = 1 << 21  # lines handed to a worker at a time: ~15 ms of fastokens work, even load at the end
KEEP_PROBLEMS = 100  # problems kept in the result; all of them go to the problems file
CHECK_FRACTION = 0.01  # of a fastokens run's text re-encoded with the reference tokenizer


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    line: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class Progress:
    docs: int  # lines read so far (Megatron's "documents")
    bytes: int  # bytes of those lines
    seconds: float
    fraction: float | None  # of the input files' size on disk, None when unknown

    @property
    def docs_per_s(self) -> float:
        return self.docs / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1024 / 1024 if self.seconds > 0 else 0.0

    def megatron_line(self) -> str:
        """The progress line Megatron's preprocess_data.py prints."""
        return f"Processed {self.docs} documents ({self.docs_per_s} docs/s, {self.mb_per_s} MB/s)."


@dataclasses.dataclass
class PreprocessResult:
    outputs: dict[str, str]  # json key -> output prefix (without .bin/.idx)
    tokenizer: str
    dtype: str
    docs_in: int  # lines read
    docs_out: dict[str, int]  # documents written per key
    bytes_in: int
    tokens_out: dict[str, int]  # per key, EOD included
    problem_counts: dict[str, int]  # per kind; "empty" counts documents, the others lines
    problems: list[Problem]  # the first KEEP_PROBLEMS
    problems_file: str | None
    seconds: float
    cross_checked: int = 0  # documents re-encoded with the reference tokenizer, all identical
    reference: str | None = None  # that tokenizer's name; None when the run was not cross-checked

    @property
    def lines_dropped(self) -> int:
        """Lines that gave no document for any key (an empty document drops only its own key's)."""
        return sum(n for kind, n in self.problem_counts.items() if kind in LINE_PROBLEMS)


@dataclasses.dataclass
class _Chunk:
    path: str
    offset: int  # of the chunk's first byte in the (decompressed) file
    length: int
    data: bytes | None  # None: the worker reads [offset, offset + length) of path itself
    done_after: int  # bytes of the input files on disk done once this chunk is


@dataclasses.dataclass
class _Encoded:
    tokens: dict[str, np.ndarray | str]  # a str: the file holding them (workers > 1)
    sizes: dict[str, np.ndarray]
    path: str
    problems: list[Problem]  # line numbers counted from the chunk's first line (0-based)
    lines: int
    bytes_in: int
    done_after: int
    checked: int = 0  # documents re-encoded by the cross-check
    mismatch: Problem | None = None  # the cross-check's finding: the run stops


# --- worker side -----------------------------------------------------------------------------

_worker: dict = {}


def _init_worker(spec: TokenizerSpec, keys: tuple[str, ...], append_eod: bool, dtype: str,
                 check_fraction: float, spill: str | None, tok: Tokenizer | None = None) -> None:
    tok = tok or build_tokenizer(spec, verify=False)
    check = CrossCheck(reference_tokenizer(spec), check_fraction) if _cross_checked(tok, check_fraction) else None
    _worker.update(tok=tok, keys=keys, eod=tok.eod if append_eod else None, dtype=np.dtype(dtype), check=check,
                   spill=spill, spilled=0)


def _cross_checked(tok: Tokenizer, fraction: float) -> bool:
    """Whether a run re-encodes a sample with the reference tokenizer: fastokens runs, unless turned off."""
    return tok.backend == "fastokens" and fraction > 0


def _line_problem(line: bytes, keys: tuple[str, ...]) -> tuple[tuple[str, str] | None, dict | None]:
    """(kind, detail) of why a line gives no document at all, else the decoded object."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ("invalid-utf8", f"byte {exc.start} of the line is not valid UTF-8 ({exc.reason})"), None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return ("malformed-json", "blank line" if not text.strip() else str(exc)), None
    if not isinstance(obj, dict):
        return ("not-an-object", f"a JSON {type(obj).__name__}, expected an object"), None
    for key in keys:
        if key not in obj:
            present = ", ".join(sorted(obj)[:10]) or "none"
            return ("missing-key", f"no key {key!r}; keys present: {present}"), None
        value = obj[key]
        if not isinstance(value, str):
            return ("not-a-string", f"{key!r} is a JSON {type(value).__name__}, expected a string"), None
        if "\\ud" in text or "\\uD" in text:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return ("invalid-utf8", f"{key!r} has a lone surrogate escape at character {exc.start}"), None
    return None, obj


def _chunk_lines(chunk: _Chunk) -> list[bytes]:
    data = chunk.data
    if data is None:
        with open(chunk.path, "rb") as f:
            f.seek(chunk.offset)
            data = f.read(chunk.length)
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the chunk ends with a newline
    return lines


def _encode_chunk(chunk: _Chunk) -> _Encoded:
    tok, keys, eod, dtype, check = (_worker[k] for k in ("tok", "keys", "eod", "dtype", "check"))
    problems: list[Problem] = []
    lines = _chunk_lines(chunk)
    texts: dict[str, list[str]] = {k: [] for k in keys}
    line_of: list[int] = []  # the chunk line of each usable line
    for i, line in enumerate(lines):
        problem, obj = _line_problem(line, keys)
        if problem is not None:
            problems.append(Problem(chunk.path, i, *problem))
            continue
        line_of.append(i)
        for key in keys:
            texts[key].append(obj[key])
    tokens: dict[str, np.ndarray] = {}
    sizes: dict[str, np.ndarray] = {}
    checked = 0
    for key in keys:
        ids, lengths = tok.encode_batch(texts[key])
        if check is not None:
            before = check.documents
            bad = check.first_mismatch(texts[key], ids, lengths)
            checked += check.documents - before
            if bad is not None:
                mismatch = Problem(chunk.path, line_of[bad[0]], "tokenizer-mismatch", f"{key!r}: {bad[1]}")
                return _Encoded({}, {}, chunk.path, [mismatch], len(lines), chunk.length, chunk.done_after,
                                checked, mismatch)
        # As Megatron's: a key whose text gives no tokens has no document; the others still do.
        kept = lengths > 0
        problems += [Problem(chunk.path, line_of[j], "empty", f"{key!r} is an empty document")
                     for j in np.flatnonzero(~kept).tolist()]
        lengths = lengths[kept]
        if eod is not None:
            ids = np.insert(ids, np.cumsum(lengths), eod)
            lengths = lengths + 1
        tokens[key] = ids.astype(dtype)
        sizes[key] = lengths.astype(np.int32)
        if _worker["spill"] is not None:  # the main process copies the file in the kernel
            _worker["spilled"] += 1
            path = os.path.join(_worker["spill"], f"{os.getpid()}-{_worker['spilled']}.bin")
            tokens[key].tofile(path)
            tokens[key] = path
    problems.sort(key=lambda p: p.line)  # stable: a line's keys stay in order
    return _Encoded(tokens, sizes, chunk.path, problems, len(lines), chunk.length, chunk.done_after, checked)


# --- main side -------------------------------------------------------------------------------

def _open(path: Path, raw: BinaryIO) -> BinaryIO | None:
    """A decompressing reader for .gz/.xz; None for a plain file (workers read those themselves)."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if name.endswith(".xz"):
        return lzma.LZMAFile(raw, mode="rb")
    return None


def _read_chunks(paths: list[Path]) -> Iterator[_Chunk]:
    """Chunks of about CHUNK_BYTES of whole lines, in order; a compressed file that is not what its
    name says, or is cut short, is a DataError naming it (never a traceback, nor click's bare "Aborted!"
    for the EOFError a truncated .xz raises)."""
    done = 0
    for path in paths:
        try:
            yield from _file_chunks(path, done)
        except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
            kind = "gzip" if path.name.lower().endswith(".gz") else "xz" if path.name.lower().endswith(".xz") else "jsonl"
            raise DataError(f"input {path}: not a complete {kind} file ({type(exc).__name__}: {exc}); nothing was "
                            "written. Check the file (a download cut short?) or its name's extension") from None
        done += path.stat().st_size


def _file_chunks(path: Path, done: int) -> Iterator[_Chunk]:
    """One file's chunks (see _read_chunks). A plain file is only cut at line ends here (one short read
    per chunk); its bytes are read by whoever encodes the chunk, so the main process stays free to
    write. Compressed files are decompressed here and the chunk carries its bytes."""
    size = path.stat().st_size
    with open(path, "rb") as raw:
        reader = _open(path, raw)
        offset = 0
        if reader is None:
            while offset < size:
                end = offset + CHUNK_BYTES
                if end < size:
                    raw.seek(end)
                    end += len(raw.readline())
                end = min(end, size)
                yield _Chunk(str(path), offset, end - offset, None, done + end)
                offset = end
        else:
            pending: _Chunk | None = None  # held until we know whether it is the file's last
            while True:
                data = reader.read(CHUNK_BYTES)
                if data and not data.endswith(b"\n"):
                    data += reader.readline()
                if pending is not None:
                    if not data:
                        pending.done_after = done + size
                    yield pending
                if not data:
                    break
                pending = _Chunk(str(path), offset, len(data), data, done + min(raw.tell(), size))
                offset += len(data)


def _check_outputs(inputs: list[Path], outputs: dict[str, str], problems: Path) -> None:
    """No output is a folder, and no input is one of the files this run writes (it would be overwritten)."""
    written = [problems] + [Path(f"{prefix}{ext}") for prefix in outputs.values() for ext in (".bin", ".idx")]
    for out in written:
        if out.is_dir():
            raise DataError(f"output {out} is a folder; choose another --output-prefix (the run writes {out.name} "
                            "as a file)")
    resolved = {out.resolve(): out for out in written}
    for path in inputs:
        if path.resolve() in resolved:
            raise DataError(f"input {path} is also an output of this run ({resolved[path.resolve()]}): it would be "
                            "overwritten; choose another --output-prefix")


def output_prefix_for(output_prefix: str, key: str) -> str:
    """Megatron's naming: `{prefix}_{key}_document`."""
    return f"{output_prefix}_{key}_document"


def preprocess(
    inputs: list[str | os.PathLike],
    output_prefix: str,
    tokenizer: TokenizerSpec,
    json_keys: tuple[str, ...] = ("text",),
    append_eod: bool = True,
    workers: int = 1,
    strict: bool = False,
    progress: Callable[[Progress], None] | None = None,
    check_fraction: float = CHECK_FRACTION,
) -> PreprocessResult:
    """Tokenize jsonl files into one indexed dataset per json key; see the module docstring."""
    paths = [Path(p) for p in inputs]
    if not paths:
        raise DataError("preprocess needs at least one input file; got none")
    for p in paths:
        if not p.is_file():
            raise DataError(f"input {p} does not exist or is not a file")
    if not json_keys or len(set(json_keys)) != len(json_keys):
        raise DataError(f"json keys must be distinct and at least one; got {list(json_keys)}")
    if workers < 1:
        raise DataError(f"workers must be >= 1; got {workers}")
    start = time.monotonic()
    tok = build_tokenizer(tokenizer)  # chooses the backend once, verified against tokenizers
    if append_eod and tok.eod is None:
        raise DataError(f"--append-eod needs an end-of-document token {'<|endoftext|>'!r}, "
                        f"which tokenizer {tok.name} lacks")
    if not 0.0 <= check_fraction <= 1.0:
        raise DataError(f"cross-check fraction must be between 0 and 1; got {check_fraction}")
    reference = reference_tokenizer(tokenizer).name if _cross_checked(tok, check_fraction) else None
    worker_spec = dataclasses.replace(tokenizer, backend=tok.backend)
    dtype = best_fitting_dtype(tok.vocab_size)
    outputs = {key: output_prefix_for(output_prefix, key) for key in json_keys}
    _check_outputs(paths, outputs, Path(f"{output_prefix}_problems.jsonl"))
    total_size = sum(p.stat().st_size for p in paths)
    counts: Counter[str] = Counter()
    kept: list[Problem] = []
    problems_path = Path(f"{output_prefix}_problems.jsonl")
    problems_path.unlink(missing_ok=True)
    docs_in = bytes_in = checked = 0
    lines_before: Counter[str] = Counter()  # lines of each file in the chunks already written

    with ExitStack() as stack:
        writers = {key: stack.enter_context(IndexedDatasetWriter(prefix, dtype)) for key, prefix in outputs.items()}
        problems_file = None
        spill = None
        if workers > 1:
            # Workers leave each chunk's tokens in a file of the local temporary folder ($TMPDIR) for
            # the main process to copy in the kernel, rather than pickle them through a pipe: the
            # main process then stays nearly idle. At most the chunks in flight are there at once.
            spill = tempfile.mkdtemp(prefix="bsops-preprocess-")
            stack.callback(shutil.rmtree, spill, True)
        init_args = (worker_spec, tuple(json_keys), append_eod, dtype.str, check_fraction, spill)
        chunks = _read_chunks(paths)
        if workers == 1:
            _init_worker(*init_args, tok)  # the tokenizer just built and verified
            results: Iterator[_Encoded] = map(_encode_chunk, chunks)
        else:
            # Bound the chunks in flight: Pool.imap would otherwise read the whole input ahead.
            # The feeder thread must not block forever when the run stops early (Pool.terminate joins it).
            slots = threading.Semaphore(4 * workers)
            stop = threading.Event()

            def bounded() -> Iterator[_Chunk]:
                for chunk in chunks:
                    while not slots.acquire(timeout=0.1):
                        if stop.is_set():
                            return
                    yield chunk

            if "fork" in multiprocessing.get_all_start_methods():
                # Forked workers inherit the tokenizer built above: ready in milliseconds, where
                # forkserver workers took about a second to import and build it again. They run
                # only json, numpy and the tokenizer, none of which holds a lock across the fork.
                _init_worker(*init_args, tok)
                ctx = multiprocessing.get_context("fork")
                pool = stack.enter_context(ctx.Pool(workers))
            else:
                ctx = multiprocessing.get_context("forkserver")
                pool = stack.enter_context(ctx.Pool(workers, initializer=_init_worker, initargs=init_args))
            stack.callback(pool.terminate)
            stack.callback(stop.set)  # runs first on the way out
            results = pool.imap(_encode_chunk, bounded(), chunksize=1)
        proc_start = time.monotonic()  # rates exclude start-up, as Megatron's do
        for encoded in results:
            if workers > 1:
                slots.release()
            if encoded.mismatch is not None:
                p = encoded.mismatch
                raise TokenizerError(
                    f"{p.path}:{lines_before[p.path] + 1 + p.line}: the {tok.name} tokenizer and the reference "
                    f"{reference} disagree on this document ({p.detail}); nothing was written. Rerun with "
                    "--tokenizer-backend tiktoken or tokenizers, and report the line to fastokens.")
            checked += encoded.checked
            if encoded.problems:
                base = lines_before[encoded.problems[0].path] + 1
                problems = [dataclasses.replace(p, line=base + p.line) for p in encoded.problems]
                if strict:
                    p = problems[0]
                    raise BadInputError(p.path, p.line, p.kind, p.detail)
                if problems_file is None:
                    problems_file = stack.enter_context(open(problems_path, "w", encoding="utf-8"))
                for p in problems:
                    counts[p.kind] += 1
                    if len(kept) < KEEP_PROBLEMS:
                        kept.append(p)
                    problems_file.write(json.dumps(dataclasses.asdict(p)) + "\n")
            for key, writer in writers.items():
                tokens = encoded.tokens[key]
                if isinstance(tokens, str):
                    writer.add_file(tokens, encoded.sizes[key])
                    os.unlink(tokens)
                else:
                    writer.add_documents(tokens, encoded.sizes[key])
            lines_before[encoded.path] += encoded.lines
            docs_in += encoded.lines
            bytes_in += encoded.bytes_in
            if progress is not None:
                progress(Progress(docs_in, bytes_in, time.monotonic() - proc_start,
                                  min(1.0, encoded.done_after / total_size) if total_size else None))
        tokens_out = {key: w.num_tokens for key, w in writers.items()}
        docs_out = {key: w.num_docs for key, w in writers.items()}
        for writer in writers.values():
            writer.finalize()

    return PreprocessResult(
        outputs=outputs, tokenizer=tok.name, dtype=str(dtype), docs_in=docs_in, docs_out=docs_out,
        bytes_in=bytes_in, tokens_out=tokens_out,
        problem_counts={k: counts[k] for k in PROBLEM_KINDS if counts[k]},
        problems=kept, problems_file=str(problems_path) if counts else None,
        seconds=time.monotonic() - start, cross_checked=checked, reference=reference)
