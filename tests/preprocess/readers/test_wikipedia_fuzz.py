"""Fuzzing the Wikipedia dump reader (preprocess.readers.wikipedia.iter_wikipedia) and the wikitext cleaner it feeds
(preprocess.readers.wikitext via preprocess.text.to_document): every damaged dump gives pages or one InputError line naming the
file, every page gives a document or a dead letter, in time linear in its size, and nothing is written."""
import bz2
import gzip
import html
import re
import sys

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from common import processes
from common.errors import InputError
from common.preprocess_config import SourceConfig
from preprocess.readers import wikipedia
from preprocess.readers.wikitext import clean_wikitext
from preprocess.records import RawDocument, Rejected
from preprocess.text import Document, to_document
from tests.fuzz_documents import FUZZ, damaged_bytes, listing
from tests.preprocess.conftest import REPO_ROOT, SAMPLES

CFG = SourceConfig()
NO_SHRINKING = (Phase.explicit, Phase.reuse, Phase.generate)
DUMP = bz2.decompress((SAMPLES / "wikipedia" / "samplewiki-pages-articles.xml.bz2").read_bytes())
# The site info and the first four pages (a redirect and articles), closed: a small valid dump to damage.
_FOURTH_PAGE_END = [match.end() for match in re.finditer(rb"</page>", DUMP)][3]
SMALL_DUMP = DUMP[:_FOURTH_PAGE_END] + b"\n</mediawiki>\n"
ARTICLES = [html.unescape(text) for text in re.findall(r"<text[^>]*>(.*?)</text>", DUMP.decode(), re.S)
            if len(text) > 1500][:6]
# XML that a broken or hostile dump holds: markup cut or repeated, entities (one naming a local file), CDATA, a
# second root, character references to what XML forbids.
XML_FRAGMENTS = (b"<", b"&", b"&amp;", b"&#0;", b"&#xD800;", b"]]>", b"<![CDATA[x]]>", b"<page>", b"</page>",
                 b"</revision>", b"<text>", b"<ns>x</ns>", b"<ns/>", b"<redirect/>", b"<!-- ", b"<mediawiki>",
                 b"<?xml version='1.0'?>", b'<!DOCTYPE m [<!ENTITY e SYSTEM "file:///etc/hostname">]>', b"&e;",
                 b"<title>" + b"x" * 300 + b"</title>", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00")
# Wikitext that markup parsers choke on: unclosed and mismatched constructs.
WIKITEXT_FRAGMENTS = ("{{", "}}", "[[", "]]", "{|", "|}", "|", "<ref>", "<ref name=", "</ref>", "<!--", "-->",
                      "\n== See also ==\n", "\n==", "'''", "<math", "</math>", "<nowiki>", "<pre>", "[http://",
                      "[[File:x.png|thumb|[[a]]]]", "&amp;", "&#x1F600;", "\u202e", "\x00", "<div>", "<table ", "(",
                      "__TOC__", "\n*", "{{{1}}}", "<br/>")


def _read_dump(path) -> list:
    """Every record of the dump at ``path``, each article cleaned; None when refused in one line naming it."""
    try:
        records = list(wikipedia.iter_wikipedia(str(path), CFG))
    except InputError as error:
        assert "\n" not in error.message and str(path) in error.message, error.message
        return None
    for record in records:
        assert isinstance(record, (RawDocument, Rejected))
        if isinstance(record, RawDocument):
            assert isinstance(to_document(record, CFG), (Document, Rejected))
    return records


def test_the_small_sample_dump_is_read(tmp_path):
    path = tmp_path / "sample.xml"
    path.write_bytes(SMALL_DUMP)
    assert sum(isinstance(record, RawDocument) for record in _read_dump(path)) >= 2


@pytest.mark.parametrize("compression", ["xml", "xml.bz2", "xml.gz"])
def test_damaged_dumps_are_read_or_refused_in_one_line(tmp_path, compression):
    compress = {"xml": bytes, "xml.bz2": bz2.compress, "xml.gz": gzip.compress}[compression]
    spliced = st.tuples(st.integers(0, len(SMALL_DUMP)), st.sampled_from(XML_FRAGMENTS), st.integers(1, 3)).map(
        lambda edit: SMALL_DUMP[:edit[0]] + edit[1] * edit[2] + SMALL_DUMP[edit[0]:])

    @settings(FUZZ, max_examples=150)
    @given(st.one_of(spliced, damaged_bytes(SMALL_DUMP)))
    def check(data):
        path = tmp_path / f"dump.{compression}"
        path.write_bytes(compress(data))
        _read_dump(path)
        assert listing(tmp_path) == [path.name]

    check()


def test_damaged_compressed_bytes_are_read_or_refused_in_one_line(tmp_path):
    compressed = bz2.compress(SMALL_DUMP)

    @settings(FUZZ, max_examples=150)
    @given(damaged_bytes(compressed))
    def check(data):
        path = tmp_path / "dump.xml.bz2"
        path.write_bytes(data)
        _read_dump(path)

    check()


def test_mangled_articles_are_cleaned_in_linear_time(tmp_path):
    """Fragments repeated a few thousand times: a cleaner quadratic in them takes seconds, past the deadline."""
    edits = st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(WIKITEXT_FRAGMENTS), st.integers(1, 2000)),
                     min_size=1, max_size=4)

    @settings(FUZZ, max_examples=150, deadline=2000, phases=NO_SHRINKING)  # shrinking slow examples: minutes
    @given(st.sampled_from(ARTICLES), edits)
    def check(article, changes):
        for at, fragment, repeat in changes:
            at %= len(article) + 1
            article = article[:at] + fragment * repeat + article[at:]
        assert isinstance(clean_wikitext(article), str)
        page = RawDocument(doc_id="wiki:x:1", source="x.xml", kind="wiki", text=article)
        assert isinstance(to_document(page, CFG), (Document, Rejected))

    check()


# ---- regressions: each a bug the fuzzing found, kept as a plain test

_UNITS = ["<!--", "<ref name=", "[http://", "<math ", "<table ", "<pre></ref>", "<nowiki>x</ref>"]
_CLEAN_ALL = """
import resource, sys
from preprocess.readers import wikitext

resource.setrlimit(resource.RLIMIT_CPU, (120, 120))  # a runaway bound (SIGXCPU), not a measurement
parse, handed = wikitext.mwparserfromhell.parse, []
def counting(text, *args, **kwargs):
    handed.append(len(text))
    return parse(text, *args, **kwargs)
wikitext.mwparserfromhell.parse = counting
for unit in sys.argv[1:]:
    page = "Prose before the markup. " + unit * 20_000 + " prose after."
    handed.clear()
    cleaned = wikitext.clean_wikitext(page)
    print(len(page), sum(handed), "Prose before the markup." in cleaned)
"""


def test_unclosed_comments_tags_and_links_are_cleaned_in_linear_work():
    """Each of these once made a regex or the parser rescan the rest of the page from every occurrence: quadratic in
    a page, which may hold up to max_document_chars (4 million) characters. The work counted: the characters handed
    to mwparserfromhell (the part that rescans) stay within the page's own size; the regex fallback's patterns stop
    where a construct cannot go on, and a child limited to 120 s of CPU (minutes of rescanning per unit, were any
    quadratic again) must finish all seven."""
    result = processes.run([sys.executable, "-c", _CLEAN_ALL, *_UNITS], capture_output=True, text=True,
                           timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    for unit, line in zip(_UNITS, result.stdout.splitlines(), strict=True):
        size, parsed, kept = line.split()
        assert int(parsed) <= int(size) and kept == "True", (unit, line)


def test_an_unclosed_comment_hides_the_rest_of_the_page_as_mediawiki_renders_it():
    cleaned = clean_wikitext("Shown before. <!-- a comment never closed.\n\nHidden paragraph.\n")
    assert cleaned == "Shown before."


def test_a_closed_comment_still_hides_only_itself():
    assert clean_wikitext("Shown <!-- hidden --> shown too. <!-- also hidden -->End.") == "Shown shown too. End."


def test_an_external_entity_is_never_read_into_a_page(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT")
    head, _, rest = SMALL_DUMP.partition(b"<mediawiki")
    dump = (head + b'<!DOCTYPE mediawiki [<!ENTITY leak SYSTEM "file://' + str(secret).encode() + b'">]>'
            + b"<mediawiki" + rest.replace(b"The ", b"&leak; The ", 1))
    path = tmp_path / "dump.xml"
    path.write_bytes(dump)
    with pytest.raises(InputError, match="undefined entity"):
        list(wikipedia.iter_wikipedia(str(path), CFG))


def test_nested_entities_are_refused_before_they_expand(tmp_path):
    entities = "".join(f'<!ENTITY {chr(98 + level)} "{("&" + chr(97 + level) + ";") * 10}">' for level in range(9))
    dump = (f'<?xml version="1.0"?><!DOCTYPE mediawiki [<!ENTITY a "{"lol" * 10}">{entities}]>'
            "<mediawiki><page><title>T</title><ns>0</ns><id>1</id><revision><text>&j;</text></revision></page>"
            "</mediawiki>")
    path = tmp_path / "dump.xml"
    path.write_text(dump)
    with pytest.raises(InputError, match="amplification"):
        list(wikipedia.iter_wikipedia(str(path), CFG))
