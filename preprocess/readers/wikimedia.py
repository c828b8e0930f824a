"""Wikipedia as the Hugging Face Hub holds it (``wikimedia/wikipedia``: Parquet files of ``id``, ``url``, ``title``,
``text``), read by the built-in ``--wikipedia`` source beside XML dumps (a ``.parquet`` file there is this format).

Its text is already plain (paragraphs by line; wikimedia's own cleaning of the wikitext), so it is cleaned as plain
text, not as wikitext. A row's id is the page's: ``wiki:{dbname}:{id}``, the dbname from its URL's host
(``en.wikipedia.org`` -> ``enwiki``), or from the dataset's directory (``20231101.en`` -> ``enwiki``), as the XML
reader names a dump's pages; so the same page has the same id, bucket and rows in both formats (tested: the shared
slice written as such Parquet gives the XML dump's shards). Read by row group, only these columns; a large file's
pieces are runs of row groups (``readers.parquet``). A row without text is skipped "empty" as an XML page is; one
whose text or id is not a string is a dead letter naming its row group and row.
"""
from __future__ import annotations

import re
from typing import Iterator
from urllib.parse import urlparse

from common.errors import InputError
from preprocess.readers.fields import KIND as PLAIN_KIND
from preprocess.readers.inputs import open_uri, source_name
from preprocess.readers.parquet import _open
from preprocess.records import RawDocument, Rejected

COLUMNS = ("id", "url", "title", "text")
_DATED_LANGUAGE = re.compile(r"^\d{8}\.([a-z_-]+)$")  # the Hub's config directories: 20231101.en
_BATCH_ROWS = 1024


def is_wikimedia(uri: str) -> bool:
    return uri.endswith(".parquet")


def dbname_of(url: object, uri: str) -> str:
    """``https://bg.wikipedia.org/wiki/…`` -> ``bgwiki``; else the directory's ``20231101.bg`` -> ``bgwiki``; else
    ``wiki`` (no language named, as an XML dump without a siteinfo dbname)."""
    host = urlparse(url).hostname if isinstance(url, str) else None
    if host and host.endswith(".wikipedia.org"):
        return host[:-len(".wikipedia.org")].replace("-", "_") + "wiki"
    for part in reversed(uri.replace("\\", "/").split("/")[:-1]):
        match = _DATED_LANGUAGE.match(part)
        if match:
            return match.group(1).replace("-", "_") + "wiki"
    return "wiki"


def iter_wikimedia(uri: str, piece: tuple | None = None) -> Iterator[RawDocument | Rejected]:
    """The pages of one wikimedia/wikipedia Parquet file (or of its row groups ``[lo, hi)``).

    Raises:
        InputError: Not a Parquet file, or without the ``id`` or ``text`` column.
    """
    source = source_name(uri)
    with open_uri(uri, decompress=False) as stream:
        parquet = _open(uri, stream)
        names = parquet.schema_arrow.names
        missing = [name for name in ("id", "text") if name not in names]
        if missing:
            raise InputError(f"{uri}: no {' or '.join(repr(m) for m in missing)} column: a --wikipedia Parquet file "
                             f"is wikimedia/wikipedia's (id, url, title, text); it has {', '.join(names)}")
        columns = [name for name in COLUMNS if name in names]
        lo, hi = (piece[1], piece[2]) if piece is not None else (0, parquet.num_row_groups)
        for group in range(lo, hi):
            row = 0
            for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group], columns=columns):
                values = {name: batch.column(name).to_pylist() for name in columns}
                for i in range(batch.num_rows):
                    yield _record(values, i, uri, source, f"{source} row group {group} row {row}")
                    row += 1


def _record(values: dict, i: int, uri: str, source: str, where: str) -> RawDocument | Rejected:
    page_id, text = values["id"][i], values["text"][i]
    title = values["title"][i] if "title" in values else None
    dbname = dbname_of(values["url"][i] if "url" in values else None, uri)
    if isinstance(page_id, int) and not isinstance(page_id, bool):
        page_id = str(page_id)
    if not isinstance(page_id, str) or not page_id.strip():
        return Rejected(source, f"wiki:{dbname}:unknown", "failed", "missing_id", f"{where}: id is {page_id!r}")
    doc_id = f"wiki:{dbname}:{page_id.strip()}"
    if text is not None and not isinstance(text, str):
        return Rejected(source, doc_id, "failed", "not_a_string", f"{where}: text is a {type(text).__name__}")
    if not text or not text.strip():
        return Rejected(source, doc_id, "skipped", "empty", f"title={title!r}")
    return RawDocument(doc_id=doc_id, source=source, kind=PLAIN_KIND, text=text)


__all__ = ["COLUMNS", "dbname_of", "is_wikimedia", "iter_wikimedia"]
