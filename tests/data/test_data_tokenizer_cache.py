"""The tokenizer probe kept in the user cache: a second run builds only its backend; changes and damage re-probe."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bigscience_ops.data import tokenizer_cache
from bigscience_ops.data.tokenizer import (FastokensTokenizer, TiktokenTokenizer, _backend, _probed,
                                           build_tokenizer, reference_tokenizer, resolve_tokenizer)

TEXT = "Cache me if you can: ünïcödé 😀 <|endoftext|> and   spaces"


def _clear() -> None:
    for cached in (build_tokenizer, reference_tokenizer, _probed, _backend):
        cached.cache_clear()


@pytest.fixture
def small_tokenizer(tmp_path, repo_root):
    """A copy of the bundled 8192-token tokenizer.json: probed in a fraction of GPT-2's time."""
    path = tmp_path / "tokenizer.json"
    shutil.copy(repo_root / "corpus" / "tokenizer.json", path)
    return path


def _records(cache) -> list[dict]:
    return [json.loads(p.read_text()) for p in cache.glob("*.json") if not p.name.endswith(".tokenizer.json")]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache of this test's own, and no tokenizer left in this process's caches."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    _clear()
    yield tmp_path / "xdg" / "bsops" / "tokenizers"
    _clear()


def _fresh_process_build(tmp_path, tokenizer: str, backend: str) -> dict:
    """Build in a new process; which heavy modules it imported, and the ids it gives."""
    code = ("import json, sys\n"
            "from bigscience_ops.data.tokenizer import build_tokenizer, resolve_tokenizer\n"
            f"tok = build_tokenizer(resolve_tokenizer({tokenizer!r}, backend={backend!r}))\n"
            f"print(json.dumps({{'backend': tok.backend, 'ids': tok.encode({TEXT!r}),\n"
            "                   'imported': sorted(m for m in ('tokenizers', 'fastokens', 'tiktoken') if m in sys.modules)}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_a_second_run_reads_the_probe_from_the_user_cache_and_builds_only_its_backend(cache, tmp_path,
                                                                                      small_tokenizer):
    first = _fresh_process_build(tmp_path, str(small_tokenizer), "auto")
    assert first["backend"] == "fastokens" and "tokenizers" in first["imported"]  # probed against tokenizers
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 3 and entries[0].endswith(".json") and entries[1].endswith(".ranks")
    record = json.loads((cache / entries[0]).read_text())
    assert record["verdicts"] == {"fastokens": "ok", "tiktoken": "ok"} and record["eod"] == 0
    for backend, imported in (("auto", ["fastokens"]), ("tiktoken", ["tiktoken"])):
        again = _fresh_process_build(tmp_path, str(small_tokenizer), backend)
        assert again["ids"] == first["ids"] and again["imported"] == imported  # no tokenizers, no rebuild
    assert sorted(p.name for p in cache.iterdir()) == entries
    assert tokenizer_cache.cache_dir() == tmp_path / "xdg" / "bsops"


def test_a_changed_tokenizer_file_is_probed_again(cache, small_tokenizer):
    build_tokenizer(resolve_tokenizer(str(small_tokenizer)))
    assert len(_records(cache)) == 1
    # The last merge dropped: another tokenizer, another key; tiktoken no longer reproduces it.
    cfg = json.loads(small_tokenizer.read_text())
    cfg["model"]["merges"].pop()
    small_tokenizer.write_text(json.dumps(cfg))
    _clear()
    tok = build_tokenizer(resolve_tokenizer(str(small_tokenizer)))
    records = _records(cache)
    assert len(records) == 2 and isinstance(tok, FastokensTokenizer)
    assert sorted(r["verdicts"]["tiktoken"] == "ok" for r in records) == [False, True]


def test_a_damaged_entry_is_ignored_and_rebuilt(cache, small_tokenizer):
    spec = resolve_tokenizer(str(small_tokenizer), backend="tiktoken")
    want = build_tokenizer(spec).encode(TEXT)
    key = tokenizer_cache.key_of([str(small_tokenizer)], "json", "plain")
    entry = {p.name.split(".", 1)[1]: p.read_bytes() for p in cache.iterdir()}
    assert sorted(entry) == ["json", "ranks", "tokenizer.json"]
    for damaged in entry:
        path = cache / f"{key}.{damaged}"
        path.write_bytes(entry[damaged][: len(entry[damaged]) // 2] + b"\x00garbage")
        _clear()
        assert tokenizer_cache.load(key) is None, damaged
        tok = build_tokenizer(spec)
        assert isinstance(tok, TiktokenTokenizer) and tok.encode(TEXT) == want
        assert tokenizer_cache.load(key) is not None and path.read_bytes() == entry[damaged]  # written again, whole


def test_an_unwritable_cache_still_builds(cache, small_tokenizer, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    spec = resolve_tokenizer(str(small_tokenizer))
    tok = build_tokenizer(spec)
    assert isinstance(tok, FastokensTokenizer) and tok.encode(TEXT) == build_tokenizer(
        resolve_tokenizer(str(small_tokenizer), backend="tokenizers")).encode(TEXT)
    assert isinstance(reference_tokenizer(spec), TiktokenTokenizer)
