"""The documents stage: input files -> the tokenized document store.

A file (or a piece of a large one: a byte range of a .bz2 dump, ...) is read as documents by its format's reader
(``preprocess.readers``), each document cleaned (``preprocess.text``) and tokenized, and the documents written by
bucket of their id's hash into the store (``preprocess.docstore``), with each part's document counts for the index
stage.

Only portable primitives are used (Create, ParDo, GroupByKey, Reshuffle), so the same pipeline runs on the
DirectRunner, Dask, Flink, Spark and Dataflow.
"""
from __future__ import annotations

import itertools

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from common import schema, storage
from common.hashing import document_hash
from common.preprocess_config import HeldoutConfig, InputSourceConfig, MultilingualConfig, SourceConfig
from preprocess import docstore, heldout, languages, readers, text
from preprocess.records import RawDocument, Rejected
from preprocess.stages.worker_tokenizer import UsesTokenizer

PIECE_BYTES = 64 << 20  # a larger file that its reader can cut is read in pieces of about this size, over the workers


class BuildDocumentStore(beam.PTransform):
    """(key, uri[, piece]) files of this part -> tokenized document store buckets and the part's document counts
    (``docstore.counts_uri``); emits the part once they are written (nothing for a part without documents).

    With ``spread`` (the default) large files are cut into pieces and files and documents are spread over
    the runner's workers. Without it reading and cleaning are one fused step, for a caller that hands each
    pipeline its own units (the local process pool). ``inputs``: the config's ``inputs:`` sources (their files'
    keys name them). With ``multilingual`` enabled, the counts are also by language; with a held-out split
    (``heldout``, selected with ``seed``), also what its selection needs.
    """

    def __init__(self, cfg: SourceConfig, tokenizer_uri, bucket_bits, work, part, vocab_size, spread: bool = True,
                 multilingual: MultilingualConfig | None = None, heldout: HeldoutConfig | None = None, seed: int = 0,
                 inputs: tuple[InputSourceConfig, ...] = ()):
        super().__init__()
        self._cfg, self._tokenizer_uri, self._bucket_bits, self._inputs = cfg, tokenizer_uri, bucket_bits, inputs
        self._work, self._part, self._vocab_size, self._spread = work, part, vocab_size, spread
        self._multilingual = multilingual
        self._heldout = (heldout, seed) if heldout is not None and heldout.enabled else None

    def expand(self, files):
        if self._spread:
            files = (files | "SplitLarge" >> beam.ParDo(SplitLargeFiles(PIECE_BYTES, self._inputs))
                     | "SpreadFiles" >> beam.Reshuffle())  # files to different workers, not all read by one
        documents = files | "Read" >> beam.ParDo(ReadSourceFile(self._cfg, self._inputs))
        if self._spread:
            documents = documents | "Spread" >> beam.Reshuffle()
        return (documents
                | "CleanTokenize" >> beam.ParDo(CleanAndTokenize(self._cfg, self._tokenizer_uri, self._bucket_bits,
                                                                 self._inputs))
                | "ByBucket" >> beam.GroupByKey()
                | "WriteBuckets" >> beam.ParDo(WriteDocumentBucket(self._work, self._part, self._vocab_size,
                                                                  self._multilingual, self._heldout))
                | "OneKey" >> beam.Map(lambda counts: (0, counts)) | "AllBuckets" >> beam.GroupByKey()
                | "WriteCounts" >> beam.ParDo(WritePartCounts(self._work, self._part, self._heldout)))


class SplitLargeFiles(beam.DoFn):
    """(key, uri) -> the same, or for a file larger than ``piece_bytes`` that its reader can cut, its pieces (key,
    uri, piece) of about that size, so that several workers read one file (``Reader.pieces``)."""

    def __init__(self, piece_bytes: int, inputs: tuple[InputSourceConfig, ...] = ()):
        self._piece_bytes, self._inputs = piece_bytes, inputs

    def process(self, element):
        key, uri = element[:2]
        reader, spec = readers.reader_of(key), readers.spec_of(key, self._inputs)
        size = storage.size_of(uri) if len(element) == 2 and reader.splittable(uri, spec) else 0
        pieces = reader.pieces(uri, size, size // self._piece_bytes, spec) if size > self._piece_bytes else []
        if len(pieces) > 1:
            yield from ((key, uri, piece) for _, piece in pieces)
        else:
            yield element


class ReadSourceFile(beam.DoFn):
    """(key, uri[, piece]) -> RawDocument | Rejected, streamed from the file by its reader (``readers.reader_of``).

    ``piece`` selects part of a file, so that several workers share it without cleaning any document twice: one of
    the reader's own pieces (``Reader.pieces``: a byte range, row groups, ...), or ("buckets", bits, lo, hi) for a
    file that cannot be cut: the whole file is read and only the documents of buckets ``[lo, hi)`` passed on.
    """

    def __init__(self, cfg: SourceConfig, inputs: tuple[InputSourceConfig, ...] = ()):
        self._cfg, self._inputs = cfg, inputs
        self._files = Metrics.counter("preprocess", "files_read")
        self._cache: dict = {}  # what a reader keeps across the pieces of a file (e.g. a dump's header)

    def process(self, element):
        key, uri, *piece = element
        self._files.inc()
        reader, spec = readers.reader_of(key), readers.spec_of(key, self._inputs)
        cfg = readers.source_config(spec, self._cfg)
        piece = piece[0] if piece else None
        if piece is None or piece[0] != "buckets":
            yield from reader.read(uri, piece, spec, cfg, self._cache)
            return
        _, bits, lo, hi = piece
        for item in reader.read(uri, None, spec, cfg, self._cache):
            if lo <= docstore.bucket_of(document_hash(item.doc_id), bits) < hi:
                yield item


def _rejected_tuple(rejected: Rejected) -> tuple:
    return (rejected.source, rejected.doc_id, rejected.outcome, rejected.reason, rejected.detail)


class CleanAndTokenize(UsesTokenizer):
    """RawDocument -> (bucket, ("doc", row)) ; Rejected -> (bucket, ("rejected", tuple))."""

    def __init__(self, cfg: SourceConfig, tokenizer_uri: str, bucket_bits: int,
                 inputs: tuple[InputSourceConfig, ...] = ()):
        super().__init__(tokenizer_uri)
        self._cfg = cfg
        self._limits = readers.limits_by_source(inputs, cfg)  # the sources with limits of their own
        self._bucket_bits = bucket_bits
        self._documents = Metrics.counter("preprocess", "documents")
        self._rejected = Metrics.counter("preprocess", "documents_rejected")

    def process(self, element):
        cfg = self._limits.get(readers.source_of(element.doc_id), self._cfg) if self._limits else self._cfg
        if isinstance(element, RawDocument):
            element = text.to_document(element, cfg)
        if not isinstance(element, Rejected):
            encoded = [ids for ids in self.tokenizer.encode_batch(list(element.sentences)) if ids]
            if len(encoded) < cfg.min_document_sentences:
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


class WriteDocumentBucket(beam.DoFn):
    """(bucket, [records]) -> docs/bNNNNNN/pPPPP.arrow, the bucket's documents from this part (none: no file); emits
    the bucket's counts (``docstore.no_counts``' keys), which ``WritePartCounts`` adds up. The records are
    ``CleanAndTokenize``'s: ("doc", row) or ("rejected", (source, doc_id, outcome, reason, detail)). With
    ``multilingual`` enabled, the counts are also by language (``languages.language_counts``); with ``heldout``
    ((config, seed) of a held-out split), also what its selection needs (``heldout.bucket_counts``)."""

    def __init__(self, work: str, part: int, vocab_size: int, multilingual: MultilingualConfig | None = None,
                 heldout: tuple[HeldoutConfig, int] | None = None):
        self._work, self._part, self._vocab_size = work, part, vocab_size
        self._multilingual = multilingual if multilingual is not None and multilingual.enabled else None
        self._heldout = heldout

    def process(self, element):
        bucket, records = element
        docs = [payload for tag, payload in records if tag == "doc"]
        counts = docstore.no_counts()
        by_source = counts["sources"]
        for source, doc_id, outcome, reason, detail in (payload for tag, payload in records if tag == "rejected"):
            counts[outcome][reason] = counts[outcome].get(reason, 0) + 1
            of_source = by_source.setdefault(readers.source_of(doc_id), docstore.no_source_counts())
            of_source[outcome][reason] = of_source[outcome].get(reason, 0) + 1
            if outcome == "failed":
                counts["dead_letters"].append({"source": source, "doc_id": doc_id, "reason": reason, "detail": detail})
        token_bytes = np.dtype(schema.token_numpy_dtype(self._vocab_size)).itemsize
        for doc in docs:
            of_source = by_source.setdefault(readers.source_of(doc[1]), docstore.no_source_counts())
            of_source["documents"] += 1
            of_source["sentences"] += len(doc[4]) // 4
            of_source["tokens"] += len(doc[3]) // token_bytes
        if docs:
            counts["documents"] = len(docs)
            counts["sentences"] = sum(len(d[4]) // 4 for d in docs)
            counts["tokens"] = sum(len(d[3]) for d in docs) // token_bytes
            if self._multilingual is not None:
                counts.update(languages.language_counts(docs, self._multilingual, token_bytes))
            if self._heldout is not None:
                counts.update(heldout.bucket_counts(*self._heldout, [d[1] for d in docs]))
            docstore.write_table(storage.join(docstore.bucket_dir(self._work, bucket), f"p{self._part:04d}.arrow"),
                                 docstore.documents_table(docs, self._vocab_size))
        yield counts


class WritePartCounts(beam.DoFn):
    """(any key, [each bucket's counts]) -> doc_counts/pPPPP.json, this part's documents counted (``docstore``'s
    ``add_counts``): one file per part for the index and the manifest to read, not one per bucket and part.
    A held-out split's smallest keys are cut to its counts (``heldout.trim_counts``)."""

    def __init__(self, work: str, part: int, heldout: tuple[HeldoutConfig, int] | None = None):
        self._work, self._part, self._heldout = work, part, heldout

    def process(self, element):
        counts = docstore.add_counts(list(element[1]))
        if self._heldout is not None:
            counts = heldout.trim_counts(counts, self._heldout[0])
        storage.write_json(docstore.counts_uri(self._work, self._part), counts)
        yield self._part
