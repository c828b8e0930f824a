"""The preprocessing stage's Beam DoFns that read and write the run's files: the input files cut into units and read
as documents, the tokenized documents written as document-store buckets (and counted for the index), the finished
instances written as pieces by key-range group. None of them tokenizes; the DoFns that do, and the PTransforms that
wire all of them into stages, are in ``preprocess.transforms``.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from common import schema, storage
from common.hashing import document_hash
from common.preprocess_config import SourceConfig
from preprocess import books, docstore, dumpsplit, handoff, shards, sources

INDEX_NAME = "index.json"  # written by the index stage: bucket offsets, group bits, corpus counts


def transport_bits(group_bits: int, most: int) -> int:
    """Bits of the transport groups (runs of adjacent key-range groups; at most ``2**most``) that finished rows
    cross the instance stage's GroupByKey by (``preprocess.transforms.TRANSPORT_GROUP_BITS``)."""
    return min(group_bits, most)


class SplitLargeDumps(beam.DoFn):
    """(kind, uri) -> the same, or for a .bz2 dump larger than ``range_bytes`` its byte ranges (kind, uri,
    ("bytes", lo, hi)), so that several workers decompress and parse one dump (see ``preprocess.dumpsplit``)."""

    def __init__(self, range_bytes: int):
        self._range_bytes = range_bytes

    def process(self, element):
        kind, uri = element[:2]
        size = storage.size_of(uri) if len(element) == 2 and dumpsplit.splittable(kind, uri) else 0
        pieces = dumpsplit.byte_ranges(size, size // self._range_bytes) if size > self._range_bytes else []
        if len(pieces) > 1:
            yield from ((kind, uri, ("bytes", lo, hi)) for lo, hi in pieces)
        else:
            yield element


class ReadSourceFile(beam.DoFn):
    """(kind, uri[, split]) -> RawDocument | Rejected, streamed from the file.

    ``split`` selects part of a file, so that several workers share it without cleaning any document twice:
    ("bytes", lo, hi) reads the pages of a byte range of a .bz2 dump; ("buckets", bits, lo, hi) reads the whole
    file and passes on only the documents of buckets ``[lo, hi)``.
    """

    def __init__(self, cfg: SourceConfig):
        self._cfg = cfg
        self._files = Metrics.counter("preprocess", "files_read")
        self._headers: dict[str, bytes] = {}  # dump headers, shared by the ranges of one file

    def process(self, element):
        kind, uri, *split = element
        self._files.inc()
        split = split[0] if split else None
        if split is not None and split[0] == "bytes":
            yield from sources.iter_wikipedia(uri, self._cfg, byte_range=(split[1], split[2]), headers=self._headers)
            return
        reader = sources.iter_wikipedia if kind == "wiki" else books.iter_book
        if split is None:
            yield from reader(uri, self._cfg)
            return
        _, bits, lo, hi = split
        for item in reader(uri, self._cfg):
            if lo <= docstore.bucket_of(document_hash(item.doc_id), bits) < hi:
                yield item


class WriteDocumentBucket(beam.DoFn):
    """(bucket, [records]) -> docs/bNNNNNN/pPPPP.arrow, the bucket's documents from this part (none: no file); emits
    the bucket's counts (``docstore.no_counts``' keys), which ``WritePartCounts`` adds up. The records are
    ``transforms.CleanAndTokenize``'s: ("doc", row) or ("rejected", (source, doc_id, outcome, reason, detail))."""

    def __init__(self, work: str, part: int, vocab_size: int):
        self._work, self._part, self._vocab_size = work, part, vocab_size

    def process(self, element):
        bucket, records = element
        docs = [payload for tag, payload in records if tag == "doc"]
        counts = docstore.no_counts()
        for source, doc_id, outcome, reason, detail in (payload for tag, payload in records if tag == "rejected"):
            counts[outcome][reason] = counts[outcome].get(reason, 0) + 1
            if outcome == "failed":
                counts["dead_letters"].append({"source": source, "doc_id": doc_id, "reason": reason, "detail": detail})
        if docs:
            counts["documents"] = len(docs)
            counts["sentences"] = sum(len(d[4]) // 4 for d in docs)
            token_bytes = np.dtype(schema.token_numpy_dtype(self._vocab_size)).itemsize
            counts["tokens"] = sum(len(d[3]) for d in docs) // token_bytes
            docstore.write_table(storage.join(docstore.bucket_dir(self._work, bucket), f"p{self._part:04d}.arrow"),
                                 docstore.documents_table(docs, self._vocab_size))
        yield counts


class WritePartCounts(beam.DoFn):
    """(any key, [each bucket's counts]) -> doc_counts/pPPPP.json, this part's documents counted (``docstore``'s
    ``add_counts``): one file per part for the index and the manifest to read, not one per bucket and part."""

    def __init__(self, work: str, part: int):
        self._work, self._part = work, part

    def process(self, element):
        storage.write_json(docstore.counts_uri(self._work, self._part), docstore.add_counts(list(element[1])))
        yield self._part


class CountBucket(beam.DoFn):
    """bucket -> (bucket, documents after removing duplicate ids, duplicates)."""

    def __init__(self, work: str):
        self._work = work

    def process(self, bucket):
        yield docstore.bucket_count(self._work, bucket)


class WritePieceGroup(beam.DoFn):
    """(transport group, [record batches]) -> pieces/tNNNNNN/pPPPP.arrow + .json: this part's rows of the transport
    group, group after group (``shards.write_piece``; the json says where each key-range group's rows are, and has
    the piece's statistics). Within a group, rows stay in arrival order: the shard sorts the group by key (with the
    other parts' pieces), whatever the order here.

    Args:
        most_transport_bits: ``preprocess.transforms.TRANSPORT_GROUP_BITS``, as the batches were keyed by it.
    """

    def __init__(self, work: str, part: int, vocab_size: int, mask_id: int, most_transport_bits: int):
        self._work, self._part, self._vocab_size, self._mask_id = work, part, vocab_size, mask_id
        self._most_transport_bits = most_transport_bits
        self._group_bits = None

    def process(self, element):
        transport, batches = element
        if self._group_bits is None:  # the index is written before the instance stage starts
            self._group_bits = storage.read_json(storage.join(self._work, INDEX_NAME))["group_bits"]
        received = (handoff.receive(b) for b in batches)
        # As one chunk: the batches come many to a piece (one per transport group of each flush of each DoFn), and
        # as record batches of a piece their metadata would outweigh their rows, on disk and when a shard reads it.
        table = pa.Table.from_batches([b if isinstance(b, pa.RecordBatch) else shards.from_ipc(b) for b in received])
        if not table.num_rows:
            return
        shards.write_piece(self._work, transport, self._part, table, self._group_bits,
                           transport_bits(self._group_bits, self._most_transport_bits),
                           shards.instance_stats(table, self._mask_id))
        yield transport
