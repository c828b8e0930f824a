"""Line-oriented files read in bounded memory, whole or by byte range (JSON lines, plain text one document per line).

A line's position is the byte offset of its first byte (in the decompressed stream of a compressed file): unlike its
number, it is known to a reader that starts in the middle of the file, so a document's id is the same whatever the
ranges. An uncompressed file is cut into byte ranges ``[lo, hi)``; a range owns every line that *starts* inside it:
it skips the tail of the line it starts in (the previous range reads that line on past its own end) and reads past
``hi`` to finish its last line. The ranges of a file hence hold every line exactly once, whatever their number.
A line longer than the caller's limit is never held: it is passed over and reported as such.
"""
from __future__ import annotations

from typing import IO, Iterator

from common.errors import InputError
from preprocess.readers.inputs import is_compressed, is_empty_local, open_uri, read_error

MIN_PIECE_BYTES = 1 << 20  # ranges are not cut finer: each costs a seek and the tail of a line read twice
_CHUNK = 1 << 20
TOO_LONG = None  # the line in place of one longer than the limit


def splittable(uri: str) -> bool:
    return not is_compressed(uri)  # a compressed stream can only be read from its start


def byte_pieces(uri: str, size: int, count: int) -> list[tuple[float, tuple]]:
    """About ``count`` even byte ranges ("bytes", lo, hi) of an uncompressed file and their shares; [] otherwise."""
    if not splittable(uri) or size <= 0:
        return []
    count = max(1, min(count, size // MIN_PIECE_BYTES))
    cuts = [i * size // count for i in range(count + 1)]
    return [((hi - lo) / size, ("bytes", lo, hi)) for lo, hi in zip(cuts, cuts[1:])]


def iter_lines(uri: str, piece: tuple | None, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(offset of the line's first byte, the line without its line end, or ``TOO_LONG`` for a line of more than
    ``max_bytes`` bytes) of every non-blank line of the file, or of the lines that start in the byte range ``piece``
    ("bytes", lo, hi) of an uncompressed file.

    Raises:
        InputError: The file cannot be opened or read, or its compression is truncated or corrupt.
    """
    lo, hi = (piece[1], piece[2]) if piece is not None else (0, None)
    position = 0
    with open_uri(uri, decompress=piece is None) as stream:
        try:
            if lo > 0:
                stream.seek(lo - 1)
                position = lo - 1 + _through_newline(stream)  # the line that starts before lo is the last range's
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


__all__ = ["MIN_PIECE_BYTES", "TOO_LONG", "byte_pieces", "iter_lines", "splittable"]
