"""Duplicates removed across and within sources (``dedup.exact``, and near copies with ``dedup.near_threshold``),
in the index stage, before any document is counted, held out or built into rows.

A document's text is compared as the documents stage stored it: cleaned (whitespace normalised, control characters
dropped), split into sentences and tokenized (with an uncased vocabulary, case-folded too), as a 63-bit BLAKE2b of
its tokens (``docstore.text_hash``). Of the documents of one text, the first in the store's global order (its id's
``document_hash``, then its id: a stable key of source and id) is kept and the others are dropped, whatever the
workers, parts or runner. The documents are bucketed by id, so copies of one text sit in different buckets; the
work goes in three steps that each hold a bounded share of the corpus:

1. ``write_keys``: each bucket's (text hash, id, sentences, tokens), sorted by text hash, and for near copies each
   document's MinHash signature and LSH band hashes (``preprocess.neardup``) -> ``dedup/keys``;
2. ``find_duplicates``: each of ``2**bits`` ranges of text hashes (``partition_bits``: at most about
   ``ROWS_PER_PARTITION`` documents each) read from every bucket's keys; its drops -> ``dedup/drops``; and
   ``find_near``, per band and range of its hashes: documents whose band agrees with the first of that band (by
   stable key) and whose signatures agree on ``near_threshold`` of their values, as pairs -> ``dedup/near``;
3. ``merge``: the near pairs joined into groups (each keeps its first document by stable key), and every drop by
   bucket (``dedup/bNNNNNN.json``, which every later load of the bucket leaves out:
   ``dropped``) and their counts per source (``dedup/summary.json``).
"""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from common import storage
from common.hashing import document_hash
from common.preprocess_config import DedupConfig
from preprocess import docstore, neardup
from preprocess.docstore import text_hash
from preprocess.layout import bits_for
from preprocess.readers import source_of

DEDUP_DIR = "dedup"
SUMMARY_NAME = "summary.json"
ROWS_PER_PARTITION = 1 << 22  # ~4M documents' keys held at once, at most (an estimate: ~64 bytes each with an id)
_HASH_BITS = 63
_PAIR_FIELDS = ("doc_id", "bucket", "sentences", "tokens")  # of each side of a near pair ("keep_" the first's)


def _keys_uri(work: str, bucket: int) -> str:
    return storage.join(work, DEDUP_DIR, "keys", f"b{bucket:06d}.arrow")


def _drops_uri(work: str, partition: int) -> str:
    return storage.join(work, DEDUP_DIR, "drops", f"t{partition:06d}.arrow")


def _near_uri(work: str, band: int, partition: int) -> str:
    return storage.join(work, DEDUP_DIR, "near", f"b{band:03d}-t{partition:06d}.arrow")


def _bucket_uri(work: str, bucket: int) -> str:
    return storage.join(work, DEDUP_DIR, f"b{bucket:06d}.json")


def write_keys(work: str, bucket: int, cfg: DedupConfig, seed: int, tokenizer_uri: str) -> int:
    """Step 1: bucket ``bucket``'s text keys, sorted by text hash (with ``cfg.near_threshold``, also each document's
    MinHash signature and LSH band hashes: ``preprocess.neardup``); returns its number of documents."""
    loaded = docstore.load_bucket(work, bucket)
    if not len(loaded):
        return 0
    hashes = np.fromiter((text_hash(loaded.document(rank)[0]) for rank in range(len(loaded))), np.uint64,
                         len(loaded))
    order = np.argsort(hashes, kind="stable")
    sentences = loaded.sentence_ends - loaded.sentence_starts
    columns = {"text_hash": hashes[order], "doc_id": pa.array([loaded.doc_ids[i] for i in order.tolist()]),
               "sentences": sentences[order].astype(np.int64), "tokens": loaded.token_lengths[order].astype(np.int64)}
    if cfg.near_threshold is not None:
        continuation = _continuation(tokenizer_uri)
        signatures = np.stack([neardup.signature(neardup.shingles(loaded.document(rank)[0], continuation,
                                                                  cfg.shingle_words), cfg.num_perm, seed)
                               for rank in order.tolist()])
        bands = neardup.band_hashes(signatures, *neardup.lsh_shape(cfg.near_threshold, cfg.num_perm))
        columns["signature"] = pa.FixedSizeListArray.from_arrays(pa.array(signatures.ravel()), cfg.num_perm)
        columns["bands"] = pa.FixedSizeListArray.from_arrays(pa.array(bands.ravel()), bands.shape[1])
    docstore.write_table(_keys_uri(work, bucket), pa.table(columns))
    return len(loaded)


@functools.lru_cache(maxsize=4)
def _continuation(tokenizer_uri: str) -> np.ndarray:
    from common.tokenizer import load_tokenizer

    return np.asarray(load_tokenizer(tokenizer_uri).is_continuation, bool)


def tasks(documents: int, cfg: DedupConfig) -> list[tuple]:
    """Step 2's tasks for a store of ``documents`` documents: ("exact", range, bits) for each range of text hashes,
    and with near duplicates ("near", band, range, bits) for each band and range of its hashes."""
    bits = partition_bits(documents)
    out = [("exact", partition, bits) for partition in range(1 << bits)] if cfg.exact else []
    if cfg.near_threshold is not None:
        bands, _ = neardup.lsh_shape(cfg.near_threshold, cfg.num_perm)
        out += [("near", band, partition, bits) for band in range(bands) for partition in range(1 << bits)]
    return out


def run_task(work: str, task: tuple, num_buckets: int, cfg: DedupConfig) -> tuple[int, int]:
    """One of ``tasks``' tasks; returns (its bits, what it found)."""
    if task[0] == "exact":
        return task[2], find_duplicates(work, task[1], task[2], num_buckets)
    return task[3], find_near(work, task[1], task[2], task[3], num_buckets, cfg.near_threshold)


def partition_bits(documents: int) -> int:
    """Ranges of text hashes for ``documents`` documents: a power of two, each about ``ROWS_PER_PARTITION``."""
    return bits_for(documents / ROWS_PER_PARTITION)


def _repeated_in_range(work: str, num_buckets: int, partition: int, bits: int, hashes_of, columns: list[str]):
    """Every bucket's keys whose hash (``hashes_of(table)``) falls in range ``partition`` of ``2**bits`` and is
    another's too, as (a table of ``columns`` with their ``bucket``, the hashes, the rows' order by (hash, stable
    key)); None where no hash repeats. Rows of hashes held once are never sorted."""
    lo, hi = partition << (_HASH_BITS - bits), (partition + 1) << (_HASH_BITS - bits)
    pieces, found = [], []
    for bucket in range(num_buckets):
        uri = _keys_uri(work, bucket)
        if not storage.exists(uri):
            continue
        table = docstore.read_table(uri)
        hashes = hashes_of(table)
        chosen = np.flatnonzero((hashes >= lo) & (hashes < hi))
        if len(chosen):
            pieces.append(table.select(columns).take(pa.array(chosen)).append_column(
                "bucket", pa.array(np.full(len(chosen), bucket, np.int64))))
            found.append(hashes[chosen])
    if not pieces:
        return None
    hashes = np.concatenate(found)
    _, inverse, counts = np.unique(hashes, return_inverse=True, return_counts=True)
    repeated = np.flatnonzero(counts[inverse] > 1)
    if not len(repeated):
        return None
    table, hashes = pa.concat_tables(pieces).take(pa.array(repeated)), hashes[repeated].tolist()
    doc_ids = table.column("doc_id").to_pylist()
    # The store's global order within one hash: the id's hash, then the id (ids are unique, so no tie is left).
    order = sorted(range(len(doc_ids)), key=lambda i: (hashes[i], document_hash(doc_ids[i]), doc_ids[i]))
    return table, hashes, order


def find_duplicates(work: str, partition: int, bits: int, num_buckets: int) -> int:
    """Step 2: the documents of text-hash range ``partition`` (of ``2**bits``) that repeat an earlier one's text;
    returns how many."""
    found = _repeated_in_range(work, num_buckets, partition, bits, lambda t: t.column("text_hash").to_numpy(),
                               ["doc_id", "sentences", "tokens"])
    if found is None:
        return 0
    table, hashes, order = found
    later = [order[k] for k in range(1, len(order)) if hashes[order[k]] == hashes[order[k - 1]]]
    docstore.write_table(_drops_uri(work, partition), table.take(pa.array(later, pa.int64())))
    return len(later)


def _band(band: int):
    def hashes_of(table: pa.Table) -> np.ndarray:
        width = table.schema.field("bands").type.list_size
        return table.column("bands").combine_chunks().flatten().to_numpy().reshape(-1, width)[:, band]
    return hashes_of


def find_near(work: str, band: int, partition: int, bits: int, num_buckets: int, threshold: float) -> int:
    """Step 2, near copies: the documents whose band ``band`` hash falls in range ``partition`` and equals another's;
    each is paired with the first of its band (by stable key) where their signatures agree on ``threshold`` of their
    values -> ``dedup/near``; returns the pairs."""
    found = _repeated_in_range(work, num_buckets, partition, bits, _band(band),
                               ["doc_id", "signature", "sentences", "tokens"])
    if found is None:
        return 0
    table, hashes, order = found
    num_perm = table.schema.field("signature").type.list_size
    signatures = table.column("signature").combine_chunks().flatten().to_numpy().reshape(-1, num_perm)
    values = {name: table.column(name).to_pylist() for name in _PAIR_FIELDS}
    pairs: dict[str, list] = {prefix + name: [] for prefix in ("keep_", "") for name in _PAIR_FIELDS}
    first = order[0]
    for k, i in enumerate(order[1:], 1):
        if hashes[i] != hashes[order[k - 1]]:
            first = i
        elif neardup.similar(signatures[first], signatures[i]) >= threshold:
            for prefix, row in (("keep_", first), ("", i)):
                for name in _PAIR_FIELDS:
                    pairs[prefix + name].append(values[name][row])
    if pairs["doc_id"]:
        docstore.write_table(_near_uri(work, band, partition), pa.table(pairs))
    return len(pairs["doc_id"])


def merge(work: str, bits: int, cfg: DedupConfig) -> dict:
    """Step 3: every range's drops -> each bucket's dropped ids, and their counts per source (the summary)."""
    by_bucket: dict[int, list[str]] = {}
    sources: dict[str, dict] = {}

    def drop(kind: str, doc_id: str, bucket: int, sentences: int, tokens: int) -> None:
        by_bucket.setdefault(bucket, []).append(doc_id)
        entry = sources.setdefault(source_of(doc_id), {"documents": 0, "sentences": 0, "tokens": 0, "exact": 0,
                                                       "near": 0})
        entry["documents"] += 1
        entry[kind] += 1
        entry["sentences"] += sentences
        entry["tokens"] += tokens

    exact: set[str] = set()
    for partition in range(1 << bits):
        uri = _drops_uri(work, partition)
        if not storage.exists(uri):
            continue
        table = docstore.read_table(uri)
        for bucket, doc_id, sentences, tokens in zip(*(table.column(name).to_pylist() for name in
                                                       ("bucket", "doc_id", "sentences", "tokens"))):
            exact.add(doc_id)
            drop("exact", doc_id, bucket, sentences, tokens)
    if cfg.near_threshold is not None:
        for doc_id, row in _near_drops(work, bits, cfg, exact):
            drop("near", doc_id, *row)
    for bucket, ids in by_bucket.items():
        storage.write_json(_bucket_uri(work, bucket), {"ids": sorted(ids)})
    summary = {"documents": sum(e["documents"] for e in sources.values()),
               "sentences": sum(e["sentences"] for e in sources.values()),
               "tokens": sum(e["tokens"] for e in sources.values()),
               "buckets": sorted(by_bucket), "sources": dict(sorted(sources.items()))}
    storage.write_json(storage.join(work, DEDUP_DIR, SUMMARY_NAME), summary)
    return summary


def _near_drops(work: str, bits: int, cfg: DedupConfig, exact: set[str]):
    """(id, (bucket, sentences, tokens)) of every near copy: the near pairs of every band and range joined into
    groups (union-find), each group keeping its first document by stable key that exact duplicates left."""
    parent: dict[str, str] = {}
    rows: dict[str, tuple] = {}

    def root(doc_id: str) -> str:
        while parent.setdefault(doc_id, doc_id) != doc_id:
            parent[doc_id] = parent[parent[doc_id]]
            doc_id = parent[doc_id]
        return doc_id

    bands, _ = neardup.lsh_shape(cfg.near_threshold, cfg.num_perm)
    for band in range(bands):
        for partition in range(1 << bits):
            uri = _near_uri(work, band, partition)
            if not storage.exists(uri):
                continue
            table = docstore.read_table(uri).to_pydict()
            for k in range(len(table["doc_id"])):
                keep, other = table["keep_doc_id"][k], table["doc_id"][k]
                for prefix, doc_id in (("keep_", keep), ("", other)):
                    rows[doc_id] = tuple(table[prefix + name][k] for name in _PAIR_FIELDS[1:])
                a, b = root(keep), root(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[str, list[str]] = {}
    for doc_id in rows:
        groups.setdefault(root(doc_id), []).append(doc_id)
    for members in groups.values():
        left = sorted((d for d in members if d not in exact), key=lambda d: (document_hash(d), d))
        for doc_id in left[1:]:
            yield doc_id, rows[doc_id]


def read_summary(work: str) -> dict | None:
    """The merge's summary, or None where the run removes no duplicates."""
    uri = storage.join(work, DEDUP_DIR, SUMMARY_NAME)
    return storage.read_json(uri) if storage.exists(uri) else None


def without(sources: dict[str, dict], summary: dict | None) -> dict[str, dict]:
    """Per-source document counts (``docstore``'s) less the duplicates the summary names (none: as they are)."""
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


__all__ = ["DEDUP_DIR", "ROWS_PER_PARTITION", "dropped", "find_duplicates", "find_near", "merge",
           "partition_bits", "read_summary", "run_task", "tasks", "without", "write_keys"]
