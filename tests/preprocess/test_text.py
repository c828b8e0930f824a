"""Tests for preprocess.text: book cleaning, sentence splitting, to_document."""
from __future__ import annotations

import pytest

from common.preprocess_config import SourceConfig
from preprocess import text
from preprocess.records import Document, RawDocument, Rejected
from preprocess.text import (
    BookChunker,
    clean_book_text,
    is_chapter_heading,
    split_long_line,
    split_sentences,
    to_document,
)


def test_split_sentences_per_paragraph():
    assert split_sentences("Hello Mr. Smith. How are you?\n\n  \nI am fine.  ") == [
        "Hello Mr. Smith.", "How are you?", "I am fine."]
    assert split_sentences("") == []


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


CFG = SourceConfig(min_document_chars=40, min_document_sentences=2, max_document_chars=5000,
                   book_document_max_chars=2000)


def _raw(body: str, kind: str = "wiki") -> RawDocument:
    return RawDocument(doc_id="wiki:test:1", source="test.xml", kind=kind, text=body)


def test_to_document_ok_for_wiki_and_book():
    doc = to_document(_raw("'''X''' is a [[thing]]. It is very well known indeed."), CFG)
    assert doc == Document("wiki:test:1", "test.xml", ("X is a thing.", "It is very well known indeed."))
    book = to_document(_raw("It was a dark\nand stormy night.\n\nThe rain fell in torrents.", "book"), CFG)
    assert isinstance(book, Document)
    assert book.sentences == ("It was a dark and stormy night.", "The rain fell in torrents.")


def test_to_document_too_short():
    few_chars = to_document(_raw("Short. Text."), CFG)
    assert (few_chars.outcome, few_chars.reason) == ("skipped", "too_short")
    one_sentence = to_document(_raw("A single sentence that is long enough to pass the characters"), CFG)
    assert isinstance(one_sentence, Rejected) and one_sentence.reason == "too_short"
    only_markup = to_document(_raw("{{Infobox|a=" + "b" * 500 + "}}"), CFG)
    assert only_markup.reason == "too_short"


def test_to_document_too_large_is_a_dead_letter():
    rejected = to_document(_raw("word " * 2000), CFG)
    assert (rejected.outcome, rejected.reason) == ("failed", "too_large")
    assert rejected.detail == "10000 characters > max_document_chars"
    assert rejected.doc_id == "wiki:test:1" and rejected.source == "test.xml"


def test_to_document_clean_error_never_raises(monkeypatch):
    def boom(_):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(text, "clean_wikitext", boom)
    rejected = to_document(_raw("Some text. More text here, long enough."), CFG)
    assert (rejected.outcome, rejected.reason) == ("failed", "clean_error")
    assert rejected.detail.startswith("RecursionError: maximum recursion")
    unknown = to_document(_raw("Some text.", kind="pdf"), CFG)
    assert unknown.reason == "clean_error" and "pdf" in unknown.detail
