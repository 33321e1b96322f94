"""One part per input shard, written atomically and recorded, so an interrupted run resumes shard by shard.

Each input file is a shard, and each shard's tokens go to a part: `PART_KEY_document.bin/.idx` per
json key, `PART_problems.jsonl` when it had unusable lines, and last `PART.preprocess.json`, the
record that says the part is complete: the input's path, size and mtime, the settings that shape
the bytes (tokenizer files' sha256, keys, EOD, special text, dtype) and the part's counts. A shard
is done when its record matches its input and the run's settings; a changed shard, or a run with
another tokenizer, redoes it. Where the parts are:

  - one input, one output: the part is the output itself (no part record: there is nothing to resume);
  - `--output-per-input`: the part of `DIR/en_00.jsonl.gz` is `PREFIX_en_00` (the shard's file name
    without its .jsonl/.json and compression suffixes), next to its record;
  - several inputs, one output: `PREFIX.shards/en_00-HASH` (HASH: of the input's path), appended in
    input order to `PREFIX_KEY_document` and removed once the merged output is in place.

Every final output also gets its own record, `PREFIX.dataset.json` (dataset_record.py). Either record
says how a dataset was made when it is merged later: `merge_checked` refuses datasets whose records
name other tokenizer files, special text or token dtype, and names the datasets that have no record
(Megatron's) since their tokenizer cannot be compared; their token dtype still is (from the .idx).
The merged dataset gets its own record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from bigscience_ops.data import dataset_record as own_record
from bigscience_ops.data.encode import Encoded, LineProblem
from bigscience_ops.data.errors import (BadInputError, DataError, DocumentTooLargeError, IncompatibleDatasetsError,
                                        InputConflictError, TokenizerError)
from bigscience_ops.data.indexed import IndexedDataset, IndexedDatasetWriter
from bigscience_ops.data.inputs import shard_stem

RECORD_FORMAT = 1
RECORD_MAX_BYTES = 16 << 20  # a larger file named like a record is not one of ours
KEEP_PROBLEMS = 100  # problems kept in a part's record and in the run's result
LISTED_PER_SHARD = 1_000_000  # problems a part's problems file lists (~150 MB); more are counted only


def output_prefix_for(output_prefix: str, key: str) -> str:
    """Megatron's naming: `{prefix}_{key}_document`."""
    return f"{output_prefix}_{key}_document"


@dataclasses.dataclass(frozen=True)
class Shard:
    index: int  # in input order
    path: str
    size: int  # on disk
    mtime_ns: int
    part: str  # the part's prefix: its outputs are output_prefix_for(part, key)
    recorded: bool  # whether the part gets a record (and so can be resumed)

    @property
    def record_path(self) -> Path:
        return Path(f"{self.part}.preprocess.json")

    @property
    def problems_path(self) -> Path:
        return Path(f"{self.part}_problems.jsonl")


@dataclasses.dataclass
class ShardStats:
    """What a part holds (kept in its record, so a resumed run still reports every shard)."""

    lines: int = 0
    bytes_in: int = 0
    docs_out: dict[str, int] = dataclasses.field(default_factory=dict)
    tokens_out: dict[str, int] = dataclasses.field(default_factory=dict)
    problem_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    problems: list[LineProblem] = dataclasses.field(default_factory=list)  # the first KEEP_PROBLEMS
    cross_checked: int = 0
    unlisted: int = 0  # problems counted but not in the problems file (over LISTED_PER_CHUNK or LISTED_PER_SHARD)
    max_id: dict[str, int] = dataclasses.field(default_factory=dict)  # per key, the largest token id written


def work_folder(output_prefix: str) -> Path:
    return Path(f"{output_prefix}.shards")


def plan_shards(paths: list[Path], output_prefix: str, per_input: bool) -> list[Shard]:
    """Each input's part (see the module docstring); two inputs that would share an output are an error."""
    shards = []
    seen: dict[str, Path] = {}
    for i, path in enumerate(paths):
        st = path.stat()
        stem = shard_stem(path)
        if per_input:
            part = f"{output_prefix}_{stem}"
            if stem in seen:
                raise InputConflictError(str(seen[stem]), str(path), f"would both be written to {part}_*; with "
                                         "--output-per-input each input's file name (without suffixes) must be unique")
            seen[stem] = path
        elif len(paths) == 1:
            part = output_prefix
        else:
            tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
            part = str(work_folder(output_prefix) / f"{stem}-{tag}")
        shards.append(Shard(i, str(path), st.st_size, st.st_mtime_ns, part, per_input or len(paths) > 1))
    return shards


def finished(shard: Shard, settings: dict, keys: tuple[str, ...]) -> ShardStats | None:
    """The stats of a shard's part when its record matches the input and the settings, else None."""
    if not shard.recorded:
        return None
    try:
        if not shard.record_path.is_file() or shard.record_path.stat().st_size > RECORD_MAX_BYTES:
            return None  # a FIFO there would block the read; a huge file is not a record of ours
        record = json.loads(shard.record_path.read_text(encoding="utf-8"))
        if (record.get("format") != RECORD_FORMAT or record["input"] != str(Path(shard.path).resolve())
                or record["size"] != shard.size or record["mtime_ns"] != shard.mtime_ns
                or record["settings"] != settings):
            return None
        for key in keys:
            prefix = output_prefix_for(shard.part, key)
            if Path(f"{prefix}.bin").stat().st_size != record["bin_bytes"][key] or not Path(f"{prefix}.idx").is_file():
                return None
        stats = record["stats"]
        stats["problems"] = [LineProblem(**p) for p in stats["problems"]]
        return ShardStats(**stats)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_stale_temporaries(part: str) -> None:
    """Temporary files a killed run left for this part (their process is gone)."""
    folder, name = os.path.split(part)
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return
    for entry in entries:
        head, sep, pid = entry.rpartition(".tmp-")
        if not (sep and pid.isdigit() and head.startswith(name)):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            Path(folder or ".", entry).unlink(missing_ok=True)
        except OSError:
            pass


class ShardSink:
    """Writes one shard's part from its chunks' results, in order; `finish` publishes it, record last."""

    def __init__(self, shard: Shard, keys: tuple[str, ...], dtype: np.dtype, settings: dict, strict: bool,
                 tokenizer_names: tuple[str, str | None]) -> None:
        self.shard, self.keys, self.settings, self.strict = shard, keys, settings, strict
        self.names = tokenizer_names
        if shard.recorded:
            shard.record_path.unlink(missing_ok=True)  # the part is no longer known to be complete
            remove_stale_temporaries(shard.part)
        Path(shard.part).parent.mkdir(parents=True, exist_ok=True)
        self.writers = {key: IndexedDatasetWriter(output_prefix_for(shard.part, key), dtype) for key in keys}
        self.stats = ShardStats()
        self._problems_tmp = Path(f"{shard.problems_path}.tmp-{os.getpid()}")
        self._problems_file = None
        self._listed = 0

    def add(self, encoded: Encoded, bytes_in: int) -> None:
        """Append a chunk's documents; its unusable lines are counted and listed (or stop a strict run)."""
        base = self.stats.lines + 1
        if encoded.mismatch is not None:
            p = encoded.mismatch
            tok, reference = self.names
            raise TokenizerError(
                f"{p.path}:{base + p.line}: the {tok} tokenizer and the reference {reference} disagree on this "
                f"document ({p.detail}); nothing was written. Rerun with --tokenizer-backend tiktoken or "
                "tokenizers, and report the line to fastokens.")
        if encoded.too_large is not None:
            line, limit = encoded.too_large
            raise DocumentTooLargeError(self.shard.path, base + line, limit)
        self.stats.cross_checked += encoded.checked
        if self.strict and encoded.problems:
            p = encoded.problems[0]
            raise BadInputError(p.path, base + p.line, p.kind, p.detail)
        for kind, n in encoded.counts.items():
            self.stats.problem_counts[kind] = self.stats.problem_counts.get(kind, 0) + n
        listed = 0
        for p in encoded.problems:
            if self._listed + listed >= LISTED_PER_SHARD:
                break
            line = base + p.line
            if self._problems_file is None:
                self._problems_file = open(self._problems_tmp, "w", encoding="utf-8")
            if len(self.stats.problems) < KEEP_PROBLEMS:
                self.stats.problems.append(dataclasses.replace(p, line=line))
            # A plain dict, not dataclasses.asdict: a corpus can have millions of empty documents.
            self._problems_file.write(json.dumps({"path": p.path, "line": line, "kind": p.kind,
                                                  "detail": p.detail}) + "\n")
            listed += 1
        self._listed += listed
        self.stats.unlisted += sum(encoded.counts.values()) - listed
        for key, writer in self.writers.items():
            tokens = encoded.tokens[key]
            if isinstance(tokens, str):  # a worker's spill file: copied by the kernel
                writer.add_file(tokens, encoded.sizes[key])
                os.unlink(tokens)
            else:
                writer.add_documents(tokens, encoded.sizes[key])
        for key, high in encoded.max_id.items():
            self.stats.max_id[key] = max(high, self.stats.max_id.get(key, high))
        self.stats.lines += encoded.lines
        self.stats.bytes_in += bytes_in

    def finish(self) -> ShardStats:
        self.stats.docs_out = {k: w.num_docs for k, w in self.writers.items()}
        self.stats.tokens_out = {k: w.num_tokens for k, w in self.writers.items()}
        for key, writer in self.writers.items():
            own_record.remove(output_prefix_for(self.shard.part, key))  # it describes the dataset replaced now
            writer.finalize()
        if self._problems_file is not None:
            self._problems_file.close()
            os.replace(self._problems_tmp, self.shard.problems_path)
        else:
            self.shard.problems_path.unlink(missing_ok=True)
        if self.shard.recorded:
            bin_bytes = {k: Path(f"{output_prefix_for(self.shard.part, k)}.bin").stat().st_size for k in self.keys}
            stats = dataclasses.asdict(self.stats)
            record = {"format": RECORD_FORMAT, "input": str(Path(self.shard.path).resolve()),
                      "size": self.shard.size, "mtime_ns": self.shard.mtime_ns, "settings": self.settings,
                      "bin_bytes": bin_bytes, "stats": stats}
            tmp = Path(f"{self.shard.record_path}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(record), encoding="utf-8")
            os.replace(tmp, self.shard.record_path)
        return self.stats

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()
        if self._problems_file is not None:
            self._problems_file.close()
        self._problems_tmp.unlink(missing_ok=True)


class Merger:
    """Appends finished parts, in input order, into the run's one output per key (several inputs, one output)."""

    def __init__(self, output_prefix: str, keys: tuple[str, ...], dtype: np.dtype) -> None:
        self.output_prefix, self.keys = output_prefix, keys
        remove_stale_temporaries(output_prefix)  # a killed run's merge
        self.writers = {key: IndexedDatasetWriter(output_prefix_for(output_prefix, key), dtype) for key in keys}
        self.problems_path = Path(f"{output_prefix}_problems.jsonl")
        self._problems_tmp = Path(f"{self.problems_path}.tmp-{os.getpid()}")
        self._problems = open(self._problems_tmp, "wb")
        self.any_problems = False
        self._bytes = dict.fromkeys(keys, 0)

    def append(self, shard: Shard) -> None:
        for key, writer in self.writers.items():
            prefix = output_prefix_for(shard.part, key)
            writer.add_file(f"{prefix}.bin", IndexedDataset(prefix).sizes)
            self._bytes[key] += Path(f"{prefix}.bin").stat().st_size
        if shard.problems_path.is_file():
            import shutil

            with open(shard.problems_path, "rb") as src:
                shutil.copyfileobj(src, self._problems)
            self.any_problems = True

    def finish(self, work: Path) -> None:
        """Publish the merged outputs, then remove the parts (their bytes are in the outputs now)."""
        for key, writer in self.writers.items():
            own_record.remove(output_prefix_for(self.output_prefix, key))  # it describes the dataset replaced now
            writer.finalize()
            merged = Path(f"{output_prefix_for(self.output_prefix, key)}.bin").stat().st_size
            if merged != self._bytes[key]:  # the parts stay for the next run
                raise DataError(f"merged {output_prefix_for(self.output_prefix, key)}.bin holds {merged} bytes, "
                                f"its parts in {work} {self._bytes[key]}; the parts were kept, rerun to merge again")
        self._problems.close()
        if self.any_problems:
            os.replace(self._problems_tmp, self.problems_path)
        else:
            self._problems_tmp.unlink()
            self.problems_path.unlink(missing_ok=True)
        import shutil

        shutil.rmtree(work, ignore_errors=True)

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()
        self._problems.close()
        self._problems_tmp.unlink(missing_ok=True)


def dataset_record(prefix: str) -> dict | None:
    """The record of the part dataset PREFIX (`PART_KEY_document`) was written as, when it describes this very
    .bin (its key among the record's and the size it recorded); None otherwise."""
    stem = os.fspath(prefix)
    if not stem.endswith("_document"):
        return None
    stem = stem[:-len("_document")]
    try:
        size = Path(f"{prefix}.bin").stat().st_size
    except OSError:
        return None
    cut = len(stem)
    while (cut := stem.rfind("_", 0, cut)) > 0:  # PART_KEY: either may hold underscores
        part, key = stem[:cut], stem[cut + 1:]
        path = Path(f"{part}.preprocess.json")
        try:
            if not path.is_file() or path.stat().st_size > RECORD_MAX_BYTES:
                continue
            record = json.loads(path.read_text(encoding="utf-8"))
            settings = record["settings"]
            if (record.get("format") == RECORD_FORMAT and own_record.valid_settings(settings)
                    and key in settings["keys"]
                    and record["bin_bytes"][key] == size):
                return record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _tokenizer_of(settings: dict) -> str:
    return f"{settings['kind']} files sha256 {', '.join(str(h)[:12] for h in settings['tokenizer'])}"


@dataclasses.dataclass(frozen=True)
class MergeResult:
    prefix: str  # the merged dataset
    unrecorded: list[str]  # inputs without a record: their tokenizer could not be compared
    ignored: list[str] = dataclasses.field(default_factory=list)  # why a file named like a record was not one
    record: str | None = None  # the merged dataset's record (dataset_record.py)


def made_with(prefix: str) -> tuple[dict | None, int | None | bool, str | None]:
    """How dataset PREFIX was made, from its records: (tokenizer identity and dtype as `settings`, its largest
    token id (False: not recorded), why a dataset record there was ignored). Its own record (PREFIX.dataset.json)
    first, then the record of the part it was written as."""
    own, why = own_record.read(prefix)
    if own is not None and own["tokenizer"] is not None:
        return {**own["tokenizer"], "dtype": own["dtype"]}, own["max_id"], None
    part = dataset_record(prefix)
    high = own["max_id"] if own is not None else False
    if part is None:
        return None, high, why
    if high is False:
        stats = part.get("stats")
        highs = stats.get("max_id") if isinstance(stats, dict) else None
        key = max((k for k in part["settings"]["keys"] if prefix.endswith(f"_{k}_document")), key=len, default=None)
        value = highs.get(key) if isinstance(highs, dict) else None
        high = value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else False
    return part["settings"], high, why


def merge_checked(prefixes: list[str], output_prefix: str) -> MergeResult:
    """Merge datasets (indexed.merge_datasets) after checking that their records agree on how they were made,
    then write the merged dataset's record (dataset_record.py): their tokenizer when every input has a record,
    and the largest of their token ids (a scan gives an input's that no record holds).

    IncompatibleDatasetsError when two records name other tokenizer files, special text or token dtype
    (or two .idx other dtypes); nothing is written then.
    """
    from bigscience_ops.data.indexed import merge_datasets

    found = {p: made_with(p) for p in prefixes}
    recorded = {p: settings for p, (settings, _, _) in found.items() if settings is not None}
    for field, value in (("tokenizers", _tokenizer_of), ("special texts", lambda s: s.get("special_text")),
                         ("token dtypes", lambda s: s["dtype"])):
        values = {p: value(s) for p, s in recorded.items()}
        if len(set(values.values())) > 1:
            raise IncompatibleDatasetsError(field, values)
    if os.path.abspath(output_prefix) not in {os.path.abspath(p) for p in prefixes}:  # else merge_datasets refuses
        own_record.remove(output_prefix)  # it describes the dataset replaced now
    out = merge_datasets(list(prefixes), output_prefix)
    highs = []
    for p, (_, high, _) in found.items():
        if high is False:
            high = own_record.scan_max_id(Path(f"{p}.bin"), IndexedDataset(p).dtype)
        if high is not None:
            highs.append(high)
    unrecorded = [p for p in prefixes if found[p][0] is None]
    tokenizer = own_record.identity(next(iter(recorded.values()))) if recorded and not unrecorded else None
    path = own_record.write(out, tokenizer, max(highs, default=None))
    return MergeResult(out, unrecorded, [why for _, _, why in found.values() if why is not None], str(path))
