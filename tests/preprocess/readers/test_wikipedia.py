"""Tests for preprocess.readers.wikipedia (and the open errors of preprocess.readers.inputs that it raises) on the
real data slice and on broken inputs made from it."""
from __future__ import annotations

import bz2
import collections
import gzip
import pathlib

import pytest

from common.errors import InputError
from common.preprocess_config import SourceConfig
from preprocess.readers import inputs, wikipedia
from preprocess.readers.wikitext import clean_wikitext
from preprocess.records import RawDocument, Rejected

WIKI_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
CFG = SourceConfig()


@pytest.fixture(scope="module")
def wiki_dump(shared_data) -> pathlib.Path:
    return shared_data / "wikipedia" / WIKI_NAME


@pytest.fixture(scope="module")
def wiki_bytes(wiki_dump) -> bytes:
    return wiki_dump.read_bytes()


@pytest.fixture(scope="module")
def books(shared_data) -> pathlib.Path:
    return shared_data / "books"


def _expect_input_error(path: pathlib.Path, *needles: str, reader=wikipedia.iter_wikipedia) -> str:
    with pytest.raises(InputError) as info:
        list(reader(str(path), CFG))
    message = str(info.value)
    assert message.startswith(InputError.MARKER) and str(path) in message
    for needle in needles:
        assert needle in message, message
    return message


# --- the real Wikipedia slice ------------------------------------------------------------------

def test_real_dump_counts_and_ids(wiki_dump):
    records = list(wikipedia.iter_wikipedia(str(wiki_dump), CFG))
    assert len(records) == 206
    articles = [r for r in records if isinstance(r, RawDocument)]
    reasons = collections.Counter(r.reason for r in records if isinstance(r, Rejected))
    assert len(articles) == 106
    assert reasons == {"redirect": 99, "non_article_namespace": 1}
    assert len(articles) + sum(reasons.values()) == 206
    assert all(r.outcome == "skipped" for r in records if isinstance(r, Rejected))
    assert records[0].doc_id == "wiki:enwiki:10" and records[0].reason == "redirect"

    first = articles[0]
    assert (first.doc_id, first.source, first.kind) == ("wiki:enwiki:12", WIKI_NAME, "wiki")
    assert first.text.startswith("{{Redirect2|Anarchist")
    prose = clean_wikitext(first.text)
    assert prose.startswith("Anarchism is a political philosophy that advocates self-governed "
                            "societies based on voluntary institutions.")
    assert len({a.doc_id for a in articles}) == 106


def test_plain_xml_and_gzip_and_missing_dbname(tmp_path, wiki_bytes):
    xml = bz2.decompress(wiki_bytes)
    plain = tmp_path / "dump.xml"
    plain.write_bytes(xml.replace(b"<dbname>enwiki</dbname>", b""))
    gz = tmp_path / "dump.xml.gz"
    gz.write_bytes(gzip.compress(xml, compresslevel=1))
    ids_plain = [r.doc_id for r in wikipedia.iter_wikipedia(str(plain), CFG)]
    ids_gz = [r.doc_id for r in wikipedia.iter_wikipedia(str(gz), CFG)]
    assert len(ids_plain) == len(ids_gz) == 206
    assert ids_plain[1] == "wiki:wiki:12" and ids_gz[1] == "wiki:enwiki:12"


def test_other_export_namespace_and_page_level_rejects(tmp_path):
    dump = tmp_path / "tiny.xml"
    dump.write_text(
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/"><siteinfo><dbname>xxwiki'
        "</dbname></siteinfo>"
        "<page><title>Empty</title><ns>0</ns><id>1</id><revision><id>9</id><text /></revision></page>"
        "<page><title>Big</title><ns>0</ns><id>2</id><revision><text>" + "y" * 3000 +
        "</text></revision></page>"
        "<page><title>Ok</title><ns>0</ns><id>3</id><revision><text>Fine.</text></revision></page>"
        "</mediawiki>", encoding="utf-8")
    cfg = SourceConfig(max_document_chars=2000, book_document_max_chars=1000)
    empty, big, ok = wikipedia.iter_wikipedia(str(dump), cfg)
    assert (empty.doc_id, empty.outcome, empty.reason) == ("wiki:xxwiki:1", "skipped", "empty")
    assert (big.doc_id, big.outcome, big.reason) == ("wiki:xxwiki:2", "failed", "too_large")
    assert big.detail == "3000 characters > max_document_chars" and "y" * 10 not in repr(big)
    assert ok == RawDocument("wiki:xxwiki:3", "tiny.xml", "wiki", "Fine.")


# --- broken dumps ------------------------------------------------------------------------------

def test_truncated_bz2_half_the_real_file(tmp_path, wiki_bytes):
    cut = tmp_path / WIKI_NAME
    cut.write_bytes(wiki_bytes[: len(wiki_bytes) // 2])
    _expect_input_error(cut, "ends early", "truncated", "re-download")


def _bz2_block_offsets(data: bytes) -> list[int]:
    """Bit offsets of the bz2 block headers (the 48-bit magic 0x314159265359, not byte-aligned)."""
    magic, number, found = b"\x31\x41\x59\x26\x53\x59", int.from_bytes(data, "big"), []
    for shift in range(8):
        shifted = (number << shift).to_bytes(len(data) + 1, "big")
        at = shifted.find(magic)
        while at != -1:
            found.append(at * 8 + 8 - shift)
            at = shifted.find(magic, at + 1)
    return sorted(found)


def test_truncated_bz2_at_a_block_boundary(tmp_path, wiki_bytes):
    # bz2 blocks are bit-aligned; cutting at the byte holding the second block's header leaves
    # exactly one complete block. Python's bz2 still raises EOFError (no end-of-stream marker).
    block = _bz2_block_offsets(wiki_bytes)[1]
    cut = tmp_path / "cut-at-block.xml.bz2"
    cut.write_bytes(wiki_bytes[: block // 8])
    _expect_input_error(cut, "ends early")


def test_multistream_cut_at_a_stream_boundary_is_caught_by_the_xml(tmp_path, wiki_bytes):
    # A multistream dump cut exactly between two streams decompresses without any error;
    # the unfinished XML is what gives the truncation away.
    xml = bz2.decompress(wiki_bytes)
    middle = xml.index(b"  <page>", len(xml) // 2)
    first_stream = bz2.compress(xml[:middle], 1)
    whole = tmp_path / "multistream.xml.bz2"
    whole.write_bytes(first_stream + bz2.compress(xml[middle:], 1))
    assert len(list(wikipedia.iter_wikipedia(str(whole), CFG))) == 206
    cut = tmp_path / "multistream-cut.xml.bz2"
    cut.write_bytes(first_stream)
    _expect_input_error(cut, "XML ends before the dump is complete", "truncated")


def test_corrupt_bz2(tmp_path, wiki_bytes):
    data = bytearray(wiki_bytes)
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    bad = tmp_path / "corrupt.xml.bz2"
    bad.write_bytes(bytes(data))
    _expect_input_error(bad, "corrupt compressed data", "Invalid data stream")


def test_corrupt_gzip(tmp_path):
    bad = tmp_path / "corrupt.xml.gz"
    bad.write_bytes(b"this is not gzip at all")
    _expect_input_error(bad, "corrupt compressed data")


HEADER = '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo></siteinfo>'
PAGE = "<page><title>T</title><ns>0</ns><id>{id}</id><revision><text>{text}</text></revision></page>"


def test_malformed_xml(tmp_path):
    bad = tmp_path / "unclosed.xml"
    bad.write_text(HEADER + "\n<page><title>T</title>\n<ns>0</ns></mediawiki>\n")
    _expect_input_error(bad, "malformed XML at line 3", "mismatched tag")


def test_xml_ending_early(tmp_path):
    bad = tmp_path / "short.xml"
    bad.write_text(HEADER + PAGE.format(id=1, text="Hello.") + "<page><title>Cut")
    _expect_input_error(bad, "XML ends before the dump is complete")


def test_non_utf8_bytes_inside_xml_text(tmp_path):
    bad = tmp_path / "latin1.xml"
    bad.write_bytes((HEADER + "\n" + PAGE.format(id=1, text="Caf\xe9 au lait") + "</mediawiki>")
                    .encode("latin-1"))
    message = _expect_input_error(bad, "not valid UTF-8 XML at line 2")
    assert "offset" in message


@pytest.mark.parametrize("name,content", [
    ("empty.xml", b""), ("empty.xml.bz2", bz2.compress(b"")), ("zero.xml.bz2", b""),
    ("blank.xml", b"  \n\n "),
])
def test_empty_dumps(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    _expect_input_error(path, "empty file")


def test_not_a_mediawiki_dump(tmp_path):
    other = tmp_path / "feed.xml"
    other.write_text("<rss><channel><title>News</title></channel></rss>")
    _expect_input_error(other, "not a MediaWiki XML dump", "<rss>")
    no_pages = tmp_path / "no-pages.xml"
    no_pages.write_text(HEADER + "</mediawiki>")
    _expect_input_error(no_pages, "not a MediaWiki XML dump", "no <page>")
    text = tmp_path / "notes.xml"
    text.write_text("just some text, not XML")
    _expect_input_error(text, "not a MediaWiki XML dump")


def test_missing_path(tmp_path):
    missing = tmp_path / "nope" / "dump.xml.bz2"
    _expect_input_error(missing, "cannot open", "FileNotFoundError", "does not exist")
    with pytest.raises(InputError, match="cannot open"):
        inputs.open_uri(str(missing))
