"""Token ids equal Megatron's GPT-2 BPE and transformers' GPT2TokenizerFast, on every backend and file kind.

Special-token text (`<|endoftext|>` inside a document) is plain text by default, as Megatron's;
with special_text="token" it is the EOD id, as GPT2TokenizerFast's default.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bigscience_ops.data.errors import TokenizerError
from bigscience_ops.data.tokenizer import (PROBE_TEXT, CrossCheck, FastokensTokenizer, HFTokenizer,
                                           TiktokenTokenizer, TokenizerSpec, build_tokenizer,
                                           reference_tokenizer, resolve_tokenizer)

FAST = {"auto": FastokensTokenizer, "fastokens": FastokensTokenizer, "tiktoken": TiktokenTokenizer,
        "tokenizers": HFTokenizer}

TEXTS = [
    "Hello, world!",
    "",
    " ",
    "    ",
    "\n\n\n",
    "trailing spaces   ",
    "  two leading, tabs\t\tand\nnewlines\r\n\r\n end",
    "It's we'll they're I'd you've I'M DON'T",
    "naïve café résumé Straße façade Ærø",
    "Ελληνικά русский язык 中文 日本語 한국어 العربية עברית हिन्दी ไทย",
    "emoji 😀😃🎉 👩‍👩‍👧‍👦 family 🇫🇷🇯🇵 flags 👍🏽 skin",
    "numbers 1234567890 3.14159 1,000,000 -42 1e-9 0x1F",
    "def f(x):\n    return x ** 2  # comment\n\tif a&&b: c[0]={'k': 1}",
    "\u00a0nbsp \u2003em-space \u3000ideographic \u200bzero-width \u2028line-sep",
    "a" * 500,
    "   " * 50 + "x",
    "<|endoftext|> special in text <|endoftext|>",
    "URL https://example.com/a?b=c&d=e#f mail x.y@z.org",
    "ok\x00null\x01control\x7fdel",
    PROBE_TEXT,
]


@pytest.mark.parametrize("special_text", ["plain", "token"])
@pytest.mark.parametrize("backend", list(FAST))
def test_gpt2_ids_equal_gpt2tokenizerfast(gpt2_files, hf_gpt2, hf_gpt2_plain, backend, special_text):
    tok = build_tokenizer(TokenizerSpec("gpt2-bpe", *gpt2_files, backend=backend, special_text=special_text))
    assert isinstance(tok, FAST[backend]) and tok.backend == FAST[backend].backend  # auto: the fastest
    assert tok.vocab_size == 50257 and tok.eod == 50256
    reference = hf_gpt2_plain if special_text == "plain" else hf_gpt2
    for text in TEXTS:
        assert tok.encode(text) == reference(text)["input_ids"], repr(text[:40])
        assert tok.encode_array(text).tolist() == reference(text)["input_ids"]
    ids, lengths = tok.encode_batch(TEXTS)  # the batch call: one flat array and each text's length
    assert ids.dtype == np.uint32 and lengths.tolist() == [len(reference(t)["input_ids"]) for t in TEXTS]
    assert ids.tolist() == [i for t in TEXTS for i in reference(t)["input_ids"]]


def test_plain_special_text_equals_megatrons_pure_python_bpe(gpt2_files, megatron_gpt2):
    tok = build_tokenizer(TokenizerSpec("gpt2-bpe", *gpt2_files))
    for text in TEXTS:
        assert tok.encode(text) == megatron_gpt2.encode(text), repr(text[:40])
    inside = tok.encode("a <|endoftext|> b")
    assert tok.eod not in inside and len(inside) > 3  # plain text, not the EOD id
    token = build_tokenizer(TokenizerSpec("gpt2-bpe", *gpt2_files, special_text="token"))
    assert token.encode("a <|endoftext|> b").count(tok.eod) == 1


@pytest.mark.parametrize("special_text", ["plain", "token"])
def test_tokenizer_json_of_gpt2_uses_fast_path(tmp_path, hf_gpt2, hf_gpt2_plain, special_text):
    path = tmp_path / "tokenizer.json"
    hf_gpt2.backend_tokenizer.save(str(path))
    slow = build_tokenizer(resolve_tokenizer(str(path), backend="tokenizers", special_text=special_text))
    reference = hf_gpt2_plain if special_text == "plain" else hf_gpt2
    for backend in ("auto", "tiktoken"):
        tok = build_tokenizer(resolve_tokenizer(str(path), backend=backend, special_text=special_text))
        assert isinstance(tok, FAST[backend])
        for text in TEXTS:
            assert tok.encode(text) == slow.encode(text) == reference(text)["input_ids"]


def test_tokenizer_json_with_normalizer_falls_back_to_tokenizers(tmp_path, hf_gpt2):
    path = tmp_path / "tokenizer.json"
    hf_gpt2.backend_tokenizer.save(str(path))
    cfg = json.loads(path.read_text())
    cfg["normalizer"] = {"type": "Lowercase"}
    path.write_text(json.dumps(cfg))
    tok = build_tokenizer(resolve_tokenizer(str(path)))
    assert not isinstance(tok, TiktokenTokenizer)  # fastokens runs a Lowercase normalizer, tiktoken cannot
    assert tok.encode("Hello WORLD") == hf_gpt2("hello world")["input_ids"]
    with pytest.raises(TokenizerError, match="normalizer"):
        build_tokenizer(resolve_tokenizer(str(path), backend="tiktoken"))
    # The cross-check reference of such a tokenizer is tokenizers itself.
    assert isinstance(reference_tokenizer(resolve_tokenizer(str(path))), HFTokenizer)


def _clear_process_caches() -> None:
    from bigscience_ops.data.tokenizer import _backend, _probed

    for cached in (build_tokenizer, reference_tokenizer, _probed, _backend):
        cached.cache_clear()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """build_tokenizer caches per spec and on disk: a test that breaks a backend probes afresh, in a
    cache folder of its own, and leaves its choice behind in neither."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _clear_process_caches()
    yield
    _clear_process_caches()


def test_a_tokenizer_fastokens_cannot_load_falls_back(tmp_path, hf_gpt2, monkeypatch, fresh_cache):
    import fastokens

    def refuse(_json: str) -> None:
        raise ValueError("unsupported pre-tokenizer Metaspace")

    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", staticmethod(refuse))
    path = tmp_path / "tokenizer.json"
    hf_gpt2.backend_tokenizer.save(str(path))
    assert isinstance(build_tokenizer(resolve_tokenizer(str(path))), TiktokenTokenizer)
    with pytest.raises(TokenizerError, match="fastokens cannot reproduce this tokenizer .*Metaspace"):
        build_tokenizer(resolve_tokenizer(str(path), backend="fastokens"))


def test_a_backend_that_fails_the_probe_is_not_used(gpt2_files, monkeypatch, fresh_cache):
    spec = TokenizerSpec("gpt2-bpe", *gpt2_files, special_text="plain")
    real = FastokensTokenizer.encode
    monkeypatch.setattr(FastokensTokenizer, "encode", lambda self, text: real(self, text)[:-1])
    assert isinstance(build_tokenizer(spec), TiktokenTokenizer)
    with pytest.raises(TokenizerError, match="fastokens's ids differ from tokenizers' on the probe text"):
        build_tokenizer(TokenizerSpec("gpt2-bpe", *gpt2_files, backend="fastokens"))


def test_cross_check_samples_the_text_and_finds_a_difference(gpt2_files):
    spec = TokenizerSpec("gpt2-bpe", *gpt2_files)
    tok, ref = build_tokenizer(spec), reference_tokenizer(spec)
    assert isinstance(tok, FastokensTokenizer) and isinstance(ref, TiktokenTokenizer)
    texts = [f"document {i}: " + "word " * (i % 50) for i in range(2000)]
    ids, lengths = tok.encode_batch(texts)
    check = CrossCheck(ref, 0.05)
    assert check.first_mismatch(texts, ids, lengths) is None
    share = check.checked / check.seen
    assert 0.05 <= share < 0.06 and 50 < check.documents < 200  # about 5% of the characters, spread out
    assert CrossCheck(ref, 0.0).first_mismatch(texts, ids, lengths) is None
    # A wrong id in a document the check picks (the first always is) is found, with where it differs.
    bad = ids.copy()
    bad[lengths[0] - 1] += 1
    index, detail = CrossCheck(ref, 0.05).first_mismatch(texts, bad, lengths)
    assert index == 0 and f"first difference at id {lengths[0] - 1}" in detail
    with pytest.raises(TokenizerError, match="between 0 and 1"):
        CrossCheck(ref, 1.5)


@pytest.mark.parametrize("special_text", ["plain", "token"])
def test_bundled_tokenizer_backends_agree(repo_root, special_text):
    path = repo_root / "corpus" / "tokenizer.json"
    slow = build_tokenizer(resolve_tokenizer(str(path), backend="tokenizers", special_text=special_text))
    assert isinstance(slow, HFTokenizer) and slow.eod is not None
    for backend in ("fastokens", "tiktoken"):
        fast = build_tokenizer(resolve_tokenizer(str(path), backend=backend, special_text=special_text))
        assert isinstance(fast, FAST[backend]) and fast.eod == slow.eod
        for text in TEXTS:
            assert fast.encode(text) == slow.encode(text)


def test_resolve_tokenizer_forms(tmp_path, gpt2_dir, gpt2_files):
    assert resolve_tokenizer("gpt2").kind == "gpt2-bpe"
    assert resolve_tokenizer(str(gpt2_dir)).vocab_file == str(gpt2_dir / "vocab.json")
    assert resolve_tokenizer(None, *gpt2_files).merges_file == gpt2_files[1]
    with pytest.raises(TokenizerError, match="neither"):
        resolve_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(TokenizerError, match="no tokenizer"):
        resolve_tokenizer(None)
    with pytest.raises(TokenizerError, match="backend"):
        TokenizerSpec("gpt2-bpe", *gpt2_files, backend="fast")
    with pytest.raises(TokenizerError, match="special_text"):
        TokenizerSpec("gpt2-bpe", *gpt2_files, special_text="eod")


def test_non_byte_level_tokens_keep_the_tiktoken_path_off():
    from bigscience_ops.data.tokenizer import _ranks_from_vocab_merges, bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    ranks, _ = _ranks_from_vocab_merges(vocab, [], set())
    assert sorted(ranks) == [bytes([b]) for b in range(256)] and ranks[b"!"] == vocab["!"]
    for bad in ("a b", "中"):  # a raw space, a character outside the byte alphabet
        reason = _ranks_from_vocab_merges({**vocab, bad: 256}, [], set())
        assert isinstance(reason, str) and repr(bad) in reason
