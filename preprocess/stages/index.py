"""The index stage, after the document store is complete: every bucket counted (duplicate ids removed,
``preprocess.docstore``), and the corpus index written (``layout.INDEX_NAME``): each bucket's first global document
index, the corpus's counts, the key-range group layout and the instance stage's units.
"""
from __future__ import annotations

import apache_beam as beam

from common import storage
from common.errors import InputError
from common.preprocess_config import DedupConfig, HeldoutConfig, InstanceConfig, MixtureConfig, MultilingualConfig
from preprocess import dedup, docstore, heldout, languages, mixture, sentence_rows
from preprocess.layout import HELDOUT_SELECTION_NAME, INDEX_NAME, bits_for, unit_shift
from preprocess.stages.barrier import Barrier, read_metas, spread

ROWS_PER_GROUP = 16384  # instances per key-range group (bounds what one shard writer sorts)
ROWS_PER_UNIT = 65536   # instances per unit of the instance stage (bounds what one of its DoFns holds at once)


class IndexCorpus(beam.PTransform):
    """After the document store is complete: count every bucket, write the index, emit non-empty buckets. With a
    held-out split (``heldout``: (config, seed, vocabulary size)), first split it off (``preprocess.heldout``)."""

    def __init__(self, work: str, num_buckets: int, cfg: InstanceConfig, spread: bool = True,
                 multilingual: MultilingualConfig | None = None, heldout: tuple[HeldoutConfig, int, int] | None = None,
                 mixture: MixtureConfig | None = None, dedup: tuple[DedupConfig, int, str] | None = None):
        super().__init__()
        self._mixture = mixture
        self._dedup = dedup if dedup is not None and dedup[0].enabled else None  # (config, seed, tokenizer URI)
        self._work, self._num_buckets, self._cfg, self._spread = work, num_buckets, cfg, spread
        self._multilingual = multilingual
        self._heldout = heldout if heldout is not None and heldout[0].enabled else None

    def expand(self, trigger):
        work, num_buckets, cfg, multilingual = self._work, self._num_buckets, self._cfg, self._multilingual
        mixture_cfg = self._mixture
        after = trigger | "AfterDocuments" >> Barrier()
        if self._dedup is not None:
            after = self._deduplicate(after)
        if self._heldout is not None:
            after = self._split(after)
        buckets = after | "Buckets" >> beam.FlatMap(lambda _: range(num_buckets))
        return (spread(buckets, "SpreadBuckets", self._spread)
                | "Count" >> beam.ParDo(CountBucket(work, split=self._heldout is not None))
                | "AllCounts" >> beam.Map(lambda row: (0, row)) | "Collect" >> beam.GroupByKey()
                | "WriteIndex" >> beam.FlatMap(lambda kv: write_index(kv[1], work, num_buckets, cfg, multilingual,
                                                                    mixture_cfg)))

    def _deduplicate(self, after):
        """Duplicates of text (``preprocess.dedup``): every bucket's text keys, then each range of hashes searched
        for repeats (and near copies, by band), then the drops merged by bucket; one element once that is done."""
        work, num_buckets = self._work, self._num_buckets
        cfg, seed, tokenizer_uri = self._dedup
        buckets = after | "DedupBuckets" >> beam.FlatMap(lambda _: range(num_buckets))
        tasks = (spread(buckets, "SpreadKeys", self._spread)
                 | "TextKeys" >> beam.Map(lambda bucket: dedup.write_keys(work, bucket, cfg, seed, tokenizer_uri))
                 | "AllKeys" >> beam.Map(lambda count: (0, count)) | "CollectKeys" >> beam.GroupByKey()
                 | "Tasks" >> beam.FlatMap(lambda kv: dedup.tasks(sum(kv[1]), cfg)))
        return (spread(tasks, "SpreadTasks", self._spread)
                | "FindDuplicates" >> beam.Map(lambda task: dedup.run_task(work, task, num_buckets, cfg))
                | "AllFound" >> beam.Map(lambda found: (0, found)) | "CollectFound" >> beam.GroupByKey()
                | "MergeDuplicates" >> beam.Map(lambda kv: dedup.merge(work, next(iter(kv[1]))[0], cfg)))

    def _split(self, after):
        """The held-out split: its selection, then every bucket's held-out documents copied into the evaluation
        store, then their text hashes written; one element once that is done."""
        work, num_buckets, cfg = self._work, self._num_buckets, self._cfg
        heldout_cfg, seed, vocab_size = self._heldout
        buckets = after | "Select" >> beam.FlatMap(lambda _: _select(work, heldout_cfg, seed, num_buckets))
        return (spread(buckets, "SpreadSplit", self._spread)
                | "SplitBucket" >> beam.ParDo(SplitBucket(work, vocab_size))
                | "AllSplit" >> beam.Map(lambda result: (0, result)) | "CollectSplit" >> beam.GroupByKey()
                | "WriteSplit" >> beam.Map(lambda kv: heldout.write_split(work, list(kv[1]), cfg)))


def _select(work: str, cfg: HeldoutConfig, seed: int, num_buckets: int) -> range:
    """The held-out selection written (``heldout.write_thresholds``); then every bucket, to split."""
    heldout.write_thresholds(work, cfg, seed)
    return range(num_buckets)


class SplitBucket(beam.DoFn):
    """bucket -> its held-out documents copied into the evaluation store; their counts and text hashes."""

    def __init__(self, work: str, vocab_size: int):
        self._work, self._vocab_size = work, vocab_size
        self._selection = None

    def process(self, bucket):
        if self._selection is None:  # written before the first bucket is sent
            self._selection = storage.read_json(storage.join(self._work, HELDOUT_SELECTION_NAME))
        yield heldout.split_bucket(self._work, bucket, self._selection, self._vocab_size)


class CountBucket(beam.DoFn):
    """bucket -> (bucket, documents after removing duplicate ids (and the duplicates of text that
    ``preprocess.dedup`` dropped), duplicate ids); after a held-out ``split``, without
    the documents whose text is held out, and a fourth element naming them (``heldout.count_training``)."""

    def __init__(self, work: str, split: bool = False):
        self._work, self._split = work, split
        self._held_out = None

    def process(self, bucket):
        if not self._split:
            yield docstore.bucket_count(self._work, bucket, dedup.dropped(self._work, bucket))
            return
        if self._held_out is None:
            self._held_out = heldout.read_text_hashes(self._work)
        yield heldout.count_training(self._work, bucket, self._held_out)


def write_index(rows, work: str, num_buckets: int, cfg: InstanceConfig,
                multilingual: MultilingualConfig | None = None, mixture_cfg: MixtureConfig | None = None) -> list[int]:
    """Bucket offsets (global document indices), corpus counts and the group layout -> index.json; for a multilingual
    run also each language's counts and sampling rate (``languages.language_mix``) and each document group's
    language; with a ``mixture`` section, each source's counts, requested share and rate (``mixture.source_mix``)."""
    rows = list(rows)
    counts = {row[0]: (row[1], row[2]) for row in rows}
    offsets = [0]
    for bucket in range(num_buckets):
        offsets.append(offsets[-1] + counts.get(bucket, (0, []))[0])
    documents = docstore.add_counts(list(read_metas(storage.join(work, docstore.COUNTS_DIR)).values()))
    corpus = {"sentences": documents["sentences"], "tokens": documents["tokens"]}
    left_out = {row[0]: row[3] for row in rows if len(row) > 3 and row[3]["ids"]}  # a held-out split's
    duplicates = dedup.read_summary(work)  # duplicates of text (exact, near), dropped before the split
    for entry in [*left_out.values(), *([duplicates] if duplicates else [])]:
        corpus = {key: corpus[key] - entry[key] for key in corpus}
    needed = 2 if cfg.sentence_objective == "nsp" else 1  # a random next segment comes from another document
    if offsets[-1] < needed:
        raise InputError(f"only {offsets[-1]} usable document(s) in the input; "
                         f"{'next-sentence prediction needs at least 2' if needed == 2 else 'nothing to build'} "
                         "(check the inputs and the sources.min_document_* settings)")
    estimated_rows = corpus["tokens"] * cfg.dupe_factor / max(1, cfg.max_seq_length - 3)
    index = {"bucket_offsets": offsets, "group_bits": min(20, bits_for(estimated_rows / ROWS_PER_GROUP)),
             "corpus": corpus, "counts": sorted([b, c, d] for b, (c, d) in counts.items())}
    if duplicates and duplicates["buckets"]:  # the buckets whose later loads leave exact duplicates out
        index["dedup_buckets"] = duplicates["buckets"]
    if left_out:  # the ids each later load of a bucket leaves out (``heldout.count_training``)
        index["heldout_dropped"] = {str(bucket): entry["ids"] for bucket, entry in sorted(left_out.items())}
    if cfg.kind == "full_sentences":
        index["stream_bits"] = sentence_rows.stream_bits_for(corpus["tokens"])  # the corpus's size alone chooses it
    else:  # units: runs of buckets, so that the stage's elements grow with the input alone
        index["unit_bits"] = min(num_buckets.bit_length() - 1, bits_for(estimated_rows / ROWS_PER_UNIT))
    if multilingual is not None and multilingual.enabled:  # the rows' expected total is the corpus's: as before
        index["languages"] = languages.language_mix(documents["languages"], multilingual)
        index["language_groups"] = languages.group_languages(documents["language_groups"])
    if mixture_cfg is not None and mixture_cfg.enabled:  # shares of the documents read (before a held-out split)
        index["mixture"] = mixture.source_mix(dedup.without(documents["sources"], duplicates), mixture_cfg)
    storage.write_json(storage.join(work, INDEX_NAME), index)
    return instance_units(index, cfg)


def instance_units(index: dict, cfg: InstanceConfig) -> list[int]:
    """What the instance stage works on, from the corpus index: the units (runs of document buckets,
    ``layout.unit_buckets``) that hold documents, or for ``full_sentences`` the packing streams that have
    documents (``preprocess.sentence_rows``)."""
    offsets = index["bucket_offsets"]
    non_empty = [bucket for bucket in range(len(offsets) - 1) if offsets[bucket + 1] > offsets[bucket]]
    if cfg.kind != "full_sentences":
        return sorted({bucket >> unit_shift(index) for bucket in non_empty})
    bucket_bits = (len(offsets) - 1).bit_length() - 1
    stream_bits = index["stream_bits"]
    return [stream for stream in range(1 << stream_bits)
            if any(offsets[b + 1] > offsets[b] for b in sentence_rows.stream_buckets(stream, stream_bits, bucket_bits))]


def first_bucket(unit: int, index: dict, cfg: InstanceConfig) -> int:
    """The document bucket an instance-stage unit starts at: the slice of buckets that holds it runs it."""
    if cfg.kind != "full_sentences":
        return unit << unit_shift(index)
    bucket_bits = (len(index["bucket_offsets"]) - 1).bit_length() - 1
    return sentence_rows.stream_buckets(unit, index["stream_bits"], bucket_bits)[0]
