"""preprocess.readers.plaintext: plain-text files as one document per line or per file."""
from __future__ import annotations

import gzip

import pytest

from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers import lines, plaintext
from preprocess.records import RawDocument

CFG = SourceConfig()
LINES = [b"The first document. It has two sentences.", b"", b"caf\xe9 is Latin-1, not UTF-8.",
         b"   ", b"The third document, after a blank line."]


def _spec(path, **kwargs) -> InputSourceConfig:
    return InputSourceConfig(name="notes", format="text", paths=[str(path)], **kwargs)


def _read(path, spec, piece=None, cfg=CFG) -> list:
    return list(plaintext.READER.read(str(path), piece, spec, cfg, {}))


def test_one_document_per_line_with_undecodable_lines_as_dead_letters(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\n".join(LINES) + b"\n")
    offsets = [sum(len(line) + 1 for line in LINES[:i]) for i in range(len(LINES))]
    records = _read(path, _spec(path))
    assert [(type(r).__name__, r.doc_id) for r in records] == [
        ("RawDocument", f"notes:notes.txt:{offsets[0]}"), ("Rejected", f"notes:notes.txt:{offsets[2]}"),
        ("RawDocument", f"notes:notes.txt:{offsets[4]}")]
    assert records[0].text == LINES[0].decode() and records[0].kind == "plain"
    assert (records[1].outcome, records[1].reason) == ("failed", "not_utf8")
    assert records[1].detail == f"notes.txt line at byte {offsets[2]}: byte 3 of the line is not UTF-8"


def test_one_document_per_file(tmp_path):
    path = tmp_path / "essay.txt.gz"
    path.write_bytes(gzip.compress(b"Line one of the essay.\nLine two of it.\n"))
    spec = _spec(path, document="file")
    (record,) = _read(path, spec)
    assert isinstance(record, RawDocument) and record.doc_id == "notes:essay.txt.gz"
    assert plaintext.READER.clean(record.text) == "Line one of the essay.\nLine two of it."
    assert not plaintext.READER.splittable(str(path), spec)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe broken")
    (rejected,) = _read(bad, spec)
    assert (rejected.reason, rejected.detail) == ("not_utf8", "bad.txt: byte 3 is not UTF-8")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b" \n\n")
    assert [(r.outcome, r.reason) for r in _read(empty, spec)] == [("failed", "empty_file")]


def test_a_file_or_line_beyond_the_document_limit_is_never_held(tmp_path):
    cfg = SourceConfig(max_document_chars=1000, book_document_max_chars=1000)
    path = tmp_path / "long.txt"
    path.write_bytes(b"short line here\n" + b"x" * 10_000 + b"\nanother short line\n")
    assert [getattr(r, "reason", "doc") for r in _read(path, _spec(path), cfg=cfg)] == ["doc", "too_large", "doc"]
    (whole,) = _read(path, _spec(path, document="file"), cfg=cfg)
    assert (whole.reason, whole.detail) == ("too_large", f"long.txt: more than {4 * 1000 + 4} bytes")


def test_pieces_of_a_large_file_give_its_lines_once(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("".join(f"Line {i} of the notes. " * (1 + i % 7) + "\n" for i in range(40_000)))
    spec, size = _spec(path), path.stat().st_size
    pieces = plaintext.READER.pieces(str(path), size, 4, spec)
    assert 1 < len(pieces) <= 4 and all(piece[0] == "bytes" for _, piece in pieces)
    assert size // lines.MIN_PIECE_BYTES >= len(pieces)
    whole = [(r.doc_id, r.text) for r in _read(path, spec)]
    assert len(whole) == 40_000
    assert [(r.doc_id, r.text) for _, piece in pieces for r in _read(path, spec, piece)] == whole
    assert plaintext.READER.pieces(str(path), size, 4, _spec(path, document="file")) == []


@pytest.mark.parametrize("text, cleaned", [
    ("  Two   spaces\tand a tab.  \n\n\nNext\x00 paragraph.\r\n", "Two spaces and a tab.\nNext paragraph."),
    ("", ""), ("one line", "one line")])
def test_plain_text_is_cleaned_by_whitespace_alone(text, cleaned):
    assert plaintext.READER.clean(text) == cleaned
