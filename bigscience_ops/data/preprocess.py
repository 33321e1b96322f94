"""jsonl shards (plain, .gz, .xz, .zst) -> Megatron indexed datasets `{prefix}_{key}_document.bin/.idx`.

Each input line is one JSON object; each `--json-keys` key's string is one document (see encode.py
for the lines that give none). Each problem is counted by kind and recorded with its file and line
number in `{prefix}_problems.jsonl`; with `strict=True` the first one stops the run instead. A
literal special token (`<|endoftext|>`) inside a document is plain text unless the tokenizer spec
says otherwise (see `tokenizer.py`), so the bytes equal Megatron's on any text.

The work is spread over `workers` processes in one of two ways, chosen per run:

  - shards: with several inputs whose sizes balance over the workers (a longest-first schedule
    keeps them >= 90% busy), each worker takes whole shards: it decompresses, tokenizes and writes
    its shard's part itself, and the main process only appends finished parts in input order.
  - chunks: otherwise (one large file, or few shards), the main process cuts each input into
    chunks of whole lines and the workers tokenize them. Plain files are read by the workers
    themselves; multi-block .xz files are decoded block by block in the workers (xz.py); .gz and
    .zst are decompressed by the main process with isal or zstandard (over 1 GB/s, see inputs.py).
    A worker leaves a chunk's tokens in a file of a temporary folder and the main process appends
    it with a kernel copy, so it stays nearly idle and N workers use N cores.

Every input is a shard with a part of its own, written atomically with a record (shards.py), so an
interrupted run of several inputs resumes without redoing the finished ones. Outputs appear only
when complete (see `indexed.IndexedDatasetWriter`).

When the backend is fastokens, about `check_fraction` of the text is also encoded by the
reference tokenizer (tiktoken, or tokenizers) and compared; a difference stops the run, naming the
file and line, and writes nothing. For inputs under SMALL_INPUT_BYTES, `auto` takes tiktoken: its
build takes 0.05 s from the user cache where fastokens' takes 0.26 s, more than tiktoken needs to
tokenize such a file (the bytes are the same).
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bigscience_ops.data import inputs as inputs_mod
from bigscience_ops.data.encode import LINE_PROBLEMS, PROBLEM_KINDS, Encoded, Encoder, Problem, split_lines
from bigscience_ops.data.errors import DataError, TokenizerError
from bigscience_ops.data.shards import (KEEP_PROBLEMS, Merger, Shard, ShardSink, ShardStats, finished,
                                        output_prefix_for, plan_shards, work_folder)
from bigscience_ops.data.tokenizer import Tokenizer, TokenizerSpec

__all__ = ["preprocess", "PreprocessResult", "Progress", "Problem", "output_prefix_for", "PROBLEM_KINDS",
           "CHUNK_BYTES", "CHECK_FRACTION"]

CHUNK_BYTES = 1 << 21  # lines handed to a worker at a time: ~15 ms of fastokens work, even load at the end
CHECK_FRACTION = 0.01  # of a fastokens run's text re-encoded with the reference tokenizer
SMALL_INPUT_BYTES = 4 << 20  # below this (decompressed, estimated), auto takes tiktoken over fastokens
COMPRESSED_RATIO = 4  # estimated decompressed / on-disk size of compressed text
SHARD_MODE_BUSY = 0.9  # whole shards to workers when a longest-first schedule keeps them this busy
POLL_S = 0.5  # progress while whole shards are in the workers


@dataclasses.dataclass(frozen=True)
class Progress:
    docs: int  # lines read so far (Megatron's "documents")
    bytes: int  # bytes of those lines
    seconds: float
    fraction: float | None  # of the inputs' size on disk (resumed shards included), None when unknown
    eta_s: float | None = None  # at this run's rate over the input bytes on disk still to do
    shards_done: int = 0
    shards: int = 1

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
    outputs: dict[str, str]  # json key -> merged output prefix (without .bin/.idx); {} with per-input outputs
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
    shard_outputs: list[str] = dataclasses.field(default_factory=list)  # per-input parts' prefixes
    shards: int = 1
    resumed: int = 0  # shards whose finished part was kept from an earlier run
    mode: str = "chunks"  # how the work was spread: sequential, chunks or shards (resumed: nothing left)
    startup_cpu_s: float = 0.0  # this process's CPU time (from its start) when the first chunk was handed out

    @property
    def lines_dropped(self) -> int:
        """Lines that gave no document for any key (an empty document drops only its own key's)."""
        return sum(n for kind, n in self.problem_counts.items() if kind in LINE_PROBLEMS)


@dataclasses.dataclass
class _Chunk:
    shard: int
    path: str
    offset: int  # plain files: the bytes [offset, offset + length) the worker reads
    length: int
    data: bytes | None  # decompressed by the main process
    xz_span: tuple[int, int] | None  # blocks [first, last) the worker decodes (xz.py)
    disk_done: int  # bytes of this shard on disk done once this chunk is


# --- worker side -----------------------------------------------------------------------------

_worker: dict = {}


def _init_worker(spec: TokenizerSpec, keys: tuple[str, ...], append_eod: bool, dtype: str,
                 check_fraction: float, spill: str | None, counters: tuple | None = None) -> None:
    import numpy as np

    from bigscience_ops.data.tokenizer import CrossCheck, build_tokenizer, reference_tokenizer

    tok = build_tokenizer(spec)  # cached: forked workers inherit the main process's
    check = CrossCheck(reference_tokenizer(spec), check_fraction) if _cross_checked(tok, check_fraction) else None
    _worker.update(encoder=Encoder(tok, keys, tok.eod if append_eod else None, np.dtype(dtype), check),
                   spill=spill, spilled=0, counters=counters, xz_blocks={})


def _cross_checked(tok: Tokenizer, fraction: float) -> bool:
    """Whether a run re-encodes a sample with the reference tokenizer: fastokens runs, unless turned off."""
    return tok.backend == "fastokens" and fraction > 0


def _not_complete(path: str, exc: BaseException) -> DataError:
    """A compressed file that is not what its name says, or is cut short (never a traceback)."""
    kind = inputs_mod.compression(path) or "jsonl"
    return DataError(f"input {path}: not a complete {kind} file ({type(exc).__name__}: {exc}); nothing was "
                     "written. Check the file (a download cut short?) or its name's extension")


def _chunk_data(chunk: _Chunk) -> bytes:
    if chunk.data is not None:
        return chunk.data
    if chunk.xz_span is not None:
        from bigscience_ops.data import xz

        blocks = _worker["xz_blocks"].get(chunk.path) or _worker["xz_blocks"].setdefault(chunk.path,
                                                                                          xz.blocks(chunk.path))
        try:
            return xz.read_span(chunk.path, blocks, *chunk.xz_span)
        except inputs_mod.decode_errors() as exc:
            raise _not_complete(chunk.path, exc) from None
    with open(chunk.path, "rb") as f:
        f.seek(chunk.offset)
        return f.read(chunk.length)


def _encode_chunk(chunk: _Chunk) -> tuple[int, Encoded, int, int]:
    """(shard, its result, decompressed bytes, disk bytes done); tokens spilled to a file with workers."""
    data = _chunk_data(chunk)
    encoded = _worker["encoder"].encode(split_lines(data), chunk.path)
    if _worker["spill"] is not None and encoded.mismatch is None:  # the main process copies it in the kernel
        for key, tokens in encoded.tokens.items():
            _worker["spilled"] += 1
            path = os.path.join(_worker["spill"], f"{os.getpid()}-{_worker['spilled']}.bin")
            tokens.tofile(path)
            encoded.tokens[key] = path
    return chunk.shard, encoded, len(data), chunk.disk_done


def _shard_task(args: tuple) -> tuple[int, ShardStats]:
    """A whole shard in this worker: read, decompress, tokenize, write its part."""
    shard, keys, dtype, settings, strict, names = args
    sink = ShardSink(shard, keys, dtype, settings, strict, names)
    counters = _worker["counters"]  # lines, bytes, disk bytes over all workers, for the main's progress
    lines = disk = 0
    try:
        for chunk in _shard_chunks(shard, xz_spans=False):
            data = _chunk_data(chunk)
            sink.add(_worker["encoder"].encode(split_lines(data), chunk.path), len(data))
            for counter, n in zip(counters, (sink.stats.lines - lines, len(data), chunk.disk_done - disk)):
                with counter.get_lock():
                    counter.value += n
            lines, disk = sink.stats.lines, chunk.disk_done
        return shard.index, sink.finish()
    except BaseException:
        sink.abort()
        raise


# --- main side -------------------------------------------------------------------------------

def _shard_chunks(shard: Shard, xz_spans: bool) -> Iterator[_Chunk]:
    """One shard's chunks in order (at least one, empty for an empty file)."""
    path = Path(shard.path)
    yielded = False
    try:
        kind = inputs_mod.compression(path)
        if kind == "xz" and xz_spans:
            from bigscience_ops.data import xz

            blocks = xz.blocks(shard.path)
            if len(blocks) > 1:
                for first, last in xz.spans(blocks, CHUNK_BYTES):
                    yielded = True
                    yield _Chunk(shard.index, shard.path, 0, 0, None, (first, last),
                                 blocks[last - 1].offset + blocks[last - 1].padded)
                return
        with open(path, "rb") as raw:
            reader = inputs_mod.open_decoded(path, raw)
            if reader is None:
                for offset, length in inputs_mod.plain_cuts(raw, CHUNK_BYTES, shard.size):
                    yielded = True
                    yield _Chunk(shard.index, shard.path, offset, length, None, None, offset + length)
            else:
                with reader:
                    for data in inputs_mod.line_chunks(reader, CHUNK_BYTES):
                        yielded = True
                        yield _Chunk(shard.index, shard.path, 0, len(data), data, None, min(raw.tell(), shard.size))
    except DataError:
        raise
    except inputs_mod.decode_errors() as exc:
        raise _not_complete(shard.path, exc) from None
    if not yielded:
        yield _Chunk(shard.index, shard.path, 0, 0, b"", None, shard.size)


def _busy_fraction(sizes: list[int], workers: int) -> float:
    """How busy `workers` stay when whole jobs of these sizes go longest first to the least loaded."""
    loads = [0] * workers
    for size in sorted(sizes, reverse=True):
        heapq.heapreplace(loads, loads[0] + size)
    longest = max(loads)
    return sum(sizes) / (workers * longest) if longest else 1.0


def _choose_tokenizer(spec: TokenizerSpec, paths: list[Path]) -> Tokenizer:
    from bigscience_ops.data.tokenizer import build_tokenizer

    if spec.backend == "auto":
        estimate = sum(p.stat().st_size * (COMPRESSED_RATIO if inputs_mod.compression(p) else 1) for p in paths)
        if estimate < SMALL_INPUT_BYTES:
            try:
                return build_tokenizer(dataclasses.replace(spec, backend="tiktoken"))
            except TokenizerError:
                pass
    return build_tokenizer(spec)  # chooses the backend once, verified against tokenizers


def _check_outputs(paths: list[Path], shards: list[Shard], outputs: list[str], keys: tuple[str, ...]) -> None:
    """No output is a folder, and no input is one of the files this run writes (it would be overwritten)."""
    written = [Path(f"{o}_problems.jsonl") for o in outputs]
    written += [Path(f"{output_prefix_for(o, k)}{ext}") for o in outputs for k in keys for ext in (".bin", ".idx")]
    written += [s.record_path for s in shards if s.recorded]
    for out in written:
        if out.is_dir():
            raise DataError(f"output {out} is a folder; choose another --output-prefix (the run writes {out.name} "
                            "as a file)")
    resolved = {out.resolve(): out for out in written}
    for path in paths:
        if path.resolve() in resolved:
            raise DataError(f"input {path} is also an output of this run ({resolved[path.resolve()]}): it would be "
                            "overwritten; choose another --output-prefix")


def _settings(spec: TokenizerSpec, keys: tuple[str, ...], append_eod: bool, dtype: str) -> dict:
    """What shapes a part's bytes: a finished part made with other settings is redone."""
    from bigscience_ops.data.tokenizer_cache import _sha256_file

    files = [spec.json_file] if spec.kind == "json" else [spec.vocab_file, spec.merges_file]
    return {"tokenizer": [_sha256_file(f) for f in files], "kind": spec.kind, "special_text": spec.special_text,
            "keys": list(keys), "append_eod": append_eod, "dtype": dtype}


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
    output_per_input: bool = False,
) -> PreprocessResult:
    """Tokenize jsonl files, folders of them or globs into indexed datasets; see the module docstring."""
    start = time.monotonic()
    paths = inputs_mod.expand_inputs(list(inputs))
    if not paths:
        raise DataError("preprocess needs at least one input file; got none")
    for p in paths:
        if not p.is_file():
            raise DataError(f"input {p} does not exist or is not a file")
    json_keys = tuple(json_keys)
    if not json_keys or len(set(json_keys)) != len(json_keys):
        raise DataError(f"json keys must be distinct and at least one; got {list(json_keys)}")
    if workers < 1:
        raise DataError(f"workers must be >= 1; got {workers}")
    if not 0.0 <= check_fraction <= 1.0:
        raise DataError(f"cross-check fraction must be between 0 and 1; got {check_fraction}")
    shards = plan_shards(paths, output_prefix, output_per_input)
    merged = not output_per_input and len(shards) > 1
    _check_outputs(paths, shards, [s.part for s in shards] + ([output_prefix] if merged else []), json_keys)
    tok = _choose_tokenizer(tokenizer, paths)
    if append_eod and tok.eod is None:
        raise DataError(f"--append-eod needs an end-of-document token {'<|endoftext|>'!r}, "
                        f"which tokenizer {tok.name} lacks")
    from bigscience_ops.data.indexed import best_fitting_dtype
    from bigscience_ops.data.tokenizer import reference_tokenizer

    reference = reference_tokenizer(tokenizer).name if _cross_checked(tok, check_fraction) else None
    dtype = best_fitting_dtype(tok.vocab_size)
    settings = _settings(tokenizer, json_keys, append_eod, dtype.str)
    stats: dict[int, ShardStats] = {}
    for shard in shards:
        done = finished(shard, settings, json_keys)
        if done is not None:
            stats[shard.index] = done
    resumed = len(stats)
    pending = [s for s in shards if s.index not in stats]
    if not pending:
        mode = "resumed"
    elif workers == 1:
        mode = "sequential"
    elif len(pending) > 1 and _busy_fraction([s.size for s in pending], workers) >= SHARD_MODE_BUSY:
        mode = "shards"
    else:
        mode = "chunks"
    run = _Run(shards, stats, tok, reference, dtype, json_keys, strict, settings, progress,
               output_prefix if merged else None)
    init_args = (dataclasses.replace(tokenizer, backend=tok.backend), json_keys, append_eod, dtype.str, check_fraction)
    try:
        if mode == "shards":
            run.in_workers(pending, workers, init_args)
        else:
            run.by_chunks(pending, workers, init_args)
        run.finish()
    except BaseException:
        run.abort()
        raise
    total = ShardStats()
    for s in stats.values():
        total.lines += s.lines
        total.bytes_in += s.bytes_in
        total.cross_checked += s.cross_checked
        for key in json_keys:
            total.docs_out[key] = total.docs_out.get(key, 0) + s.docs_out.get(key, 0)
            total.tokens_out[key] = total.tokens_out.get(key, 0) + s.tokens_out.get(key, 0)
        for kind, n in s.problem_counts.items():
            total.problem_counts[kind] = total.problem_counts.get(kind, 0) + n
    kept = [p for i in sorted(stats) for p in stats[i].problems][:KEEP_PROBLEMS]
    if output_per_input:
        problems_file = f"{output_prefix}_*_problems.jsonl" if total.problem_counts else None
    else:
        problems_file = f"{output_prefix}_problems.jsonl" if total.problem_counts else None
    return PreprocessResult(
        outputs={} if output_per_input else {k: output_prefix_for(output_prefix, k) for k in json_keys},
        tokenizer=tok.name, dtype=str(dtype), docs_in=total.lines, docs_out=total.docs_out,
        bytes_in=total.bytes_in, tokens_out=total.tokens_out,
        problem_counts={k: total.problem_counts[k] for k in PROBLEM_KINDS if total.problem_counts.get(k)},
        problems=kept, problems_file=problems_file, seconds=time.monotonic() - start,
        cross_checked=total.cross_checked, reference=reference,
        shard_outputs=[s.part for s in shards] if output_per_input else [], shards=len(shards), resumed=resumed,
        mode=mode, startup_cpu_s=run.startup_cpu_s)


class _Run:
    """One run's state in the main process: finished shards, the merge in input order, progress."""

    def __init__(self, shards: list[Shard], stats: dict[int, ShardStats], tok: Tokenizer, reference: str | None,
                 dtype, keys: tuple[str, ...], strict: bool, settings: dict,
                 progress: Callable[[Progress], None] | None, merge_into: str | None) -> None:
        self.shards, self.stats, self.tok, self.dtype, self.keys = shards, stats, tok, dtype, keys
        self.strict, self.settings, self.progress = strict, settings, progress
        self.names = (tok.name, reference)
        self.merger = Merger(merge_into, keys, dtype) if merge_into else None
        self.merge_into = merge_into
        self.next_merge = 0
        self.disk_total = sum(s.size for s in shards)
        self.disk_before = sum(shards[i].size for i in stats)  # resumed shards
        self.startup_cpu_s = 0.0
        self.t0 = time.monotonic()
        self.docs = self.bytes = self.disk = 0  # this run's, over finished and current shards

    def _started(self) -> None:
        self.startup_cpu_s = time.process_time()
        self.t0 = time.monotonic()  # rates exclude start-up, as Megatron's do

    def _shard_done(self, index: int, stats: ShardStats) -> None:
        self.stats[index] = stats
        if self.merger is not None:
            while self.next_merge < len(self.shards) and self.next_merge in self.stats:
                self.merger.append(self.shards[self.next_merge])
                self.next_merge += 1

    def _report(self, docs: int, nbytes: int, disk: int) -> None:
        if self.progress is None:
            return
        seconds = time.monotonic() - self.t0
        done = self.disk_before + disk
        eta = (self.disk_total - done) * seconds / disk if disk > 0 else None
        self.progress(Progress(docs, nbytes, seconds, min(1.0, done / self.disk_total) if self.disk_total else None,
                               eta, len(self.stats), len(self.shards)))

    def by_chunks(self, pending: list[Shard], workers: int, init_args: tuple) -> None:
        """The main process cuts (and decompresses) each input; one or more workers tokenize the chunks."""
        from contextlib import ExitStack

        def chunks() -> Iterator[_Chunk]:
            for shard in pending:
                yield from _shard_chunks(shard, xz_spans=workers > 1)

        with ExitStack() as stack:
            if workers == 1:
                _init_worker(*init_args, None)
                results: Iterator = map(_encode_chunk, chunks())
            else:
                import shutil
                import tempfile
                import threading

                # Workers leave each chunk's tokens in a file of the local temporary folder ($TMPDIR) for
                # the main process to copy in the kernel, rather than pickle them through a pipe.
                spill = tempfile.mkdtemp(prefix="bsops-preprocess-")
                stack.callback(shutil.rmtree, spill, True)
                pool = self._pool(stack, workers, init_args + (spill,))
                # Bound the chunks in flight: Pool.imap would otherwise read the whole input ahead.
                # The feeder thread must not block forever when the run stops early (Pool.terminate joins it).
                slots = threading.Semaphore(4 * workers)
                stop = threading.Event()
                stack.callback(stop.set)  # runs first on the way out

                def bounded() -> Iterator[_Chunk]:
                    for chunk in chunks():
                        while not slots.acquire(timeout=0.1):
                            if stop.is_set():
                                return
                        yield chunk

                results = pool.imap(_encode_chunk, bounded(), chunksize=1)
            sink: ShardSink | None = None
            disk_before_shard = 0
            self._started()
            try:
                for index, encoded, nbytes, disk_done in results:
                    if workers > 1:
                        slots.release()
                    if sink is None or sink.shard.index != index:
                        if sink is not None:
                            disk_before_shard += sink.shard.size
                            self._shard_done(sink.shard.index, sink.finish())
                        sink = ShardSink(self.shards[index], self.keys, self.dtype, self.settings, self.strict,
                                         self.names)
                    sink.add(encoded, nbytes)
                    self.docs += encoded.lines
                    self.bytes += nbytes
                    self._report(self.docs, self.bytes, disk_before_shard + disk_done)
                if sink is not None:
                    self._shard_done(sink.shard.index, sink.finish())
                    sink = None
            finally:
                if sink is not None:
                    sink.abort()

    def _pool(self, stack, workers: int, init_args: tuple):
        import multiprocessing

        # Forked workers inherit the tokenizer built above: ready in milliseconds, where forkserver
        # workers take about a second to import and build it again. They run only json, numpy and
        # the tokenizer, none of which holds a lock across the fork.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "forkserver"
        pool = stack.enter_context(multiprocessing.get_context(method).Pool(workers, _init_worker, init_args))
        stack.callback(pool.terminate)
        return pool

    def in_workers(self, pending: list[Shard], workers: int, init_args: tuple) -> None:
        """Whole shards to the workers, longest first; finished parts appended in input order."""
        import multiprocessing
        from contextlib import ExitStack

        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                          else "forkserver")
        counters = tuple(ctx.Value("q", 0) for _ in range(3))  # lines, bytes, disk bytes, over all workers
        order = sorted(pending, key=lambda s: -s.size)
        tasks = [(s, self.keys, self.dtype, self.settings, self.strict, self.names) for s in order]
        with ExitStack() as stack:
            pool = self._pool(stack, workers, init_args + (None, counters))
            self._started()
            results = pool.imap_unordered(_shard_task, tasks)
            while True:
                try:
                    index, stats = results.next(timeout=POLL_S)
                except multiprocessing.TimeoutError:
                    pass
                except StopIteration:
                    break
                else:
                    self._shard_done(index, stats)
                self.docs, self.bytes, self.disk = (c.value for c in counters)
                self._report(self.docs, self.bytes, self.disk)

    def finish(self) -> None:
        if self.merger is not None:
            if self.next_merge != len(self.shards):
                raise DataError(f"shard {self.shards[self.next_merge].path} has no finished part; nothing was merged")
            self.merger.finish(work_folder(self.merge_into))

    def abort(self) -> None:
        if self.merger is not None:
            self.merger.abort()
