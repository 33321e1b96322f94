"""jsonl shards (plain, .gz, .xz, .zst) -> Megatron indexed datasets `{prefix}_{key}_document.bin/.idx`.

Each input line is one JSON object; each `--json-keys` key's string is one document (see encode.py
for the lines that give none). Each problem is counted by kind and recorded with its file and line
number in `{prefix}_problems.jsonl`; with `strict=True` the first one stops the run instead. A
literal special token (`<|endoftext|>`) inside a document is plain text unless the tokenizer spec
says otherwise (see `tokenizer.py`), so the bytes equal Megatron's on any text.

The work is spread over `workers` processes in one of two ways, chosen per run (pipeline.py):

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
when complete (see `indexed.IndexedDatasetWriter`); each output's record `PREFIX.dataset.json`
(dataset_record.py: its tokenizer, counts and largest token id) is written last.

The number of workers is capped (`cap_workers`) at this machine's cores (those this process may run on) and at
the pieces of work the inputs give (each input's chunks of CHUNK_BYTES, a compressed one's estimated from its size),
so `--workers 1000000` on a 50-line file runs in this process alone; `Listener.workers` hears the cap before any work.
A json key becomes part of an output's file name (`{prefix}_{key}_document`): one that could name a file outside
the output prefix's folder, or hold a control or separator character, is refused (`check_json_keys`) before
anything is written.

Inputs are untrusted: a line longer than `max_document_bytes` stops the run naming its file and line
(memory stays bounded whatever the compression ratio, see pipeline.py), a cut-short or damaged
archive of any kind is refused, folders and globs give each file once and never bsops' own side
files (inputs.py), and two inputs that are the same file or would write the same output are refused
before anything is written.

When the backend is fastokens, about `check_fraction` of the text is also encoded by the
reference tokenizer (tiktoken, or tokenizers) and compared; a difference stops the run, naming the
file and line, and writes nothing. For inputs under SMALL_INPUT_BYTES, `auto` takes tiktoken: its
build takes 0.05 s from the user cache where fastokens' takes 0.26 s, more than tiktoken needs to
tokenize such a file (the bytes are the same).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import os
import re
import time
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path

from bigscience_ops.data import dataset_record, inputs as inputs_mod
from bigscience_ops.data.encode import LINE_PROBLEMS, PROBLEM_KINDS, LineProblem
from bigscience_ops.data.errors import DataError, InputConflictError, NotCorpusError, TokenizerError
from bigscience_ops.data.inputs import MAX_DOCUMENT_BYTES
from bigscience_ops.data.pipeline import CHUNK_BYTES, EncodeSettings, PreprocessProgress, Run, cross_checked
from bigscience_ops.data.shards import (KEEP_PROBLEMS, Shard, ShardStats, finished, output_prefix_for, plan_shards,
                                        remove_stale_temporaries)
from bigscience_ops.data.tokenizer import Tokenizer, TokenizerSpec

__all__ = ["preprocess", "PreprocessResult", "Limits", "Listener", "PreprocessProgress", "LineProblem", "output_prefix_for",
           "PROBLEM_KINDS", "CHUNK_BYTES", "CHECK_FRACTION", "MAX_DOCUMENT_BYTES"]

CHECK_FRACTION = 0.01  # of a fastokens run's text re-encoded with the reference tokenizer
SMALL_INPUT_BYTES = 4 << 20  # below this (decompressed, estimated), auto takes tiktoken over fastokens
COMPRESSED_RATIO = 4  # estimated decompressed / on-disk size of compressed text
SHARD_MODE_BUSY = 0.9  # whole shards to workers when a longest-first schedule keeps them this busy
COMPRESSED_MAX_RATIO = 64  # a compressed input's work is estimated at up to this ratio (text compresses 3-10x)
JSON_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
JSON_KEY_ALLOWED = ("allowed: 1-100 ASCII letters, digits, '_', '-' and '.', starting with a letter, digit or '_' "
                    "(each key names an output file PREFIX_KEY_document.bin, in the output prefix's folder)")


class BadJsonKey(DataError):
    """A json key that cannot be part of an output's file name (it would leave the prefix's folder, or hide)."""

    def __init__(self, key: str) -> None:
        self.key = key
        shown = repr(key) if len(key) <= 60 else f"{key[:40]!r}... ({len(key)} characters)"
        super().__init__(f"json key {shown}: {JSON_KEY_ALLOWED}")

    def __reduce__(self):
        return type(self), (self.key,)


def check_json_keys(keys) -> tuple[str, ...]:
    """The keys, when each can be part of an output file's name (JSON_KEY); BadJsonKey for the first that cannot."""
    keys = tuple(keys)
    for key in keys:
        if not isinstance(key, str) or not JSON_KEY.fullmatch(key):
            raise BadJsonKey(str(key))
    return keys


@dataclass(frozen=True)
class Workers:
    """How many worker processes a run starts: the number asked, capped at the cores and at the pieces of work."""

    asked: int
    used: int
    cores: int  # this process may run on (os.sched_getaffinity), as nproc counts them
    pieces: int  # of work the pending inputs give: chunks of CHUNK_BYTES (at least one per input)

    @property
    def capped(self) -> bool:
        return self.used < self.asked

    def line(self) -> str:
        return (f"--workers {self.asked} capped to {self.used}: this machine has {self.cores} core(s) and the input "
                f"gives {self.pieces} piece(s) of work (a chunk of lines, or a whole input, each)")


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as nproc counts them), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cap_workers(asked: int, shards: list[Shard]) -> Workers:
    """`asked` capped at the cores and at the pieces of work `shards` give (at least 1 worker)."""
    from bigscience_ops.data import pipeline

    chunk = pipeline.CHUNK_BYTES  # read now: tests make chunks smaller
    pieces = sum(max(1, math.ceil(s.size * (COMPRESSED_MAX_RATIO if inputs_mod.compression(s.path) else 1) / chunk))
                 for s in shards)
    cores = available_cores()
    return Workers(asked, max(1, min(asked, cores, pieces)), cores, pieces)


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
    problems: list[LineProblem]  # the first KEEP_PROBLEMS
    problems_file: str | None
    seconds: float
    cross_checked: int = 0  # documents re-encoded with the reference tokenizer, all identical
    reference: str | None = None  # that tokenizer's name; None when the run was not cross-checked
    shard_outputs: list[str] = dataclasses.field(default_factory=list)  # per-input parts' prefixes
    shards: int = 1
    resumed: int = 0  # shards whose finished part was kept from an earlier run
    mode: str = "chunks"  # how the work was spread: sequential, chunks or shards (resumed: nothing left)
    startup_cpu_s: float = 0.0  # this process's CPU time (from its start) when the first chunk was handed out
    problems_unlisted: int = 0  # counted in problem_counts but not in the problems file (too many to list)
    workers: Workers | None = None  # the worker processes asked for and used (1: this process alone)

    @property
    def lines_dropped(self) -> int:
        """Lines that gave no document for any key (an empty document drops only its own key's)."""
        return sum(n for kind, n in self.problem_counts.items() if kind in LINE_PROBLEMS)


# --- the run ---------------------------------------------------------------------------------

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


def _written(shard: Shard, keys: tuple[str, ...]) -> list[Path]:
    """The files a shard's part is published as."""
    files = [Path(f"{output_prefix_for(shard.part, k)}{ext}") for k in keys for ext in (".bin", ".idx")]
    files += [dataset_record.record_path(output_prefix_for(shard.part, k)) for k in keys]  # when final
    return files + [shard.problems_path] + ([shard.record_path] if shard.recorded else [])


def _final_outputs(shards: list[Shard], output_prefix: str, per_input: bool,
                   keys: tuple[str, ...]) -> dict[str, tuple[str, list[int]]]:
    """Each dataset the run leaves (not a merge's parts): prefix -> (its key, the shards whose tokens it holds)."""
    if per_input:
        return {output_prefix_for(s.part, k): (k, [s.index]) for s in shards for k in keys}
    return {output_prefix_for(output_prefix, k): (k, [s.index for s in shards]) for k in keys}


def _max_id(prefix: str, key: str, stats: list[ShardStats], dtype) -> int | None:
    """The largest token id of a dataset of these shards' `key` tokens: their stats', or a scan where a part's
    record was written before bsops recorded it."""
    held = [s for s in stats if s.tokens_out.get(key)]
    if all(key in s.max_id for s in held):
        return max((s.max_id[key] for s in held), default=None)
    from bigscience_ops.data.dataset_record import scan_max_id

    return scan_max_id(Path(f"{prefix}.bin"), dtype)


def _check_outputs(paths: list[Path], shards: list[Shard], merged: str | None, keys: tuple[str, ...]) -> None:
    """No output is a folder, no two shards write one file, and no input is a file this run writes."""
    owner: dict[Path, Shard | None] = {}
    for shard in shards:
        for out in _written(shard, keys):
            other = owner.setdefault(out.resolve(), shard)
            if other is not shard:
                raise InputConflictError(other.path, shard.path, f"would both be written to {out}; each input "
                                         "needs outputs of its own (rename one, or give them in two runs)")
    written = [out for shard in shards for out in _written(shard, keys)]
    if merged is not None:
        merged_files = [Path(f"{merged}_problems.jsonl")]
        merged_files += [Path(f"{output_prefix_for(merged, k)}{ext}") for k in keys
                         for ext in (".bin", ".idx", dataset_record.SUFFIX)]
        for out in merged_files:
            if owner.get(out.resolve()) is not None:
                raise InputConflictError(owner[out.resolve()].path, merged, f"(a part, and the merged output) "
                                         f"would both be written to {out}; choose another --output-prefix")
        written += merged_files
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
    from bigscience_ops.data.tokenizer_cache import sha256_file

    files = [spec.json_file] if spec.kind == "json" else [spec.vocab_file, spec.merges_file]
    return {"tokenizer": [sha256_file(f) for f in files], "kind": spec.kind, "special_text": spec.special_text,
            "keys": list(keys), "append_eod": append_eod, "dtype": dtype}


@dataclass(frozen=True)
class Limits:
    """How much a run takes and checks: the longest document, and the share of the text cross-checked."""

    max_document_bytes: int = MAX_DOCUMENT_BYTES
    """The longest line taken (a longer one stops the run, naming its file and line)."""
    check_fraction: float = CHECK_FRACTION
    """About this share of a fastokens run's text is encoded again by the reference tokenizer and compared."""


@dataclass(frozen=True)
class Listener:
    """What a run tells its caller while it works (the CLI prints it); each is optional."""

    progress: Callable[[PreprocessProgress], None] | None = None
    """Hears the documents, bytes and shards done so far, as the run goes."""
    workers: Callable[[Workers], None] | None = None
    """Hears once, before any work, the worker processes asked for and used (see cap_workers)."""


def preprocess(
    inputs: list[str | os.PathLike],
    output_prefix: str,
    tokenizer: TokenizerSpec,
    json_keys: tuple[str, ...] = ("text",),
    append_eod: bool = True,
    workers: int = 1,
    strict: bool = False,
    output_per_input: bool = False,
    *,
    limits: Limits = Limits(),
    listener: Listener = Listener(),
) -> PreprocessResult:
    """Tokenize jsonl files, folders of them or globs into indexed datasets; see the module docstring."""
    start = time.monotonic()
    check_fraction, max_document_bytes = limits.check_fraction, limits.max_document_bytes
    paths = inputs_mod.expand_inputs(list(inputs))
    if not paths:
        raise DataError("preprocess needs at least one input file; got none")
    for p in paths:
        odd = inputs_mod.not_a_file(p)
        if odd is not None and odd[0] == "missing":
            raise DataError(f"input {p} does not exist or is not a file")
        if odd is not None:
            raise NotCorpusError(str(p), odd[0], f"does not exist or is not a file: it is {odd[1]}")
    if max_document_bytes < 1:
        raise DataError(f"the maximum document size must be at least 1 byte; got {max_document_bytes}")
    json_keys = check_json_keys(json_keys)  # before any name is built from them
    if not json_keys or len(set(json_keys)) != len(json_keys):
        raise DataError(f"json keys must be distinct and at least one; got {list(json_keys)}")
    if workers < 1:
        raise DataError(f"workers must be >= 1; got {workers}")
    if not 0.0 <= check_fraction <= 1.0:
        raise DataError(f"cross-check fraction must be between 0 and 1; got {check_fraction}")
    shards = plan_shards(paths, output_prefix, output_per_input)
    merged = not output_per_input and len(shards) > 1
    _check_outputs(paths, shards, output_prefix if merged else None, json_keys)
    tok = _choose_tokenizer(tokenizer, paths)
    if append_eod and tok.eod is None:
        raise DataError(f"--append-eod needs an end-of-document token {'<|endoftext|>'!r}, "
                        f"which tokenizer {tok.name} lacks")
    from bigscience_ops.data.indexed import best_fitting_dtype
    from bigscience_ops.data.tokenizer import reference_tokenizer

    reference = reference_tokenizer(tokenizer).name if cross_checked(tok, check_fraction) else None
    dtype = best_fitting_dtype(tok.vocab_size)
    settings = _settings(tokenizer, json_keys, append_eod, dtype.str)
    stats: dict[int, ShardStats] = {}
    for shard in shards:
        done = finished(shard, settings, json_keys)
        if done is not None:
            stats[shard.index] = done
    resumed = len(stats)
    pending = [s for s in shards if s.index not in stats]
    capped = cap_workers(workers, pending)
    if listener.workers is not None:
        listener.workers(capped)
    workers = capped.used
    if not pending:
        mode = "resumed"
    elif workers == 1:
        mode = "sequential"
    elif len(pending) > 1 and _busy_fraction([s.size for s in pending], workers) >= SHARD_MODE_BUSY:
        mode = "shards"
    else:
        mode = "chunks"
    outputs = _final_outputs(shards, output_prefix, output_per_input, json_keys)
    for prefix, (_, indices) in outputs.items():  # rewritten by this run (their record goes as they are replaced)
        if merged or any(i not in stats for i in indices):
            remove_stale_temporaries(prefix)  # a killed run's record (or dataset) not yet renamed
    run = Run(shards, stats, tok, reference, dtype, json_keys, strict, settings, listener.progress,
               output_prefix if merged else None)
    encode = EncodeSettings(dataclasses.replace(tokenizer, backend=tok.backend), json_keys, append_eod, dtype.str,
                            check_fraction, max_document_bytes)
    try:
        if mode == "shards":
            run.in_workers(pending, workers, encode)
        else:
            run.by_chunks(pending, workers, encode)
        run.finish()
    except BaseException:
        run.abort()
        raise
    for prefix, (key, indices) in outputs.items():  # last: the .bin/.idx are final
        dataset_record.write(prefix, dataset_record.identity(settings),
                             _max_id(prefix, key, [stats[i] for i in indices], dtype))
    total = ShardStats()
    for s in stats.values():
        total.lines += s.lines
        total.bytes_in += s.bytes_in
        total.cross_checked += s.cross_checked
        total.unlisted += s.unlisted
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
        mode=mode, startup_cpu_s=run.startup_cpu_s, problems_unlisted=total.unlisted, workers=capped)


