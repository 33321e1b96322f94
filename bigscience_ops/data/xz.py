"""Block-parallel reading of .xz files: the index read from the file's end, blocks decoded by workers.

An .xz file written by `xz -T N` (or with `--block-size`) is a sequence of independently compressed
blocks, listed in the index at the end of each stream with their compressed and uncompressed
sizes. `blocks(path)` reads those indices (no decompression) and `Span` decodes a run of blocks on
its own: the blocks' bytes are wrapped in a stream header, an index and a footer of their own, so
liblzma checks every block's CRC as when it reads the whole file.

Lines cross block boundaries. A span of blocks [first, last) owns the lines that START in
(start, end] of the decompressed stream, where start and end are the span's uncompressed
offsets (the first span also owns the line at 0): it skips through the first newline at or after
`start`, and after its own blocks reads on into the next ones up to the first newline at or after
`end`. The next span skips exactly those bytes, so every line belongs to one span, whole.

A span is decoded as a stream, a chunk of text at a time, and handed on in pieces of whole lines
(`span_pieces`): a block of any size (the index says 1.5 GB? it may hold even more) never sits in
memory whole, and a line longer than the run's maximum raises LineTooLong as soon as it passes it.
The index's numbers are not trusted beyond that: liblzma checks each block against them.

Measured here (2 cores, a 346 MB jsonl in 14 blocks): `lzma` reads 144 MB/s on one core and
`xz -T2 -dc` 249 MB/s; decoding blocks in the workers gives every worker its own 144 MB/s, and
the main process never touches the text, where `xz -T N -dc` would pipe it all through the main
process and then to the workers again.
"""

from __future__ import annotations

import dataclasses
import itertools
import lzma
import struct
import zlib

from collections.abc import Iterator

from bigscience_ops.data.errors import DamagedInputError
from bigscience_ops.data.inputs import LineTooLong

HEADER_MAGIC = b"\xfd7zXZ\x00"
FOOTER_MAGIC = b"YZ"
SCAN = 1 << 16  # bytes decoded at a time when looking for the newline that ends a span
READ = 1 << 20  # compressed bytes read at a time
PIECE = 1 << 21  # decoded bytes handed on at a time (about a chunk of pipeline.py)


@dataclasses.dataclass(frozen=True)
class Block:
    offset: int  # of the block in the file
    padded: int  # its size in the file (a multiple of 4)
    unpadded: int  # header + compressed data + check, as the index records it
    start: int  # uncompressed offset in the whole file
    size: int  # uncompressed size
    flags: bytes  # the stream flags of its stream (check type)

    @property
    def end(self) -> int:
        return self.start + self.size


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("index number runs past the index")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def blocks(path: str) -> list[Block]:
    """Every block of every stream in the file, in order; DataError when the file is not a whole .xz."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        pos = f.tell()
        streams: list[list[Block]] = []
        while pos > 0:
            f.seek(max(0, pos - 4))
            if pos % 4 or pos < 32 + 12:
                raise DamagedInputError(path, "xz", f"a stream ends at byte {pos}")
            if f.read(4) == b"\0\0\0\0":  # stream padding
                pos -= 4
                continue
            f.seek(pos - 12)
            footer = f.read(12)
            backward, flags, magic = struct.unpack("<I2s2s", footer[4:])
            if magic != FOOTER_MAGIC or zlib.crc32(footer[4:10]) != struct.unpack("<I", footer[:4])[0]:
                raise DamagedInputError(path, "xz", f"no stream footer before byte {pos}")
            index_size = (backward + 1) * 4
            index_start = pos - 12 - index_size
            if index_start < 12:
                raise DamagedInputError(path, "xz", f"the index before byte {pos - 12} is longer than the file")
            f.seek(index_start)
            index = f.read(index_size)
            try:
                if index[0] != 0 or zlib.crc32(index[:-4]) != struct.unpack("<I", index[-4:])[0]:
                    raise ValueError("index CRC")
                count, p = _varint(index, 1)
                records = []
                for _ in range(count):
                    unpadded, p = _varint(index, p)
                    size, p = _varint(index, p)
                    records.append((unpadded, size))
            except (ValueError, IndexError):
                raise DamagedInputError(path, "xz", "its index is damaged") from None
            stream_start = index_start - sum((u + 3) // 4 * 4 for u, _ in records) - 12
            f.seek(max(0, stream_start))
            header = f.read(12)
            if stream_start < 0 or header[:6] != HEADER_MAGIC or header[6:8] != flags:
                raise DamagedInputError(path, "xz", "stream header and index disagree")
            offset = stream_start + 12
            stream = []
            for unpadded, size in records:
                padded = (unpadded + 3) // 4 * 4
                stream.append(Block(offset, padded, unpadded, 0, size, flags))
                offset += padded
            streams.append(stream)
            pos = stream_start
    out: list[Block] = []
    start = 0
    for stream in reversed(streams):
        for b in stream:
            out.append(dataclasses.replace(b, start=start))
            start += b.size
    return out


def _standalone(f, run: list[Block]) -> Iterator[bytes]:
    """The blocks of `run` (one stream's, consecutive) as a complete .xz stream of their own, READ bytes at a time."""
    flags = run[0].flags
    yield HEADER_MAGIC + flags + struct.pack("<I", zlib.crc32(flags))
    f.seek(run[0].offset)
    left = run[-1].offset + run[-1].padded - run[0].offset
    while left > 0:
        data = f.read(min(left, READ))
        if not data:
            raise EOFError("the file ends inside a block its index lists")
        left -= len(data)
        yield data
    index = b"\0" + _encode_varint(len(run)) + b"".join(_encode_varint(b.unpadded) + _encode_varint(b.size)
                                                        for b in run)
    index += b"\0" * (-len(index) % 4)
    index += struct.pack("<I", zlib.crc32(index))
    tail = struct.pack("<I2s", len(index) // 4 - 1, flags)
    footer = struct.pack("<I", zlib.crc32(tail)) + tail + FOOTER_MAGIC
    yield index + footer


def _decoded(f, run: list[Block], piece: int) -> Iterator[bytes]:
    """The uncompressed bytes of consecutive blocks, at most `piece` at a time, checked (CRC of each block,
    sizes, index) as they are decoded."""
    i = 0
    while i < len(run):  # one standalone stream per source stream
        j = i + 1
        while j < len(run) and run[j].offset == run[j - 1].offset + run[j - 1].padded:
            j += 1
        dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        for raw in _standalone(f, run[i:j]):
            out = dec.decompress(raw, max_length=piece)
            while True:
                if out:
                    yield out
                if dec.eof or dec.needs_input:
                    break
                out = dec.decompress(b"", max_length=piece)
        if not dec.eof:
            raise lzma.LZMAError("block ended early")
        i = j


def spans(all_blocks: list[Block], target: int) -> list[tuple[int, int]]:
    """Consecutive block ranges [first, last) of at least `target` uncompressed bytes (the last may be less)."""
    out = []
    first = size = 0
    for i, b in enumerate(all_blocks):
        size += b.size
        if size >= target:
            out.append((first, i + 1))
            first, size = i + 1, 0
    if first < len(all_blocks):
        out.append((first, len(all_blocks)))
    return out


def span_pieces(path: str, all_blocks: list[Block], first: int, last: int, piece: int = PIECE,
                max_line: int | None = None) -> Iterator[bytes]:
    """The whole lines span [first, last) owns (see the module docstring), in pieces of about `piece` bytes,
    each ending at a line end (the file's last may not).

    A line longer than `max_line` raises LineTooLong with its index among the lines this span gave,
    as soon as the part of it decoded passes `max_line`. A span that a line longer than that crosses
    from its start gives nothing: the span where the line starts raises.
    """
    with open(path, "rb") as f:
        source = _decoded(f, all_blocks[first:last], piece)
        if first > 0:  # skip the end of the line that started before this span
            skipped = 0
            for data in source:
                nl = data.find(b"\n")
                if nl >= 0:
                    source = itertools.chain([data[nl + 1:]], source)
                    break
                skipped += len(data)
                if max_line is not None and skipped > max_line:
                    return
            else:
                return  # a line that started before this span runs through all of it
        pending = bytearray()  # the start of a line whose end is not decoded yet
        lines = 0  # whole lines given so far

        def too_long(extra: int) -> bool:
            return max_line is not None and len(pending) + extra > max_line

        for data in source:
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                pending += data
                if too_long(0):
                    raise LineTooLong(lines)
                continue
            if too_long(data.find(b"\n")):
                raise LineTooLong(lines)
            chunk = bytes(pending) + data[:cut]
            pending = bytearray(data[cut:])
            lines += chunk.count(b"\n")
            yield chunk
            if too_long(0):
                raise LineTooLong(lines)
        if last < len(all_blocks):  # the last line goes on into the next blocks, or starts right at the end
            for data in _decoded(f, all_blocks[last:], SCAN):
                nl = data.find(b"\n")
                if too_long(nl if nl >= 0 else len(data)):
                    raise LineTooLong(lines)
                if nl >= 0:
                    pending += data[:nl + 1]
                    break
                pending += data
        if pending:
            yield bytes(pending)


def read_span(path: str, all_blocks: list[Block], first: int, last: int) -> bytes:
    """The whole lines span [first, last) owns, at once (span_pieces joined)."""
    return b"".join(span_pieces(path, all_blocks, first, last))
