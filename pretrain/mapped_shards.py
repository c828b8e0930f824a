"""One shard file of a dataset, read in place: where each row's values lie in the memory-mapped file.

Arrow IPC files keep every buffer 8-byte aligned, so typed numpy views of the whole mapping address any
record batch's buffers directly: a row is found by (record batch, row within it), without pyarrow and
without copying. The mapped pages are the kernel's page cache, shared by every process that maps the file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from common.errors import DatasetFormatError

_LIST_COLUMNS = ("input_ids", "masked_positions", "masked_labels")
PACKED_COLUMN = "doc_starts"  # packed datasets only: where each document's block starts in the row
_SCALAR_COLUMNS = ("segment_a_len", "next_sentence_label")


class MappedShard:
    """One shard file: its size checked at once, mapped and its record batches located as rows are read."""

    def __init__(self, path: Path, manifest_rows: int, packed: bool = False):
        """``path`` as checked against the manifest (``common.verify.check_shard_files``); ``packed``: the
        manifest says its rows have ``doc_starts``."""
        self.path, self.num_rows = path, manifest_rows
        self._columns = (*_LIST_COLUMNS, PACKED_COLUMN) if packed else _LIST_COLUMNS
        self._bytes = None  # mapped when a row of this shard is first read

    def _open(self) -> None:
        """Map the file and read its footer and first record batch's header.

        The pipeline writes record batches of equal size (the last one shorter), so the first batch's size
        places every row; each batch's header is read when a row of it is first read, and its size checked.
        A shard written otherwise has all its headers read at once.
        """
        path = self.path
        try:
            mapped = pa.memory_map(str(path))
            self._reader = ipc.open_file(mapped)
            mapped.seek(0)
            self._whole = mapped.read_buffer(mapped.size())
            first = self._reader.get_batch(0) if self._reader.num_record_batches else None
        except (pa.ArrowException, OSError) as error:
            raise DatasetFormatError(f"{path}: not a readable Arrow shard ({error}); the file is truncated or "
                                     "damaged: copy it again, or re-run preprocessing") from None
        self._views: dict[np.dtype, np.ndarray] = {}
        schema = self._reader.schema
        if PACKED_COLUMN in self._columns and PACKED_COLUMN not in schema.names:
            raise DatasetFormatError(f"{path}: no {PACKED_COLUMN} column, but the manifest says its rows are packed; "
                                     "the shard belongs to another dataset: copy the dataset again, or re-run "
                                     "preprocessing")
        self._list_type = {name: numpy_type(schema.field(name).type.value_type) for name in self._columns}
        self._scalar_type = {name: numpy_type(schema.field(name).type) for name in _SCALAR_COLUMNS}
        batches = self._reader.num_record_batches
        self._read = np.zeros(batches, bool)
        self._offsets_at = {name: np.zeros(batches, np.int64) for name in self._columns}
        self._values_at = {name: np.zeros(batches, np.int64) for name in self._columns}
        self._scalar_at = {name: np.zeros(batches, np.int64) for name in _SCALAR_COLUMNS}
        size = first.num_rows if first is not None else 0
        if size and (batches - 1) * size < self.num_rows <= batches * size:
            self.batch_starts = np.minimum(np.arange(batches + 1, dtype=np.int64) * size, self.num_rows)
            # Checked like every later batch: in a one-batch shard, batch 0 is the only place a manifest
            # that lists fewer rows than the file holds can show.
            self._place_checked(0, first)
        else:
            self._read_every_header()
        self._bytes = np.frombuffer(self._whole, np.uint8)

    def _read_headers(self, indices: np.ndarray) -> bool:
        """Place the record batches ``indices``; False when one of them is not the size expected (every
        header has then been read, and ``batch_starts`` changed)."""
        for index in indices.tolist():
            if not self._place_checked(index, self._reader.get_batch(index)):
                return False
        return True

    def _place_checked(self, index: int, batch: pa.RecordBatch) -> bool:
        """Place record batch ``index`` if it holds the rows ``batch_starts`` expects; otherwise read every
        header instead (which refuses a shard whose rows differ from the manifest's) and return False."""
        if batch.num_rows != self.batch_starts[index + 1] - self.batch_starts[index]:
            self._read_every_header()
            return False
        self._place(index, batch)
        return True

    def _read_every_header(self) -> None:
        starts = [0]
        for index in range(self._reader.num_record_batches):
            batch = self._reader.get_batch(index)
            starts.append(starts[-1] + batch.num_rows)
            self._place(index, batch)
        if starts[-1] != self.num_rows:
            raise DatasetFormatError(f"{self.path}: {starts[-1]} rows but the manifest lists {self.num_rows}; "
                                     "the shard or the manifest was altered: copy the dataset again, or re-run "
                                     "preprocessing")
        self.batch_starts = np.asarray(starts, np.int64)

    def _place(self, index: int, batch: pa.RecordBatch) -> None:
        """Record where record batch ``index``'s buffers lie in the file."""
        self._read[index] = True
        if not batch.num_rows:
            return
        for name in self._columns:
            buffers = batch.column(name).buffers()
            self._offsets_at[name][index] = self._element(buffers[1], np.dtype(np.int32))
            self._values_at[name][index] = self._element(buffers[3], self._list_type[name])
        for name in _SCALAR_COLUMNS:
            self._scalar_at[name][index] = self._element(batch.column(name).buffers()[1], self._scalar_type[name])

    def _element(self, buffer: pa.Buffer | None, dtype: np.dtype) -> int:
        """The index of ``buffer``'s first element in a ``dtype`` view of the whole file."""
        if buffer is None or buffer.size == 0:
            return 0
        position = buffer.address - self._whole.address
        if not 0 <= position <= self._whole.size - buffer.size or position % dtype.itemsize:
            raise DatasetFormatError(f"{self.path}: its buffers are not stored in place (compressed or unaligned "
                                     "Arrow IPC); write shards with the preprocessing stage")
        return position // dtype.itemsize

    def _view(self, dtype: np.dtype) -> np.ndarray:
        if dtype not in self._views:
            usable = len(self._bytes) - len(self._bytes) % dtype.itemsize
            self._views[dtype] = self._bytes[:usable].view(dtype)
        return self._views[dtype]

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record batch, row within it) of each of the shard's ``rows``; every read of rows starts here."""
        if self._bytes is None:
            self._open()
        batch = np.searchsorted(self.batch_starts, rows, side="right") - 1
        unread = np.unique(batch[~self._read[batch]])
        if unread.size and not self._read_headers(unread):
            batch = np.searchsorted(self.batch_starts, rows, side="right") - 1
        return batch, rows - self.batch_starts[batch]

    def list_bounds(self, column: str, batch: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index of each row's first value in ``values(column)``, its number of values)."""
        offsets = self._view(np.dtype(np.int32))
        at = self._offsets_at[column][batch] + row
        first = offsets[at].astype(np.int64)
        return self._values_at[column][batch] + first, offsets[at + 1] - first

    def values(self, column: str) -> np.ndarray:
        return self._view(self._list_type[column])

    def scalar(self, column: str, batch: np.ndarray, row: np.ndarray) -> np.ndarray:
        return self._view(self._scalar_type[column])[self._scalar_at[column][batch] + row]


def numpy_type(arrow_type: pa.DataType) -> np.dtype:
    return pa.array([], arrow_type).to_numpy(zero_copy_only=False).dtype


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(start, start + length)`` for each pair."""
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)


__all__ = ["PACKED_COLUMN", "MappedShard", "numpy_type", "ranges"]
