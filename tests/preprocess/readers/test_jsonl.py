"""preprocess.readers.jsonl: JSON lines read as documents and dead letters, plain and compressed, whole or in pieces
(byte ranges realigned to line starts; stride pieces of a compressed stream)."""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import pathlib

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import InputError
from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers import jsonl, lines
from preprocess.records import RawDocument, Rejected

CFG = SourceConfig()
PROSE = "The river rises in the northern hills. It flows south through three towns."


def _spec(path, **kwargs) -> InputSourceConfig:
    return InputSourceConfig(name="web", format="jsonl", paths=[str(path)], **kwargs)


def _read(path, spec=None, piece=None, cfg=CFG) -> list:
    spec = spec or _spec(path)
    return list(jsonl.READER.read(str(path), piece, spec, cfg, {}))


PLANTED = [
    b'{"text": "' + PROSE.encode() + b'", "url": "a"}',
    b"{not json",
    b'{"url": "no text here"}',
    b'{"text": 42}',
    b'{"text": "caf\xe9 is not UTF-8"}',
    b"[1, 2, 3]",
    b"",
    b'{"text": null}',
    b'\t  ',
    b'{"text": "Second good record. It has two sentences."}',
]


def test_bad_records_are_dead_letters_with_their_file_and_line(tmp_path):
    path = tmp_path / "crawl.jsonl"
    path.write_bytes(b"\n".join(PLANTED) + b"\n")
    records = _read(path)
    offsets = [sum(len(line) + 1 for line in PLANTED[:i]) for i in range(len(PLANTED))]
    docs = [r for r in records if isinstance(r, RawDocument)]
    assert [(d.doc_id, d.source, d.kind, d.text) for d in docs] == [
        (f"web:crawl.jsonl:{offsets[0]}", "crawl.jsonl", "plain", PROSE),
        (f"web:crawl.jsonl:{offsets[9]}", "crawl.jsonl", "plain", "Second good record. It has two sentences.")]
    failed = [r for r in records if isinstance(r, Rejected)]
    assert all(r.outcome == "failed" and r.source == "crawl.jsonl" for r in failed)
    assert [(r.doc_id, r.reason) for r in failed] == [
        (f"web:crawl.jsonl:{offsets[1]}", "not_json"), (f"web:crawl.jsonl:{offsets[2]}", "missing_text_field"),
        (f"web:crawl.jsonl:{offsets[3]}", "not_a_string"), (f"web:crawl.jsonl:{offsets[4]}", "not_utf8"),
        (f"web:crawl.jsonl:{offsets[5]}", "not_an_object"), (f"web:crawl.jsonl:{offsets[7]}", "null_text")]
    for record, index in zip(failed, (1, 2, 3, 4, 5, 7)):  # each detail names the file and the line
        assert record.detail.startswith(f"crawl.jsonl line at byte {offsets[index]}: "), record.detail
    assert "fields: url" in failed[1].detail and "(int)" in failed[2].detail and "byte 13" in failed[3].detail


def test_a_text_field_that_the_first_record_lacks_fails_at_once_in_one_line(tmp_path):
    path = tmp_path / "crawl.jsonl"
    path.write_text("not json\n" + json.dumps({"content": PROSE, "url": "u"}) + "\n")
    with pytest.raises(InputError) as raised:
        _read(path)
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and "'text'" in message
    assert "content, url" in message and "text_field" in message
    # A later record without the field is only a dead letter; an id field that is missing is refused the same way.
    path.write_text(json.dumps({"text": PROSE}) + "\n" + json.dumps({"content": PROSE}) + "\n")
    assert [getattr(r, "reason", "doc") for r in _read(path)] == ["doc", "missing_text_field"]
    with pytest.raises(InputError, match=r"no field 'doc_id'.*id_field"):
        _read(path, _spec(path, id_field="doc_id"))


def test_ids_titles_and_a_custom_text_field(tmp_path):
    path = tmp_path / "news.json"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"body": PROSE, "key": 7, "headline": "Rivers"}, {"body": PROSE, "headline": "No key"},
        {"body": PROSE, "key": "x:y"}]) + "\n")
    spec = _spec(path, text_field="body", id_field="key", title_field="headline")
    first, missing, third = _read(path, spec)
    assert (first.doc_id, first.text) == ("web:7", f"Rivers\n{PROSE}")
    assert (missing.outcome, missing.reason) == ("failed", "missing_id") and "'key'" in missing.detail
    assert (third.doc_id, third.text) == ("web:x:y", PROSE)


@pytest.mark.parametrize("suffix, compress", [
    (".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress),
    (".zst", lambda data: zstandard.ZstdCompressor().compress(data))])
def test_compressed_files_give_the_records_of_the_plain_one(tmp_path, suffix, compress):
    data = b"\n".join(PLANTED) + b"\n"
    plain = tmp_path / "crawl.jsonl"
    plain.write_bytes(data)
    packed = tmp_path / f"crawl.jsonl{suffix}"
    packed.write_bytes(compress(data))
    assert jsonl.READER.splittable(str(packed), None) and jsonl.READER.splittable(str(plain), None)
    def shown(records):
        return [(r.doc_id.replace(suffix, ""), type(r).__name__, getattr(r, "reason", "")) for r in records]

    assert shown(_read(packed)) == shown(_read(plain))


@pytest.mark.parametrize("suffix, compress", [
    (".gz", gzip.compress), (".zst", lambda data: zstandard.ZstdCompressor().compress(data))])
def test_a_truncated_or_corrupt_compressed_file_is_one_clear_error(tmp_path, suffix, compress):
    data = compress(("\n".join(json.dumps({"text": f"{PROSE} {i}"}) for i in range(2000))).encode())
    path = tmp_path / f"crawl.jsonl{suffix}"
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(InputError, match=f"{path}: the compressed stream ends early"):
        _read(path)
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(InputError, match=f"{path}: corrupt compressed data"):
        _read(path)


def test_a_line_longer_than_the_limit_is_a_dead_letter_and_never_held(tmp_path):
    cfg = SourceConfig(max_document_chars=1000, book_document_max_chars=1000)
    path = tmp_path / "crawl.jsonl"
    huge = json.dumps({"text": "word " * 20_000})  # 100 kB > 6 * 1000 + 64 KiB
    path.write_text(json.dumps({"text": PROSE}) + "\n" + huge + "\n" + json.dumps({"text": PROSE}) + "\n")
    records = _read(path, cfg=cfg)
    assert [getattr(r, "reason", "doc") for r in records] == ["doc", "too_large", "doc"]
    assert records[2].doc_id == f"web:crawl.jsonl:{len(json.dumps({'text': PROSE})) + 1 + len(huge) + 1}"


def _line_file(tmp_path: pathlib.Path, lengths: list[int], crlf: bool) -> tuple[pathlib.Path, list[tuple[int, bytes]]]:
    """A file of lines of the given lengths (0: a blank line); the (offset, content) of its non-blank lines."""
    end = b"\r\n" if crlf else b"\n"
    data, expected = b"", []
    for i, length in enumerate(lengths):
        content = (f"{i}:".encode() + b"x" * length)[:length] if length else b""
        if content:
            expected.append((len(data), content))
        data += content + end
    path = tmp_path / "lines.jsonl"
    path.write_bytes(data)
    return path, expected


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=60), cuts=st.lists(st.integers(0, 10_000), max_size=8),
       crlf=st.booleans())
def test_byte_ranges_hold_every_line_exactly_once(tmp_path_factory, lengths, cuts, crlf):
    path, expected = _line_file(tmp_path_factory.mktemp("ranges"), lengths, crlf)
    size = path.stat().st_size
    bounds = sorted({0, size, *(cut % (size + 1) for cut in cuts)})
    ranges = [("bytes", lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    read = [line for piece in ranges for line in lines.iter_lines(str(path), piece, 1 << 20)]
    assert read == expected
    assert list(lines.iter_lines(str(path), None, 1 << 20)) == expected


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_the_readers_pieces_of_a_large_file_give_its_records_once(tmp_path, count):
    path = tmp_path / "big.jsonl"
    with open(path, "w") as out:
        for i in range(30_000):  # about 3 MB: three pieces at most
            out.write(json.dumps({"text": f"Record {i} of the corpus. " * (1 + i % 5)}) + "\n")
    size = path.stat().st_size
    pieces = jsonl.READER.pieces(str(path), size, count, None)
    assert len(pieces) == min(count, size // lines.MIN_PIECE_BYTES) and abs(sum(s for s, _ in pieces) - 1) < 1e-9
    whole = [(r.doc_id, r.text) for r in _read(path)]
    assert len(whole) == 30_000
    assert [(r.doc_id, r.text) for _, piece in pieces for r in _read(path, piece=piece)] == whole


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=60), count=st.integers(2, 5),
       block=st.sampled_from([1, 7, 16, 64]), crlf=st.booleans())
def test_stride_pieces_of_a_compressed_stream_hold_every_line_exactly_once(tmp_path_factory, lengths, count, block,
                                                                            crlf):
    path, expected = _line_file(tmp_path_factory.mktemp("stride"), lengths, crlf)
    packed = path.with_name("lines.jsonl.gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lines, "STRIDE_BLOCK_BYTES", block)  # blocks shorter than lines: each is cut mid-line
        read = [line for index in range(count) for line in lines.iter_lines(str(packed), ("stride", index, count),
                                                                              1 << 20)]
    assert sorted(read) == expected
    for offset, _ in read:  # the piece that owns a line is the one whose block holds its first byte
        assert sum(1 for o, _ in read if o == offset) == 1


@pytest.mark.parametrize("suffix, compress, most", [
    (".zst", lambda data: zstandard.ZstdCompressor().compress(data), lines.MAX_STREAM_READS[".zst"]),
    (".gz", gzip.compress, lines.MAX_STREAM_READS[".gz"]), (".bz2", bz2.compress, lines.MAX_STREAM_READS[".bz2"])])
def test_a_large_compressed_file_is_shared_by_stride_pieces_that_give_its_records_once(tmp_path, monkeypatch, suffix,
                                                                                      compress, most):
    data = "".join(json.dumps({"text": f"Record {i} of the corpus. " * (1 + i % 5)}) + "\n" for i in range(30_000))
    path = tmp_path / f"big.jsonl{suffix}"
    path.write_bytes(compress(data.encode()))
    monkeypatch.setattr(lines, "MIN_PIECE_BYTES", 1 << 10)  # the file is small: let it be cut all the same
    monkeypatch.setattr(lines, "STRIDE_BLOCK_BYTES", 1 << 16)  # about 50 blocks of the 3 MB stream
    pieces = jsonl.READER.pieces(str(path), path.stat().st_size, 99, None)
    assert [piece for _, piece in pieces] == [("stride", index, most) for index in range(most)]
    assert abs(sum(share for share, _ in pieces) - 1) < 1e-9
    whole = [(r.doc_id, r.text) for r in _read(path)]
    parts = [[(r.doc_id, r.text) for r in _read(path, piece=piece)] for _, piece in pieces]
    assert len(whole) == 30_000 and all(len(part) > 30_000 / most / 2 for part in parts)  # each takes its share
    assert sorted(record for part in parts for record in part) == sorted(whole)
    assert jsonl.READER.pieces(str(path), path.stat().st_size, 1, None) == []


def test_only_the_piece_with_the_file_start_checks_the_first_record(tmp_path, monkeypatch):
    path = tmp_path / "crawl.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(b'{"body": "%d"}\n' % i for i in range(5000))))
    monkeypatch.setattr(lines, "STRIDE_BLOCK_BYTES", 1 << 10)
    with pytest.raises(InputError, match="no field 'text'"):
        _read(path, piece=("stride", 0, 3))
    assert {r.reason for r in _read(path, piece=("stride", 1, 3))} == {"missing_text_field"}


@pytest.mark.parametrize("content, what", [
    ("[\n  " + json.dumps({"text": PROSE}) + ",\n  " + json.dumps({"text": PROSE}) + "\n]\n", "a pretty-printed JSON"),
    (json.dumps([{"text": PROSE}, {"text": PROSE}]) + "\n", "a JSON array"),
    ("{\n  \"text\": " + json.dumps(PROSE) + "\n}\n", "a pretty-printed JSON"),
])
def test_a_file_that_is_one_json_document_fails_at_once_in_one_line(tmp_path, content, what):
    path = tmp_path / "records.json"
    path.write_text(content)
    with pytest.raises(InputError) as raised:
        _read(path)
    message = raised.value.message
    assert "\n" not in message and message.startswith(f"{path}: {what}") and "not JSON lines" in message
