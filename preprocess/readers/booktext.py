"""Pure cleaning of plain-text books (BooksCorpus-style, e.g. Project Gutenberg): a book's lines cut into chunks of
bounded size at chapter headings and paragraphs, and a chunk turned into paragraphs, with no I/O (the reader is
``preprocess.readers.books``). Paragraphs are separated by a single "\\n" in every cleaned text.
"""
from __future__ import annotations

import re
from typing import Iterator

_CHAPTER_RE = re.compile(
    r"^\[?\s*(?:chapter|book|act|actus|part|volume|vol\.|canto|stave|scene|scena|scoena)\s+"
    r"(?:(?=[mdclxvi]+\b)m{0,3}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})"
    r"|\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|the\s+\w+"
    r"|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last"
    r"|primus|secundus|tertius|quartus|quintus|sextus|septimus)"
    r"\s*(?:[.:\]\-—]|$)",
    re.I,
)
# "IX. THE STRANGE LADY": a Roman numeral and an upper-case title (the contents list that
# repeats the titles in mixed case does not match).
_ROMAN_TITLE_RE = re.compile(r"^[IVXLC]+\.\s+[^a-z]*[A-Z][^a-z]*$")
_MAX_HEADING_LEN = 80


def is_chapter_heading(line: str) -> bool:
    """Whether a line of a book looks like a chapter-level heading ("CHAPTER IV.", "Actus Primus.").

    Args:
        line: One line of text.

    Returns:
        True for a short line that starts with a division word and a numeral followed by
        punctuation or the end of the line; "Part on the plain, ..." does not count.
    """
    stripped = line.strip()
    return 0 < len(stripped) <= _MAX_HEADING_LEN and (
        _CHAPTER_RE.match(stripped) is not None or _ROMAN_TITLE_RE.match(stripped) is not None)


_ILLUSTRATION_RE = re.compile(r"^\[illustration[^\]]*\]+$", re.I)
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # e.g. a DOS end-of-file ^Z


def clean_book_text(text: str) -> str:
    """Turn a chunk of a plain-text book into paragraphs.

    Paragraphs are separated by blank lines; the hard-wrapped lines of a paragraph are joined
    with a space. Chapter heading lines and bare "[Illustration]" markers are dropped (they are
    layout, not prose).

    Args:
        text: Raw book text (any line endings).

    Returns:
        Paragraphs separated by "\\n", whitespace collapsed. May be "".
    """
    paragraphs: list[str] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            paragraph = " ".join(" ".join(current).split())
            current.clear()
            if paragraph and not _ILLUSTRATION_RE.match(paragraph):
                paragraphs.append(paragraph)

    for line in _CONTROL_RE.sub("", text).splitlines():
        if not line.strip():
            flush()
        elif is_chapter_heading(line):
            flush()
        else:
            current.append(line)
    flush()
    return "\n".join(paragraphs)


class BookChunker:
    """Groups the lines of a book into chunks of at most ``max_chars`` characters.

    A new chunk starts at a chapter heading (unless the chunk so far holds only headings, as in
    "VOLUME I" / "CHAPTER I") and before a line that would make the chunk too long: the cut
    falls at the last blank line, or at a line when a single paragraph is longer than the limit.
    Lines must already be at most ``max_chars`` long (see ``split_long_line``).
    """

    def __init__(self, max_chars: int):
        self.max_chars = max_chars
        self.lines: list[str] = []
        self.length = 0            # len("\n".join(self.lines))
        self.last_blank = -1       # index of the last blank line (a paragraph boundary)
        self.has_body = False      # any non-blank, non-heading line yet

    def _take(self, count: int) -> str:
        """Remove and return the first ``count`` lines as a chunk text."""
        text = "\n".join(self.lines[:count])
        rest = self.lines[count:]
        self.lines = []
        self.length, self.last_blank, self.has_body = 0, -1, False
        for line in rest:
            self._append(line)
        return text

    def _append(self, line: str) -> None:
        self.length += len(line) + (1 if self.lines else 0)
        if line.strip():
            self.has_body = self.has_body or not is_chapter_heading(line)
        else:
            self.last_blank = len(self.lines)
        self.lines.append(line)

    def add(self, line: str) -> Iterator[str]:
        """Add one line (at most ``max_chars`` long); yield the chunks it completes."""
        if is_chapter_heading(line) and self.has_body:
            yield self._take(len(self.lines))
        while self.lines and self.length + 1 + len(line) > self.max_chars:
            # Cut at the last paragraph boundary; a single over-long paragraph is cut at a line.
            cut = self.last_blank if self.last_blank > 0 else len(self.lines)
            yield self._take(cut)
            if self.lines and not self.lines[0].strip():
                self._take(1)  # the blank line that separated the paragraphs
        self._append(line)

    def finish(self) -> Iterator[str]:
        if self.lines:
            yield self._take(len(self.lines))


def split_long_line(line: str, limit: int) -> Iterator[str]:
    """Cut a line longer than ``limit`` characters, preferably at whitespace."""
    while len(line) > limit:
        cut = line.rfind(" ", limit // 2, limit)
        cut = limit if cut <= 0 else cut
        yield line[:cut]
        line = line[cut:].lstrip(" ")
    yield line
