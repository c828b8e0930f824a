"""What every input format shares after reading: a raw document cleaned by its format's cleaner
(``preprocess.readers.cleaner``), split into sentences, and checked against the length limits.

Everything here is a pure function of its arguments (no I/O, no Beam), so the Beam transforms and the vocabulary
sample share it and tests can call it directly. Paragraphs are separated by a single "\\n" in every cleaned text.
"""
from __future__ import annotations

import blingfire

from common.preprocess_config import SourceConfig
from preprocess.readers import cleaner
from preprocess.records import Document, RawDocument, Rejected


def split_sentences(text: str) -> list[str]:
    """Split cleaned text into sentences with blingfire, paragraph by paragraph.

    Args:
        text: Paragraphs separated by "\\n".

    Returns:
        Stripped, non-empty sentences in order.
    """
    sentences: list[str] = []
    for paragraph in text.split("\n"):
        if not paragraph.strip():
            continue
        for sentence in blingfire.text_to_sentences(paragraph).split("\n"):
            sentence = sentence.strip()
            if sentence:
                sentences.append(sentence)
    return sentences


def _short_repr(exc: BaseException, limit: int = 200) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def to_document(raw: RawDocument, cfg: SourceConfig) -> Document | Rejected:
    """Clean a raw document and split it into sentences; never raises.

    Args:
        raw: A page, book chunk or record as read by a reader of ``preprocess.readers``.
        cfg: Length limits.

    Returns:
        A ``Document``, or a ``Rejected`` record: failed "too_large" when the raw text is longer
        than ``cfg.max_document_chars``, failed "clean_error" when cleaning raised, skipped
        "too_short" when the cleaned text has fewer than ``cfg.min_document_chars`` characters or
        fewer than ``cfg.min_document_sentences`` sentences.
    """
    def reject(outcome: str, reason: str, detail: str = "") -> Rejected:
        return Rejected(source=raw.source, doc_id=raw.doc_id, outcome=outcome, reason=reason,
                        detail=detail)

    try:
        n = len(raw.text)
        if n > cfg.max_document_chars:
            return reject("failed", "too_large", f"{n} characters > max_document_chars")
        cleaned = cleaner(raw.kind)(raw.text)
        sentences = split_sentences(cleaned)
    except Exception as exc:  # one bad document must never stop the run
        return reject("failed", "clean_error", _short_repr(exc))
    if len(cleaned) < cfg.min_document_chars or len(sentences) < cfg.min_document_sentences:
        return reject("skipped", "too_short",
                      f"{len(cleaned)} characters, {len(sentences)} sentences")
    return Document(doc_id=raw.doc_id, source=raw.source, sentences=tuple(sentences))
