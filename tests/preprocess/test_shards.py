"""Shard assembly streams one key-range group at a time: the same bytes as writing the whole shard's table at once,
with memory bounded by a group, not by the shard."""
from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from common import processes, schema
from preprocess import shards
from preprocess.batch import FinalizedBatch, InstanceKeys
from tests.preprocess.conftest import REPO_ROOT

VOCAB = 1000
GROUP_BITS = 3


def _piece(rng: np.random.Generator, group: int, rows: int, group_bits: int = GROUP_BITS) -> pa.Table:
    """``rows`` random instances whose keys fall in key-range group ``group``."""
    lengths = rng.integers(8, 40, rows)
    counts = np.minimum(lengths // 4, 5)
    finalized = FinalizedBatch(
        input_ids=rng.integers(0, VOCAB, int(lengths.sum())).astype(np.uint16), lengths=lengths,
        segment_a_len=lengths // 2, masked_positions=rng.integers(1, 8, int(counts.sum())), masked_counts=counts,
        masked_labels=rng.integers(0, VOCAB, int(counts.sum())).astype(np.uint16), truncated=rng.random(rows) < 0.1)
    low = rng.integers(0, 1 << (64 - group_bits), rows, dtype=np.uint64)
    order = (np.uint64(group) << np.uint64(64 - group_bits)) | low
    keys = InstanceKeys(random=order, order=order, tiebreak=rng.integers(0, 1 << 62, rows).astype(np.uint64))
    batch = shards.instance_batch(finalized, keys, rng.integers(0, 2, rows).astype(np.int8), None, None, VOCAB)
    return pa.Table.from_batches([batch])


def _write_pieces(work, rows_per_piece: list[list[int]], seed: int = 0, group_bits: int = GROUP_BITS,
                  transport_bits: int = GROUP_BITS) -> list[int]:
    """The pieces of every (transport group, part), each of several record batches (one or more per group);
    ``rows_per_piece[group][part]`` rows of each group from each part. Returns the rows per group."""
    rng = np.random.default_rng(seed)
    tables: dict[tuple[int, int], list[pa.Table]] = {}
    for group, parts in enumerate(rows_per_piece):
        for part, rows in enumerate(parts):
            if rows:
                transport = group >> (group_bits - transport_bits)
                tables.setdefault((transport, part), []).append(_piece(rng, group, rows, group_bits))
    for (transport, part), pieces in tables.items():
        shards.write_piece(str(work), transport, part, pa.concat_tables(pieces), group_bits, transport_bits)
    return [sum(parts) for parts in rows_per_piece]


def _output_schema() -> pa.Schema:
    return schema.instance_schema(VOCAB, provenance=False, metadata={"max_seq_length": 40})


def _whole_table_sha256(work, shard: int, num_shards: int, group_rows: list[int], batch_rows: int,
                        transport_shift: int) -> str:
    """The shard written as it was before streaming: every overlapping group sorted and sliced, concatenated,
    cast, then cut into record batches at once."""
    lo, hi = shards.shard_bounds(shard, num_shards, sum(group_rows))
    tables, start = [], 0
    for group, rows in enumerate(group_rows):
        end = start + rows
        if rows and end > lo and start < hi:
            first = max(lo - start, 0)
            tables.append(shards.sorted_group(str(work), group, transport_shift)
                          .slice(first, min(hi, end) - start - first))
        start = end
    whole = pa.concat_tables(tables)
    out = _output_schema()
    table = pa.Table.from_arrays([whole.column(f.name).cast(f.type) for f in out], schema=out)
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, out) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


@pytest.mark.parametrize("transport_bits", [GROUP_BITS, 1])
@pytest.mark.parametrize("num_shards, batch_rows", [(1, 16), (3, 16), (4, 50), (5, 4096)])
def test_streamed_shards_are_the_bytes_of_the_whole_table(tmp_path, num_shards, batch_rows, transport_bits):
    # Groups of 30-90 rows from 3 parts (one group empty, one in a single part): shards start and end inside
    # groups, and batches of 16 rows do not divide a group. A piece per group, or per run of four groups.
    group_rows = _write_pieces(tmp_path / "work", [[10, 20, 30], [0, 0, 0], [45, 0, 0], [25, 25, 25],
                                                   [1, 2, 3], [40, 30, 20], [33, 0, 11], [5, 6, 7]],
                               transport_bits=transport_bits)
    out = _output_schema()
    shift = GROUP_BITS - transport_bits
    total_rows = total_tokens = 0
    for shard in range(num_shards):
        entry = shards.assemble_shard(str(tmp_path / "work"), str(tmp_path / "out"), shard, num_shards, group_rows,
                                      out, batch_rows=batch_rows, transport_shift=shift)
        path = tmp_path / "out" / entry["name"]
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() == _whole_table_sha256(
            tmp_path / "work", shard, num_shards, group_rows, batch_rows, shift)
        reader = ipc.open_file(str(path))
        table = reader.read_all()
        assert reader.schema == out and entry["rows"] == table.num_rows and entry["bytes"] == path.stat().st_size
        assert entry["tokens"] == sum(len(ids) for ids in table.column("input_ids").to_pylist())
        assert max(reader.get_batch(i).num_rows for i in range(reader.num_record_batches)) <= batch_rows
        total_rows += entry["rows"]
        total_tokens += entry["tokens"]
    assert total_rows == sum(group_rows)


def test_an_empty_shard_is_an_empty_file_of_the_schema(tmp_path):
    group_rows = _write_pieces(tmp_path / "work", [[2, 0], [0, 1]])
    entry = shards.assemble_shard(str(tmp_path / "work"), str(tmp_path / "out"), 0, 4, group_rows, _output_schema())
    assert entry["rows"] == 0 and entry["tokens"] == 0
    assert ipc.open_file(str(tmp_path / "out" / entry["name"])).read_all().num_rows == 0


_PEAK_OF_ONE_SHARD = """
import json, sys
import pyarrow as pa
from preprocess import shards
work, out, group_rows, schema = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), pa.ipc.read_schema(sys.argv[4])
entry = shards.assemble_shard(work, out, 0, 1, group_rows, schema, transport_shift=int(sys.argv[5]))
print(json.dumps({"arrow_peak": pa.default_memory_pool().max_memory(), "bytes": entry["bytes"]}))
"""


def test_memory_is_bounded_by_a_group_not_by_the_shard(tmp_path):
    # 24 groups of 1,500 rows from 4 parts in one shard, in pieces of 8 groups each: Arrow's peak allocation (in a
    # fresh process, so that it counts this shard alone) stays within a few groups' size; the whole shard's table
    # would take over 20.
    rows_per_piece = [[375] * 4 for _ in range(24)] + [[0] * 4] * 8
    group_rows = _write_pieces(tmp_path / "work", rows_per_piece, seed=1, group_bits=5, transport_bits=2)
    group_bytes = max(shards.sorted_group(str(tmp_path / "work"), g, 3).nbytes for g in range(24))
    schema_file = tmp_path / "schema.arrow"
    schema_file.write_bytes(_output_schema().serialize().to_pybytes())
    proc = processes.run([sys.executable, "-c", _PEAK_OF_ONE_SHARD, str(tmp_path / "work"), str(tmp_path / "out"),
                          json.dumps(group_rows), str(schema_file), "3"], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=True, timeout=120)
    measured = json.loads(proc.stdout.splitlines()[-1])
    assert measured["bytes"] > 15 * group_bytes
    assert measured["arrow_peak"] < 4 * group_bytes, (measured, group_bytes)
