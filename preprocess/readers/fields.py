"""What the readers of the config's ``inputs:`` sources share (``jsonl``, ``parquet``, ``plaintext``, ``hf_datasets``):
their documents' ids and kind, a record's fields turned into a document or a dead letter, and the plain-text cleaner.

A source's documents have ids ``{name}:{id}`` (with ``id_field``) or ``{name}:{file}:{position}``, so that a
document's key is its source and id (or position) whatever the workers, pieces or runner; with ``language_field``
the first field is ``{name}@{language}``, so that the id says its language (``readers.id_language``) wherever
the document goes. Their kind is "plain".
A bad record is a failed ``Rejected`` (a dead letter naming the file and the position) and the run goes on; a text
field that a file's records do not have at all is an ``InputError`` at once.
"""
from __future__ import annotations

import re
from typing import Iterator, Mapping

from common.errors import InputError
from common.preprocess_config import InputSourceConfig
from preprocess.readers import lines
from preprocess.readers.inputs import WholeFileReader, is_compressed
from preprocess.records import RawDocument, Rejected

KIND = "plain"
UTF8_BOM = b"\xef\xbb\xbf"
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_LANGUAGE_RE = re.compile(r"[A-Za-z0-9_-]{1,32}")  # a code (en, pt-BR, zh_Hans, eng_Latn): never ":" or "@"
LANGUAGE_MARK = "@"  # between a source's name and its document's language in an id's first field


def clean_plain_text(text: str) -> str:
    """Plain text as paragraphs: each non-blank line one paragraph, its whitespace collapsed, control characters
    dropped (no markup or boilerplate handling: that is the Wikipedia and books formats')."""
    return "\n".join(" ".join(line.split()) for line in _CONTROL_RE.sub("", text).splitlines() if line.strip())


def positional_id(spec: InputSourceConfig, label: str, position: str) -> str:
    return f"{spec.name}:{label}:{position}"


def failed(spec: InputSourceConfig, label: str, position: str, reason: str, detail: str) -> Rejected:
    """A dead letter for the record at ``position`` of file ``label`` (its id: the position's, always readable)."""
    return Rejected(source=label, doc_id=positional_id(spec, label, position), outcome="failed", reason=reason,
                    detail=detail)


def document_of(record: Mapping, spec: InputSourceConfig, label: str, position: str,
                where: str) -> RawDocument | Rejected:
    """A record (field name -> value) as a raw document, or as a dead letter: "missing_text_field", "null_text",
    "not_a_string" (the text), "missing_id" (``id_field`` absent or null), "bad_language" (``language_field``
    absent, null or not a language code). ``where`` names the record in the
    dead letter's detail ("data.jsonl line at byte 812", "part-0.parquet row group 2, row 17")."""
    if spec.text_field not in record:
        return failed(spec, label, position, "missing_text_field",
                      f"{where}: no field {spec.text_field!r} (fields: {_fields(record)})")
    text = record[spec.text_field]
    if text is None:
        return failed(spec, label, position, "null_text", f"{where}: {spec.text_field!r} is null")
    if not isinstance(text, str):
        return failed(spec, label, position, "not_a_string",
                      f"{where}: {spec.text_field!r} is not a string ({type(text).__name__})")
    prefix = spec.name
    if spec.language_field is not None:
        language = record.get(spec.language_field)
        if not isinstance(language, str) or not _LANGUAGE_RE.fullmatch(language.strip()):
            return failed(spec, label, position, "bad_language",
                          f"{where}: {spec.language_field!r} is not a language code ({_shown(language)})")
        prefix = f"{spec.name}{LANGUAGE_MARK}{language.strip()}"
    doc_id = f"{prefix}:{label}:{position}"
    if spec.id_field is not None:
        value = record.get(spec.id_field)
        if value is None or isinstance(value, (dict, list)):
            return failed(spec, label, position, "missing_id", f"{where}: no usable {spec.id_field!r} (id_field)")
        doc_id = f"{prefix}:{value}"
    if spec.title_field is not None and isinstance(record.get(spec.title_field), str):
        text = f"{record[spec.title_field]}\n{text}"  # the title as the document's first paragraph
    return RawDocument(doc_id=doc_id, source=label, kind=KIND, text=text)


def check_fields(uri: str, spec: InputSourceConfig, fields: list[str]) -> None:
    """Refuse, in one line, a file whose records (its schema, or its first record) lack the text or id field."""
    for key, name in (("text_field", spec.text_field), ("id_field", spec.id_field),
                      ("language_field", spec.language_field)):
        if name is not None and name not in fields:
            raise InputError(f"{uri}: no field {name!r} in its records (the first record's fields: "
                             f"{', '.join(map(str, fields)) or 'none'}); set inputs {spec.name!r} {key} to the field "
                             "that holds it")


def decoded_lines(uri: str, piece: tuple | None, max_bytes: int, spec: InputSourceConfig,
                  label: str) -> Iterator[tuple[str, str, str] | Rejected]:
    """(position, where, text) of each line of the file (or of those that ``piece`` owns:
    ``lines.iter_lines``), a byte-order mark at the file's start dropped; a line longer than ``max_bytes`` or not
    UTF-8 is a dead letter instead ("too_large", "not_utf8") naming the file and the line's offset."""
    for offset, line in lines.iter_lines(uri, piece, max_bytes):
        position, where = str(offset), f"{label} line at byte {offset}"
        if line is lines.TOO_LONG:
            yield failed(spec, label, position, "too_large", f"{where}: longer than {max_bytes} bytes")
            continue
        if offset == 0 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM):]
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield failed(spec, label, position, "not_utf8", f"{where}: byte {exc.start} of the line is not UTF-8")
            continue
        yield position, where, text


def _shown(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _fields(record: Mapping) -> str:
    names = [str(name) for name in list(record)[:20]]
    return ", ".join(names) + (", ..." if len(record) > 20 else "") if names else "none"


class PlainFormat(WholeFileReader):
    """What the ``inputs:`` formats' readers share (``preprocess.readers.Reader``): plain-text documents, files
    listed and read as ``WholeFileReader`` does unless a format cuts them, and the memory class ``{format}`` or
    ``{format}_compressed``."""

    kind = KIND
    format = ""
    compressed_cost = 4.0  # a compressed file expands as it is read (as the built-in readers count it)

    def clean(self, text: str) -> str:
        return clean_plain_text(text)

    def memory_class(self, uri: str) -> str:
        return f"{self.format}_compressed" if is_compressed(uri) else self.format

    def cost_per_byte(self, uri: str) -> float:
        return self.compressed_cost if is_compressed(uri) else 1.0


__all__ = ["KIND", "LANGUAGE_MARK", "UTF8_BOM", "PlainFormat", "check_fields", "clean_plain_text", "decoded_lines", "document_of",
           "failed", "positional_id"]
