"""JSON lines (``format: jsonl``): one JSON object per line, in .jsonl/.json files, plain or .gz/.bz2/.xz/.zst.

A file is streamed line by line (``preprocess.readers.lines``); one larger than a piece is cut, so that several
workers read it: an uncompressed file into byte ranges realigned to line starts, a compressed one into stride pieces
of its decompressed stream. A record's position is its
line's byte offset. Bad records are dead letters naming the file and the line's offset: "not_utf8", "not_json",
"not_an_object", "too_large" (a line longer than ``6 * max_document_chars`` bytes plus 64 KiB, never held), and the
field problems of ``fields.document_of``. A file that is one JSON document (an array of records, or pretty-printed)
is an ``InputError`` at once. A text (or id) field that the file's first record does not have, when
it parses, is an ``InputError`` at once: a source configured with the wrong field name fails in one line, not with a
dead letter per record.
"""
from __future__ import annotations

import json
from typing import Iterator

from common.errors import InputError
from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers import lines
from preprocess.readers.fields import PlainFormat, check_fields, decoded_lines, document_of, failed
from preprocess.records import RawDocument, Rejected

def max_line_bytes(cfg: SourceConfig) -> int:
    """The longest line read: a text at the document limit, every character written as a \\uXXXX escape, and room
    for the other fields."""
    return 6 * cfg.max_document_chars + (64 << 10)


def iter_jsonl(uri: str, spec: InputSourceConfig, cfg: SourceConfig, label: str,
               piece: tuple | None = None) -> Iterator[RawDocument | Rejected]:
    """The records of a JSON lines file (or of the lines that ``piece`` owns: ``lines.iter_lines``).

    Yields:
        A ``RawDocument`` (kind "plain") per usable record, a failed ``Rejected`` per bad one.

    Raises:
        InputError: The file cannot be read, or its first record lacks the text or id field.
    """
    checked = not lines.holds_file_start(piece)  # only the piece with the file's start sees its first record
    for line in decoded_lines(uri, piece, max_line_bytes(cfg), spec, label):
        if isinstance(line, Rejected):
            yield line
            continue
        position, where, text = line
        if not checked and text.strip() in ("[", "{"):
            raise _not_json_lines(uri, "a pretty-printed JSON document")
        try:
            record = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; so are huge integers
            yield failed(spec, label, position, "not_json", f"{where}: {_short(exc)}")
            continue
        if not checked and isinstance(record, list):
            raise _not_json_lines(uri, "a JSON array")
        if not isinstance(record, dict):
            yield failed(spec, label, position, "not_an_object", f"{where}: a JSON {type(record).__name__}")
            continue
        if not checked:
            check_fields(uri, spec, list(record))
            checked = True
        yield document_of(record, spec, label, position, where)


def _not_json_lines(uri: str, what: str) -> InputError:
    """A file that is one JSON document, not one object per line: one line at once, not a dead letter per line."""
    return InputError(f"{uri}: {what}, not JSON lines (one object per line): rewrite it as JSON lines, e.g. "
                      f"jq -c '.[]' FILE > FILE.jsonl for an array of records")


def _short(exc: BaseException, limit: int = 160) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class JsonLinesReader(PlainFormat):
    """``preprocess.readers.Reader`` of JSON lines files."""

    format = "jsonl"

    def splittable(self, uri: str, spec) -> bool:
        return lines.splittable(uri)

    def pieces(self, uri: str, size: int, count: int, spec, exact: bool = False) -> list[tuple[float, tuple]]:
        return lines.byte_pieces(uri, size, count)

    def read(self, uri: str, piece, spec, cfg: SourceConfig, cache: dict) -> Iterator[RawDocument | Rejected]:
        return iter_jsonl(uri, spec, cfg, self.label(uri), piece)


READER = JsonLinesReader()

__all__ = ["READER", "JsonLinesReader", "iter_jsonl", "max_line_bytes"]
