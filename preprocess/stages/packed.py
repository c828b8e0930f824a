"""The instance stage for packed rows (``kind: full_sentences`` or ``doc_sentences``): units of the document store ->
pieces of finished rows by key range. Rows are built by ``preprocess.sentence_rows``; there is no join (no random next).

A unit is a run of document-store buckets for ``doc_sentences`` (each document is packed alone; as for pairs,
``layout.unit_buckets``) and a packing stream for ``full_sentences`` (its documents may sit in several buckets,
or share one with other streams). Each row's randomness (static masks, its place in the shuffle) comes from its
key: (seed, document or stream, duplicate, row).
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from common import storage
from common.hashing import document_hash
from preprocess import docstore
from preprocess.batch import InstanceKeys, key_bases, keys_from_bases, ragged_arange
from preprocess.layout import unit_buckets
from preprocess.sentence_rows import (
    Pieces,
    document_pieces,
    finalize_packed,
    row_bounds,
    stream_buckets,
    stream_of,
    stream_order,
    stream_pieces,
)
from preprocess.stages.instances import CHUNK_ROWS, BuildsInstances, CreatesInstances


class CreatePackedInstances(CreatesInstances):
    """Units of this part -> packed rows written as pieces by key range (``CreatesInstances``' arguments; the units
    are those of ``preprocess.executors.plan.Plan.instance_units``)."""

    def expand(self, units):
        return self._write_pieces(self._spread_units(units) | "Pack" >> beam.ParDo(BuildPackedInstances(*self._args)))


class BuildPackedInstances(BuildsInstances):
    """unit -> (transport group, batch) for every transport group (``layout.TRANSPORT_GROUP_BITS``) of its rows,
    a batch per group every ``FLUSH_ROWS`` rows; records each bucket's (``doc_sentences``: a unit is a run of buckets,
    ``layout.unit_buckets``) or stream's (``full_sentences``) row count under planned/."""

    def process(self, unit):
        pending = []
        if self._cfg.kind == "doc_sentences":
            self._load_index()
            for bucket in unit_buckets(self._index, unit):
                built = self._documents(bucket)
                self._planned(f"b{bucket:06d}", self._finish(*built, pending), built)
                if self._due(pending):
                    yield from self._drain(pending)
        else:
            built = self._stream(unit)
            self._planned(f"s{unit:06d}", self._finish(*built, pending), built)
        yield from self._drain(pending)

    def _planned(self, name: str, rows: int, built: tuple) -> None:
        """The driver checks that every planned row reached a piece before it publishes anything. Also the rows and
        tokens by source (and language, in a multilingual run): a row counts for its first document's, a token for
        its own document's."""
        planned = {"instances": rows}
        pieces, doc_ids = built[1], built[4]
        by_tokens = self._by_origin(doc_ids, pieces.doc, pieces.length)
        first_docs = pieces.doc[row_bounds(pieces.row, rows)[0]] if rows else pieces.doc[:0]
        by_rows = self._by_origin(doc_ids, first_docs)
        for kind, groups in by_tokens.items():
            planned[kind] = {group: {"rows": by_rows[kind].get(group, {"rows": 0})["rows"], "tokens": entry["tokens"]}
                             for group, entry in groups.items()}
        storage.write_json(storage.join(self._work, "planned", f"{name}.json"), planned)

    def _documents(self, bucket: int):
        """Every duplicate of every document of ``bucket``, each document in rows of its own."""
        loaded = docstore.load_bucket(self._work, bucket, self._drop(bucket))
        lengths = loaded.token_lengths
        copies = self._copies(loaded.doc_ids)  # dupe_factor each, or the mix's (of languages or sources)
        parts = []
        for dupe in range(max(1, int(copies.max(initial=0)))):
            used = np.flatnonzero(copies > dupe)  # every document, unless a mix thins it
            pieces = document_pieces(lengths[used], self._cfg.max_seq_length, dupe)
            pieces = pieces._replace(doc=used[pieces.doc])
            # A row's key: (document, duplicate, its row within the document).
            first_row = np.searchsorted(pieces.doc, np.arange(len(lengths)))
            bases = np.asarray([key_bases(self._seed, doc_id, dupe) for doc_id in loaded.doc_ids],
                               np.uint64).reshape(-1, 2)
            keys = keys_from_bases(bases[pieces.doc, 0], bases[pieces.doc, 1], pieces.row - first_row[pieces.doc])
            parts.append((pieces, keys))
        pieces, keys = _concat(parts)
        return loaded.tokens, pieces, loaded.token_starts[pieces.doc] + pieces.start, keys, loaded.doc_ids

    def _stream(self, stream: int):
        """Every duplicate of packing stream ``stream``: its documents (in global order, from the buckets that hold
        them) packed one after the other, in each duplicate's own order."""
        self._load_index()
        stream_bits, offsets = self._index["stream_bits"], self._offsets()
        bucket_bits = (len(offsets) - 1).bit_length() - 1
        doc_ids, tokens, lengths = [], [], []
        for bucket in stream_buckets(stream, stream_bits, bucket_bits):
            if offsets[bucket + 1] == offsets[bucket]:
                continue
            loaded = docstore.load_bucket(self._work, bucket, self._drop(bucket))
            ranks = np.arange(len(loaded))
            if stream_bits > bucket_bits:  # the bucket holds other streams' documents too
                ranks = np.asarray([rank for rank, doc_id in enumerate(loaded.doc_ids)
                                    if stream_of(document_hash(doc_id), stream_bits) == stream], np.int64)
            doc_lengths = loaded.token_lengths[ranks]
            tokens.append(loaded.tokens[ragged_arange(loaded.token_starts[ranks], doc_lengths)])
            lengths.append(doc_lengths)
            doc_ids.extend(loaded.doc_ids[rank] for rank in ranks.tolist())
        lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        pool = np.concatenate(tokens) if tokens else np.zeros(0, np.uint16)
        doc_starts = np.cumsum(lengths) - lengths
        copies = self._copies(doc_ids)  # dupe_factor each, or the mix's (of languages or sources)
        parts = []
        for dupe in range(max(1, int(copies.max(initial=0)))):
            order = stream_order(self._seed, doc_ids, dupe)
            order = order[copies[order] > dupe]  # every document, unless a mix thins it
            pieces = stream_pieces(lengths[order], self._cfg.max_seq_length)
            pieces = pieces._replace(doc=order[pieces.doc])
            rows = int(pieces.row[-1]) + 1 if len(pieces.row) else 0
            # A row's key: (stream, duplicate, its row within the stream).
            first, second = key_bases(self._seed, f"stream:{stream_bits}:{stream}", dupe)
            parts.append((pieces, keys_from_bases(np.full(rows, first, np.uint64), np.full(rows, second, np.uint64),
                                                  np.arange(rows))))
        pieces, keys = _concat(parts)
        return pool, pieces, doc_starts[pieces.doc] + pieces.start, keys, doc_ids

    def _finish(self, pool: np.ndarray, pieces: Pieces, starts: np.ndarray, keys: InstanceKeys, doc_ids: list[str],
                pending: list) -> int:
        """Finalise the rows in key-range group order, CHUNK_ROWS at a time, into ``pending``; returns their number.
        Provenance: doc_a names the row's first document, doc_b its last."""
        rows = len(keys.order)
        first, count = row_bounds(pieces.row, rows)
        order = self._by_group(keys)
        keys = keys.take(order)
        for start in range(0, rows, CHUNK_ROWS):
            chunk = order[start:start + CHUNK_ROWS]
            selected = ragged_arange(first[chunk], count[chunk])
            finalized = finalize_packed(pool, starts[selected], pieces.length[selected],
                                        np.repeat(np.arange(len(chunk)), count[chunk]),
                                        keys.random[start:start + CHUNK_ROWS], self._cfg, self.vocab)
            doc_a = doc_b = None
            if self._provenance:
                doc_a = [doc_ids[d] for d in pieces.doc[first[chunk]].tolist()]
                doc_b = [doc_ids[d] for d in pieces.doc[first[chunk] + count[chunk] - 1].tolist()]
            self._collect(pending, finalized, keys.take(np.arange(start, start + len(chunk))),
                          np.zeros(len(chunk), np.int8), doc_a, doc_b)
        return rows


def _concat(parts: list[tuple[Pieces, InstanceKeys]]) -> tuple[Pieces, InstanceKeys]:
    """The pieces and keys of several duplicates as one batch of rows (row numbers made consecutive)."""
    offset, pieces = 0, []
    for part, keys in parts:
        pieces.append(part._replace(row=part.row + offset))
        offset += len(keys.order)
    return (Pieces(*(np.concatenate([getattr(p, f) for p in pieces]) for f in Pieces._fields)),
            InstanceKeys.concat([keys for _, keys in parts]))


__all__ = ["BuildPackedInstances", "CreatePackedInstances"]
