"""Plain text (``format: text``): one document per line (``document: line``, the default) or per file
(``document: file``), UTF-8, plain or compressed.

Per line, a file is streamed (``preprocess.readers.lines``) and, when large, cut into pieces (byte ranges realigned
to line starts, or stride pieces of a compressed stream); a document's position is its line's byte offset. Per file, the file is one document
(id ``{name}:{file}``), read up to what ``max_document_chars`` allows and never further. Dead letters: "not_utf8",
"too_large" (a line or file beyond the document limit, never held whole), "empty_file".
"""
from __future__ import annotations

from typing import Iterator

from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers import lines
from preprocess.readers.fields import KIND, UTF8_BOM, PlainFormat, decoded_lines
from preprocess.readers.inputs import is_empty_local, open_uri, read_error
from preprocess.records import RawDocument, Rejected



def max_document_bytes(cfg: SourceConfig) -> int:
    """The most bytes of a document read: UTF-8 takes at most 4 bytes a character (a longer text is too large)."""
    return 4 * cfg.max_document_chars + 4


def iter_text_lines(uri: str, spec: InputSourceConfig, cfg: SourceConfig, label: str,
                    piece: tuple | None = None) -> Iterator[RawDocument | Rejected]:
    """One document per non-blank line of the file (or of the lines that ``piece`` owns: ``lines.iter_lines``)."""
    for line in decoded_lines(uri, piece, max_document_bytes(cfg), spec, label):
        if isinstance(line, Rejected):
            yield line
            continue
        position, _, text = line
        yield RawDocument(doc_id=f"{spec.name}:{label}:{position}", source=label, kind=KIND, text=text)


def read_text_file(uri: str, spec: InputSourceConfig, cfg: SourceConfig, label: str) -> RawDocument | Rejected:
    """The whole file as one document."""
    limit = max_document_bytes(cfg)
    doc_id = f"{spec.name}:{label}"

    def reject(reason: str, detail: str) -> Rejected:
        return Rejected(source=label, doc_id=doc_id, outcome="failed", reason=reason, detail=f"{label}: {detail}")

    with open_uri(uri) as stream:
        try:
            data = stream.read(limit + 1)
        except Exception as exc:
            if isinstance(exc, EOFError) and is_empty_local(uri):
                data = b""
            else:
                raise read_error(uri, exc) from exc
    if len(data) > limit:
        return reject("too_large", f"more than {limit} bytes")
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    if not data.strip():
        return reject("empty_file", "no text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return reject("not_utf8", f"byte {exc.start} is not UTF-8")
    return RawDocument(doc_id=doc_id, source=label, kind=KIND, text=text)


class TextReader(PlainFormat):
    """``preprocess.readers.Reader`` of plain-text files."""

    format = "text"

    def splittable(self, uri: str, spec) -> bool:
        return spec is not None and spec.document == "line" and lines.splittable(uri)

    def pieces(self, uri: str, size: int, count: int, spec, exact: bool = False) -> list[tuple[float, tuple]]:
        return lines.byte_pieces(uri, size, count) if self.splittable(uri, spec) else []

    def read(self, uri: str, piece, spec, cfg: SourceConfig, cache: dict) -> Iterator[RawDocument | Rejected]:
        if spec.document == "file":
            return iter([read_text_file(uri, spec, cfg, self.label(uri))])
        return iter_text_lines(uri, spec, cfg, self.label(uri), piece)


READER = TextReader()

__all__ = ["READER", "TextReader", "iter_text_lines", "max_document_bytes", "read_text_file"]
