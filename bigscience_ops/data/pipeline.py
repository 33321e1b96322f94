"""How one preprocessing run spreads its work over processes: chunks of one input, or whole shards.

  - sequential (1 worker): this process reads each input chunk by chunk, tokenizes, writes.
  - chunks: this process cuts (and, for .gz/.zst/one-block .xz, decompresses) each input into
    chunks of whole lines; the workers read plain chunks and decode multi-block .xz spans
    themselves, tokenize, and leave each chunk's tokens in a spill file that this process appends
    with a kernel copy, in order.
  - shards: each worker takes whole shards (longest first) and writes each one's part itself; this
    process only appends finished parts in input order and reports progress from shared counters.

`Run` holds what the main process tracks: finished shards, the merge, progress and its ETA.

Memory is bounded whatever the inputs' compression ratio: every reader hands on about CHUNK_BYTES of
whole lines at a time, a line longer than the run's maximum stops the run as soon as it passes it
(DocumentTooLargeError, naming the file and line), and a worker decodes its .xz span as a stream,
tokenizing it a piece at a time. An .xz whose index lists a block over XZ_WORKER_BLOCK_BYTES is read
as one stream by the main process instead: a span of one such block would hold a gigabyte's
document sizes in a worker.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bigscience_ops.data import inputs as inputs_mod
from bigscience_ops.data.encode import Encoded, Encoder, split_lines
from bigscience_ops.data.errors import DamagedInputError, DataError, DocumentTooLargeError
from bigscience_ops.data.shards import Merger, Shard, ShardSink, ShardStats, remove_stale_temporaries, work_folder
from bigscience_ops.data.tokenizer import Tokenizer, TokenizerSpec

CHUNK_BYTES = 1 << 21  # lines handed to a worker at a time: ~15 ms of fastokens work, even load at the end
XZ_WORKER_BLOCK_BYTES = 256 << 20  # a multi-block .xz with a larger block is read as one stream (xz -9 -T0: 192 MiB)
POLL_S = 0.5  # progress while whole shards are in the workers


@dataclasses.dataclass(frozen=True)
class PreprocessProgress:
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


@dataclasses.dataclass(frozen=True)
class EncodeSettings:
    """What every process that tokenizes needs (the pool's initializer argument)."""

    spec: TokenizerSpec  # with the backend the main process chose
    keys: tuple[str, ...]
    append_eod: bool
    dtype: str
    check_fraction: float
    max_document_bytes: int  # the longest line taken (newline not counted)


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


def _init_worker(settings: EncodeSettings, spill: str | None, counters: tuple | None = None) -> None:
    import numpy as np

    from bigscience_ops.data.tokenizer import CrossCheck, build_tokenizer, reference_tokenizer

    tok = build_tokenizer(settings.spec)  # cached: forked workers inherit the main process's
    check = (CrossCheck(reference_tokenizer(settings.spec), settings.check_fraction)
             if cross_checked(tok, settings.check_fraction) else None)
    _worker.update(encoder=Encoder(tok, settings.keys, tok.eod if settings.append_eod else None,
                                   np.dtype(settings.dtype), check, settings.max_document_bytes),
                   spill=spill, spilled=0, counters=counters, xz_blocks={}, max_bytes=settings.max_document_bytes)


def cross_checked(tok: Tokenizer, fraction: float) -> bool:
    """Whether a run re-encodes a sample with the reference tokenizer: fastokens runs, unless turned off."""
    return tok.backend == "fastokens" and fraction > 0


def _not_complete(path: str, exc: BaseException) -> DataError:
    """A compressed file that is not what its name says, or is cut short (never a traceback)."""
    return DamagedInputError(path, inputs_mod.compression(path) or "jsonl", f"{type(exc).__name__}: {exc}")


def _xz_blocks(path: str) -> list:
    from bigscience_ops.data import xz

    return _worker["xz_blocks"].get(path) or _worker["xz_blocks"].setdefault(path, xz.blocks(path))


def _chunk_data(chunk: _Chunk) -> bytes:
    if chunk.data is not None:
        return chunk.data
    with open(chunk.path, "rb") as f:
        f.seek(chunk.offset)
        return f.read(chunk.length)


def _spill_path() -> str:
    """A new file in the spill folder, for tokens the main process copies in the kernel."""
    _worker["spilled"] += 1
    return os.path.join(_worker["spill"], f"{os.getpid()}-{_worker['spilled']}.bin")


def _encode_span(chunk: _Chunk) -> tuple[Encoded, int]:
    """A multi-block .xz span decoded and tokenized a piece at a time: tokens appended to spill files."""
    import numpy as np

    from bigscience_ops.data import xz

    encoder = _worker["encoder"]
    total = Encoded({}, {}, [], 0)
    parts: dict[str, list] = {key: [] for key in encoder.keys}  # token arrays, or the one spill file
    sizes: dict[str, list] = {key: [] for key in encoder.keys}
    nbytes = 0
    try:
        for data in xz.span_pieces(chunk.path, _xz_blocks(chunk.path), *chunk.xz_span, CHUNK_BYTES,
                                   _worker["max_bytes"]):
            piece = encoder.encode(split_lines(data), chunk.path)
            nbytes += len(data)
            total.extend(piece)
            if total.stops:
                return total, nbytes
            for key, tokens in piece.tokens.items():
                sizes[key].append(piece.sizes[key])
                if _worker["spill"] is None:
                    parts[key].append(tokens)
                else:
                    if not parts[key]:
                        parts[key].append(_spill_path())
                    with open(parts[key][0], "ab") as f:
                        tokens.tofile(f)
    except inputs_mod.LineTooLong as exc:
        total.too_large = (exc.index, _worker["max_bytes"])
        return total, nbytes
    except inputs_mod.decode_errors() as exc:
        raise _not_complete(chunk.path, exc) from None
    for key in encoder.keys:
        total.sizes[key] = np.concatenate(sizes[key]) if sizes[key] else np.zeros(0, np.int32)
        if not parts[key]:
            total.tokens[key] = np.zeros(0, encoder.dtype)
        elif isinstance(parts[key][0], str):
            total.tokens[key] = parts[key][0]
        else:
            total.tokens[key] = np.concatenate(parts[key])
    return total, nbytes


def _encode_chunk(chunk: _Chunk) -> tuple[int, Encoded, int, int]:
    """(shard, its result, decompressed bytes, disk bytes done); tokens spilled to a file with workers."""
    if chunk.xz_span is not None:
        encoded, nbytes = _encode_span(chunk)
        return chunk.shard, encoded, nbytes, chunk.disk_done
    data = _chunk_data(chunk)
    encoded = _worker["encoder"].encode(split_lines(data), chunk.path)
    if _worker["spill"] is not None and not encoded.stops:  # the main process copies it in the kernel
        for key, tokens in encoded.tokens.items():
            path = _spill_path()
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
        for chunk in _shard_chunks(shard, False, _worker["max_bytes"]):
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

def _shard_chunks(shard: Shard, xz_spans: bool, max_bytes: int) -> Iterator[_Chunk]:
    """One shard's chunks in order (at least one, empty for an empty file); a line over `max_bytes` stops it."""
    path = Path(shard.path)
    yielded = False
    try:
        kind = inputs_mod.compression(path)
        if kind == "xz" and xz_spans:
            from bigscience_ops.data import xz

            blocks = xz.blocks(shard.path)
            if len(blocks) > 1 and max(b.size for b in blocks) <= XZ_WORKER_BLOCK_BYTES:
                for first, last in xz.spans(blocks, CHUNK_BYTES):
                    yielded = True
                    yield _Chunk(shard.index, shard.path, 0, 0, None, (first, last),
                                 blocks[last - 1].offset + blocks[last - 1].padded)
                return
        with open(path, "rb") as raw:
            reader = inputs_mod.open_decoded(path, raw)
            if reader is None:
                for offset, length in inputs_mod.plain_cuts(raw, CHUNK_BYTES, shard.size, max_bytes):
                    yielded = True
                    yield _Chunk(shard.index, shard.path, offset, length, None, None, offset + length)
            else:
                with reader:
                    for data in inputs_mod.line_chunks(reader, CHUNK_BYTES, max_bytes):
                        yielded = True
                        yield _Chunk(shard.index, shard.path, 0, len(data), data, None, min(raw.tell(), shard.size))
    except DataError:
        raise
    except inputs_mod.LineTooLong as exc:
        raise DocumentTooLargeError(shard.path, exc.index + 1, max_bytes) from None
    except inputs_mod.decode_errors() as exc:
        raise _not_complete(shard.path, exc) from None
    if not yielded:
        yield _Chunk(shard.index, shard.path, 0, 0, b"", None, shard.size)


END_S = 60.0
"""Seconds a stopped run's workers get to finish the few tasks they hold before they are killed."""


def _end_pool(pool, failure: type[BaseException] | None) -> bool:
    """End a pool its run is done with. Its feeders hand out no further task by now (their stop events are set),
    so the workers finish what they hold and exit: Pool.terminate alone kills them, and one killed while writing
    its result holds the result queue's lock for ever, which hangs terminate's own join (seen under load when a
    run refused a bomb). Killed only after END_S, or at once on Ctrl-C (the workers got the SIGINT too)."""
    import threading

    pool.close()
    if failure is not None and issubclass(failure, KeyboardInterrupt):
        pool.terminate()
        return False
    ending = threading.Thread(target=pool.join, name="bsops-pool-end", daemon=True)
    ending.start()
    ending.join(END_S if failure is not None else None)
    if ending.is_alive():
        pool.terminate()
    return False


class Run:
    """One run's state in the main process: finished shards, the merge in input order, progress."""

    def __init__(self, shards: list[Shard], stats: dict[int, ShardStats], tok: Tokenizer, reference: str | None,
                 dtype, keys: tuple[str, ...], strict: bool, settings: dict,
                 progress: Callable[[PreprocessProgress], None] | None, merge_into: str | None) -> None:
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
        self._merge_ready()

    def _merge_ready(self) -> None:
        """Append the finished parts (resumed ones included) that follow the merged ones, in input order."""
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
        self.progress(PreprocessProgress(docs, nbytes, seconds, min(1.0, done / self.disk_total) if self.disk_total else None,
                               eta, len(self.stats), len(self.shards)))

    def by_chunks(self, pending: list[Shard], workers: int, settings: EncodeSettings) -> None:
        """The main process cuts (and decompresses) each input; one or more workers tokenize the chunks."""
        if not pending:
            self._started()
            return
        from contextlib import ExitStack

        def chunks() -> Iterator[_Chunk]:
            for shard in pending:
                yield from _shard_chunks(shard, workers > 1, settings.max_document_bytes)

        with ExitStack() as stack:
            if workers == 1:
                _init_worker(settings, None)
                results: Iterator = map(_encode_chunk, chunks())
            else:
                import shutil
                import tempfile
                import threading

                # Workers leave each chunk's tokens in a file of the local temporary folder ($TMPDIR) for
                # the main process to copy in the kernel, rather than pickle them through a pipe.
                spill = tempfile.mkdtemp(prefix="bsops-preprocess-")
                stack.callback(shutil.rmtree, spill, True)
                pool = self._pool(stack, workers, (settings, spill))
                # Bound the chunks in flight: Pool.imap would otherwise read the whole input ahead.
                # The feeder thread must not block forever when the run stops early (Pool.terminate joins it).
                slots = threading.Semaphore(4 * workers)
                stop = threading.Event()
                stack.callback(stop.set)  # runs first on the way out

                def bounded() -> Iterator[_Chunk]:
                    # Pool.terminate waits for this generator (in the pool's task thread) to return: once the
                    # run stops it must cut no further chunk, or a refused bomb would be read to its end first.
                    for chunk in chunks():
                        while not slots.acquire(timeout=0.1):
                            if stop.is_set():
                                return
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
        # Objects from before the fork are left out of the workers' garbage collections: a collection
        # writes to every object it visits, and each write copies a page the worker shares with this
        # process (gc.freeze's own use case).
        gc.freeze()
        try:
            pool = multiprocessing.get_context(method).Pool(workers, _init_worker, init_args)
        finally:
            gc.unfreeze()
        stack.push(lambda kind, error, trace: _end_pool(pool, kind))
        return pool

    def in_workers(self, pending: list[Shard], workers: int, settings: EncodeSettings) -> None:
        """Whole shards to the workers, longest first; finished parts appended in input order."""
        import multiprocessing

        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                          else "forkserver")
        counters = tuple(ctx.Value("q", 0) for _ in range(3))  # lines, bytes, disk bytes, over all workers
        order = sorted(pending, key=lambda s: -s.size)
        tasks = [(s, self.keys, self.dtype, self.settings, self.strict, self.names) for s in order]
        try:
            self._shards_in_pool(workers, settings, tasks, counters)
        except BaseException:
            # The pool was terminated (its workers killed mid-part, and reaped): what they were writing goes.
            for shard in pending:
                remove_stale_temporaries(shard.part)
            raise

    def _shards_in_pool(self, workers: int, settings: EncodeSettings, tasks: list[tuple], counters: tuple) -> None:
        """in_workers' pool: terminated (its workers killed and reaped) when anything goes wrong."""
        import multiprocessing
        from contextlib import ExitStack

        import threading

        with ExitStack() as stack:
            pool = self._pool(stack, workers, (settings, None, counters))
            # The shards go to the pool's task thread one at a time, at most `workers` ahead of the results:
            # Pool.terminate waits for that thread, which must never be stuck writing a task to workers it
            # has just killed (a refused run hung there for minutes under load).
            slots = threading.Semaphore(workers)
            stop = threading.Event()
            stack.callback(stop.set)  # runs first on the way out

            def fed() -> Iterator[tuple]:
                for task in tasks:
                    while not slots.acquire(timeout=0.1):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    yield task

            self._started()
            results = pool.imap_unordered(_shard_task, fed())
            while True:
                try:
                    index, stats = results.next(timeout=POLL_S)
                except multiprocessing.TimeoutError:
                    pass
                except StopIteration:
                    break
                else:
                    slots.release()
                    self._shard_done(index, stats)
                self.docs, self.bytes, self.disk = (c.value for c in counters)
                self._report(self.docs, self.bytes, self.disk)

    def finish(self) -> None:
        if self.merger is not None:
            self._merge_ready()  # a run whose parts were all finished before: only the merge is left
            if self.next_merge != len(self.shards):
                raise DataError(f"shard {self.shards[self.next_merge].path} has no finished part; nothing was merged")
            self.merger.finish(work_folder(self.merge_into))

    def abort(self) -> None:
        if self.merger is not None:
            self.merger.abort()
