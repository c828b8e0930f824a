"""The instances stage, after the index: units of the document store -> finished rows written as pieces by key range,
for the shards stage to assemble. What the two kinds of rows share is here: the base of their DoFns
(``BuildsInstances``), of their transforms (``CreatesInstances``) and the piece writer; pairs are built in
``preprocess.stages.pairs``, packed rows in ``preprocess.stages.packed``.

Run-wide facts (bucket offsets, group layout) are read from the corpus index the index stage wrote
(``layout.INDEX_NAME``), not from side inputs.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from common import storage
from common.masking import MaskingVocab
from common.preprocess_config import InstanceConfig
from preprocess import dedup, handoff, languages, layout, mixture, readers, shards
from preprocess.batch import InstanceKeys
from preprocess.layout import INDEX_NAME, transport_bits
from preprocess.stages.worker_tokenizer import UsesTokenizer

CHUNK_ROWS = 8192  # instances finalised at once (bounds the masking matrices)
# Finished instances a DoFn of the instance stage holds before it sends them on as one record batch per transport
# group. Sent per bucket instead, the number of batches grew with the square of the input (buckets x groups), a few
# rows each, and their per-object overhead outgrew the rows (comparisons.units_of_buckets_32x in bench/results).
FLUSH_ROWS = 32768


class BuildsInstances(UsesTokenizer):
    """The base of the instance stage's DoFns (pairs in ``pairs``, packed rows in ``packed``): reads the corpus
    index (written by the index stage) on first use, when it is sure to exist, and emits finished rows by group.

    With ``provenance`` the instances carry the ids of their source documents (doc_a, doc_b); without it no
    document id is copied, sent or written: the output would drop them. With a ``lot`` the batches and requests
    cross the GroupByKeys as ``preprocess.handoff`` references parked there (one-process runners only).
    """

    def __init__(self, tokenizer_uri: str, work: str, cfg: InstanceConfig, seed: int, provenance: bool = True,
                 lot: handoff.Lot | None = None):
        super().__init__(tokenizer_uri)
        self._work, self._cfg, self._seed, self._provenance = work, cfg, seed, provenance
        self._lot = lot
        self._index = None
        self._most_transport_bits = layout.TRANSPORT_GROUP_BITS  # as WritePieceGroup is told (it cuts what is sent)
        self._instances = Metrics.counter("preprocess", "instances")

    def setup(self):
        super().setup()
        self.vocab = MaskingVocab.from_tokenizer(self.tokenizer)

    def _load_index(self):
        if self._index is None:
            self._index = storage.read_json(storage.join(self._work, INDEX_NAME))
            self._offsets_array = np.asarray(self._index["bucket_offsets"])
            self._dedup_buckets = frozenset(self._index.get("dedup_buckets", ()))
            self._duplicates: dict[int, frozenset[str]] = {}

    def _copies(self, doc_ids: list[str]) -> np.ndarray:
        """How many times each document is used: ``dupe_factor`` each, or the mix's number (``preprocess.mixture``)
        where the index has one: a multilingual run's smoothed mix of languages, or the config's mix of sources."""
        self._load_index()
        if "languages" in self._index:
            return languages.document_copies(self._seed, doc_ids, self._index["language_groups"],
                                             self._index["languages"], self._cfg.dupe_factor)
        if "mixture" in self._index:
            rates = {source: entry["rate"] for source, entry in self._index["mixture"].items()}
            return mixture.document_copies(self._seed, doc_ids, readers.source_of, rates, self._cfg.dupe_factor)
        return np.full(len(doc_ids), self._cfg.dupe_factor, np.int64)

    def _by_origin(self, doc_ids: list[str], docs: np.ndarray, tokens: np.ndarray | None = None) -> dict:
        """{"sources": {source: {"rows": n[, "tokens": n]}}[, "languages": {...}]} of rows whose first document is
        ``doc_ids[docs[i]]`` (and whose ``tokens[i]`` tokens are that document's), for the manifest; languages in
        a multilingual run only."""
        self._load_index()
        out = {"sources": mixture.group_rows(doc_ids, docs, readers.source_of, tokens)}
        if "languages" in self._index:
            groups = self._index["language_groups"]
            out["languages"] = mixture.group_rows(doc_ids, docs, lambda d: groups[languages.document_group(d)],
                                                  tokens)
        return out

    def _drop(self, bucket: int) -> frozenset[str]:
        """The ids a load of ``bucket`` leaves out: those of a held-out split's text (``preprocess.heldout``) and
        exact duplicates of an earlier document's text (``preprocess.dedup``)."""
        self._load_index()
        drop = frozenset(self._index.get("heldout_dropped", {}).get(str(bucket), ()))
        if bucket in self._dedup_buckets:
            if bucket not in self._duplicates:
                self._duplicates[bucket] = dedup.dropped(self._work, bucket)
            drop |= self._duplicates[bucket]
        return drop

    def _offsets(self) -> list[int]:
        """Global index of each bucket's first document, plus the corpus size."""
        self._load_index()
        return self._index["bucket_offsets"]

    def _group_bits(self) -> int:
        self._load_index()
        return self._index["group_bits"]

    def _by_group(self, keys: InstanceKeys) -> np.ndarray:
        """The order that makes each key-range group contiguous, so a batch splits into groups by slicing.
        (Every instance's content depends on its key alone, so the order of a batch changes nothing else.)"""
        return np.argsort(shards.group_of_keys(keys.order, self._group_bits()), kind="stable")

    def _locate(self, global_index):
        self._load_index()
        bucket = np.searchsorted(self._offsets_array, global_index, side="right") - 1
        return bucket, global_index - self._offsets_array[bucket]

    def _collect(self, pending: list, finalized, keys, next_label, doc_a, doc_b) -> None:
        """Adds a finished batch, its rows ordered by key-range group (``_by_group``), to ``pending`` (record batches
        not yet sent; ``_drain`` sends them)."""
        batch = shards.instance_batch(finalized, keys, next_label, doc_a, doc_b, self.tokenizer.vocab_size)
        self._instances.inc(batch.num_rows)
        pending.append(batch)

    @staticmethod
    def _due(pending: list) -> bool:
        """Whether ``pending`` holds ``FLUSH_ROWS`` rows or more: time to ``_drain`` it."""
        return sum(batch.num_rows for batch in pending) >= FLUSH_ROWS

    def _drain(self, pending: list):
        """Every batch of ``pending`` sent on as one record batch per transport group (the group's slices of each,
        concatenated; see ``layout.TRANSPORT_GROUP_BITS``); empties ``pending``. A batch's rows are in key-range group
        order (``_by_group``), so each transport group is a contiguous slice of it."""
        by_group: dict[int, list[pa.RecordBatch]] = {}
        bits = transport_bits(self._group_bits(), self._most_transport_bits)
        for batch in pending:
            groups = shards.group_of_keys(batch.column(batch.schema.get_field_index("order_key")).to_numpy(), bits)
            bounds = np.flatnonzero(np.diff(groups)) + 1
            for start, end in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(groups)]])):
                by_group.setdefault(int(groups[start]), []).append(batch.slice(int(start), int(end - start)))
        pending.clear()
        for group in sorted(by_group):
            slices = by_group.pop(group)
            rows = slices[0] if len(slices) == 1 else pa.Table.from_batches(slices).combine_chunks().to_batches()[0]
            yield group, handoff.send(rows if self._lot is not None else shards.to_ipc(rows), self._lot)


class CreatesInstances(beam.PTransform):
    """The base of the instance stage's transforms (``pairs.CreateInstances``, ``packed.CreatePackedInstances``):
    units of this part -> rows written as pieces by key range.

    With ``spread`` (the default) the units are redistributed over the runner's workers first; without it
    they stay where they are, for a caller that hands each pipeline its own units (the local process pool).
    ``provenance``: whether the pieces carry doc_a and doc_b (only a --provenance output needs them).
    ``lot``: for a runner that runs the whole pipeline in this process, the batches and requests cross the
    GroupByKeys by reference, parked in this ``preprocess.handoff`` lot, instead of being encoded and copied.
    """

    def __init__(self, tokenizer_uri, work, cfg: InstanceConfig, seed, part, vocab_size, mask_id,
                 spread: bool = True, provenance: bool = True, lot: handoff.Lot | None = None):
        super().__init__()
        self._args = (tokenizer_uri, work, cfg, seed, provenance, lot)  # what the stage's DoFns are built with
        self._part, self._vocab_size, self._mask_id, self._work = part, vocab_size, mask_id, work
        self._spread = spread

    def _spread_units(self, units):
        """``units`` redistributed over the workers, or as they are without ``spread``."""
        return units | "Spread" >> beam.Reshuffle() if self._spread else units

    def _write_pieces(self, rows):
        """(transport group, batch) rows -> this part's pieces, one per transport group."""
        return (rows | "ByGroup" >> beam.GroupByKey()
                | "WritePieces" >> beam.ParDo(WritePieceGroup(self._work, self._part, self._vocab_size,
                                                              self._mask_id, layout.TRANSPORT_GROUP_BITS)))


class WritePieceGroup(beam.DoFn):
    """(transport group, [record batches]) -> pieces/tNNNNNN/pPPPP.arrow + .json: this part's rows of the transport
    group, group after group (``shards.write_piece``; the json says where each key-range group's rows are, and has
    the piece's statistics). Within a group, rows stay in arrival order: the shard sorts the group by key (with the
    other parts' pieces), whatever the order here.

    Args:
        most_transport_bits: ``preprocess.layout.TRANSPORT_GROUP_BITS``, as the batches were keyed by it.
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
