"""The bundled corpus (corpus/kjv.jsonl.xz + corpus/tokenizer.json) built into .bin/.idx on demand.

The `tiny` experiment trains on `corpus/build/tiny_text_document`; `ensure_bundled_corpus` makes it
with no download (about a second), with its record (dataset_record.py), and rebuilds it when the
corpus or tokenizer file is newer or the record is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

from bigscience_ops.data.dataset_record import record_path
from bigscience_ops.data.errors import DataError
from bigscience_ops.data.indexed import exists, idx_path
from bigscience_ops.data.locks import build_lock
from bigscience_ops.data.preprocess import output_prefix_for, preprocess
from bigscience_ops.data.tokenizer import TokenizerSpec
from bigscience_ops.resources import bundled
from bigscience_ops.schema import Experiment

CORPUS_DIR = bundled("corpus")
CORPUS_FILE = CORPUS_DIR / "kjv.jsonl.xz"
TOKENIZER_FILE = CORPUS_DIR / "tokenizer.json"
NAME = "tiny"  # outputs tiny_text_document.bin/.idx


def default_build_dir() -> Path:
    return CORPUS_DIR / "build"


def bundled_tokenizer() -> TokenizerSpec:
    return TokenizerSpec("json", json_file=str(TOKENIZER_FILE))


def ensure_bundled_corpus(out_dir: str | os.PathLike) -> str:
    """Build OUT_DIR/tiny_text_document.bin/.idx from the bundled corpus if missing; return the prefix."""
    for f in (CORPUS_FILE, TOKENIZER_FILE):
        if not f.is_file():
            raise DataError(f"bundled corpus file {f} is missing; it is part of the repository "
                            "(regenerate with corpus/make_corpus.py and corpus/make_tokenizer.py)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = output_prefix_for(str(out / NAME), "text")
    sources_mtime = max(CORPUS_FILE.stat().st_mtime, TOKENIZER_FILE.stat().st_mtime)

    def up_to_date() -> bool:  # a build from before datasets had a record (dataset_record.py) is built again
        return (exists(prefix) and record_path(prefix).is_file()
                and idx_path(prefix).stat().st_mtime >= sources_mtime)

    with build_lock(out / f".{NAME}.lock", up_to_date) as build:  # several ranks may ask at once
        if build:
            preprocess([CORPUS_FILE], str(out / NAME), bundled_tokenizer(), ("text",),
                       append_eod=True, workers=1, strict=True)
    return prefix


def ensure_data(exp: Experiment) -> None:
    """Build the bundled corpus when the experiment trains on it; any other missing dataset is an error."""
    for i, source in enumerate(exp.data.blend):
        prefix = Path(source.prefix)
        if Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file():
            continue
        if prefix.name == "tiny_text_document":
            built = ensure_bundled_corpus(prefix.parent)
            if Path(built) != prefix:
                raise DataError(f"data.blend[{i}].prefix: got {source.prefix}; the bundled corpus builds {built}")
            continue
        raise DataError(f"data.blend[{i}].prefix: got {source.prefix}; no {prefix}.bin/.idx there "
                        "(preprocess the data first)")
