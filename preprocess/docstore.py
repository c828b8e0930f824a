"""The tokenized document store: the pipeline's intermediate, between cleaning and instance creation.

Documents are partitioned into hash-range *buckets* (the top bits of ``document_hash``). Each
preprocessing part writes at most one Arrow file per bucket, sorted by hash; reading a bucket merges
those files. A document's *global index* is its rank in hash order over the whole corpus, which
does not depend on how many parts or buckets the run used, so the output does not either.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from common import schema, storage


def bucket_of(doc_hash: int, bucket_bits: int) -> int:
    return doc_hash >> (64 - bucket_bits) if bucket_bits else 0


def bucket_dir(work: str, bucket: int) -> str:
    return storage.join(work, "docs", f"b{bucket:06d}")


COUNTS_DIR = "doc_counts"  # one file per part of the documents stage: its counts and dead letters


def counts_uri(work: str, part: int) -> str:
    return storage.join(work, COUNTS_DIR, f"p{part:04d}.json")


def no_counts() -> dict:
    """A part's (or bucket's) document counts, and per source (its name: ``readers.source_of``) the same, without
    the dead letters (``no_source_counts``)."""
    return {"documents": 0, "sentences": 0, "tokens": 0, "skipped": {}, "failed": {}, "dead_letters": [],
            "sources": {}}


def no_source_counts() -> dict:
    """One source's documents kept (with their sentences and tokens: ``preprocess.mixture`` weighs sources by
    them) and skipped and failed by reason."""
    return {"documents": 0, "sentences": 0, "tokens": 0, "skipped": {}, "failed": {}}


def add_counts(counts: list[dict]) -> dict:
    """The sum of document counts (``no_counts``' keys: documents kept, their sentences and tokens, documents
    skipped and failed by reason, and the failed ones' dead letters, ordered by source and id)."""
    total = no_counts()
    for part in counts:
        total = merge_counts(total, part)
    total["dead_letters"].sort(key=lambda letter: (letter["source"], letter["doc_id"]))
    return total


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


def write_table(uri: str, table: pa.Table, batch_rows: int = 4096) -> int:
    """Write an Arrow IPC *file* (uncompressed, memory-mappable); returns its size in bytes."""
    sink = io.BytesIO() if not storage.is_local(uri) else None
    with storage.open_write(uri) as handle:
        target = sink if sink is not None else handle
        with ipc.new_file(target, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=batch_rows):
                writer.write_batch(batch)
        if sink is not None:
            handle.write(sink.getvalue())
        return handle.tell()


def read_table(uri: str) -> pa.Table:
    if storage.is_local(uri):
        with pa.memory_map(storage.local_path(uri)) as source:
            return ipc.open_file(source).read_all()
    with storage.open_read(uri) as handle:
        return ipc.open_file(pa.BufferReader(handle.read())).read_all()


def documents_table(docs: list[tuple[int, str, str, bytes, bytes]], vocab_size: int) -> pa.Table:
    """Build a bucket file's table from (doc_hash, doc_id, source, token bytes, sentence-length bytes)."""
    docs = sorted(docs, key=lambda d: (d[0], d[1], d[2]))
    tok_dtype = schema.token_numpy_dtype(vocab_size)
    tokens = [np.frombuffer(d[3], dtype=tok_dtype) for d in docs]
    lengths = [np.frombuffer(d[4], dtype=np.uint32) for d in docs]
    return pa.table({
        "doc_hash": pa.array([d[0] for d in docs], pa.uint64()),
        "doc_id": pa.array([d[1] for d in docs], pa.string()),
        "source": pa.array([d[2] for d in docs], pa.string()),
        "tokens": _list_array(tokens, schema.token_type(vocab_size)),
        "sentence_lengths": _list_array(lengths, pa.uint32()),
    })


def _list_array(arrays: list[np.ndarray], value_type: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=value_type.to_pandas_dtype())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, value_type))


@dataclass
class Bucket:
    """A bucket's documents in global order, with duplicate ids removed.

    The token and sentence-length arrays keep the order of the bucket's files (concatenated); documents are put in
    global order by their start and end offsets only, so loading a bucket never moves its tokens.
    """

    doc_ids: list[str]
    tokens: np.ndarray          # every document's tokens, in file order
    token_starts: np.ndarray    # the document of rank i is tokens[token_starts[i]:token_ends[i]]
    token_ends: np.ndarray
    duplicates: list[tuple[str, str]]  # (doc_id, source) of dropped copies
    # Every sentence start of every document, as token offsets into ``tokens``, then the end (strictly increasing:
    # sentences are never empty). The document of rank i has the sentences ``sentence_starts[i]`` up to
    # ``sentence_ends[i]`` (exclusive), and boundaries[sentence_ends[i]] is its end.
    boundaries: np.ndarray
    sentence_starts: np.ndarray
    sentence_ends: np.ndarray

    def __len__(self) -> int:
        return len(self.doc_ids)

    @property
    def token_lengths(self) -> np.ndarray:
        return self.token_ends - self.token_starts

    def document(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """(flat tokens, sentence offsets from the document's start, with its length at the end) of ``rank``."""
        start, end = self.token_starts[rank], self.token_ends[rank]
        offsets = self.boundaries[self.sentence_starts[rank]:self.sentence_ends[rank] + 1] - start
        return self.tokens[start:end], offsets


_SORT_KEYS = [("doc_hash", "ascending"), ("doc_id", "ascending"), ("source", "ascending")]


def _ordered(work: str, bucket: int, columns: list[str] | None = None, drop: frozenset[str] = frozenset()):
    """(a bucket's rows as its files hold them, the row order that puts them in global order (hash, id, source)
    without duplicate ids, the document ids in that order, the dropped duplicates); a None table if empty.
    The ids in ``drop`` (the held-out split's, ``preprocess.heldout``) are left out too, as if never stored."""
    # The instance stage loads buckets many times a second, and Arrow's allocator (mimalloc) keeps freed pages
    # resident for a second: without this, the buffers of the buckets loaded in that second would add up.
    pa.default_memory_pool().release_unused()
    files = [u for u in storage.list_files(bucket_dir(work, bucket)) if u.endswith(".arrow")]
    if not files:
        return None, None, [], []
    tables = [read_table(u) for u in files]
    table = pa.concat_tables([t.select(columns) if columns else t for t in tables])
    order = pc.sort_indices(table.select([name for name, _ in _SORT_KEYS]), sort_keys=_SORT_KEYS)
    doc_ids = table.column("doc_id").take(order).to_pylist()
    order = order.to_numpy()
    keep = [i for i in range(len(doc_ids)) if (i == 0 or doc_ids[i] != doc_ids[i - 1]) and doc_ids[i] not in drop]
    if len(keep) == len(doc_ids):
        return table, order, doc_ids, []
    if "tokens" in table.column_names:
        keep = [_first_copy(table, order, doc_ids, i) for i in keep]
    kept = set(keep)
    dropped = [i for i in range(len(doc_ids)) if i not in kept and doc_ids[i] not in drop]
    sources = table.column("source").take(pa.array(order[dropped])).to_pylist()
    duplicates = [(doc_ids[i], source) for i, source in zip(dropped, sources)]
    return table, order[keep], [doc_ids[i] for i in keep], duplicates


def _first_copy(table: pa.Table, order, doc_ids: list[str], first: int) -> int:
    """Of the copies of one id that start at rank ``first`` (ordered by source), the one kept: the first source's
    copy with the smallest tokens. The parts' files hold copies of one id and source in no fixed order (it depends
    on the workers), so the text decides, and the kept copy is the same for any workers, parts and runner."""
    last = first
    while last + 1 < len(doc_ids) and doc_ids[last + 1] == doc_ids[first]:
        last += 1
    if last == first:
        return first
    sources = table.column("source").take(pa.array(order[first:last + 1])).to_pylist()
    same = [first + k for k, source in enumerate(sources) if source == sources[0]]
    if len(same) == 1:
        return first
    tokens = table.column("tokens").take(pa.array(order[same])).to_pylist()
    return same[min(range(len(same)), key=lambda k: tokens[k])]


def text_hash(tokens: np.ndarray) -> int:
    """A document's text, as cleaned, sentence-split and tokenized, as 63 bits (JSON keeps them exactly)."""
    return int.from_bytes(hashlib.blake2b(np.ascontiguousarray(tokens).tobytes(), digest_size=8).digest(),
                          "little") >> 1


def bucket_ids(work: str, bucket: int, drop: frozenset[str] = frozenset()) -> tuple[list[str], list[tuple[str, str]]]:
    """A bucket's document ids in global order and its dropped duplicates, without touching the tokens."""
    _, _, doc_ids, duplicates = _ordered(work, bucket, ["doc_hash", "doc_id", "source"], drop)
    return doc_ids, duplicates


def bucket_count(work: str, bucket: int, drop: frozenset[str] = frozenset()) -> tuple[int, int, list[tuple[str, str]]]:
    """(bucket, documents after removing duplicate ids and the ids in ``drop``, the duplicate ids): one row of the
    corpus index."""
    doc_ids, duplicates = bucket_ids(work, bucket, drop)
    return bucket, len(doc_ids), duplicates


def load_bucket(work: str, bucket: int, drop: frozenset[str] = frozenset()) -> Bucket:
    """A bucket's documents in global order, without duplicate ids nor the ids in ``drop`` (see ``_ordered``)."""
    table, order, doc_ids, duplicates = _ordered(work, bucket, drop=drop)
    if table is None:
        empty = np.zeros(0, np.int64)
        return Bucket([], np.zeros(0, np.uint16), empty, empty, [], np.zeros(1, np.int64), empty, empty)
    token_offsets, tokens = _flat(table.column("tokens"))
    sentence_offsets, sentence_lengths = _flat(table.column("sentence_lengths"))
    boundaries = np.zeros(len(sentence_lengths) + 1, np.int64)
    np.cumsum(sentence_lengths, out=boundaries[1:])
    return Bucket(doc_ids, tokens, token_offsets[:-1][order], token_offsets[1:][order], duplicates, boundaries,
                  sentence_offsets[:-1][order], sentence_offsets[1:][order])


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(row offsets from 0, all values) of a list column, rows in their order."""
    array = column.combine_chunks()
    offsets = np.asarray(array.offsets, dtype=np.int64)
    return offsets - offsets[0], array.flatten().to_numpy(zero_copy_only=False)
