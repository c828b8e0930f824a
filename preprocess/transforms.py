"""Beam PTransforms of the preprocessing stage, and its DoFns that tokenize and build instances (those that only read
and write files are in ``preprocess.file_dofns``). Each DoFn is thin and delegates to pure modules.

Only portable primitives are used (Create, ParDo, GroupByKey, Reshuffle), so the same pipeline runs
on the DirectRunner, Dask, Flink, Spark and Dataflow. Run-wide facts (bucket offsets, corpus size,
group layout) are read from small files that the barrier stages in ``preprocess.barriers`` write, not
from side inputs.
"""
from __future__ import annotations

import itertools

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.utils import shared

from common import schema, storage
from common.hashing import document_hash, rng_for
from common.masking import MaskingVocab
from common.preprocess_config import InstanceConfig, SourceConfig
from preprocess import docstore, handoff, shards, text
from preprocess.batch import InstanceKeys, finalize_batch, instance_keys, ragged_arange, random_segments
from preprocess.file_dofns import (
    INDEX_NAME,
    ReadSourceFile,
    SplitLargeDumps,
    WriteDocumentBucket,
    WritePartCounts,
    WritePieceGroup,
    transport_bits,
)
from preprocess.instances import InstancePlan, plan_instances, plan_sop_instances
from preprocess.records import RawDocument, Rejected
from preprocess.requests import merge_requests, split_by, take_requests

CHUNK_ROWS = 8192  # instances finalised at once (bounds the masking matrices)
# Finished instances a DoFn of the instance stage holds before it sends them on as one record batch per transport
# group. Sent per bucket instead, the number of batches grew with the square of the input (buckets x groups), a few
# rows each, and their per-object overhead outgrew the rows (comparisons.units_of_buckets_32x in bench/results).
FLUSH_ROWS = 32768
# Finished rows cross the ByGroup GroupByKey keyed by a transport group: a run of adjacent key-range groups, at most
# 2**TRANSPORT_GROUP_BITS of them, so a flush is cut into batches of FLUSH_ROWS >> TRANSPORT_GROUP_BITS rows on
# average, or more. Key-range groups are sized for the shard writers, so their number grows with the corpus; cut by
# them, a flush came as a row or two per batch at full scale (comparisons.full_scale_layout in bench/results).
# WritePieceGroup writes a transport group as one piece, its key-range groups one after the other.
TRANSPORT_GROUP_BITS = 9
# The random-next join is keyed by a range of target units, at most 2**JOIN_RANGE_BITS of them, for the same reason:
# a unit's requests cut by every target unit came a few rows each once units numbered in the thousands.
JOIN_RANGE_BITS = 7
DUMP_RANGE_BYTES = 64 << 20  # a larger .bz2 dump is read as byte ranges of this size, spread over the workers


def unit_shift(index: dict) -> int:
    """Bits of a document bucket below its instance-stage unit (``unit_bits`` of the index, written by the index
    stage; an index without it makes every bucket a unit of its own)."""
    bucket_bits = (len(index["bucket_offsets"]) - 1).bit_length() - 1
    return bucket_bits - index.get("unit_bits", bucket_bits)


def join_range_shift(index: dict) -> int:
    """Bits of a unit's index below its range of the random-next join (at most ``2**JOIN_RANGE_BITS`` ranges)."""
    bucket_bits = (len(index["bucket_offsets"]) - 1).bit_length() - 1
    return max(0, bucket_bits - unit_shift(index) - JOIN_RANGE_BITS)


def unit_buckets(index: dict, unit: int) -> list[int]:
    """The non-empty document buckets of instance-stage unit ``unit`` (a contiguous run of buckets)."""
    offsets, shift = index["bucket_offsets"], unit_shift(index)
    return [b for b in range(unit << shift, (unit + 1) << shift) if offsets[b + 1] > offsets[b]]


def _rejected_tuple(rejected: Rejected) -> tuple:
    return (rejected.source, rejected.doc_id, rejected.outcome, rejected.reason, rejected.detail)


_TOKENIZERS = shared.Shared()  # one loaded tokenizer per process, whatever the number of DoFns and pipelines


def share_tokenizer(tokenizer_uri: str, tokenizer) -> None:
    """Offers an already loaded ``tokenizer`` to the DoFns of this process (and of processes forked from it) that
    would load ``tokenizer_uri``. The caller keeps it alive (the process-wide cache holds a weak reference)."""
    _TOKENIZERS.acquire(lambda: tokenizer, tag=tokenizer_uri)


class _UsesTokenizer(beam.DoFn):
    """Gets the run's tokenizer once per worker process (DoFn.setup), not once per element or per DoFn."""

    def __init__(self, tokenizer_uri: str):
        self._tokenizer_uri = tokenizer_uri
        self.tokenizer = None

    def setup(self):
        from common.tokenizer import load_tokenizer

        self.tokenizer = _TOKENIZERS.acquire(lambda: load_tokenizer(self._tokenizer_uri), tag=self._tokenizer_uri)


class CleanAndTokenize(_UsesTokenizer):
    """RawDocument -> (bucket, ("doc", row)) ; Rejected -> (bucket, ("rejected", tuple))."""

    def __init__(self, cfg: SourceConfig, tokenizer_uri: str, bucket_bits: int):
        super().__init__(tokenizer_uri)
        self._cfg = cfg
        self._bucket_bits = bucket_bits
        self._documents = Metrics.counter("preprocess", "documents")
        self._rejected = Metrics.counter("preprocess", "documents_rejected")

    def process(self, element):
        if isinstance(element, RawDocument):
            element = text.to_document(element, self._cfg)
        if not isinstance(element, Rejected):
            encoded = [ids for ids in self.tokenizer.encode_batch(list(element.sentences)) if ids]
            if len(encoded) < self._cfg.min_document_sentences:
                element = Rejected(element.source, element.doc_id, "skipped", "too_short", "after tokenization")
        bucket = docstore.bucket_of(document_hash(element.doc_id), self._bucket_bits)
        if isinstance(element, Rejected):
            self._rejected.inc()
            yield bucket, ("rejected", _rejected_tuple(element))
            return
        self._documents.inc()
        dtype = schema.token_numpy_dtype(self.tokenizer.vocab_size)
        lengths = np.fromiter(map(len, encoded), np.uint32, len(encoded))
        tokens = np.fromiter(itertools.chain.from_iterable(encoded), dtype, int(lengths.sum()))
        yield bucket, ("doc", (document_hash(element.doc_id), element.doc_id, element.source,
                               tokens.tobytes(), lengths.tobytes()))


class BuildsInstances(_UsesTokenizer):
    """The base of the instance stage's DoFns (pairs here, packed rows in ``preprocess.packed``): reads the corpus
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
        self._most_transport_bits = TRANSPORT_GROUP_BITS  # as WritePieceGroup is told (it cuts what is sent)
        self._instances = Metrics.counter("preprocess", "instances")

    def setup(self):
        super().setup()
        self.vocab = MaskingVocab.from_tokenizer(self.tokenizer)

    def _load_index(self):
        if self._index is None:
            self._index = storage.read_json(storage.join(self._work, INDEX_NAME))
            self._offsets_array = np.asarray(self._index["bucket_offsets"])

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
        concatenated; see ``TRANSPORT_GROUP_BITS``); empties ``pending``. A batch's rows are in key-range group
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


class PlanAndBuildInstances(BuildsInstances):
    """unit -> ("done", (transport group, batch)) for actual-next pairs, ("request", (range, requests)) for random
    ones, keyed by the range of units (``join_range_shift``) that holds the document B is drawn from. Sentence-order
    pairs (``sentence_objective: sop``) are all "done": both segments come from the document.

    A unit is a contiguous run of document buckets (``unit_buckets``) of about ``barriers.ROWS_PER_UNIT`` instances.
    Work is batched per bucket (one vectorised finalisation for all its actual-next instances) and sent per unit:
    at most one batch per transport group every ``FLUSH_ROWS`` instances, and one request payload per target range,
    which keeps Beam's per-element cost, and the number of elements, from growing faster than the input.
    """

    def setup(self):
        super().setup()
        self._dropped = Metrics.counter("preprocess", "sop_one_token_chunks_dropped")

    def _plan(self, offsets: np.ndarray, doc_index: int, num_docs: int, doc_id: str,
              dupe: int) -> tuple[list[InstancePlan], int]:
        """One (document, duplicate)'s plans from its own RNG (NSP pairs, or sentence-order pairs), and the number
        of one-token chunks sentence-order planning dropped."""
        rng = rng_for(self._seed, "plan", doc_id, dupe)
        if self._cfg.sentence_objective == "sop":
            return plan_sop_instances(offsets, rng, self._cfg)
        return plan_instances(offsets, doc_index, num_docs, rng, self._cfg), 0

    def process(self, unit):
        self._load_index()
        pending, requests = [], []
        for bucket in unit_buckets(self._index, unit):
            requests.extend(self._bucket(bucket, pending))
            if self._due(pending):
                yield from (("done", item) for item in self._drain(pending))
        yield from (("done", item) for item in self._drain(pending))
        if requests:
            merged = merge_requests(requests)
            shift = unit_shift(self._index) + join_range_shift(self._index)
            for target, rows in split_by(self._locate(merged["targets"])[0] >> shift):
                yield "request", (int(target), handoff.send(take_requests(merged, rows), self._lot))

    def _bucket(self, bucket: int, pending: list) -> list[dict]:
        """Plans ``bucket``'s instances, adds its actual-next ones to ``pending`` and returns its random-next
        requests (none or one); records its planned count."""
        loaded = docstore.load_bucket(self._work, bucket)
        num_docs, first_index = self._offsets()[-1], self._offsets()[bucket]
        plans, runs, counts = [], [], []  # runs: (document, duplicate), each with counts[i] plans in a row
        dropped = 0
        requests = []
        for rank, doc_id in enumerate(loaded.doc_ids):
            offsets = loaded.document(rank)[1]
            for dupe in range(self._cfg.dupe_factor):
                planned, dropped_chunks = self._plan(offsets, first_index + rank, num_docs, doc_id, dupe)
                plans.extend(planned)
                runs.append((doc_id, dupe))
                counts.append(len(planned))
                dropped += dropped_chunks
        if plans:
            # One row per instance: InstancePlan's fields as integers, and the document's rank in the bucket.
            table = np.fromiter(itertools.chain.from_iterable(plans), np.int64, len(plans) * len(plans[0]))
            table = table.reshape(len(plans), len(plans[0]))
            ranks = np.repeat(np.arange(len(loaded.doc_ids)).repeat(self._cfg.dupe_factor), counts)
            keys = instance_keys(self._seed, runs, counts, table[:, _INDEX])
            is_random = table[:, _IS_RANDOM].astype(bool)
            actual, random_next = np.flatnonzero(~is_random), np.flatnonzero(is_random)
            if len(actual):
                self._finish_actual(loaded, table[actual], ranks[actual], keys.take(actual), pending)
            if len(random_next):
                requests.append(self._requests(loaded, table[random_next], ranks[random_next], keys.take(random_next)))
        # The driver checks that every planned instance reached a piece before it publishes anything.
        planned = {"instances": len(plans)}
        if self._cfg.sentence_objective == "sop":
            planned["sop_dropped_chunks"] = dropped
            self._dropped.inc(dropped)
        storage.write_json(storage.join(self._work, "planned", f"b{bucket:06d}.json"), planned)
        return requests

    def _finish_actual(self, loaded, plans: np.ndarray, ranks: np.ndarray, keys: InstanceKeys, pending: list):
        order = self._by_group(keys)
        plans, ranks, keys = plans[order], ranks[order], keys.take(order)
        ranges = plans[:, _A_START:_B_END + 1] + loaded.token_starts[ranks][:, None]
        doc_a = [loaded.doc_ids[rank] for rank in ranks.tolist()] if self._provenance else None
        for start in range(0, len(ranges), CHUNK_ROWS):
            rows = slice(start, start + CHUNK_ROWS)
            finalized = finalize_batch(loaded.tokens, ranges[rows, :2], ranges[rows, 2:], keys.random[rows],
                                       self._cfg, self.vocab)
            chunk_docs = doc_a[rows] if doc_a is not None else None
            # Label 0 (B follows A), or 1 where sentence-order prediction swapped them.
            self._collect(pending, finalized, keys.take(np.arange(len(ranges))[rows]),
                          plans[rows, _SWAPPED].astype(np.int8), chunk_docs, chunk_docs)

    def _requests(self, loaded, plans: np.ndarray, ranks: np.ndarray, keys: InstanceKeys) -> dict:
        a_ranges = plans[:, _A_START:_A_END + 1] + loaded.token_starts[ranks][:, None]
        lengths = a_ranges[:, 1] - a_ranges[:, 0]
        return {"doc_a": [loaded.doc_ids[rank] for rank in ranks.tolist()] if self._provenance else None,
                "keys": keys, "targets": plans[:, _RANDOM_DOC], "target_b_length": plans[:, _TARGET_B_LENGTH],
                "a_tokens": loaded.tokens[ragged_arange(a_ranges[:, 0], lengths)], "a_lengths": lengths}


# Columns of a bucket's plan table (one row of InstancePlan fields per instance).
_INDEX, _A_START, _A_END, _B_START, _B_END, _IS_RANDOM, _TARGET_B_LENGTH, _RANDOM_DOC, _SWAPPED = range(9)


class ResolveRandomNext(BuildsInstances):
    """(range of units, [requests]) -> (transport group, batch): B drawn from the requested documents of the range's
    buckets, one bucket loaded at a time."""

    def process(self, element):
        _, refs = element
        requests = merge_requests([handoff.receive(ref) for ref in refs])
        pending = []
        for bucket, rows in split_by(self._locate(requests["targets"])[0]):
            loaded = docstore.load_bucket(self._work, int(bucket))
            rows = rows[self._by_group(requests["keys"].take(rows))]
            for start in range(0, len(rows), CHUNK_ROWS):
                self._resolve(loaded, int(bucket), take_requests(requests, rows[start:start + CHUNK_ROWS]), pending)
            if self._due(pending):
                yield from self._drain(pending)
        yield from self._drain(pending)

    def _resolve(self, loaded, bucket: int, requests: dict, pending: list) -> None:
        keys, a_lengths = requests["keys"], requests["a_lengths"]
        ranks = requests["targets"] - self._offsets()[bucket]
        a_tokens = requests["a_tokens"].astype(loaded.tokens.dtype)
        a_end = np.cumsum(a_lengths)
        a_ranges = np.stack([a_end - a_lengths, a_end], axis=1)
        b_ranges = random_segments(loaded.boundaries, loaded.sentence_starts[ranks], loaded.sentence_ends[ranks],
                                   requests["target_b_length"], keys.random) + len(a_tokens)
        pool = np.concatenate([a_tokens, loaded.tokens])
        finalized = finalize_batch(pool, a_ranges, b_ranges, keys.random, self._cfg, self.vocab)
        doc_b = [loaded.doc_ids[rank] for rank in ranks.tolist()] if self._provenance else None
        self._collect(pending, finalized, keys, np.ones(len(ranks), np.int8), requests["doc_a"], doc_b)


class CreateInstances(beam.PTransform):
    """Units of this part (runs of document buckets) -> instances written as pieces by key range, random next
    resolved by a join keyed by the range of units that holds B's document.

    With ``spread`` (the default) the units are redistributed over the runner's workers first; without it
    they stay where they are, for a caller that hands each pipeline its own units (the local process pool).
    ``provenance``: whether the pieces carry doc_a and doc_b (only a --provenance output needs them).
    ``lot``: for a runner that runs the whole pipeline in this process, the batches and requests cross the
    GroupByKeys by reference, parked in this ``preprocess.handoff`` lot, instead of being encoded and copied.
    """

    def __init__(self, tokenizer_uri, work, cfg: InstanceConfig, seed, part, vocab_size, mask_id,
                 spread: bool = True, provenance: bool = True, lot: handoff.Lot | None = None):
        super().__init__()
        self._args = (tokenizer_uri, work, cfg, seed, provenance, lot)
        self._part, self._vocab_size, self._mask_id, self._work = part, vocab_size, mask_id, work
        self._spread = spread

    def expand(self, units):
        if self._spread:
            units = units | "Spread" >> beam.Reshuffle()
        # Two filters rather than a multi-output ParDo: Beam's DaskRunner does not route tagged outputs.
        planned = units | "Plan" >> beam.ParDo(PlanAndBuildInstances(*self._args))
        done = planned | "Done" >> beam.FlatMap(lambda kv: [kv[1]] if kv[0] == "done" else [])
        resolved = (planned | "Requests" >> beam.FlatMap(lambda kv: [kv[1]] if kv[0] == "request" else [])
                    | "ByTargetUnit" >> beam.GroupByKey()
                    | "Resolve" >> beam.ParDo(ResolveRandomNext(*self._args)))
        return ((done, resolved) | beam.Flatten() | "ByGroup" >> beam.GroupByKey()
                | "WritePieces" >> beam.ParDo(WritePieceGroup(self._work, self._part, self._vocab_size,
                                                              self._mask_id, TRANSPORT_GROUP_BITS)))


class BuildDocumentStore(beam.PTransform):
    """(kind, uri[, split]) files of this part -> tokenized document store buckets and the part's document counts
    (``docstore.counts_uri``); emits the part once they are written (nothing for a part without documents).

    With ``spread`` (the default) large dumps are cut into byte ranges and files and documents are spread over
    the runner's workers. Without it reading and cleaning are one fused step, for a caller that hands each
    pipeline its own units (the local process pool).
    """

    def __init__(self, cfg: SourceConfig, tokenizer_uri, bucket_bits, work, part, vocab_size, spread: bool = True):
        super().__init__()
        self._cfg, self._tokenizer_uri, self._bucket_bits = cfg, tokenizer_uri, bucket_bits
        self._work, self._part, self._vocab_size, self._spread = work, part, vocab_size, spread

    def expand(self, files):
        if self._spread:
            files = (files | "SplitDumps" >> beam.ParDo(SplitLargeDumps(DUMP_RANGE_BYTES))
                     | "SpreadFiles" >> beam.Reshuffle())  # files to different workers, not all read by one
        documents = files | "Read" >> beam.ParDo(ReadSourceFile(self._cfg))
        if self._spread:
            documents = documents | "Spread" >> beam.Reshuffle()
        return (documents
                | "CleanTokenize" >> beam.ParDo(CleanAndTokenize(self._cfg, self._tokenizer_uri, self._bucket_bits))
                | "ByBucket" >> beam.GroupByKey()
                | "WriteBuckets" >> beam.ParDo(WriteDocumentBucket(self._work, self._part, self._vocab_size))
                | "OneKey" >> beam.Map(lambda counts: (0, counts)) | "AllBuckets" >> beam.GroupByKey()
                | "WriteCounts" >> beam.ParDo(WritePartCounts(self._work, self._part)))
