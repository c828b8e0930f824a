"""Streaming reader for MediaWiki XML dumps (the input I/O it shares with the other readers is
``preprocess.readers.inputs``; its text is cleaned by ``preprocess.readers.wikitext``, and a large .bz2 dump is read in
byte ranges cut by ``preprocess.readers.dumpsplit``).

Readers never hold a whole file in memory: dumps are parsed incrementally by expat, and of a page's text at most
``max_document_chars + 1`` characters are kept (a longer page is counted and rejected as "too_large").
File-level problems (unreadable URI, truncated or corrupt compression, malformed XML) raise ``InputError``;
page-level problems are yielded as ``Rejected`` records so the run can go on and count them.
"""
from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from typing import IO, Iterator

from common.errors import InputError
from common.preprocess_config import SourceConfig
from preprocess.readers import dumpsplit, parquet, wikimedia
from preprocess.readers.inputs import Utf8Check, WholeFileReader, is_compressed, open_uri, read_error, source_name
from preprocess.readers.wikitext import clean_wikitext
from preprocess.records import RawDocument, Rejected

# Expat error codes (xml.parsers.expat.errors) that mean "the input stopped in the middle".
_XML_ENDED_EARLY = {3, 5, 6}  # no element found, unclosed token, partial character
_XML_INVALID_TOKEN = 4


class _CheckedReader:
    """A byte stream wrapper that remembers what the XML parser was fed.

    It counts bytes, notes whether anything but whitespace was seen and finds the first byte
    that is not valid UTF-8, so a parser error can be explained ("empty file", "not UTF-8 at
    byte N") instead of only "not well-formed".
    """

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self.utf8 = Utf8Check()
        self.eof = self.nonblank = self.root_seen = False

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.eof = self.eof or not data
        self.nonblank = self.nonblank or bool(data.strip())
        self.utf8.feed(data)
        return data

    def probe(self, limit: int = 8 << 20) -> Exception | None:
        """Read on a little after a parse error; return the decompression error found, if any.

        A bz2 block's CRC is checked only at the end of the block, after its (corrupt) bytes were
        handed out, so the XML parser may fail first. The real cause is the compression error.
        """
        try:
            while limit > 0 and self._raw.read(min(limit, 1 << 20)):
                limit -= 1 << 20
        except Exception as exc:  # the decompressor's verdict on the bytes already parsed
            return exc
        return None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _parse_error(uri: str, exc: ET.ParseError, reader: _CheckedReader) -> InputError:
    line, column = getattr(exc, "position", (0, 0))
    code = getattr(exc, "code", None)
    if reader.utf8.seen == 0:
        return InputError(f"{uri}: empty file (0 bytes after decompression); "
                          "re-download it or remove it from the inputs")
    if not reader.nonblank:
        return InputError(f"{uri}: empty file (only whitespace); "
                          "re-download it or remove it from the inputs")
    if reader.utf8.bad_offset is not None and code == _XML_INVALID_TOKEN:
        return InputError(
            f"{uri}: not valid UTF-8 XML at line {line}, column {column} (first invalid UTF-8 "
            f"byte at offset {reader.utf8.bad_offset} after decompression); MediaWiki dumps are "
            "UTF-8, so the file is corrupt or was re-encoded — re-download it")
    if not reader.root_seen:
        return InputError(f"{uri}: not a MediaWiki XML dump: not XML at all ({exc}); "
                          "pass a pages-articles .xml or .xml.bz2 file")
    if code in _XML_ENDED_EARLY and reader.eof:
        return InputError(
            f"{uri}: the XML ends before the dump is complete (line {line}, column {column}: "
            f"{exc}); the file was cut short (truncated download, or a multistream .bz2 cut "
            "at a stream boundary) — re-download it and check its size and checksum")
    return InputError(f"{uri}: malformed XML at line {line}, column {column}: {exc}; "
                      "the file is corrupt — re-download it or check how it was produced")


def iter_wikipedia(uri: str, cfg: SourceConfig,
                   byte_range: tuple[int, int] | None = None,
                   headers: dict[str, bytes] | None = None) -> Iterator[RawDocument | Rejected]:
    """Stream the pages of a MediaWiki ``pages-articles`` XML dump.

    Args:
        uri: A .xml, .xml.bz2 (single or multistream) or otherwise compressed dump.
        cfg: Size limits.
        byte_range: For a .bz2 dump, only the pages of the compressed bytes ``[lo, hi)`` (see
            ``preprocess.readers.dumpsplit``): the ranges of a file together give each page exactly once.
        headers: A cache of dump headers by URI that the caller keeps, so that several ranges of one file
            decompress its first block once.

    Yields:
        A ``RawDocument`` (kind "wiki", wikitext) per main-namespace article, and a ``Rejected``
        per other page: skipped "non_article_namespace", "redirect" or "empty", or failed
        "too_large" (its text is not yielded).

    Raises:
        InputError: The file cannot be read, its compression is truncated or corrupt, it is not
            well-formed UTF-8 XML, it is empty, or it is not a MediaWiki dump.
    """
    source = source_name(uri)
    if byte_range is not None:
        yield from _iter_range(uri, source, cfg, *byte_range, headers if headers is not None else {})
        return
    with open_uri(uri) as raw:
        reader = _CheckedReader(raw)
        try:
            yield from _iter_pages(uri, source, cfg, reader)
        except InputError:
            raise
        except ET.ParseError as exc:
            cause = reader.probe()
            if cause is not None:
                raise read_error(uri, cause, reader.utf8.seen) from exc
            raise _parse_error(uri, exc, reader) from exc
        except Exception as exc:  # decompression and transport errors surface from read()
            raise read_error(uri, exc, reader.utf8.seen) from exc


def _iter_range(uri: str, source: str, cfg: SourceConfig, lo: int, hi: int,
                headers: dict[str, bytes]) -> Iterator[RawDocument | Rejected]:
    with open_uri(uri, decompress=False) as raw:
        reader = None
        try:
            if lo and uri not in headers:
                headers[uri] = dumpsplit.dump_header(raw)
            header = headers[uri] if lo else b""
            chunks = dumpsplit.range_xml(raw, lo, hi, header)
            first = next(chunks, None)
            if first is None:
                return  # no page starts in this range
            reader = _CheckedReader(dumpsplit.IterReader(itertools.chain([first], chunks)))
            yield from _iter_pages(uri, source, cfg, reader, whole_file=False)
        except InputError:
            raise
        except dumpsplit.SplitError as exc:
            raise InputError(f"{uri}: {exc}; the file is damaged — re-download it and check its checksum") from exc
        except ET.ParseError as exc:
            raise _parse_error(f"{uri} (the pages in compressed bytes {lo}-{hi})", exc, reader) from exc
        except Exception as exc:  # transport errors
            raise read_error(uri, exc) from exc


def _iter_pages(uri: str, source: str, cfg: SourceConfig, reader: _CheckedReader,
                whole_file: bool = True) -> Iterator[RawDocument | Rejected]:
    """The pages of the dump ``reader`` reads, parsed in chunks of ``_CHUNK`` bytes by expat through ``_Pages``,
    which keeps of a page's text at most ``max_document_chars + 1`` characters: a page of gigabytes is counted and
    rejected as too large, never held whole."""
    target = _Pages(uri, source, cfg, reader)
    parser = ET.XMLParser(target=target)
    while True:
        data = reader.read(_CHUNK)
        if data:
            parser.feed(data)
        else:
            parser.close()
        yield from target.done
        target.done.clear()
        if not data:
            break
    if target.pages == 0 and whole_file:  # a byte range may own no page
        raise InputError(f"{uri}: not a MediaWiki XML dump: <mediawiki> holds no <page> "
                         "elements; pass a pages-articles XML dump")


_CHUNK = 1 << 16
_SHORT_FIELD = 4096  # characters kept of a title, namespace, id or database name (MediaWiki titles: 255 bytes)


class _Pages:
    """An ``XMLParser`` target: the fields of each ``<page>`` as expat hands their text over in pieces, each kept up
    to a bound (the text: ``max_document_chars + 1``, so that its length still decides "too_large"); a finished page
    becomes a record in ``done``."""

    def __init__(self, uri: str, source: str, cfg: SourceConfig, reader: _CheckedReader):
        self.uri, self.source, self.cfg, self.reader = uri, source, cfg, reader
        self.path: list[str] = []
        self.done: list[RawDocument | Rejected] = []
        self.pages, self.dbname = 0, "wiki"
        self.field: str | None = None          # the field whose text is being collected
        self.parts: list[str] = []
        self.kept = self.length = 0
        self._new_page()

    def _new_page(self) -> None:
        self.page: dict = {"redirect": False}

    def start(self, tag: str, _attrib: dict) -> None:
        name = _local(tag)
        if not self.path:
            self.reader.root_seen = True
            if name != "mediawiki":
                raise InputError(f"{self.uri}: not a MediaWiki XML dump: the root element is <{name}>, "
                                 "expected <mediawiki>; pass a pages-articles XML dump")
        parent = self.path[-1] if self.path else None
        self.path.append(name)
        if name == "page" and parent == "mediawiki":
            self._new_page()
        elif name == "redirect" and parent == "page":
            self.page["redirect"] = True
        elif (parent, name) in _FIELDS:
            self.field, self.parts, self.kept, self.length = _FIELDS[(parent, name)], [], 0, 0

    def data(self, text: str) -> None:
        if self.field is None:
            return
        limit = self.cfg.max_document_chars + 1 if self.field == "text" else _SHORT_FIELD
        self.length += len(text)
        if self.kept < limit:
            piece = text[:limit - self.kept]
            self.parts.append(piece)
            self.kept += len(piece)

    def end(self, tag: str) -> None:
        name = self.path.pop()
        if self.field is not None and (self.path[-1] if self.path else None, name) in _FIELDS:
            value = "".join(self.parts) if self.parts else None
            if self.field == "dbname":
                self.dbname = (value or "").strip() or self.dbname
            else:  # a later revision's text replaces an earlier one's: with full history the last is current
                self.page[self.field] = value
                if self.field == "text":
                    self.page["text_length"] = self.length
            self.field, self.parts = None, []
        elif name == "page" and self.path == ["mediawiki"]:
            self.pages += 1
            self.done.append(_page_record(self.page, self.source, self.dbname, self.cfg))
            self._new_page()

    def close(self) -> None:
        return None


# (parent, element) -> the field its text fills.
_FIELDS = {("page", "title"): "title", ("page", "ns"): "ns", ("page", "id"): "id", ("revision", "text"): "text",
           ("siteinfo", "dbname"): "dbname"}


def _page_record(page: dict, source: str, dbname: str, cfg: SourceConfig) -> RawDocument | Rejected:
    title = page.get("title") or ""
    ns = (page.get("ns") or "").strip() if "ns" in page else None
    page_id = (page.get("id") or "").strip() if "id" in page else None
    text = page.get("text")
    doc_id = f"wiki:{dbname}:{page_id or 'unknown'}"
    if ns != "0":
        outcome, reason, detail = "skipped", "non_article_namespace", f"ns={ns} title={title!r}"
    elif page["redirect"]:
        outcome, reason, detail = "skipped", "redirect", f"title={title!r}"
    elif text is None or not text.strip():
        outcome, reason, detail = "skipped", "empty", f"title={title!r}"
    elif page["text_length"] > cfg.max_document_chars:
        outcome, reason, detail = "failed", "too_large", f"{page['text_length']} characters > max_document_chars"
    else:
        return RawDocument(doc_id=doc_id, source=source, kind="wiki", text=text)
    return Rejected(source=source, doc_id=doc_id, outcome=outcome, reason=reason, detail=detail)


def dump_language(dbname: str) -> str:
    """A Wikipedia's language from its database name: ``bgwiki`` -> ``bg``, ``zh_yuewiki`` -> ``zh_yue``; ""
    for a dump that names none (our reader's placeholder ``wiki``)."""
    return dbname[:-len("wiki")] if dbname.endswith("wiki") else dbname


class WikipediaReader(WholeFileReader):
    """``preprocess.readers.Reader`` of MediaWiki dumps (the built-in ``--wikipedia`` source, key "wiki"), and of
    wikimedia/wikipedia Parquet files (``.parquet``: ``preprocess.readers.wikimedia``)."""

    kind = "wiki"

    def clean(self, text: str) -> str:
        return clean_wikitext(text)

    def splittable(self, uri: str, spec=None) -> bool:
        # .bz2: independent blocks (other compressions must be read from their start); Parquet: row groups
        return uri.endswith(".bz2") or wikimedia.is_wikimedia(uri)

    def pieces(self, uri: str, size: int, count: int, spec=None, exact: bool = False) -> list[tuple[float, tuple]]:
        """Byte ranges of a .bz2 dump (``dumpsplit``); ``exact`` moves them to block starts (a few small reads), so
        that their sizes are their work."""
        if not self.splittable(uri):
            return []
        if wikimedia.is_wikimedia(uri):
            return parquet.group_runs(parquet.row_groups(uri), count)
        ranges = dumpsplit.byte_ranges(size, count)
        if exact and len(ranges) > 1:
            with open_uri(uri, decompress=False) as raw:
                ranges = dumpsplit.snap_to_blocks(raw, size, ranges)
        return [((hi - lo) / size, ("bytes", lo, hi)) for lo, hi in ranges]

    def read(self, uri: str, piece, spec, cfg: SourceConfig, cache: dict) -> Iterator[RawDocument | Rejected]:
        if wikimedia.is_wikimedia(uri):
            return wikimedia.iter_wikimedia(uri, piece)
        if piece is None:
            return iter_wikipedia(uri, cfg)
        _, lo, hi = piece
        return iter_wikipedia(uri, cfg, byte_range=(lo, hi), headers=cache.setdefault("dump_headers", {}))

    def memory_class(self, uri: str) -> str:
        if wikimedia.is_wikimedia(uri):
            return parquet.READER.memory_class(uri)
        return "wiki_compressed" if is_compressed(uri) else "wiki"

    def cost_per_byte(self, uri: str) -> float:
        if wikimedia.is_wikimedia(uri):
            return parquet.READER.cost_per_byte(uri)
        return 2.0 * (4.0 if is_compressed(uri) else 1.0)  # a compressed dump expands as it is read

    def id_language(self, doc_id: str) -> str:
        """``wiki:bgwiki:558`` -> ``bg``: a dump's documents carry its dbname."""
        return dump_language(doc_id.split(":")[1])


READER = WikipediaReader()
