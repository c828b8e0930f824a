"""preprocess.readers.books: plain-text books read as bounded documents, on the real books and on edge cases."""
from __future__ import annotations

import gzip
import pathlib

import pytest

from common.errors import InputError
from common.preprocess_config import SourceConfig
from preprocess.readers import books
from preprocess.records import RawDocument, Rejected

CFG = SourceConfig()


@pytest.fixture(scope="module")
def book_dir(shared_data) -> pathlib.Path:
    return shared_data / "books"


def test_missing_book_is_named(tmp_path):
    missing = tmp_path / "nope" / "book.txt"
    with pytest.raises(InputError, match="cannot open") as info:
        list(books.iter_book(str(missing), CFG))
    assert str(missing) in str(info.value)


def test_real_utf8_book_is_chunked_by_chapter(book_dir):
    chunks = list(books.iter_book(str(book_dir / "pg1342-pride-and-prejudice.txt"), CFG))
    assert all(isinstance(c, RawDocument) and c.kind == "book" for c in chunks)
    assert [c.doc_id for c in chunks[:2]] == ["book:pg1342-pride-and-prejudice.txt:00000",
                                               "book:pg1342-pride-and-prejudice.txt:00001"]
    assert len(chunks) == 62  # front matter + 61 chapters
    assert chunks[1].text.startswith("Chapter I.]")
    assert "It is a truth universally acknowledged" in chunks[1].text
    assert chunks[2].text.startswith("CHAPTER II.") and chunks[-1].text.startswith("CHAPTER LXI.")
    assert "“" in chunks[1].text  # curly quotes decoded as UTF-8
    assert all(len(c.text) <= CFG.book_document_max_chars for c in chunks)


def test_gutenberg_boilerplate_is_stripped(book_dir):
    emma = list(books.iter_book(str(book_dir / "austen-emma.txt"), CFG))
    assert emma[0].text.lstrip().startswith("VOLUME I")
    assert not any("SMALL PRINT" in c.text or "Project Gutenberg" in c.text for c in emma)
    kept = list(books.iter_book(str(book_dir / "austen-emma.txt"), SourceConfig(strip_gutenberg_boilerplate=False)))
    assert "SMALL PRINT" in kept[0].text


def test_latin1_book_uses_the_fallback(book_dir):
    chunks = list(books.iter_book(str(book_dir / "chesterton-ball.txt"), CFG))
    assert chunks and all(isinstance(c, RawDocument) for c in chunks)
    joined = "".join(c.text for c in chunks)
    assert "Brunetière, Coppée" in joined and "café" in joined
    assert "END OF THE PROJECT GUTENBERG" not in joined and "SMALL PRINT" not in joined
    assert chunks[1].text.startswith("I. A DISCUSSION SOMEWHAT IN THE AIR")


def test_latin1_book_without_fallback_is_one_dead_letter(book_dir):
    cfg = SourceConfig(book_encoding_fallback=None)
    records = list(books.iter_book(str(book_dir / "chesterton-ball.txt"), cfg))
    assert records == [Rejected("chesterton-ball.txt", "book:chesterton-ball.txt", "failed",
                                "not_utf8", "byte offset 229333")]


def test_book_with_one_huge_line_streams(tmp_path):
    huge = tmp_path / "huge.txt"
    huge.write_bytes(("lorem ipsum dolor é " * 160_000).encode())  # ~3.4 MB, no newline
    cfg = SourceConfig(book_document_max_chars=50_000)
    chunks = list(books.iter_book(str(huge), cfg))
    assert all(isinstance(c, RawDocument) for c in chunks)
    assert all(0 < len(c.text) <= 50_000 for c in chunks)
    assert sum(len(c.text.split()) for c in chunks) == 4 * 160_000
    assert "\ufffd" not in "".join(c.text for c in chunks)  # é cut by the 1 MiB line limit survives


def test_bom_crlf_and_size_cuts(tmp_path):
    book = tmp_path / "bom.txt.gz"
    paragraph = "A sentence that goes on. " * 20 + "\r\n"
    book.write_bytes(gzip.compress(("\ufeffTitle\r\n\r\n" + (paragraph + "\r\n") * 200).encode()))
    chunks = list(books.iter_book(str(book), SourceConfig(book_document_max_chars=2000)))
    assert chunks[0].text.startswith("Title\n\nA sentence") and chunks[0].source == "bom.txt.gz"
    assert all(len(c.text) <= 2000 and "\r" not in c.text for c in chunks)
    assert all(c.text.rstrip().endswith("goes on.") for c in chunks)  # cut at paragraphs


@pytest.mark.parametrize("content", [
    b"", b"  \n\n\t\n",
    b"header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n\n*** END OF THE PROJECT GUTENBERG "
    b"EBOOK X ***\nlicense\n",
])
def test_empty_book(tmp_path, content):
    book = tmp_path / "empty.txt"
    book.write_bytes(content)
    (record,) = books.iter_book(str(book), CFG)
    assert (record.source, record.outcome, record.reason) == ("empty.txt", "failed", "empty_file")
