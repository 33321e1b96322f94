"""The data of the bundled KJV smoke tasks, for lm-eval's `custom_dataset`: their jsonl read from this folder.

lm-eval reads a task's `dataset_kwargs.data_files` against the folder it runs in, so a task file that names its
data relative to itself works only from its own folder. lm-eval imports a `!function` module from the task file's
folder, wherever it runs: `local_json` makes each relative data file absolute against this folder and loads it
with `datasets`' json builder, as `dataset_path: json` would. `bsops eval` hands it absolute paths already (and
datasets' cache folder, eval.hf_cache): they are kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _here(files: Any) -> Any:
    if isinstance(files, str):
        return files if "://" in files or os.path.isabs(files) else str(HERE / files)
    if isinstance(files, list):
        return [_here(f) for f in files]
    return {split: _here(f) for split, f in files.items()}


def local_json(data_files: Any, cache_dir: str | None = None, **_metadata: Any) -> Any:
    """The task's splits (a DatasetDict) from its jsonl files, relative ones read from this folder."""
    import datasets

    return datasets.load_dataset("json", data_files=_here(data_files), cache_dir=cache_dir)
