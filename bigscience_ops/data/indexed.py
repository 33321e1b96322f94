"""Megatron's `MMapIndexedDataset` file format: a `.bin` of token ids and an `.idx` describing it.

Layout of `PREFIX.idx` (little endian), as Megatron-DeepSpeed's `megatron/data/indexed_dataset.py`
reads it:

    9 bytes   magic b"MMIDIDX\\x00\\x00"
    u64       version, 1
    u8        dtype code of the tokens in .bin (see DTYPE_CODES)
    u64       N, number of items (here: one item per document)
    u64       M, length of the document index
    i32[N]    sizes: tokens per item
    i64[N]    pointers: byte offset of each item in .bin
    i64[M]    document index: item index where each document starts, then N (so M = docs + 1)

`PREFIX.bin` is the items' tokens back to back. The writer never leaves a complete-looking `.idx`
next to a partial `.bin`: both are written under temporary names, the old `.idx` is removed, then
the `.bin` is renamed and the `.idx` last.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from types import TracebackType

import numpy as np

from bigscience_ops.data.errors import DataError, DataFormatError, IncompatibleDatasetsError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = len(MAGIC) + 8 + 1 + 8 + 8  # 34 bytes before the sizes array

# Megatron's codes; 6 and 7 (float, double) are token-free and not accepted here.
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    8: np.dtype(np.uint16),
}
CODE_OF_DTYPE = {dtype: code for code, dtype in DTYPE_CODES.items()}


def best_fitting_dtype(vocab_size: int) -> np.dtype:
    """The token dtype Megatron's preprocessing picks: uint16 below 65500 ids, else int32."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def bin_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


def idx_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


def exists(prefix: str | os.PathLike) -> bool:
    """Whether both files of the pair are there (a lone .bin is an interrupted write)."""
    return bin_path(prefix).is_file() and idx_path(prefix).is_file()


def _dtype_code(dtype: np.dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype not in CODE_OF_DTYPE:
        allowed = ", ".join(str(d) for d in CODE_OF_DTYPE)
        raise DataError(f"token dtype {dtype} cannot be stored; allowed: {allowed}")
    return CODE_OF_DTYPE[dtype]


def write_index(path: str | os.PathLike, dtype: np.dtype, sizes: np.ndarray, doc_idx: np.ndarray) -> None:
    """Write an .idx file for items of `sizes` tokens stored back to back with `dtype`."""
    sizes = np.asarray(sizes)
    if sizes.size and (sizes.min() < 0 or sizes.max() > np.iinfo(np.int32).max):
        raise DataError(f"item sizes must fit in int32 and be >= 0; got range [{sizes.min()}, {sizes.max()}]")
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1], dtype=np.int64, out=pointers[1:])
        pointers *= itemsize
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", _dtype_code(dtype)))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.astype("<i4", copy=False).tobytes(order="C"))
        f.write(pointers.astype("<i8", copy=False).tobytes(order="C"))
        f.write(np.asarray(doc_idx).astype("<i8", copy=False).tobytes(order="C"))


def _publish(tmp_bin: Path, tmp_idx: Path, prefix: str | os.PathLike) -> None:
    """Move a finished pair into place: old .idx away first, then .bin, then .idx."""
    final_bin, final_idx = bin_path(prefix), idx_path(prefix)
    final_idx.unlink(missing_ok=True)
    os.replace(tmp_bin, final_bin)
    os.replace(tmp_idx, final_idx)


def _copy_fd(src: int, dst: int, nbytes: int) -> None:
    """Copy nbytes from src's position to dst's position inside the kernel."""
    left = nbytes
    while left > 0:
        try:
            n = os.copy_file_range(src, dst, left)
        except OSError:  # across filesystems on older kernels, or a filesystem without it
            n = os.sendfile(dst, src, None, left)
        if n == 0:
            raise DataError(f"copying tokens stopped with {left} of {nbytes} bytes left (source shorter?)")
        left -= n


class IndexedDatasetWriter:
    """Appends documents to PREFIX.bin/.idx; nothing appears under the final names until `finalize`.

    Use as a context manager: an exception (or Ctrl-C) inside the block removes the temporary files.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype) -> None:
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        _dtype_code(self.dtype)
        Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        tag = f".tmp-{os.getpid()}"
        self._tmp_bin = Path(f"{self.prefix}.bin{tag}")
        self._tmp_idx = Path(f"{self.prefix}.idx{tag}")
        self._file = open(self._tmp_bin, "wb")
        self._sizes: list[np.ndarray] = []
        self.num_docs = 0
        self.num_tokens = 0
        self._done = False

    def add_documents(self, tokens: np.ndarray, sizes: np.ndarray) -> None:
        """Append documents given as their tokens back to back and the token count of each."""
        tokens = np.asarray(tokens)
        sizes = np.asarray(sizes, dtype=np.int64)
        if int(sizes.sum()) != tokens.size:
            raise DataError(f"sizes add up to {int(sizes.sum())} tokens but {tokens.size} were given")
        self._file.write(memoryview(np.ascontiguousarray(tokens, dtype=self.dtype)).cast("B"))
        self._sizes.append(sizes.astype(np.int32))
        self.num_docs += len(sizes)
        self.num_tokens += tokens.size

    def add_file(self, path: str | os.PathLike, sizes: np.ndarray) -> None:
        """Append documents whose tokens, in this writer's dtype, are the whole of file `path`.

        The bytes are copied by the kernel (copy_file_range, else sendfile), never through Python.
        """
        sizes = np.asarray(sizes, dtype=np.int64)
        nbytes = os.path.getsize(path)
        if nbytes != int(sizes.sum()) * self.dtype.itemsize:
            raise DataError(f"{path} holds {nbytes} bytes but the sizes add up to {int(sizes.sum())} "
                            f"{self.dtype} tokens")
        self._file.flush()
        with open(path, "rb") as src:
            _copy_fd(src.fileno(), self._file.fileno(), nbytes)
        self._file.seek(0, os.SEEK_END)  # the buffered writer takes its position from the file again
        self._sizes.append(sizes.astype(np.int32))
        self.num_docs += len(sizes)
        self.num_tokens += nbytes // self.dtype.itemsize

    def add_document(self, tokens: np.ndarray | list[int]) -> None:
        tokens = np.asarray(tokens, dtype=self.dtype)
        self.add_documents(tokens, np.array([tokens.size]))

    def finalize(self) -> str:
        """Write the index and move both files into place; returns the prefix."""
        self._file.close()
        sizes = np.concatenate(self._sizes) if self._sizes else np.zeros(0, dtype=np.int32)
        doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
        write_index(self._tmp_idx, self.dtype, sizes, doc_idx)
        _publish(self._tmp_bin, self._tmp_idx, self.prefix)
        self._done = True
        return self.prefix

    def abort(self) -> None:
        """Remove the temporary files; the final names are left as they were."""
        if not self._file.closed:
            self._file.close()
        self._tmp_bin.unlink(missing_ok=True)
        self._tmp_idx.unlink(missing_ok=True)
        self._done = True

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._done:
            if exc_type is None:
                self.finalize()
            else:
                self.abort()


class IndexedDataset:
    """Reads a PREFIX.bin/.idx pair through memory maps; `ds[i]` is item i's tokens (a read-only view)."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = os.fspath(prefix)
        ipath, bpath = idx_path(prefix), bin_path(prefix)
        for p in (ipath, bpath):
            if not p.is_file():
                raise DataFormatError(f"{p} does not exist; an indexed dataset needs both "
                                      f"{ipath.name} and {bpath.name} (build them with `bsops preprocess`)")
        with open(ipath, "rb") as f:
            header = f.read(HEADER_SIZE)
        if len(header) < HEADER_SIZE or header[:9] != MAGIC:
            raise DataFormatError(f"{ipath}: not an MMapIndexedDataset index (magic {header[:9]!r}, "
                                  f"expected {MAGIC!r})")
        (version,) = struct.unpack("<Q", header[9:17])
        if version != VERSION:
            raise DataFormatError(f"{ipath}: index version {version}; only version {VERSION} is supported")
        code = header[17]
        if code not in DTYPE_CODES:
            raise DataFormatError(f"{ipath}: dtype code {code}; allowed codes: {sorted(DTYPE_CODES)}")
        self.dtype = DTYPE_CODES[code]
        n, m = struct.unpack("<QQ", header[18:34])
        expected = HEADER_SIZE + 4 * n + 8 * n + 8 * m
        if ipath.stat().st_size != expected:
            raise DataFormatError(f"{ipath}: {ipath.stat().st_size} bytes, expected {expected} for "
                                  f"{n} items and a document index of {m}")
        idx_map = np.memmap(ipath, mode="r", dtype=np.uint8)
        self.sizes: np.ndarray = np.frombuffer(idx_map, dtype="<i4", count=n, offset=HEADER_SIZE)
        self.pointers: np.ndarray = np.frombuffer(idx_map, dtype="<i8", count=n, offset=HEADER_SIZE + 4 * n)
        self.doc_idx: np.ndarray = np.frombuffer(idx_map, dtype="<i8", count=m, offset=HEADER_SIZE + 12 * n)
        bin_size = bpath.stat().st_size
        want = int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize if n else 0
        if bin_size != want:
            raise DataFormatError(f"{bpath}: {bin_size} bytes but its index describes {want}; "
                                  "the pair is from different runs or the .bin is truncated")
        self._bin = np.memmap(bpath, mode="r", dtype=self.dtype) if bin_size else np.zeros(0, self.dtype)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens of item i from `offset`, `length` of them (default: to its end), as Megatron's `get`."""
        start = int(self.pointers[i]) // self.dtype.itemsize + offset
        if length is None:
            length = int(self.sizes[i]) - offset
        return self._bin[start:start + length]

    @property
    def tokens(self) -> np.ndarray:
        """All tokens back to back (a memory map)."""
        return self._bin

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))


def prefixes_in(folder: str | os.PathLike) -> list[str]:
    """The prefixes of the .bin/.idx pairs in a folder, sorted by name (Megatron's merge_datasets.py --input)."""
    folder = Path(folder)
    found = []
    for idx in sorted(folder.glob("*.idx"), key=lambda p: p.name):
        prefix = str(idx.with_suffix(""))
        if not bin_path(prefix).is_file():
            raise DataFormatError(f"{idx} has no {bin_path(prefix).name} next to it; a dataset needs both")
        found.append(prefix)
    if not found:
        raise DataError(f"folder {folder} holds no .idx/.bin pair to merge")
    return found


def merge_datasets(prefixes: list[str], output_prefix: str) -> str:
    """Concatenate indexed datasets into OUTPUT_PREFIX (same dtype required), as Megatron's merge."""
    if not prefixes:
        raise DataError("merge needs at least one input prefix; got none")
    datasets = [IndexedDataset(p) for p in prefixes]
    dtypes = {str(d.dtype) for d in datasets}
    if len(dtypes) > 1:  # made with tokenizers of different vocabulary sizes
        raise IncompatibleDatasetsError("token dtypes", {d.prefix: str(d.dtype) for d in datasets})
    if os.path.abspath(output_prefix) in {os.path.abspath(p) for p in prefixes}:
        raise DataError(f"output prefix {output_prefix} is also an input; choose another output prefix")
    dtype = datasets[0].dtype
    Path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
    tag = f".tmp-{os.getpid()}"
    tmp_bin, tmp_idx = Path(f"{output_prefix}.bin{tag}"), Path(f"{output_prefix}.idx{tag}")
    try:
        with open(tmp_bin, "wb") as out:
            for d in datasets:
                with open(bin_path(d.prefix), "rb") as src:
                    _copy_fd(src.fileno(), out.fileno(), os.fstat(src.fileno()).st_size)
        sizes = np.concatenate([d.sizes for d in datasets])
        doc_parts = [np.zeros(1, dtype=np.int64)]
        offset = 0
        for d in datasets:
            doc_parts.append(d.doc_idx[1:].astype(np.int64) + offset)
            offset += len(d)
        write_index(tmp_idx, dtype, sizes, np.concatenate(doc_parts))
        _publish(tmp_bin, tmp_idx, output_prefix)
    except BaseException:
        tmp_bin.unlink(missing_ok=True)
        tmp_idx.unlink(missing_ok=True)
        raise
    return output_prefix
