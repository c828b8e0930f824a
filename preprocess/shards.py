"""Sorted runs ("pieces") of instances, the final shuffled shards, and their statistics.

Every instance carries a 128-bit shuffle key derived from (seed, document, duplicate, index). The
global order of the dataset is the key order, so shard ``s`` of ``S`` holds the rows ranked
``[s*R//S, (s+1)*R//S)``: shards are equal to within one row, and every shard is a uniformly
random sample of the corpus in random order. Pieces are the rows of one key-range group from one
part, so a shard is assembled from the few groups that overlap its rank range (each sorted by key
as it is read) with bounded memory.
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
from preprocess.docstore import read_table, write_table

HISTOGRAM_BIN = 16  # sequence-length histogram bin width, in tokens

def piece_uri(work: str, group: int, part: int) -> str:
    return storage.join(work, "pieces", f"g{group:06d}", f"p{part:04d}.arrow")


def _ragged(flat: np.ndarray, lengths: np.ndarray, value_type: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, value_type))


def batch_table(finalized, keys, next_label: np.ndarray, doc_a: list[str] | None, doc_b: list[str] | None,
                vocab_size: int) -> pa.Table:
    """A finished batch (preprocess.batch.FinalizedBatch) as rows of the piece schema; without provenance
    (``doc_a`` and ``doc_b`` None) the doc_a and doc_b columns are left out."""
    tok = schema.token_type(vocab_size)
    provenance = {} if doc_a is None else {"doc_a": pa.array(doc_a, pa.string()), "doc_b": pa.array(doc_b, pa.string())}
    return pa.table({
        "order_key": pa.array(keys.order, pa.uint64()),
        "tiebreak": pa.array(keys.tiebreak, pa.uint64()),
        "input_ids": _ragged(finalized.input_ids, finalized.lengths, tok),
        "segment_a_len": pa.array(finalized.segment_a_len.astype(np.int32), pa.int32()),
        "masked_positions": _ragged(finalized.masked_positions.astype(np.uint16), finalized.masked_counts, pa.uint16()),
        "masked_labels": _ragged(finalized.masked_labels, finalized.masked_counts, tok),
        "next_sentence_label": pa.array(next_label, pa.int8()),
        **provenance,
        "truncated": pa.array(finalized.truncated, pa.bool_()),
    })


def group_of_keys(order_keys: np.ndarray, group_bits: int) -> np.ndarray:
    if not group_bits:
        return np.zeros(len(order_keys), np.int64)
    return (np.asarray(order_keys, np.uint64) >> np.uint64(64 - group_bits)).astype(np.int64)


def sort_by_key(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("order_key", "ascending"), ("tiebreak", "ascending")]))


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return ipc.open_stream(pa.py_buffer(data)).read_all()


def instance_stats(table: pa.Table, mask_id: int) -> dict:
    """Counts that let the manifest report NSP balance, masking split and lengths."""
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
    }


def merge_counts(a: dict, b: dict) -> dict:
    """Add nested count dictionaries (missing keys count as zero)."""
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict):
            out[key] = merge_counts(out.get(key, {}), value)
        elif isinstance(value, (int, float)):
            out[key] = out.get(key, 0) + value
        elif isinstance(value, list):
            out[key] = list(out.get(key, [])) + value
        else:
            out[key] = value
    return out


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}.arrow"


def shard_bounds(shard: int, num_shards: int, num_rows: int) -> tuple[int, int]:
    return shard * num_rows // num_shards, (shard + 1) * num_rows // num_shards


def _write_ipc_file(path: str, table: pa.Table, output_schema: pa.Schema, batch_rows: int) -> tuple[str, int]:
    """Write ``table`` as an Arrow IPC file at ``path``; returns (sha256 of its bytes, size)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, output_schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest(), os.path.getsize(path)


def assemble_shard(work: str, output_dir: str, shard: int, num_shards: int, group_rows: list[int],
                   output_schema: pa.Schema, batch_rows: int = 4096) -> dict:
    """Write shard ``shard`` from the key-range groups that overlap its rank range.

    Args:
        group_rows: rows per key-range group over all parts, in key order.
        output_schema: the final schema (provenance columns present or not).
    Returns:
        The shard's manifest entry: name, rows, sha256, bytes.
    """
    total = sum(group_rows)
    lo, hi = shard_bounds(shard, num_shards, total)
    tables, start = [], 0
    for group, rows in enumerate(group_rows):
        end = start + rows
        if rows and end > lo and start < hi:
            group_dir = storage.join(work, "pieces", f"g{group:06d}")
            present = [u for u in storage.list_files(group_dir) if u.endswith(".arrow")]
            table = sort_by_key(pa.concat_tables([read_table(u) for u in present]))
            tables.append(table.slice(max(lo - start, 0), min(hi, end) - max(lo, start)))
        start = end
    rows_table = pa.concat_tables(tables) if tables else None
    columns = [rows_table.column(f.name).cast(f.type) if rows_table is not None else pa.array([], f.type)
               for f in output_schema]
    shard_table = pa.Table.from_arrays(columns, schema=output_schema)
    name = shard_name(shard, num_shards)
    target = storage.join(output_dir, name)
    if storage.is_local(target):
        # The output directory is already a staging area (published by renaming it): write in place.
        final = storage.local_path(target)
        partial = f"{final}.partial"
        digest, size = _write_ipc_file(partial, shard_table, output_schema, batch_rows)
        os.replace(partial, final)
    else:
        # Write locally first so the checksum is of the exact bytes that are uploaded.
        with tempfile.TemporaryDirectory(prefix="shard-") as tmp:
            local = os.path.join(tmp, name)
            digest, size = _write_ipc_file(local, shard_table, output_schema, batch_rows)
            storage.upload_file(local, target)
    return {"name": name, "rows": shard_table.num_rows, "sha256": digest, "bytes": size,
            "tokens": int(pc.sum(pc.list_value_length(shard_table.column("input_ids"))).as_py() or 0)}


__all__ = ["assemble_shard", "batch_table", "from_ipc", "group_of_keys", "instance_stats", "merge_counts",
           "piece_uri", "shard_bounds", "shard_name", "sort_by_key", "to_ipc", "write_table"]
