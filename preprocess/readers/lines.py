"""Line-oriented files read in bounded memory, whole or by pieces (JSON lines, plain text one document per line).

A line's position is the byte offset of its first byte (in the decompressed stream of a compressed file): unlike its
number, it is known to a reader that starts in the middle of the file, so a document's id is the same whatever the
pieces. A piece owns every line that *starts* inside its byte ranges: a range ``[lo, hi)`` skips the tail of the
line it starts in (the range before reads that line on past its own end) and reads past ``hi`` to finish its last
line, so the pieces of a file hold every line exactly once, whatever their number.

* An uncompressed file is cut into contiguous ranges ("bytes", lo, hi), each reached by a seek.
* A compressed stream can only be read from its start, so its pieces take turns by blocks of its decompressed
  stream: ("stride", index, count) owns the blocks ``b`` with ``b % count == index``. Each piece decompresses the
  whole stream but passes over the other pieces' blocks without splitting them into lines, so sharing a large
  .jsonl.zst among workers costs each of them one decompression of it (``MAX_STREAM_READS`` bounds how many).

A line longer than the caller's limit is never held: it is passed over and reported as such.
"""
from __future__ import annotations

from typing import IO, Iterator

from common.errors import InputError
from preprocess.readers.inputs import is_compressed, is_empty_local, open_uri, read_error

MIN_PIECE_BYTES = 1 << 20  # ranges are not cut finer: each costs a seek and the tail of a line read twice
STRIDE_BLOCK_BYTES = 1 << 20  # of a decompressed stream: the pieces of a compressed file take turns by these
# The most pieces a compressed file is cut into, by compressor: each piece decompresses the whole stream. Not
# measured apart: a 1 GiB .jsonl.zst in 16 pieces ran at 549,591 tokens per CPU-second, a quarter of it in 8 at
# 602,306 (bench/results/preprocess-formats-*.json); gzip, and far more bzip2 and xz, decompress more slowly, so
# they get fewer.
MAX_STREAM_READS = {".zst": 16, ".gz": 8, ".bz2": 2, ".xz": 2}
_CHUNK = 1 << 20
TOO_LONG = None  # the line in place of one longer than the limit


def splittable(uri: str) -> bool:
    """Every line file can be cut: into byte ranges, or a compressed one into stride pieces (``byte_pieces``)."""
    return not is_compressed(uri) or _stream_reads(uri) > 1


def _stream_reads(uri: str) -> int:
    return next((count for suffix, count in MAX_STREAM_READS.items() if uri.endswith(suffix)), 1)


def byte_pieces(uri: str, size: int, count: int) -> list[tuple[float, tuple]]:
    """About ``count`` pieces of a file and their shares: even byte ranges ("bytes", lo, hi) of an uncompressed
    file, stride pieces ("stride", index, count) of a compressed one (at most ``MAX_STREAM_READS``); [] for one."""
    if size <= 0:
        return []
    if is_compressed(uri):
        count = min(count, _stream_reads(uri), max(1, size // MIN_PIECE_BYTES))
        return [(1 / count, ("stride", index, count)) for index in range(count)] if count > 1 else []
    count = max(1, min(count, size // MIN_PIECE_BYTES))
    cuts = [i * size // count for i in range(count + 1)]
    return [((hi - lo) / size, ("bytes", lo, hi)) for lo, hi in zip(cuts, cuts[1:])]


def holds_file_start(piece: tuple | None) -> bool:
    """Whether ``piece`` (None: the whole file) owns the file's first line."""
    return piece is None or piece[1] == 0  # a range from byte 0, or the stride piece of block 0


def _ranges(piece: tuple | None) -> Iterator[tuple[int, int | None]]:
    """The byte ranges [lo, hi) (hi None: to the end) whose starting lines ``piece`` owns, in file order."""
    if piece is None:
        yield 0, None
    elif piece[0] == "bytes":
        yield piece[1], piece[2]
    else:
        _, index, count = piece
        lo = index * STRIDE_BLOCK_BYTES
        while True:
            yield lo, lo + STRIDE_BLOCK_BYTES
            lo += count * STRIDE_BLOCK_BYTES


def iter_lines(uri: str, piece: tuple | None, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(offset of the line's first byte, the line without its line end, or ``TOO_LONG`` for a line of more than
    ``max_bytes`` bytes) of every non-blank line of the file, or of the lines that ``piece`` owns (a byte range
    ("bytes", lo, hi) of an uncompressed file, a stride piece ("stride", index, count) of a compressed one).

    Raises:
        InputError: The file cannot be opened or read, or its compression is truncated or corrupt.
    """
    seekable = piece is not None and piece[0] == "bytes"
    position = 0
    with open_uri(uri, decompress=not seekable) as stream:
        try:
            for lo, hi in _ranges(piece):
                if lo > position:
                    position = _advance(stream, position, lo - 1, seekable)
                    if position < lo - 1:
                        return  # the stream ended before this range
                    position += _through_newline(stream)  # the line that starts before lo is not this range's
                while hi is None or position < hi:
                    start = position
                    line, consumed = _read_line(stream, max_bytes)
                    if not consumed:
                        return
                    position += consumed
                    if line is TOO_LONG or line.strip():
                        yield start, line
        except InputError:
            raise
        except Exception as exc:  # decompression and transport errors surface from reads
            if isinstance(exc, EOFError) and position == 0 and is_empty_local(uri):
                return  # a 0-byte compressed file: no lines
            raise read_error(uri, exc, position) from exc


def _advance(stream: IO[bytes], position: int, target: int, seekable: bool) -> int:
    """Move from ``position`` to ``target`` (a seek, or reading and dropping a stream's bytes in large chunks, not
    split into lines); the position reached (short of ``target`` at the stream's end)."""
    if seekable:
        stream.seek(target)
        return target
    while position < target:
        chunk = stream.read(min(_CHUNK, target - position))
        if not chunk:
            break
        position += len(chunk)
    return position


def _through_newline(stream: IO[bytes]) -> int:
    """Read up to and including the next b"\\n" (or to the end); the bytes consumed."""
    consumed = 0
    while True:
        chunk = stream.readline(_CHUNK)
        consumed += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return consumed


def _read_line(stream: IO[bytes], max_bytes: int) -> tuple[bytes | None, int]:
    """(the next line without its line end, or ``TOO_LONG``; the bytes consumed, 0 at the end)."""
    line = stream.readline(max_bytes + 1)
    if not line:
        return b"", 0
    if line.endswith(b"\n"):
        return line[:-2] if line.endswith(b"\r\n") else line[:-1], len(line)
    if len(line) <= max_bytes:
        return line, len(line)  # the last line, without a line end
    return TOO_LONG, len(line) + _through_newline(stream)


__all__ = ["MAX_STREAM_READS", "MIN_PIECE_BYTES", "STRIDE_BLOCK_BYTES", "TOO_LONG", "byte_pieces", "holds_file_start",
           "iter_lines", "splittable"]
