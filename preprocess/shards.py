"""Sorted runs ("pieces") of instances, the final shuffled shards, and their statistics.

Every instance carries a 128-bit shuffle key derived from (seed, document, duplicate, index). The
global order of the dataset is the key order, so shard ``s`` of ``S`` holds the rows ranked
``[s*R//S, (s+1)*R//S)``: shards are equal to within one row, and every shard is a uniformly
random sample of the corpus in random order. A piece holds the rows of one transport group (a run of
adjacent key-range groups, ``preprocess.layout.TRANSPORT_GROUP_BITS``) from one part, group after
group, and its metadata says where each group's rows are; a shard is assembled from the few groups that
overlap its rank range (each sorted by key as it is read) one group at a time: memory is bounded by a
group, not by a shard (local pieces are memory-mapped; from an object store, the pieces of one transport
group are held while its groups are written).
"""
from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from common import schema, storage
from preprocess.docstore import merge_counts, read_table, write_table

HISTOGRAM_BIN = 16  # sequence-length histogram bin width, in tokens

def piece_uri(work: str, transport: int, part: int) -> str:
    return storage.join(work, "pieces", f"t{transport:06d}", f"p{part:04d}.arrow")


def write_piece(work: str, transport: int, part: int, table: pa.Table, group_bits: int, transport_bits: int,
                stats: dict | None = None) -> list[int]:
    """Write ``table`` (rows of transport group ``transport``) as the piece of ``part``, group after group (rows
    keep their order within a group), and its metadata: rows, each group's row count in file order, the layout's
    bits and ``stats``. Returns the groups it holds."""
    groups = group_of_keys(table.column("order_key").to_numpy(), group_bits)
    if np.any(groups >> (group_bits - transport_bits) != transport):
        raise ValueError(f"piece of transport group {transport}: rows of another transport group")
    if np.any(np.diff(groups) < 0):
        order = np.argsort(groups, kind="stable")
        table, groups = table.take(order), groups[order]
    present, counts = np.unique(groups, return_counts=True)
    uri = piece_uri(work, transport, part)
    write_table(uri, table.combine_chunks())
    storage.write_json(uri[:-len(".arrow")] + ".json", {
        "rows": table.num_rows, "groups": [[int(g), int(n)] for g, n in zip(present, counts)],
        "group_bits": group_bits, "transport_bits": transport_bits, "stats": stats or {}})
    return present.tolist()


def _ragged(flat: np.ndarray, lengths: np.ndarray, value_type: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, value_type))


def instance_batch(finalized, keys, next_label: np.ndarray, doc_a: list[str] | None, doc_b: list[str] | None,
                   vocab_size: int) -> pa.RecordBatch:
    """A finished batch (preprocess.batch.FinalizedBatch) as a record batch of the piece schema; without provenance
    (``doc_a`` and ``doc_b`` None) the doc_a and doc_b columns are left out, and ``doc_starts`` is there for packed
    rows only.

    A record batch, not a table: each of its slices (one per key-range group) is held until its piece is written,
    and a table's slice carries twice the metadata (chunked columns), which outweighs the rows of a small slice.
    """
    tok = schema.token_type(vocab_size)
    provenance = {} if doc_a is None else {"doc_a": pa.array(doc_a, pa.string()), "doc_b": pa.array(doc_b, pa.string())}
    packed = {} if finalized.doc_starts is None else {
        "doc_starts": _ragged(finalized.doc_starts.astype(np.uint16), finalized.doc_counts, pa.uint16())}
    return pa.record_batch({
        "order_key": pa.array(keys.order, pa.uint64()),
        "tiebreak": pa.array(keys.tiebreak, pa.uint64()),
        "input_ids": _ragged(finalized.input_ids, finalized.lengths, tok),
        "segment_a_len": pa.array(finalized.segment_a_len.astype(np.int32), pa.int32()),
        "masked_positions": _ragged(finalized.masked_positions.astype(np.uint16), finalized.masked_counts, pa.uint16()),
        "masked_labels": _ragged(finalized.masked_labels, finalized.masked_counts, tok),
        "next_sentence_label": pa.array(next_label, pa.int8()),
        **packed,
        **provenance,
        "truncated": pa.array(finalized.truncated, pa.bool_()),
    })


def group_of_keys(order_keys: np.ndarray, group_bits: int) -> np.ndarray:
    if not group_bits:
        return np.zeros(len(order_keys), np.int64)
    return (np.asarray(order_keys, np.uint64) >> np.uint64(64 - group_bits)).astype(np.int64)


def sort_by_key(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("order_key", "ascending"), ("tiebreak", "ascending")]))


def to_ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.RecordBatch:
    return ipc.open_stream(pa.py_buffer(data)).read_next_batch()


def instance_stats(table: pa.Table, mask_id: int) -> dict:
    """Counts that let the manifest report NSP balance, masking split and lengths (and for packed rows, the document
    blocks they hold)."""
    rows = table.num_rows
    input_ids = table.column("input_ids").combine_chunks()
    lengths = pc.list_value_length(input_ids).to_numpy(zero_copy_only=False).astype(np.int64)
    positions = table.column("masked_positions").combine_chunks()
    labels = table.column("masked_labels").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    row_starts = np.asarray(input_ids.offsets, dtype=np.int64)[:-1] - input_ids.offsets[0].as_py()
    per_row = pc.list_value_length(positions).to_numpy(zero_copy_only=False).astype(np.int64)
    flat_positions = positions.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    values = input_ids.flatten().to_numpy(zero_copy_only=False)
    shown = values[np.repeat(row_starts, per_row) + flat_positions] if len(flat_positions) else labels
    is_mask = shown == mask_id
    unchanged = (~is_mask) & (shown == labels)
    nsp = table.column("next_sentence_label").to_numpy().astype(np.int64)
    histogram = np.bincount(lengths // HISTOGRAM_BIN).tolist() if rows else []
    return {
        "instances": rows,
        "tokens": int(lengths.sum()),
        "next_sentence": {"actual": int((nsp == 0).sum()), "random": int((nsp == 1).sum())},
        "masked": {"positions": int(len(labels)), "mask_token": int(is_mask.sum()),
                   "unchanged": int(unchanged.sum()), "random_token": int(len(labels) - is_mask.sum() - unchanged.sum())},
        "truncated": int(table.column("truncated").to_numpy(zero_copy_only=False).sum()) if "truncated" in table.column_names else 0,
        "length_histogram": {str(i * HISTOGRAM_BIN): c for i, c in enumerate(histogram) if c},
        **({"document_blocks": int(pc.sum(pc.list_value_length(table.column("doc_starts"))).as_py() or 0)}
           if "doc_starts" in table.column_names else {}),
    }


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}.arrow"


def shard_bounds(shard: int, num_shards: int, num_rows: int) -> tuple[int, int]:
    return shard * num_rows // num_shards, (shard + 1) * num_rows // num_shards


def _overlapping_groups(group_rows: list[int], lo: int, hi: int):
    """(group, first row, rows) of the part of each key-range group that falls in the ranks ``[lo, hi)``, in key
    order; ranks count over the groups in order, each group sorted by key."""
    start = 0
    for group, rows in enumerate(group_rows):
        end = start + rows
        if rows and end > lo and start < hi:
            yield group, max(lo - start, 0), min(hi, end) - max(lo, start)
        start = end


class PieceGroups:
    """Key-range groups read from the pieces of every part, each sorted by key. The pieces of one transport group
    are open at a time (memory-mapped where local): ask for groups in order and each piece is opened once."""

    def __init__(self, work: str, transport_shift: int):
        self._work, self._shift = work, transport_shift
        self._transport, self._pieces = None, []

    def _open(self, transport: int) -> None:
        self._pieces = []
        for uri in storage.list_files(storage.join(self._work, "pieces", f"t{transport:06d}")):
            if uri.endswith(".arrow"):
                meta = storage.read_json(uri[:-len(".arrow")] + ".json")
                counts = np.array([n for _, n in meta["groups"]], np.int64)
                starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
                where = {g: (int(start), int(n)) for (g, n), start in zip(meta["groups"], starts)}
                self._pieces.append((read_table(uri), where))
        self._transport = transport

    def sorted(self, group: int) -> pa.Table:
        """Group ``group``'s rows from all parts, sorted by key."""
        if group >> self._shift != self._transport:
            self._open(group >> self._shift)
        slices = [table.slice(*where[group]) for table, where in self._pieces if group in where]
        if not slices:
            raise RuntimeError(f"no piece under {storage.join(self._work, 'pieces')} holds key-range group {group}: "
                               "the work directory lost files; rerun the instances step")
        return sort_by_key(pa.concat_tables(slices))


def sorted_group(work: str, group: int, transport_shift: int = 0) -> pa.Table:
    """A key-range group's rows from all parts' pieces, sorted by key."""
    return PieceGroups(work, transport_shift).sorted(group)


def _write_shard_file(path: str, pieces: PieceGroups, lo: int, hi: int, group_rows: list[int],
                      output_schema: pa.Schema, batch_rows: int) -> dict:
    """Write the rows ranked ``[lo, hi)`` as an Arrow IPC file at ``path``, one key-range group at a time: a group
    is read, sorted, written and dropped before the next is read, so memory is bounded by a group, not by the
    shard. Returns rows, tokens, sha256 of the file's bytes and its size.

    Each group's slice is cut into record batches of at most ``batch_rows`` rows, as ``to_batches`` cuts the
    whole shard's table (a batch never spans two chunks, and each sorted group is one chunk): the bytes are those
    of writing the concatenated table at once.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    rows = tokens = 0
    # Arrow's allocator (mimalloc) keeps freed pages resident for a second: released after each group, or the
    # buffers of the groups written in that second (and of the stage before) would add up.
    pool = pa.default_memory_pool()
    pool.release_unused()
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, output_schema) as writer:
        for group, first, count in _overlapping_groups(group_rows, lo, hi):
            table = pieces.sorted(group).slice(first, count)
            table = pa.Table.from_arrays([table.column(f.name).cast(f.type) for f in output_schema],
                                         schema=output_schema)
            writer.write_table(table, max_chunksize=batch_rows)
            rows += table.num_rows
            tokens += int(pc.sum(pc.list_value_length(table.column("input_ids"))).as_py() or 0)
            del table
            pool.release_unused()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"rows": rows, "tokens": tokens, "sha256": digest.hexdigest(), "bytes": os.path.getsize(path)}


def assemble_shard(work: str, output_dir: str, shard: int, num_shards: int, group_rows: list[int],
                   output_schema: pa.Schema, batch_rows: int = 4096, transport_shift: int = 0) -> dict:
    """Write shard ``shard`` from the key-range groups that overlap its rank range, one group at a time.

    Args:
        group_rows: rows per key-range group over all parts, in key order.
        output_schema: the final schema (provenance columns present or not).
        transport_shift: bits of a key-range group's number below its transport group's (where its pieces are).
    Returns:
        The shard's manifest entry: name, rows, sha256, bytes, tokens.
    """
    lo, hi = shard_bounds(shard, num_shards, sum(group_rows))
    name = shard_name(shard, num_shards)
    target = storage.join(output_dir, name)
    if storage.is_local(target):
        # The output directory is already a staging area (published by renaming it): write in place.
        final = storage.local_path(target)
        partial = f"{final}.partial"
        written = _write_shard_file(partial, PieceGroups(work, transport_shift), lo, hi, group_rows, output_schema,
                                    batch_rows)
        os.replace(partial, final)
    else:
        # Write locally first so the checksum is of the exact bytes that are uploaded.
        with tempfile.TemporaryDirectory(prefix="shard-") as tmp:
            local = os.path.join(tmp, name)
            written = _write_shard_file(local, PieceGroups(work, transport_shift), lo, hi, group_rows,
                                        output_schema, batch_rows)
            storage.upload_file(local, target)
    return {"name": name, **written}


__all__ = ["PieceGroups", "assemble_shard", "from_ipc", "group_of_keys", "instance_batch", "instance_stats",
           "merge_counts", "piece_uri", "shard_bounds", "shard_name", "sort_by_key", "sorted_group", "to_ipc",
           "write_piece", "write_table"]
