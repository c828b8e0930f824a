"""Tests for preprocess.readers.booktext: a book's lines cut into chunks, and a chunk cleaned into paragraphs."""
from __future__ import annotations

import pytest

from preprocess.readers.booktext import BookChunker, clean_book_text, is_chapter_heading, split_long_line


def test_clean_book_text_joins_wrapped_lines():
    raw = ("CHAPTER I\n\n\nIt is a truth universally acknowledged, that a single man\n"
           "in possession   of a good fortune\r\nmust be in want of a wife.\n\n"
           "[Illustration]\n\n  Second   paragraph.\x1a\n")
    assert clean_book_text(raw) == (
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune must be in want of a wife.\nSecond paragraph.")


@pytest.mark.parametrize("line,expected", [
    ("CHAPTER I", True), ("Chapter 12.", True), ("BOOK II", True), ("ACT III", True),
    ("PART ONE", True), ("VOLUME I", True), ("[BOOK I.  INSCRIPTIONS]", True),
    ("Actus Primus. Scoena Prima.", True), ("IX. THE STRANGE LADY", True),
    ("Part on the plain, or in the air sublime,", False), ("Book of old travels", False),
    ("Act to doe and to performe", False), ("CHAPTER I " + "x" * 100, False), ("", False),
])
def test_chapter_headings(line, expected):
    assert is_chapter_heading(line) is expected


def test_book_chunker_cuts_at_headings_and_paragraphs():
    chunker = BookChunker(1000)
    lines = ["VOLUME I", "", "CHAPTER I", ""] + [f"line {i} " + "x" * 90 for i in range(8)] + \
            [""] + ["y" * 95] * 4 + ["", "CHAPTER II", "", "short"]
    chunks = [c for line in lines for c in chunker.add(line)] + list(chunker.finish())
    assert chunks[0].startswith("VOLUME I\n\nCHAPTER I")      # headings alone do not make a chunk
    assert chunks[0].endswith("x" * 90)                         # cut at the blank line
    assert chunks[1].startswith("y" * 95) and chunks[2].startswith("CHAPTER II")
    assert all(len(c) <= 1000 for c in chunks)
    pieces = list(split_long_line("ab " * 10, 8))
    assert all(len(p) <= 8 for p in pieces) and " ".join(pieces).split() == ["ab"] * 10
    assert list(split_long_line("x" * 20, 8)) == ["x" * 8, "x" * 8, "x" * 4]
