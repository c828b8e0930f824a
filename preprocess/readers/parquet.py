"""Parquet (``format: parquet``): each row a record, read with ``pyarrow.parquet`` by row group, only the columns the
source names (text, and its id and title when set).

A file's pieces are runs of its row groups ("rowgroups", lo, hi), each with its share of the file's bytes, so that
a large file is read by several workers; memory holds one batch of one row group's needed columns. A row's
position is ``{row group}/{row in the group}``. A text (or id) column that the file's schema does not have is an
``InputError`` at once; a row whose text is null, or not a string, is a dead letter naming the row group and row.
"""
from __future__ import annotations

from typing import Iterator

from common.errors import InputError
from common.preprocess_config import InputSourceConfig, SourceConfig
from preprocess.readers.fields import PlainFormat, check_fields, document_of
from preprocess.readers.inputs import open_uri
from preprocess.records import RawDocument, Rejected

_BATCH_ROWS = 1024


def needed_columns(spec: InputSourceConfig, names: list[str]) -> list[str]:
    wanted = [spec.text_field, spec.id_field, spec.title_field, spec.language_field]
    return [name for name in dict.fromkeys(wanted) if name is not None and name in names]


def _open(uri: str, stream):
    """The ``pyarrow.parquet.ParquetFile`` of ``stream`` (imported here: a run without Parquet inputs, the most,
    does not pay for the import)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(stream)
    except Exception as exc:  # ArrowInvalid: not Parquet, truncated footer, ...
        raise InputError(f"{uri}: not a readable Parquet file ({type(exc).__name__}: {exc}); check that it is "
                         "Parquet and complete (re-download it)") from exc


def row_groups(uri: str) -> list[int]:
    """The stored (compressed) bytes of each row group of a Parquet file: what reading it costs."""
    with open_uri(uri, decompress=False) as stream:
        metadata = _open(uri, stream).metadata
        return [sum(metadata.row_group(g).column(c).total_compressed_size for c in range(metadata.num_columns))
                for g in range(metadata.num_row_groups)]


def group_runs(sizes: list[int], count: int) -> list[tuple[float, tuple]]:
    """``count`` (at most one per row group) contiguous runs of row groups of about equal bytes, with their shares."""
    total = sum(sizes) or 1
    count = max(1, min(count, len(sizes)))
    runs, start, done = [], 0, 0
    for index, size in enumerate(sizes):
        done += size
        left = len(sizes) - index - 1
        if len(runs) < count - 1 and (done * count >= total * (len(runs) + 1) or left == count - 1 - len(runs)):
            runs.append((start, index + 1))
            start = index + 1
    runs.append((start, len(sizes)))
    return [(sum(sizes[lo:hi]) / total, ("rowgroups", lo, hi)) for lo, hi in runs if hi > lo]


def iter_parquet(uri: str, spec: InputSourceConfig, label: str,
                 piece: tuple | None = None) -> Iterator[RawDocument | Rejected]:
    """The rows of a Parquet file (or of its row groups ``[lo, hi)``, ``piece`` ("rowgroups", lo, hi)).

    Raises:
        InputError: The file cannot be read as Parquet, or its schema lacks the text or id column.
    """
    with open_uri(uri, decompress=False) as stream:
        parquet = _open(uri, stream)
        names = parquet.schema_arrow.names
        check_fields(uri, spec, names)
        columns = needed_columns(spec, names)
        lo, hi = (piece[1], piece[2]) if piece is not None else (0, parquet.num_row_groups)
        for group in range(lo, hi):
            row = 0
            try:
                batches = parquet.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group], columns=columns)
                for batch in batches:
                    values = {name: batch.column(name).to_pylist() for name in columns}
                    for i in range(batch.num_rows):
                        record = {name: values[name][i] for name in columns}
                        yield document_of(record, spec, label, f"{group}/{row}",
                                          f"{label} row group {group}, row {row}")
                        row += 1
            except InputError:
                raise
            except Exception as exc:  # a corrupt page, a transport error
                raise InputError(f"{uri}: cannot read row group {group} ({type(exc).__name__}: {exc}); the file "
                                 "is damaged or unreadable — re-download it") from exc


class ParquetReader(PlainFormat):
    """``preprocess.readers.Reader`` of Parquet files."""

    format = "parquet"
    compressed_cost = 3.0  # columns are compressed inside the file, whatever its name

    def splittable(self, uri: str, spec) -> bool:
        return True

    def pieces(self, uri: str, size: int, count: int, spec, exact: bool = False) -> list[tuple[float, tuple]]:
        return group_runs(row_groups(uri), count)  # reads the file's footer

    def read(self, uri: str, piece, spec, cfg: SourceConfig, cache: dict) -> Iterator[RawDocument | Rejected]:
        return iter_parquet(uri, spec, self.label(uri), piece)

    def memory_class(self, uri: str) -> str:
        return "parquet"

    def cost_per_byte(self, uri: str) -> float:
        return self.compressed_cost


READER = ParquetReader()

__all__ = ["READER", "ParquetReader", "group_runs", "iter_parquet", "row_groups"]
