"""A single huge Wikipedia page is never held whole: the reader keeps at most ``max_document_chars + 1`` characters
of a page's text, so memory stays bounded by that limit (and the parser's chunk), not by the page."""
import tracemalloc

from common.preprocess_config import SourceConfig
from preprocess.readers import wikipedia
from preprocess.records import RawDocument, Rejected

PAGE = "<page><title>{title}</title><ns>0</ns><id>{id}</id><revision><text>{text}</text></revision></page>"


def _dump(path, huge_chars: int):
    with open(path, "w", encoding="utf-8") as out:
        out.write('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo><dbname>enwiki</dbname>'
                  "</siteinfo>")
        out.write(PAGE.format(title="Small", id=1, text="Short prose. " * 10))
        out.write("<page><title>Huge</title><ns>0</ns><id>2</id><revision><text>")
        block = "Lorem ipsum dolor sit amet &amp; more. " * 1000  # entities too: expat hands text over in pieces
        for _ in range(huge_chars // len(block)):
            out.write(block)
        out.write("</text></revision></page>")
        out.write(PAGE.format(title="After", id=3, text="Prose after the huge page. " * 10))
        out.write("</mediawiki>")


def test_a_huge_page_is_rejected_as_too_large_without_being_held_whole(tmp_path):
    dump, huge = tmp_path / "huge.xml", 48 << 20  # 48 M characters against a limit of 100,000
    _dump(dump, huge)
    cfg = SourceConfig(max_document_chars=100_000, book_document_max_chars=100_000)
    tracemalloc.start()
    try:
        records = list(wikipedia.iter_wikipedia(str(dump), cfg))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [type(r) for r in records] == [RawDocument, Rejected, RawDocument]
    assert records[1].reason == "too_large" and records[1].doc_id == "wiki:enwiki:2"
    length = int(records[1].detail.split()[0])
    assert length > 40 << 20 and records[1].detail.endswith("characters > max_document_chars")
    # Bounded by the limit, not the page: a few times 100,000 characters plus the parser's chunks, where holding the
    # page would take its 48 M characters (and more, while joined).
    assert peak < 8 << 20, peak
    assert records[2].text.startswith("Prose after the huge page.")


def test_a_page_at_the_limit_is_kept_whole_and_one_past_it_is_not(tmp_path):
    for chars, kind in ((1000, RawDocument), (1001, Rejected)):
        dump = tmp_path / f"page{chars}.xml"
        dump.write_text('<mediawiki><siteinfo><dbname>w</dbname></siteinfo>'
                        + PAGE.format(title="T", id=7, text="x" * chars) + "</mediawiki>")
        (record,) = wikipedia.iter_wikipedia(str(dump), SourceConfig(max_document_chars=1000, book_document_max_chars=1000))
        assert type(record) is kind
        if kind is RawDocument:
            assert record.text == "x" * 1000
        else:
            assert record.detail == "1001 characters > max_document_chars"
