"""Plain records that flow between the readers, the cleaners and the Beam transforms."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RawDocument:
    """One unit of raw text as read from a source, before cleaning."""

    doc_id: str   # stable and location-independent: "wiki:enwiki:12", "book:austen-emma.txt:0003"
    source: str   # the file's base name (never the full URI, so s3:// and local runs agree)
    kind: str     # "wiki" (text is wikitext) or "book" (text is plain text)
    text: str


@dataclass(frozen=True)
class Document:
    """A cleaned document: an article or a bounded piece of a book, as a list of sentences."""

    doc_id: str
    source: str
    sentences: tuple[str, ...]


@dataclass(frozen=True)
class Rejected:
    """A document that was not used. ``outcome`` is "skipped" (by design) or "failed" (a dead letter)."""

    source: str
    doc_id: str
    outcome: str  # "skipped" | "failed"
    reason: str   # e.g. "redirect", "non_article_namespace", "too_short", "too_large", "not_utf8", "clean_error"
    detail: str = ""
