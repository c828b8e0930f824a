"""Tests for preprocess.text: sentence splitting, and to_document with each format's cleaner."""
from __future__ import annotations

from common.preprocess_config import SourceConfig
from preprocess.readers import wikipedia
from preprocess.records import Document, RawDocument, Rejected
from preprocess.text import split_sentences, to_document


def test_split_sentences_per_paragraph():
    assert split_sentences("Hello Mr. Smith. How are you?\n\n  \nI am fine.  ") == [
        "Hello Mr. Smith.", "How are you?", "I am fine."]
    assert split_sentences("") == []


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

    monkeypatch.setattr(wikipedia.WikipediaReader, "clean", lambda self, text: boom(text))
    rejected = to_document(_raw("Some text. More text here, long enough."), CFG)
    assert (rejected.outcome, rejected.reason) == ("failed", "clean_error")
    assert rejected.detail.startswith("RecursionError: maximum recursion")
    unknown = to_document(_raw("Some text.", kind="pdf"), CFG)
    assert unknown.reason == "clean_error" and "pdf" in unknown.detail
