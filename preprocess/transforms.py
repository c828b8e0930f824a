"""Beam PTransforms of the preprocessing stage. Each DoFn is thin and delegates to pure modules.

Only portable primitives are used (Create, ParDo, GroupByKey, Reshuffle), so the same pipeline runs
on the DirectRunner, Dask, Flink, Spark and Dataflow. Small run-wide facts (bucket offsets, corpus
size) are constructor arguments computed by the driver between stages, not side inputs.
"""
from __future__ import annotations

import bisect

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from preprocess import docstore, shards, sources, storage, text
from preprocess.config import InstanceConfig, SourceConfig
from preprocess.hashing import document_hash, rng_for, stable_hash64
from preprocess.instances import InstancePlan, MaskingVocab, finalize_instance, plan_instances
from preprocess.records import RawDocument, Rejected


def _rejected_tuple(rejected: Rejected) -> tuple:
    return (rejected.source, rejected.doc_id, rejected.outcome, rejected.reason, rejected.detail)


class _UsesTokenizer(beam.DoFn):
    """Loads the run's tokenizer once per worker (DoFn.setup), not once per element."""

    def __init__(self, tokenizer_uri: str):
        self._tokenizer_uri = tokenizer_uri
        self.tokenizer = None

    def setup(self):
        from preprocess.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(self._tokenizer_uri)


class ReadSourceFile(beam.DoFn):
    """(kind, uri) -> RawDocument | Rejected, streamed from the file."""

    def __init__(self, cfg: SourceConfig):
        self._cfg = cfg
        self._files = Metrics.counter("preprocess", "files_read")

    def process(self, element):
        kind, uri = element
        self._files.inc()
        reader = sources.iter_wikipedia if kind == "wiki" else sources.iter_book
        yield from reader(uri, self._cfg)


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
        dtype = "uint16" if self.tokenizer.vocab_size <= 65536 else "uint32"
        tokens = np.concatenate([np.asarray(ids, dtype=dtype) for ids in encoded])
        lengths = np.asarray([len(ids) for ids in encoded], dtype=np.uint32)
        yield bucket, ("doc", (document_hash(element.doc_id), element.doc_id, element.source,
                               tokens.tobytes(), lengths.tobytes()))


class WriteDocumentBucket(beam.DoFn):
    """(bucket, [records]) -> docs/bNNNNNN/pPPPP.arrow + .json (counts, dead letters)."""

    def __init__(self, work: str, part: int, vocab_size: int):
        self._work, self._part, self._vocab_size = work, part, vocab_size

    def process(self, element):
        bucket, records = element
        docs = [payload for tag, payload in records if tag == "doc"]
        rejected = sorted(payload for tag, payload in records if tag == "rejected")
        meta = {"documents": len(docs), "sentences": 0, "tokens": 0, "skipped": {}, "failed": {}, "dead_letters": []}
        for source, doc_id, outcome, reason, detail in rejected:
            meta[outcome][reason] = meta[outcome].get(reason, 0) + 1
            if outcome == "failed":
                meta["dead_letters"].append({"source": source, "doc_id": doc_id, "reason": reason, "detail": detail})
        base = storage.join(docstore.bucket_dir(self._work, bucket), f"p{self._part:04d}")
        if docs:
            table = docstore.documents_table(docs, self._vocab_size)
            meta["sentences"] = sum(len(d[4]) // 4 for d in docs)
            meta["tokens"] = sum(len(d[3]) for d in docs) // (2 if self._vocab_size <= 65536 else 4)
            docstore.write_table(base + ".arrow", table)
        storage.write_json(base + ".json", meta)
        yield bucket


class CountBucket(beam.DoFn):
    """bucket -> (bucket, documents after removing duplicate ids, duplicates)."""

    def __init__(self, work: str):
        self._work = work

    def process(self, bucket):
        loaded = docstore.load_bucket(self._work, bucket)
        yield bucket, len(loaded), loaded.duplicates


class _BuildsInstances(_UsesTokenizer):
    def __init__(self, tokenizer_uri: str, work: str, cfg: InstanceConfig, seed: int,
                 bucket_offsets: list[int], group_bits: int):
        super().__init__(tokenizer_uri)
        self._work, self._cfg, self._seed = work, cfg, seed
        self._offsets = bucket_offsets       # global index of each bucket's first document, plus the total
        self._group_bits = group_bits
        self._instances = Metrics.counter("preprocess", "instances")

    def setup(self):
        super().setup()
        self.vocab = MaskingVocab.from_tokenizer(self.tokenizer)

    def _locate(self, global_index: int) -> tuple[int, int]:
        bucket = bisect.bisect_right(self._offsets, global_index) - 1
        return bucket, global_index - self._offsets[bucket]

    def _record(self, instance, doc_id: str, dupe: int, index: int, doc_b: str):
        key = stable_hash64(self._seed, "order", doc_id, dupe, index)
        tiebreak = stable_hash64(self._seed, "tiebreak", doc_id, dupe, index)
        self._instances.inc()
        record = (key, tiebreak, instance.input_ids.tobytes(), instance.segment_a_len,
                  instance.masked_positions.astype(np.uint16).tobytes(), instance.masked_labels.tobytes(),
                  instance.next_sentence_label, doc_id, doc_b, instance.truncated)
        return shards.group_of(key, self._group_bits), record


class PlanAndBuildInstances(_BuildsInstances):
    """bucket -> ("done", (group, record)) for actual-next pairs, ("request", (bucket, request)) for random."""

    def process(self, bucket):
        loaded = docstore.load_bucket(self._work, bucket)
        num_docs = self._offsets[-1]
        planned = 0
        for rank, doc_id in enumerate(loaded.doc_ids):
            tokens, offsets = loaded.document(rank)
            for dupe in range(self._cfg.dupe_factor):
                plans = plan_instances(offsets, self._offsets[bucket] + rank, num_docs,
                                       rng_for(self._seed, "plan", doc_id, dupe), self._cfg)
                planned += len(plans)
                for plan in plans:
                    if plan.is_random_next:
                        target_bucket, _ = self._locate(plan.random_doc)
                        request = (doc_id, dupe, plan.index, tokens[plan.a_start:plan.a_end].tobytes(),
                                   plan.target_b_length, plan.random_doc)
                        yield "request", (target_bucket, request)
                        continue
                    rng = rng_for(self._seed, "instance", doc_id, dupe, plan.index)
                    instance = finalize_instance(plan, tokens, tokens, None, rng, self._cfg, self.vocab)
                    yield "done", self._record(instance, doc_id, dupe, plan.index, doc_id)
        # The driver checks that every planned instance reached a piece before it publishes anything.
        storage.write_json(storage.join(self._work, "planned", f"b{bucket:06d}.json"), {"instances": planned})


class ResolveRandomNext(_BuildsInstances):
    """(bucket, [requests]) -> (group, record): B drawn from the requested document of this bucket."""

    def process(self, element):
        bucket, requests = element
        loaded = docstore.load_bucket(self._work, bucket)
        dtype = loaded.tokens.dtype
        for doc_id, dupe, index, tokens_a, target_b_length, random_doc in sorted(requests):
            _, rank = self._locate(random_doc)
            b_tokens, b_offsets = loaded.document(rank)
            a_tokens = np.frombuffer(tokens_a, dtype=dtype)
            plan = InstancePlan(index=index, a_start=0, a_end=len(a_tokens), b_start=0, b_end=0, is_random_next=True,
                                target_b_length=target_b_length, random_doc=random_doc)
            rng = rng_for(self._seed, "instance", doc_id, dupe, index)
            instance = finalize_instance(plan, a_tokens, b_tokens, b_offsets, rng, self._cfg, self.vocab)
            yield self._record(instance, doc_id, dupe, index, loaded.doc_ids[rank])


class WritePieceGroup(beam.DoFn):
    """(group, [records]) -> pieces/gNNNNNN/pPPPP.arrow (sorted by key) + .json (rows, statistics)."""

    def __init__(self, work: str, part: int, vocab_size: int, mask_id: int):
        self._work, self._part, self._vocab_size, self._mask_id = work, part, vocab_size, mask_id

    def process(self, element):
        group, records = element
        table = shards.pieces_table(list(records), self._vocab_size)
        uri = shards.piece_uri(self._work, group, self._part)
        docstore.write_table(uri, table)
        storage.write_json(uri[:-len(".arrow")] + ".json",
                           {"rows": table.num_rows, "stats": shards.instance_stats(table, self._mask_id)})
        yield group


class CreateInstances(beam.PTransform):
    """Buckets of this part -> instances written as sorted pieces, random next resolved by a keyed join."""

    def __init__(self, tokenizer_uri, work, cfg: InstanceConfig, seed, bucket_offsets, group_bits, part,
                 vocab_size, mask_id):
        super().__init__()
        self._args = (tokenizer_uri, work, cfg, seed, bucket_offsets, group_bits)
        self._part, self._vocab_size, self._mask_id, self._work = part, vocab_size, mask_id, work

    def expand(self, buckets):
        planned = (buckets | "Spread" >> beam.Reshuffle()
                   | "Plan" >> beam.ParDo(PlanAndBuildInstances(*self._args)))
        done = planned | "Done" >> beam.FlatMap(lambda kv: [kv[1]] if kv[0] == "done" else [])
        resolved = (planned | "Requests" >> beam.FlatMap(lambda kv: [kv[1]] if kv[0] == "request" else [])
                    | "ByTargetBucket" >> beam.GroupByKey()
                    | "Resolve" >> beam.ParDo(ResolveRandomNext(*self._args)))
        return ((done, resolved) | beam.Flatten() | "ByGroup" >> beam.GroupByKey()
                | "WritePieces" >> beam.ParDo(WritePieceGroup(self._work, self._part, self._vocab_size,
                                                              self._mask_id)))


class BuildDocumentStore(beam.PTransform):
    """(kind, uri) files of this part -> tokenized document store buckets."""

    def __init__(self, cfg: SourceConfig, tokenizer_uri, bucket_bits, work, part, vocab_size):
        super().__init__()
        self._cfg, self._tokenizer_uri, self._bucket_bits = cfg, tokenizer_uri, bucket_bits
        self._work, self._part, self._vocab_size = work, part, vocab_size

    def expand(self, files):
        return (files
                | "Read" >> beam.ParDo(ReadSourceFile(self._cfg))
                | "Spread" >> beam.Reshuffle()
                | "CleanTokenize" >> beam.ParDo(CleanAndTokenize(self._cfg, self._tokenizer_uri, self._bucket_bits))
                | "ByBucket" >> beam.GroupByKey()
                | "WriteBuckets" >> beam.ParDo(WriteDocumentBucket(self._work, self._part, self._vocab_size)))
