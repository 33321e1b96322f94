"""jsonl[.gz|.xz] -> Megatron indexed datasets `{prefix}_{key}_document.bin/.idx`.

Each input line is one JSON object; each `--json-keys` key's string is one document. A line that
cannot be used (invalid UTF-8, malformed JSON, not an object, a missing key, a non-string value,
an empty document) is dropped for every key, counted by kind and recorded with its file and line
number in `{prefix}_problems.jsonl`; with `strict=True` the first one stops the run instead.

Lines are read in chunks by the main process, tokenized by `workers` processes (in order) and
written by the main process. Outputs appear only when complete (see `indexed.IndexedDatasetWriter`).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bigscience_ops.data.errors import BadInputError, DataError
from bigscience_ops.data.indexed import IndexedDatasetWriter, best_fitting_dtype
from bigscience_ops.data.tokenizer import TokenizerSpec, build_tokenizer

PROBLEM_KINDS = ("invalid-utf8", "malformed-json", "not-an-object", "missing-key", "not-a-string", "empty")
CHUNK_BYTES = 1 << 20  # lines handed to a worker at a time
KEEP_PROBLEMS = 100  # problems kept in the result; all of them go to the problems file


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
    docs_out: int  # documents written per key
    bytes_in: int
    tokens_out: dict[str, int]  # per key, EOD included
    problem_counts: dict[str, int]
    problems: list[Problem]  # the first KEEP_PROBLEMS
    problems_file: str | None
    seconds: float

    @property
    def docs_dropped(self) -> int:
        return sum(self.problem_counts.values())


@dataclasses.dataclass
class _Chunk:
    path: str
    first_line: int
    lines: list[bytes]


@dataclasses.dataclass
class _Encoded:
    tokens: dict[str, np.ndarray]
    sizes: dict[str, np.ndarray]
    problems: list[Problem]
    docs_in: int
    bytes_in: int


# --- worker side -----------------------------------------------------------------------------

_worker: dict = {}


def _init_worker(spec: TokenizerSpec, keys: tuple[str, ...], append_eod: bool, dtype: str) -> None:
    tok = build_tokenizer(spec, verify=False)
    _worker.update(tok=tok, keys=keys, eod=tok.eod if append_eod else None, dtype=np.dtype(dtype))


def _encode_chunk(chunk: _Chunk) -> _Encoded:
    tok, keys, eod, dtype = _worker["tok"], _worker["keys"], _worker["eod"], _worker["dtype"]
    encode = tok.encode
    flat: dict[str, list[int]] = {k: [] for k in keys}
    sizes: dict[str, list[int]] = {k: [] for k in keys}
    problems: list[Problem] = []
    nbytes = 0
    for lineno, raw in enumerate(chunk.lines, chunk.first_line):
        nbytes += len(raw)
        problem = None
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problem = ("invalid-utf8", f"byte {exc.start} of the line is not valid UTF-8 ({exc.reason})")
        if problem is None:
            try:
                obj = json.loads(line)
            except ValueError as exc:
                problem = ("malformed-json", "blank line" if not line.strip() else str(exc))
        if problem is None and not isinstance(obj, dict):
            problem = ("not-an-object", f"a JSON {type(obj).__name__}, expected an object")
        if problem is None:
            ids_of: dict[str, list[int]] = {}
            for key in keys:
                if key not in obj:
                    present = ", ".join(sorted(obj)[:10]) or "none"
                    problem = ("missing-key", f"no key {key!r}; keys present: {present}")
                    break
                text = obj[key]
                if not isinstance(text, str):
                    problem = ("not-a-string", f"{key!r} is a JSON {type(text).__name__}, expected a string")
                    break
                if "\\ud" in line or "\\uD" in line:
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError as exc:
                        problem = ("invalid-utf8", f"{key!r} has a lone surrogate escape at character {exc.start}")
                        break
                ids = encode(text) if text else []
                if not ids:
                    problem = ("empty", f"{key!r} is an empty document")
                    break
                ids_of[key] = ids
        if problem is not None:
            problems.append(Problem(chunk.path, lineno, *problem))
            continue
        for key, ids in ids_of.items():
            if eod is not None:
                ids.append(eod)
            flat[key].extend(ids)
            sizes[key].append(len(ids))
    return _Encoded(
        tokens={k: np.array(v, dtype=dtype) for k, v in flat.items()},
        sizes={k: np.array(v, dtype=np.int32) for k, v in sizes.items()},
        problems=problems, docs_in=len(chunk.lines), bytes_in=nbytes)


# --- main side -------------------------------------------------------------------------------

def _open(path: Path, raw: BinaryIO) -> BinaryIO:
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if name.endswith(".xz"):
        return lzma.LZMAFile(raw, mode="rb")
    return raw


def _read_chunks(paths: list[Path], on_position: Callable[[int], None]) -> Iterator[_Chunk]:
    """Chunks of about CHUNK_BYTES of whole lines; `on_position` gets bytes of input files done."""
    done = 0
    for path in paths:
        with open(path, "rb") as raw, _open(path, raw) as f:
            lines: list[bytes] = []
            size = 0
            first = 1
            lineno = 0
            for lineno, line in enumerate(f, 1):
                lines.append(line)
                size += len(line)
                if size >= CHUNK_BYTES:
                    on_position(done + raw.tell())
                    yield _Chunk(str(path), first, lines)
                    lines, size, first = [], 0, lineno + 1
            # The file is read to its end: count it as done before its last chunk is reported.
            done += os.fstat(raw.fileno()).st_size
            on_position(done)
            if lines:
                yield _Chunk(str(path), first, lines)


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
    backend = "tiktoken" if tok.name.startswith("tiktoken") else "tokenizers"
    worker_spec = dataclasses.replace(tokenizer, backend=backend)
    dtype = best_fitting_dtype(tok.vocab_size)
    outputs = {key: output_prefix_for(output_prefix, key) for key in json_keys}
    total_size = sum(p.stat().st_size for p in paths)
    position = [0]

    def on_position(done: int) -> None:
        position[0] = done

    counts: Counter[str] = Counter()
    kept: list[Problem] = []
    problems_path = Path(f"{output_prefix}_problems.jsonl")
    problems_path.unlink(missing_ok=True)
    docs_in = bytes_in = docs_out = 0
    init_args = (worker_spec, tuple(json_keys), append_eod, dtype.str)

    with ExitStack() as stack:
        writers = {key: stack.enter_context(IndexedDatasetWriter(prefix, dtype)) for key, prefix in outputs.items()}
        problems_file = None
        chunks = _read_chunks(paths, on_position)
        if workers == 1:
            _init_worker(*init_args)
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

            ctx = multiprocessing.get_context("forkserver")
            pool = stack.enter_context(ctx.Pool(workers, initializer=_init_worker, initargs=init_args))
            stack.callback(pool.terminate)
            stack.callback(stop.set)  # runs first on the way out
            results = pool.imap(_encode_chunk, bounded(), chunksize=1)
        proc_start = time.monotonic()  # rates exclude start-up, as Megatron's do
        for encoded in results:
            if workers > 1:
                slots.release()
            if encoded.problems:
                if strict:
                    p = encoded.problems[0]
                    raise BadInputError(p.path, p.line, p.kind, p.detail)
                if problems_file is None:
                    problems_file = stack.enter_context(open(problems_path, "w", encoding="utf-8"))
                for p in encoded.problems:
                    counts[p.kind] += 1
                    if len(kept) < KEEP_PROBLEMS:
                        kept.append(p)
                    problems_file.write(json.dumps(dataclasses.asdict(p)) + "\n")
            for key, writer in writers.items():
                writer.add_documents(encoded.tokens[key], encoded.sizes[key])
            docs_in += encoded.docs_in
            bytes_in += encoded.bytes_in
            docs_out = next(iter(writers.values())).num_docs
            if progress is not None:
                progress(Progress(docs_in, bytes_in, time.monotonic() - proc_start,
                                  min(1.0, position[0] / total_size) if total_size else None))
        tokens_out = {key: w.num_tokens for key, w in writers.items()}
        for writer in writers.values():
            writer.finalize()

    return PreprocessResult(
        outputs=outputs, tokenizer=tok.name, dtype=str(dtype), docs_in=docs_in, docs_out=docs_out,
        bytes_in=bytes_in, tokens_out=tokens_out,
        problem_counts={k: counts[k] for k in PROBLEM_KINDS if counts[k]},
        problems=kept, problems_file=str(problems_path) if counts else None,
        seconds=time.monotonic() - start)
