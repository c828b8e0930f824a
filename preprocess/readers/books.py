"""Streaming reader for plain-text books (BooksCorpus-style: one book per file, e.g. Project Gutenberg texts); the
chunking and cleaning are ``preprocess.readers.booktext``'s.

A book is read line by line, twice: a first pass checks the encoding and finds the Project Gutenberg boilerplate,
the second decodes the body and cuts it into documents of bounded size. An unreadable file raises ``InputError``;
a book that cannot be used (not UTF-8 without a fallback, empty) is yielded as one ``Rejected`` record.
"""
from __future__ import annotations

import codecs
import itertools
import re
from typing import Iterator

from common.preprocess_config import SourceConfig
from preprocess.readers.booktext import BookChunker, clean_book_text, split_long_line
from preprocess.readers.inputs import (
    Utf8Check,
    WholeFileReader,
    is_compressed,
    is_empty_local,
    open_uri,
    read_error,
    source_name,
)
from preprocess.records import RawDocument, Rejected

_READ_LINE_LIMIT = 1 << 20   # a "line" longer than this is cut, so a file without newlines streams
_UTF8_BOM = b"\xef\xbb\xbf"

# Project Gutenberg boilerplate markers, matched on raw bytes (they are ASCII).
_PG_START_RE = re.compile(
    rb"^\s*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG E-?(?:BOOK|TEXT)", re.I)
_PG_OLD_HEADER_END_RE = re.compile(rb"^\s*\*+\s*END\s*\*?\s*THE SMALL PRINT", re.I)
_PG_END_RE = re.compile(
    rb"^\s*(?:\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG|END OF (?:THE )?PROJECT GUTENBERG)",
    re.I)


def _iter_pieces(uri: str) -> Iterator[bytes]:
    """Yield the lines of a file as bytes, cutting lines longer than ``_READ_LINE_LIMIT``."""
    with open_uri(uri) as stream:
        seen = 0
        try:
            while True:
                piece = stream.readline(_READ_LINE_LIMIT)
                if not piece:
                    return
                seen += len(piece)
                yield piece
        except Exception as exc:
            if isinstance(exc, EOFError) and seen == 0 and is_empty_local(uri):
                return
            raise read_error(uri, exc, seen) from exc


def _scan_book(uri: str) -> tuple[int, int | None, int | None, int | None]:
    """First pass over a book: size, first invalid UTF-8 byte, and the body's line range.

    Returns:
        (bytes, bad_utf8_offset, first body piece index, end piece index or None). The body
        starts after the Gutenberg start marker (or after the old "*END*THE SMALL PRINT!" header
        when there is no start marker) and ends before the first end marker after it.
    """
    utf8 = Utf8Check()
    start = old_header_end = None
    ends: list[int] = []
    for index, piece in enumerate(_iter_pieces(uri)):
        utf8.feed(piece)
        if start is None and _PG_START_RE.match(piece):
            start = index
        elif old_header_end is None and _PG_OLD_HEADER_END_RE.match(piece):
            old_header_end = index
        elif _PG_END_RE.match(piece):
            ends.append(index)
    utf8.feed(b"", final=True)  # a file that ends inside a multi-byte character
    header_end = start if start is not None else old_header_end
    body_start = 0 if header_end is None else header_end + 1
    end = next((i for i in ends if i >= body_start), None)
    return utf8.seen, utf8.bad_offset, body_start, end


def _decoded_lines(uri: str, decoder, start: int, end: int | None) -> Iterator[str]:
    """Second pass: the decoded lines of pieces ``start`` to ``end`` (exclusive)."""
    carry = ""
    for number, piece in enumerate(_iter_pieces(uri)):
        if number < start:
            continue
        if end is not None and number >= end:
            break
        if number == 0 and piece.startswith(_UTF8_BOM):
            piece = piece[len(_UTF8_BOM):]
        line, carry = carry + decoder.decode(piece), ""
        if len(piece) < _READ_LINE_LIMIT or piece.endswith(b"\n"):
            yield line.rstrip("\r\n")
            continue
        # Cut by the line-length limit: keep a cut word whole.
        space = line.rfind(" ")
        if space > 0:
            line, carry = line[:space], line[space + 1:]
        yield line
    if carry:
        yield carry


def iter_book(uri: str, cfg: SourceConfig) -> Iterator[RawDocument | Rejected]:
    """Stream one plain-text book as chunks of raw text.

    The file is read twice, line by line: a first pass checks that it is UTF-8 and finds the
    Project Gutenberg boilerplate, so the encoding decision covers the whole book and is the
    same on every run; the second pass decodes and chunks it.

    Args:
        uri: A local path or URI of one book (optionally compressed).
        cfg: Chunk size, encoding fallback and boilerplate stripping.

    Yields:
        ``RawDocument`` chunks (kind "book", doc_id "book:{name}:{index:05d}", at most
        ``cfg.book_document_max_chars`` characters, cut at chapter headings and paragraph
        boundaries), or a single failed ``Rejected``: "not_utf8" (when the book is not UTF-8
        and ``cfg.book_encoding_fallback`` is None) or "empty_file".

    Raises:
        InputError: The URI cannot be opened or read.
    """
    source = source_name(uri)

    def reject(reason: str, detail: str) -> Rejected:
        return Rejected(source=source, doc_id=f"book:{source}", outcome="failed", reason=reason,
                        detail=detail)

    total, bad_offset, body_start, body_end = _scan_book(uri)
    if total == 0:
        yield reject("empty_file", "0 bytes")
        return
    if bad_offset is not None and cfg.book_encoding_fallback is None:
        yield reject("not_utf8", f"byte offset {bad_offset}")
        return
    if not cfg.strip_gutenberg_boilerplate:
        body_start, body_end = 0, None
    if bad_offset is None:
        decoder = codecs.getincrementaldecoder("utf-8")()
    else:
        # Fallbacks other than latin-1 can meet undefined bytes; replace them, do not fail.
        decoder = codecs.getincrementaldecoder(cfg.book_encoding_fallback)(errors="replace")

    chunker, index = BookChunker(cfg.book_document_max_chars), 0
    lines = _decoded_lines(uri, decoder, body_start, body_end)
    parts = (p for line in lines for p in split_long_line(line, cfg.book_document_max_chars))
    for text in itertools.chain((t for p in parts for t in chunker.add(p)), chunker.finish()):
        if text.strip():
            yield RawDocument(doc_id=f"book:{source}:{index:05d}", source=source, kind="book",
                              text=text)
            index += 1
    if index == 0:
        yield reject("empty_file", "no text (only whitespace or Project Gutenberg boilerplate)")


class BooksReader(WholeFileReader):
    """``preprocess.readers.Reader`` of plain-text books (the built-in ``--books`` source, key "book"): each book is
    read whole (its encoding and boilerplate are decided over the whole file)."""

    kind = "book"

    def clean(self, text: str) -> str:
        return clean_book_text(text)

    def read(self, uri: str, piece, spec, cfg: SourceConfig, cache: dict) -> Iterator[RawDocument | Rejected]:
        return iter_book(uri, cfg)

    def memory_class(self, uri: str) -> str:
        return "book"

    def cost_per_byte(self, uri: str) -> float:
        return 4.0 if is_compressed(uri) else 1.0


READER = BooksReader()
