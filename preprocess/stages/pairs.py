"""The instances stage for pairs (``kind: pairs``, BERT's next-sentence or ALBERT's sentence-order pairs): units of
the document store -> pieces of finished instances by key range. Each (document, duplicate) is planned by
``preprocess.instances``; the instances of a bucket are finalised (truncated, assembled, masked) in bulk by
``preprocess.batch``; a random next segment is requested from the unit range that holds its document
(``preprocess.requests``) and resolved by a join.
"""
from __future__ import annotations

import itertools

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from common import storage
from common.hashing import rng_for
from preprocess import docstore, handoff
from preprocess.batch import InstanceKeys, finalize_batch, instance_keys, ragged_arange, random_segments
from preprocess.instances import InstancePlan, plan_instances, plan_sop_instances
from preprocess.layout import join_range_shift, unit_buckets, unit_shift
from preprocess.requests import merge_requests, split_by, take_requests
from preprocess.stages.instances import CHUNK_ROWS, BuildsInstances, CreatesInstances


class CreateInstances(CreatesInstances):
    """Units of this part (runs of document buckets) -> instances written as pieces by key range, random next
    resolved by a join keyed by the range of units that holds B's document (``CreatesInstances``' arguments).
    """

    def expand(self, units):
        units = self._spread_units(units)
        # Two filters rather than a multi-output ParDo: Beam's DaskRunner does not route tagged outputs.
        planned = units | "Plan" >> beam.ParDo(PlanAndBuildInstances(*self._args))
        done = planned | "Done" >> beam.FlatMap(lambda kv: [kv[1]] if kv[0] == "done" else [])
        resolved = (planned | "Requests" >> beam.FlatMap(lambda kv: [kv[1]] if kv[0] == "request" else [])
                    | "ByTargetUnit" >> beam.GroupByKey()
                    | "Resolve" >> beam.ParDo(ResolveRandomNext(*self._args)))
        return self._write_pieces((done, resolved) | beam.Flatten())


class PlanAndBuildInstances(BuildsInstances):
    """unit -> ("done", (transport group, batch)) for actual-next pairs, ("request", (range, requests)) for random
    ones, keyed by the range of units (``join_range_shift``) that holds the document B is drawn from. Sentence-order
    pairs (``sentence_objective: sop``) are all "done": both segments come from the document.

    A unit is a contiguous run of document buckets (``unit_buckets``) of about ``stages.index.ROWS_PER_UNIT`` instances.
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
        loaded = docstore.load_bucket(self._work, bucket, self._drop(bucket))
        num_docs, first_index = self._offsets()[-1], self._offsets()[bucket]
        plans, runs, counts = [], [], []  # runs: (document, duplicate), each with counts[i] plans in a row
        dropped = 0
        requests = []
        copies = self._copies(loaded.doc_ids)  # dupe_factor each, or the mix's (of languages or sources)
        for rank, doc_id in enumerate(loaded.doc_ids):
            offsets = loaded.document(rank)[1]
            for dupe in range(int(copies[rank])):
                planned, dropped_chunks = self._plan(offsets, first_index + rank, num_docs, doc_id, dupe)
                plans.extend(planned)
                runs.append((doc_id, dupe))
                counts.append(len(planned))
                dropped += dropped_chunks
        if plans:
            # One row per instance: InstancePlan's fields as integers, and the document's rank in the bucket.
            table = np.fromiter(itertools.chain.from_iterable(plans), np.int64, len(plans) * len(plans[0]))
            table = table.reshape(len(plans), len(plans[0]))
            ranks = np.repeat(np.arange(len(loaded.doc_ids)).repeat(copies), counts)
            keys = instance_keys(self._seed, runs, counts, table[:, _INDEX])
            is_random = table[:, _IS_RANDOM].astype(bool)
            actual, random_next = np.flatnonzero(~is_random), np.flatnonzero(is_random)
            if len(actual):
                self._finish_actual(loaded, table[actual], ranks[actual], keys.take(actual), pending)
            if len(random_next):
                requests.append(self._requests(loaded, table[random_next], ranks[random_next], keys.take(random_next)))
        # The driver checks that every planned instance reached a piece before it publishes anything.
        # Also the rows and their document's own tokens (segment A, and B unless random) by source (and language).
        planned = {"instances": len(plans)}
        if plans:
            own = table[:, _A_END] - table[:, _A_START] + table[:, _B_END] - table[:, _B_START]
            planned.update(self._by_origin(loaded.doc_ids, ranks, own))
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
            loaded = docstore.load_bucket(self._work, int(bucket), self._drop(int(bucket)))
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
