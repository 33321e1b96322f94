"""The data's pre-flight checks: what a launch would find wrong with the data, found before anything is written.

`check_data(exp, train_samples)` reads the experiment's inputs (never a run folder) and returns a DataCheck:
- every blend prefix's `.bin` and `.idx` exist, are readable and describe each other (indexed.IndexedDataset);
  the bundled corpus a launch builds when it is missing (corpus.ensure_data) is "built at launch", not an error;
- the tokenizer's files exist (kind gpt2-bpe: vocab_file and merges_file; json: json_file);
- the largest token id of each dataset is below the model's padded vocabulary (sizing.padded_vocab_size). A record
  is a claim, checked: the dataset's own record `PREFIX.dataset.json` (dataset_record.py: every dataset bsops
  writes has one) is read only as a regular file (a symbolic link there is refused, LinkedRecord), is bound to its
  data's content (binding.py), and the id it claims is borne out by a scan of the `.bin` once per file (numpy
  memmap in chunks: disk speed, bounded memory; kept in `PREFIX.maxid`, else in the user cache, keyed by the
  binding and the file's ctime, and signed with the user's own key: an edit with the mtime set back, or a cache
  someone else wrote, is scanned again). A record that is torn, hostile, whose counts differ from the .idx, that
  is bound to other data (a record copied beside changed data) or whose claim the scan refutes is not used, with
  a note, and the scan's id is the one checked (a refusal then names the record too). A part's
  `PART.preprocess.json` says which tokenizer made the data, never its largest id;
- the tokenizer the dataset was made with (the sha256 of its files, in either record) is the experiment's; a
  dataset without a record (Megatron's, or a merge of such) gets a note, since its tokenizer cannot be compared;
- how many times the run reads each blend entry's training documents (epochs, as the GPT dataset builds them:
  gpt_dataset.py, index_mappings.num_epochs_needed); more than one is a warning: the run repeats data.

Each error is a DataCheckError naming the field, the file and what is allowed, in one line. `refusal` is what
render and launch raise (DataRefused, listing them all). A record of another team's run (`record: true`) reads
data that lives on that team's cluster: its findings are warnings there, never a refusal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from bigscience_ops.data import binding
from bigscience_ops.data import dataset_record as own_record
from bigscience_ops.data.binding import cache_path, scan_max_id  # noqa: F401  (the pre-flight's cache and scan)
from bigscience_ops.data.errors import DataError
from bigscience_ops.schema import Experiment, TokenizerConfig
from bigscience_ops.sizing import padded_vocab_size

BUNDLED_DATASET = "tiny_text_document"  # the name corpus.ensure_data builds at launch (corpus.NAME's text key)


# ----------------------------------------------------------------------------- errors

class DataCheckError(DataError):
    """One thing wrong with the data a run would read: the field, the file and the problem, in one line."""

    def __init__(self, field: str, path: str, problem: str) -> None:
        self.field, self.path, self.problem = field, path, problem
        super().__init__(f"{field}: {path}: {problem}")

    def __reduce__(self):
        return type(self), (self.field, self.path, self.problem)


class MissingDataFile(DataCheckError):
    """A blend prefix's .bin or .idx (or the bundled corpus a launch would build it from) does not exist."""


class UnreadableDataFile(DataCheckError):
    """A dataset file exists but cannot be read, or the .bin and .idx do not describe each other."""


class MissingTokenizerFile(DataCheckError):
    """A file of data.tokenizer does not exist or cannot be read."""


class LinkedRecord(DataCheckError):
    """A dataset's record is a symbolic link: a record is read only as the regular file beside its data."""


class TokenIdBeyondVocab(DataCheckError):
    """A dataset holds a token id the model has no embedding row for."""


class OtherTokenizer(DataCheckError):
    """A dataset's record says it was made with other tokenizer files than the experiment's."""


class NoTrainingData(DataCheckError):
    """data.split leaves a dataset no training documents, or they hold too few tokens for a sample."""


class DataRefused(DataError):
    """The data checks found errors: render and launch refuse, and nothing is written."""

    def __init__(self, errors: list[DataCheckError]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(str(e) for e in self.errors))


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True)
class MaxId:
    value: int | None  # None: the dataset holds no token
    source: str  # "record PATH" (its PREFIX.dataset.json, its claim checked), "cache PATH", "scan", "scan, not
    # cached: why"


@dataclass(frozen=True)
class BlendEntry:
    """One blend entry as the run would read it."""

    index: int
    prefix: str
    state: str  # "ready", "built at launch" or "missing"
    documents: int = 0
    train_documents: int = 0
    train_tokens: int = 0
    samples: int = 0  # training samples the run asks of this entry (a blend asks 0.5% over its share)
    epochs: float = 0.0  # how many times those samples read the training documents
    index_epochs: int = 0  # the whole epochs the dataset's index is built of (Megatron's num_epochs)
    max_id: MaxId | None = None

    def line(self, seq_length: int) -> str:
        """The plan's line for this entry."""
        head = f"data.blend[{self.index}] {self.prefix}"
        if self.state != "ready":
            return f"{head}: {self.state}"
        return (f"{head}: {self.train_documents:,} of {self.documents:,} documents for training, "
                f"{self.train_tokens:,} tokens; {self.samples:,} samples x {seq_length} tokens read them "
                f"{self.epochs:.2f} times ({self.index_epochs} epoch(s) in the index)")


@dataclass(frozen=True)
class DataCheck:
    entries: list[BlendEntry] = field(default_factory=list)
    errors: list[DataCheckError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    record: bool = False  # the experiment is a record of another team's run: errors do not refuse

    @property
    def refusing(self) -> list[DataCheckError]:
        """The errors that refuse a launch (none for a record)."""
        return [] if self.record else self.errors

    def refusal(self) -> DataRefused | None:
        return DataRefused(self.refusing) if self.refusing else None


# ----------------------------------------------------------------------------- tokenizer

def tokenizer_files(tok: TokenizerConfig) -> list[tuple[str, str | None]]:
    """(field, path) of each file the tokenizer kind reads."""
    if tok.kind == "gpt2-bpe":
        return [("data.tokenizer.vocab_file", tok.vocab_file), ("data.tokenizer.merges_file", tok.merges_file)]
    return [("data.tokenizer.json_file", tok.json_file)]


def _readable(path: Path) -> str | None:
    """Why `path` is not a readable regular file, or None."""
    try:
        if not path.exists():
            return "does not exist"
        if not path.is_file():
            return "is not a regular file"
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None


def _check_tokenizer(tok: TokenizerConfig) -> tuple[list[DataCheckError], list[str] | None]:
    """The tokenizer's missing files, and the sha256 of its files when all are there (as preprocess records them)."""
    errors: list[DataCheckError] = []
    for name, path in tokenizer_files(tok):
        if path is None:  # a blank site value: the site check's to report
            return errors, None
        why = _readable(Path(path))
        if why is not None:
            allowed = ("kind gpt2-bpe reads vocab_file and merges_file" if tok.kind == "gpt2-bpe"
                       else "kind json reads json_file")
            errors.append(MissingTokenizerFile(name, path, f"{why}; {allowed}: give the path of an existing file"))
    if errors:
        return errors, None
    from bigscience_ops.data.tokenizer_cache import sha256_file

    return errors, [sha256_file(path) for _, path in tokenizer_files(tok)]


def _recorded_tokenizer(settings: dict) -> str:
    """The record's tokenizer as a message shows it; a record is untrusted: only short plain words get through."""
    kind, hashes = settings.get("kind"), settings.get("tokenizer")
    shown = [_plain(h)[:12] for h in hashes] if isinstance(hashes, list) else [_plain(hashes)]
    return f"{_plain(kind)} files sha256 {', '.join(shown[:4]) or 'none'}"


def _plain(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return "".join(ch for ch in text[:64] if ch.isalnum() or ch in "-_.") or "?"


# ----------------------------------------------------------------------------- largest token id

def max_token_id(prefix: str, dtype, bound: dict | None = None) -> MaxId:
    """The dataset's largest token id from a scan of its .bin, kept (binding.checked_max_id: beside the .idx, else in
    the user cache) for data with this binding. `bound`: the data's binding, when the caller computed it."""
    return MaxId(*binding.checked_max_id(prefix, dtype, bound))


# ----------------------------------------------------------------------------- the checks

def _bundled_build(prefix: Path) -> tuple[bool, list[Path]]:
    """Whether a launch builds `prefix` from the bundled corpus (corpus.ensure_data's rule, by the name alone), and
    its missing sources."""
    if prefix.name != BUNDLED_DATASET:
        return False, []
    from bigscience_ops.data import corpus  # numpy and the preprocess pipeline: only for the bundled corpus

    return True, [f for f in (corpus.CORPUS_FILE, corpus.TOKENIZER_FILE) if not f.is_file()]


def _epochs(entry: BlendEntry, sizes, split: str, samples: int, seq_length: int) -> BlendEntry | DataCheckError:
    from bigscience_ops.data.gpt_dataset import split_boundaries
    from bigscience_ops.data.index_mappings import num_epochs_needed

    first, end = split_boundaries(split, len(sizes))[:2]
    tokens = int(sizes[first:end].sum(dtype="int64"))
    field = f"data.blend[{entry.index}].prefix"
    if end <= first or tokens <= 1:
        return NoTrainingData(field, entry.prefix, f"data.split {split!r} leaves {end - first} training documents "
                                                   f"({tokens} tokens) of {len(sizes)}; a sample needs at least 2 "
                                                   "tokens: use more data or another split")
    return BlendEntry(entry.index, entry.prefix, "ready", len(sizes), end - first, tokens, samples,
                      (samples * seq_length + 1) / tokens, num_epochs_needed(tokens, seq_length, samples))


def check_data(exp: Experiment, train_samples: int) -> DataCheck:
    """The pre-flight checks of `exp`'s data for a run of `train_samples` training samples (the module docstring)."""
    errors: list[DataCheckError] = []
    warnings: list[str] = []
    notes: list[str] = []
    entries: list[BlendEntry] = []
    tok_errors, tok_hashes = _check_tokenizer(exp.data.tokenizer)
    errors += tok_errors
    m, p = exp.model, exp.parallel
    vocab = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, p.tensor)
    blend = exp.data.blend
    total_weight = sum(s.weight for s in blend)
    for i, source in enumerate(blend):
        field = f"data.blend[{i}].prefix"
        prefix = source.prefix
        samples = train_samples if len(blend) == 1 else math.ceil(train_samples * source.weight / total_weight * 1.005)
        files = [Path(f"{prefix}.bin"), Path(f"{prefix}.idx")]
        missing = [f for f in files if not f.exists()]
        if missing:
            bundled, sources = _bundled_build(Path(prefix))
            if bundled and not sources:
                entries.append(BlendEntry(i, prefix, "built at launch from the bundled corpus"))
                notes.append(f"{field}: {prefix}.bin/.idx will be built at launch from the bundled corpus")
                continue
            for f in sources or missing:
                what = "a bundled corpus file the launch builds the dataset from" if sources else "an indexed dataset"
                errors.append(MissingDataFile(field, str(f), f"does not exist; {what} needs it "
                                                             "(bsops preprocess writes PREFIX.bin and PREFIX.idx)"))
            entries.append(BlendEntry(i, prefix, "missing"))
            continue
        unreadable = [(f, why) for f in files if (why := _readable(f)) is not None]
        if unreadable:
            errors += [UnreadableDataFile(field, str(f), f"{why}; the run reads it") for f, why in unreadable]
            entries.append(BlendEntry(i, prefix, "missing"))
            continue
        from bigscience_ops.data.errors import DataFormatError
        from bigscience_ops.data.indexed import IndexedDataset
        from bigscience_ops.data.shards import dataset_record

        try:
            indexed = IndexedDataset(prefix)
        except (DataFormatError, OSError, ValueError) as exc:
            errors.append(UnreadableDataFile(field, f"{prefix}.idx", f"not a dataset the run can read: {exc}"))
            entries.append(BlendEntry(i, prefix, "missing"))
            continue
        counted = _epochs(BlendEntry(i, prefix, "ready"), indexed.sizes, exp.data.split, samples, m.seq_length)
        if isinstance(counted, DataCheckError):
            errors.append(counted)
            counted = BlendEntry(i, prefix, "ready", len(indexed.sizes))
        reading = own_record.inspect(prefix, indexed)  # the dataset's own record, its claims checked
        own = reading.record
        if reading.link:
            errors.append(LinkedRecord(
                field, str(own_record.record_path(prefix)), "is a symbolic link; a dataset's record is read only "
                "as the regular file bsops wrote beside its .bin/.idx (a link can name another dataset's record): "
                "replace the link with that file, or remove it (the .bin is then scanned)"))
        elif reading.why is not None:
            notes.append(f"{field}: {reading.why}; not used")
        record = dataset_record(prefix) if own is None else None  # its part's: which tokenizer made it
        try:
            high = (MaxId(*reading.max_id) if own is not None
                    else max_token_id(prefix, indexed.dtype, reading.binding))
        except OSError as exc:
            errors.append(UnreadableDataFile(field, f"{prefix}.bin", f"cannot be read ({exc.strerror or exc})"))
            high = None
        entries.append(BlendEntry(**{**counted.__dict__, "max_id": high}))
        del indexed
        if high is not None and high.value is not None and high.value >= vocab:
            where = "its record, checked" if high.source.startswith("record") else "a scan of the file"
            if own is None and reading.why is not None:
                where += f"; {reading.why}"  # the record that claimed otherwise, named
            errors.append(TokenIdBeyondVocab(
                field, f"{prefix}.bin", f"holds token id {high.value} ({where}); the model's vocabulary is "
                f"model.vocab_size {m.vocab_size} padded to {vocab} (make_vocab_size_divisible_by "
                f"{m.make_vocab_size_divisible_by} x TP {p.tensor}): ids must be below {vocab}. Preprocess the data "
                f"with the experiment's tokenizer, or set model.vocab_size to at least {high.value + 1}"))
        if own is not None and own["tokenizer"] is None:
            notes.append(f"{field}: {prefix} was merged from datasets some of which had no record: the tokenizer it "
                         "was made with is not known, so it was not compared with data.tokenizer")
        elif own is None and record is None:
            notes.append(f"{field}: {prefix} has no bsops record ({own_record.record_path(prefix).name}): the "
                         "tokenizer it was made with is not known, so it was not compared with data.tokenizer")
        elif tok_hashes is not None:
            settings = own["tokenizer"] if own is not None else record.get("settings")
            settings = settings if isinstance(settings, dict) else {}
            if settings.get("kind") != exp.data.tokenizer.kind or settings.get("tokenizer") != tok_hashes:
                ours = f"{exp.data.tokenizer.kind} files sha256 {', '.join(h[:12] for h in tok_hashes)}"
                errors.append(OtherTokenizer(
                    field, f"{prefix}.bin", f"was made with another tokenizer: its record names "
                    f"{_recorded_tokenizer(settings)}, data.tokenizer is {ours} "
                    f"({', '.join(str(path) for _, path in tokenizer_files(exp.data.tokenizer))}); preprocess the "
                    "data again with data.tokenizer, or set data.tokenizer to the files it was made with"))
        if counted.epochs > 1:
            warnings.append(f"{field}: the run reads {prefix}'s {counted.train_tokens:,} training tokens "
                            f"{counted.epochs:.2f} times: samples repeat (more data, or fewer train.samples)")
    if exp.record and errors:
        notes.append(f"{exp.name} is a record of another team's run: its data is on that team's cluster, so what "
                     "is missing here is shown, not refused")
    return DataCheck(entries, errors, warnings, notes, exp.record)
