"""Exact duplicates removed across and within sources (``dedup.exact``), in the index stage, before any document is
counted, held out or built into rows.

A document's text is compared as the documents stage stored it: cleaned (whitespace normalised, control characters
dropped), split into sentences and tokenized (with an uncased vocabulary, case-folded too), as a 63-bit BLAKE2b of
its tokens (``heldout.text_hash``). Of the documents of one text, the first in the store's global order (its id's
``document_hash``, then its id: a stable key of source and id) is kept and the others are dropped, whatever the
workers, parts or runner. The documents are bucketed by id, so copies of one text sit in different buckets; the
work goes in three steps that each hold a bounded share of the corpus:

1. ``write_keys``: each bucket's (text hash, id, source, sentences, tokens), sorted by text hash -> ``dedup/keys``;
2. ``find_duplicates``: each of ``2**bits`` ranges of text hashes (``partition_bits``: at most about
   ``ROWS_PER_PARTITION`` documents each) read from every bucket's keys; its drops -> ``dedup/drops``;
3. ``merge``: the drops by bucket (``dedup/bNNNNNN.json``, which every later load of the bucket leaves out:
   ``dropped``) and their counts per source (``dedup/summary.json``).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from common import storage
from common.hashing import document_hash
from preprocess import docstore
from preprocess.docstore import text_hash
from preprocess.layout import bits_for
from preprocess.readers import source_of

DEDUP_DIR = "dedup"
SUMMARY_NAME = "summary.json"
ROWS_PER_PARTITION = 1 << 22  # ~4M documents' keys (about 200 MiB with their ids) at once, at most
_HASH_BITS = 63


def _keys_uri(work: str, bucket: int) -> str:
    return storage.join(work, DEDUP_DIR, "keys", f"b{bucket:06d}.arrow")


def _drops_uri(work: str, partition: int) -> str:
    return storage.join(work, DEDUP_DIR, "drops", f"t{partition:06d}.arrow")


def _bucket_uri(work: str, bucket: int) -> str:
    return storage.join(work, DEDUP_DIR, f"b{bucket:06d}.json")


def write_keys(work: str, bucket: int) -> int:
    """Step 1: bucket ``bucket``'s text keys, sorted by text hash; returns its number of documents."""
    loaded = docstore.load_bucket(work, bucket)
    if not len(loaded):
        return 0
    hashes = np.fromiter((text_hash(loaded.document(rank)[0]) for rank in range(len(loaded))), np.uint64,
                         len(loaded))
    order = np.argsort(hashes, kind="stable")
    sentences = loaded.sentence_ends - loaded.sentence_starts
    table = pa.table({"text_hash": hashes[order], "doc_id": pa.array([loaded.doc_ids[i] for i in order.tolist()]),
                      "sentences": sentences[order].astype(np.int64),
                      "tokens": loaded.token_lengths[order].astype(np.int64)})
    docstore.write_table(_keys_uri(work, bucket), table)
    return len(loaded)


def partition_bits(documents: int) -> int:
    """Ranges of text hashes for ``documents`` documents: a power of two, each about ``ROWS_PER_PARTITION``."""
    return bits_for(documents / ROWS_PER_PARTITION)


def find_duplicates(work: str, partition: int, bits: int, num_buckets: int) -> int:
    """Step 2: the documents of text-hash range ``partition`` (of ``2**bits``) that repeat an earlier one's text;
    returns how many."""
    lo, hi = partition << (_HASH_BITS - bits), (partition + 1) << (_HASH_BITS - bits)
    pieces = []
    for bucket in range(num_buckets):
        uri = _keys_uri(work, bucket)
        if not storage.exists(uri):
            continue
        table = docstore.read_table(uri)
        hashes = table.column("text_hash").to_numpy()
        start, end = np.searchsorted(hashes, [lo, hi])
        if end > start:
            pieces.append(table.slice(start, end - start).append_column("bucket", pa.array(
                np.full(end - start, bucket, np.int64))))
    if not pieces:
        return 0
    table = pa.concat_tables(pieces)
    _, inverse, counts = np.unique(table.column("text_hash").to_numpy(), return_inverse=True, return_counts=True)
    repeated = np.flatnonzero(counts[inverse] > 1)  # only texts held more than once: the rest are never sorted
    if not len(repeated):
        return 0
    table = table.take(pa.array(repeated))
    hashes = table.column("text_hash").to_numpy().tolist()
    doc_ids = table.column("doc_id").to_pylist()
    # The store's global order within one text: the id's hash, then the id (ids are unique, so no tie is left).
    order = sorted(range(len(doc_ids)), key=lambda i: (hashes[i], document_hash(doc_ids[i]), doc_ids[i]))
    later = [order[k] for k in range(1, len(order)) if hashes[order[k]] == hashes[order[k - 1]]]
    docstore.write_table(_drops_uri(work, partition), table.take(pa.array(later, pa.int64())))
    return len(later)


def merge(work: str, bits: int) -> dict:
    """Step 3: every range's drops -> each bucket's dropped ids, and their counts per source (the summary)."""
    by_bucket: dict[int, list[str]] = {}
    sources: dict[str, dict] = {}
    for partition in range(1 << bits):
        uri = _drops_uri(work, partition)
        if not storage.exists(uri):
            continue
        table = docstore.read_table(uri)
        for bucket, doc_id, sentences, tokens in zip(*(table.column(name).to_pylist() for name in
                                                       ("bucket", "doc_id", "sentences", "tokens"))):
            by_bucket.setdefault(bucket, []).append(doc_id)
            entry = sources.setdefault(source_of(doc_id), {"documents": 0, "sentences": 0, "tokens": 0})
            entry["documents"] += 1
            entry["sentences"] += sentences
            entry["tokens"] += tokens
    for bucket, ids in by_bucket.items():
        storage.write_json(_bucket_uri(work, bucket), {"ids": sorted(ids)})
    summary = {"documents": sum(e["documents"] for e in sources.values()),
               "sentences": sum(e["sentences"] for e in sources.values()),
               "tokens": sum(e["tokens"] for e in sources.values()),
               "buckets": sorted(by_bucket), "sources": dict(sorted(sources.items()))}
    storage.write_json(storage.join(work, DEDUP_DIR, SUMMARY_NAME), summary)
    return summary


def read_summary(work: str) -> dict | None:
    """The merge's summary, or None where the run removes no duplicates."""
    uri = storage.join(work, DEDUP_DIR, SUMMARY_NAME)
    return storage.read_json(uri) if storage.exists(uri) else None


def without(sources: dict[str, dict], summary: dict | None) -> dict[str, dict]:
    """Per-source document counts (``docstore``'s) less the exact duplicates the summary names (none: as they are)."""
    if not summary:
        return sources
    out = {}
    for name, entry in sources.items():
        removed = summary["sources"].get(name, {})
        out[name] = {**entry, **{key: entry[key] - removed.get(key, 0) for key in ("documents", "sentences", "tokens")
                                 if key in entry}}
    return out


def dropped(work: str, bucket: int) -> frozenset[str]:
    """The ids of bucket ``bucket`` that repeat an earlier document's text (none before the merge, or without it)."""
    uri = _bucket_uri(work, bucket)
    return frozenset(storage.read_json(uri)["ids"]) if storage.exists(uri) else frozenset()


__all__ = ["DEDUP_DIR", "ROWS_PER_PARTITION", "dropped", "find_duplicates", "merge", "partition_bits",
           "read_summary", "without", "write_keys"]
