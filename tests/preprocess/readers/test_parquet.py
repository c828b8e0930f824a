"""preprocess.readers.parquet: Parquet rows read by row group, only the needed columns, bad rows as dead letters."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import InputError
from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers import parquet
from preprocess.records import RawDocument, Rejected

CFG = SourceConfig()


def _spec(path, **kwargs) -> InputSourceConfig:
    return InputSourceConfig(name="pq", format="parquet", paths=[str(path)], **kwargs)


def _read(path, spec, piece=None) -> list:
    return list(parquet.READER.read(str(path), piece, spec, CFG, {}))


def _write(path, rows: int, row_group_size: int, **columns) -> None:
    table = pa.table({"text": [f"Row {i} has text. It has two sentences." if i % 11 else None for i in range(rows)],
                      "id": list(range(rows)), "blob": [b"x" * 100] * rows, **columns})
    pq.write_table(table, path, row_group_size=row_group_size)


def _shown(record) -> tuple[str, str]:
    return record.doc_id, record.text if isinstance(record, RawDocument) else record.reason


@pytest.mark.parametrize("count", [1, 2, 3, 5, 50])
def test_row_groups_read_as_pieces_give_the_documents_of_the_whole_file(tmp_path, count):
    path = tmp_path / "part-0.parquet"
    _write(path, rows=100, row_group_size=9)  # 12 row groups
    spec = _spec(path)
    pieces = parquet.READER.pieces(str(path), path.stat().st_size, count, spec)
    assert len(pieces) == min(count, 12) and abs(sum(share for share, _ in pieces) - 1) < 1e-9
    runs = [piece[1:] for _, piece in pieces]
    assert runs[0][0] == 0 and runs[-1][1] == 12 and all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    whole = [_shown(r) for r in _read(path, spec)]
    assert len(whole) == 100
    assert [_shown(r) for _, piece in pieces for r in _read(path, spec, piece)] == whole


def test_null_and_non_string_texts_are_dead_letters_naming_the_row_group_and_row(tmp_path):
    path = tmp_path / "part-0.parquet"
    _write(path, rows=30, row_group_size=10)
    records = _read(path, _spec(path, id_field="id"))
    failed = [r for r in records if isinstance(r, Rejected)]
    assert [(r.doc_id, r.reason) for r in failed] == [("pq:part-0.parquet:0/0", "null_text"),
                                                      ("pq:part-0.parquet:1/1", "null_text"),
                                                      ("pq:part-0.parquet:2/2", "null_text")]
    assert failed[1].detail == "part-0.parquet row group 1, row 1: 'text' is null"
    docs = [r for r in records if isinstance(r, RawDocument)]
    assert len(docs) == 27 and docs[0].doc_id == "pq:1" and docs[0].source == "part-0.parquet"
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), numbers)
    assert [r.reason for r in _read(numbers, _spec(numbers))] == ["not_a_string", "not_a_string"]


def test_a_missing_text_column_fails_at_once_naming_the_columns(tmp_path):
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"content": ["a"], "url": ["u"]}), path)
    with pytest.raises(InputError) as raised:
        _read(path, _spec(path))
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and "'text'" in message and "content, url" in message
    not_parquet = tmp_path / "fake.parquet"
    not_parquet.write_bytes(b"not a parquet file at all")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        _read(not_parquet, _spec(not_parquet))


def test_only_the_needed_columns_are_read():
    spec = InputSourceConfig(name="pq", format="parquet", paths=["x"], id_field="id", title_field="title")
    assert parquet.needed_columns(spec, ["blob", "title", "text", "id"]) == ["text", "id", "title"]
    assert parquet.needed_columns(InputSourceConfig(name="pq", format="parquet", paths=["x"]),
                                  ["blob", "text", "id"]) == ["text"]


def test_group_runs_balance_bytes():
    assert [p for _, p in parquet.group_runs([10, 10, 10, 10], 2)] == [("rowgroups", 0, 2), ("rowgroups", 2, 4)]
    assert [p for _, p in parquet.group_runs([100, 1, 1, 1], 2)] == [("rowgroups", 0, 1), ("rowgroups", 1, 4)]
    assert [p for _, p in parquet.group_runs([1, 1, 1, 100], 3)] == [("rowgroups", 0, 2), ("rowgroups", 2, 3),
                                                                      ("rowgroups", 3, 4)]
    assert len(parquet.group_runs([5] * 3, 10)) == 3
