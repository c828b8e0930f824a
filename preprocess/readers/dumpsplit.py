"""Reading one byte range of a bzip2-compressed MediaWiki dump, so that workers share a dump without each
decompressing all of it.

A bzip2 stream is a sequence of blocks. Each block starts with the 48-bit magic 0x314159265359 at any bit
offset (blocks are not byte-aligned) followed by the block's own CRC; a stream ends with the magic
0x177245385090 and a combined CRC. So one block can be cut out of the bit stream and decompressed alone,
given a stream header and trailer of its own (the idea behind pbzip2, lbzip2 and Hadoop's splittable bzip2
codec). A byte range ``[lo, hi)`` owns the blocks whose magic starts in it, and a page belongs to the block in
which its ``<page>`` tag starts: the range skips the tail of the page it starts in and reads past ``hi`` to the
end of its last page. The ranges of a file hence hold every page exactly once, whatever their number.

The XML handed to the parser is the dump's own header (``<mediawiki>`` and ``<siteinfo>``, taken from the
file's first block), the range's pages, and a closing ``</mediawiki>``.
"""
from __future__ import annotations

import bz2
import io
from typing import IO, Iterator

import numpy as np

BLOCK_MAGIC = 0x314159265359
END_MAGIC = 0x177245385090
_PAGE = b"<page>"
_READ_BYTES = 1 << 20
_HEADER_LIMIT = 64 << 20  # decompressed bytes searched for the first <page> (the header is a few kB)
MIN_RANGE_BYTES = 128 << 10  # half a bzip2 block (900 kB of text compress to about 250 kB)


def byte_ranges(size: int, pieces: int) -> list[tuple[int, int]]:
    """``pieces`` contiguous ``[lo, hi)`` ranges covering ``size`` bytes (fewer for a small file)."""
    pieces = max(1, min(pieces, size // MIN_RANGE_BYTES))
    return [(i * size // pieces, (i + 1) * size // pieces) for i in range(pieces)]


def snap_to_blocks(raw: IO[bytes], size: int, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges with every inner boundary moved to the byte where the next block starts, so each range holds
    whole blocks and its size says how much it holds; ranges left without a block are dropped. (A block whose
    magic starts at bit 8*B + r belongs to the range starting at byte B.)"""
    cuts = [0]
    for lo, _ in ranges[1:]:
        block = _BitWindow(raw, lo, read_bytes=64 << 10).next_block(lo * 8 - 1)  # within about 1 MB
        cut = size if block is None else block // 8
        if cut > cuts[-1]:
            cuts.append(cut)
    cuts.append(size)
    return [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


class SplitError(Exception):
    """The compressed data cannot be split: truncated or corrupt. ``str()`` says what and where."""


def _patterns(magic: int) -> list[tuple[int, int, bytes]]:
    """For each bit shift r, the 7-byte big-endian window whose bits [r, r+48) are ``magic``: (shift, value,
    mask, its bytes 1-5). Those five bytes are fully determined for every shift, so ``bytes.find`` proposes
    candidates quickly and the partial first and last bytes confirm them."""
    out = []
    for r in range(8):
        value = magic << (8 - r)
        out.append((r, value, ((1 << 48) - 1) << (8 - r), ((value >> 8) & ((1 << 40) - 1)).to_bytes(5, "big")))
    return out


_MAGICS = [(kind, *pattern) for kind, magic in (("block", BLOCK_MAGIC), ("end", END_MAGIC))
           for pattern in _patterns(magic)]


def find_magics(data: bytes, start_byte: int = 0) -> list[tuple[int, str]]:
    """(bit offset in ``data``, "block" or "end") of every magic whose 7-byte window starts at ``start_byte``
    or later and lies within ``data``, in order."""
    found = []
    for kind, r, value, mask, core in _MAGICS:
        at = data.find(core, start_byte + 1)
        while 0 <= at <= len(data) - 6:
            if int.from_bytes(data[at - 1:at + 6], "big") & mask == value:
                found.append(((at - 1) * 8 + r, kind))
            at = data.find(core, at + 1)
    return sorted(found)


class _BitWindow:
    """The compressed file from a byte offset on, read as needed; finds magics and cuts out bit ranges.

    Offsets are absolute (bits or bytes from the start of the file); bytes before the last range cut out are
    forgotten, so memory stays at about one block.
    """

    def __init__(self, raw: IO[bytes], offset: int, read_bytes: int = _READ_BYTES):
        raw.seek(offset)
        self._raw, self._base, self._buf, self._read_bytes = raw, offset, bytearray(), read_bytes
        self._scanned = offset  # every window starting before this byte was scanned
        self._found: list[tuple[int, str]] = []
        self.eof = False

    def _read_more(self) -> None:
        chunk = self._raw.read(self._read_bytes)
        if chunk:
            self._buf += chunk
        else:
            self.eof = True
            self._buf += bytes(7)  # lets a window at the very end be confirmed; zeros are never a magic

    def next_magic(self, after_bit: int) -> tuple[int, str] | None:
        """The first magic at a bit offset > ``after_bit``, or None when the file has no more."""
        while True:
            self._found = [m for m in self._found if m[0] > after_bit]
            if self._found:
                return self._found[0]
            if self.eof:
                return None
            self._read_more()
            hits = find_magics(bytes(self._buf), max(0, self._scanned - self._base))
            self._found = [(bit + self._base * 8, kind) for bit, kind in hits]
            self._scanned = self._base + len(self._buf) - 6

    def next_block(self, after_bit: int) -> int | None:
        """The bit offset of the first block magic after ``after_bit`` (past any end of stream: a multistream
        file goes on), or None."""
        magic = self.next_magic(after_bit)
        while magic is not None and magic[1] != "block":
            magic = self.next_magic(magic[0])
        return None if magic is None else magic[0]

    def bits(self, start_bit: int, end_bit: int) -> np.ndarray:
        """Bits ``[start_bit, end_bit)`` as a 0/1 array; the bytes before ``start_bit`` are forgotten."""
        first, last = start_bit // 8 - self._base, (end_bit + 7) // 8 - self._base
        while len(self._buf) < last and not self.eof:
            self._read_more()
        unpacked = np.unpackbits(np.frombuffer(bytes(self._buf[first:last]), np.uint8))
        if first > 0:
            del self._buf[:first]
            self._base += first
        return unpacked[start_bit % 8:start_bit % 8 + (end_bit - start_bit)]


def _magic_bits(value: int, width: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(value.to_bytes(width // 8, "big"), np.uint8))


_END_BITS = _magic_bits(END_MAGIC, 48)


def decode_block(block_bits: np.ndarray) -> bytes:
    """Decompress one block (its bits from the block magic up to the next magic) as a stream of its own."""
    crc = block_bits[48:80]  # a one-block stream's combined CRC is the block's CRC
    body = np.concatenate([block_bits, _END_BITS, crc])
    return bz2.decompress(b"BZh9" + np.packbits(body).tobytes())


def iter_blocks(raw: IO[bytes], lo: int) -> Iterator[tuple[int, bytes]]:
    """(bit offset of the block magic, decompressed bytes) of every block from the first that starts at byte
    ``lo`` or later, to the end of the file.

    A candidate magic is confirmed by decoding; one that is really data inside a block (chance 2**-48 per bit)
    makes that block fail alone, and it is then decoded together with the next candidate.
    """
    window = _BitWindow(raw, lo)
    start = window.next_block(lo * 8 - 1)
    if start is None and lo == 0:
        raise SplitError("no bzip2 block found: not bzip2 data, or empty")
    while start is not None:
        end, error = window.next_magic(start), None
        for _ in range(3):
            if end is None:
                raise SplitError(f"the compressed stream ends early, inside the block at byte {start // 8} "
                                 "(truncated download?)")
            try:
                data = decode_block(window.bits(start, end[0]))
                break
            except (OSError, ValueError, EOFError) as exc:
                error, end = exc, window.next_magic(end[0])
        else:
            raise SplitError(f"corrupt compressed data in the block at byte {start // 8} ({error})")
        yield start, data
        start = window.next_block(end[0] - 1)


def dump_header(raw: IO[bytes]) -> bytes:
    """The dump's XML before its first ``<page>``: the ``<mediawiki>`` start tag and ``<siteinfo>``."""
    head = bytearray()
    for _, data in iter_blocks(raw, 0):
        head += data
        at = head.find(_PAGE)
        if at >= 0:
            return bytes(head[:at])
        if len(head) > _HEADER_LIMIT:
            break
    raise SplitError("no <page> element in the dump's first blocks")


def range_xml(raw: IO[bytes], lo: int, hi: int, header: bytes) -> Iterator[bytes]:
    """The XML of the pages whose ``<page>`` tag starts in the blocks that start in bytes ``[lo, hi)``.

    For ``lo == 0`` the file's own beginning is kept; otherwise ``header`` (see ``dump_header``) comes first,
    and only once a page is found, so a range that owns no page yields nothing.
    """
    keep = len(_PAGE) - 1  # bytes held back: a tag may straddle two blocks
    pending, position, owned_end, started = b"", 0, None, lo == 0
    for magic_bit, data in iter_blocks(raw, lo):
        if owned_end is None and magic_bit >= hi * 8:
            owned_end = position + len(pending)
        pending += data
        if not started:
            at = pending.find(_PAGE)
            if at < 0 or (owned_end is not None and position + at >= owned_end):
                if owned_end is not None:
                    return  # no page starts in this range
                position, pending = position + len(pending) - keep, pending[-keep:]
                continue
            started, position, pending = True, position + at, pending[at:]
            yield header
        if owned_end is not None:
            at = pending.find(_PAGE, max(0, owned_end - position))
            if at >= 0:
                yield pending[:at]
                yield b"</mediawiki>\n"
                return
        if len(pending) > keep:
            yield pending[:-keep]
            position, pending = position + len(pending) - keep, pending[-keep:]
    if started:
        yield pending


class IterReader(io.RawIOBase):
    """A read-only file object over an iterator of byte strings."""

    def __init__(self, chunks: Iterator[bytes]):
        super().__init__()
        self._chunks, self._left = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            self._left = next(self._chunks, None)
            if self._left is None:
                self._left = b""
                return 0
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


__all__ = ["SplitError", "byte_ranges", "snap_to_blocks", "decode_block", "dump_header", "find_magics",
           "iter_blocks", "range_xml", "IterReader"]
