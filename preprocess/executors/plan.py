"""The plan of a run: its four stages with their inputs and parameters, built once by the driver.

    documents (per part: files) -> index (barrier) -> instances (per part: buckets) -> shards (barrier)

The stages meet at files under the work directory, so the executors only schedule them: ``pipeline``
as one Beam pipeline (or one per part), ``local`` in a pool of processes, ``steps`` as
separate jobs. Each stage has its Beam form; the index and shards stages also a plain one, for an executor that
runs them without a pipeline. An executor that runs a pipeline entirely in this process passes the pipeline's
handoff lot (``preprocess.handoff``): its elements then stay where they are (no spreading over workers) and
payloads cross the GroupByKeys by reference; with None they are spread and travel by value.
"""
from __future__ import annotations

import dataclasses

import apache_beam as beam
import pyarrow as pa

from common import schema, storage
from common.errors import InputError
from common.preprocess_config import (
    DedupConfig,
    HeldoutConfig,
    InputSourceConfig,
    InstanceConfig,
    MixtureConfig,
    MultilingualConfig,
    OutputConfig,
    PreprocessConfig,
    SourceConfig,
)
from preprocess import dedup, docstore, handoff, heldout, languages, mixture, readers
from preprocess.executors.part_budget import split_parts
from preprocess.layout import EVAL_DIR, INDEX_NAME, bits_for, bucket_ranges
from preprocess.stages import documents as documents_stage
from preprocess.stages import index as index_stage
from preprocess.stages import packed as packed_stage
from preprocess.stages import pairs as pairs_stage
from preprocess.stages import shards as shards_stage

# Input bytes per document-store bucket. Every part writes two files per bucket and the instance stage loads a
# bucket whole, so larger buckets mean fewer files and file operations (about 8 k buckets for the whole of Wikipedia
# and BooksCorpus) for a few MiB of tokens per load; work balances over the documents stage's input units and the
# instance stage's units, not over buckets (comparisons.bucket_size in bench/results).
BYTES_PER_BUCKET = 4 << 20


def _input_size(uri: str) -> int:
    try:
        return storage.size_of(uri)
    except Exception as exc:  # noqa: BLE001 - every backend words "missing" and "denied" differently
        raise InputError(f"cannot read {uri}: {exc.__class__.__name__}: {exc}; check that it exists and that "
                         "this machine's credentials may read it") from None


def resolve_inputs(wikipedia: list[str], books: list[str],
                   inputs: tuple[InputSourceConfig, ...] = ()) -> list[tuple[str, str, int]]:
    """(key, uri, size in bytes) of every input file (``preprocess.readers.input_files``: the built-in sources', then
    the config's ``inputs:``); refuses no input, unreadable inputs and clashing names."""
    files = readers.input_files({"wikipedia": wikipedia, "books": books}, inputs)
    if not files:
        raise InputError("no input files: pass --wikipedia and/or --books, or list sources under inputs: in the "
                         "config")
    return [(key, uri, _input_size(uri)) for key, uri in files]


def bucket_bits_for(sized: list[tuple[str, str, int]], slices: int) -> int:
    """Document-store buckets: enough for every slice, and about BYTES_PER_BUCKET of input each."""
    input_bytes = sum(size for _, _, size in sized)
    return min(16, max(bits_for(slices), bits_for(input_bytes / BYTES_PER_BUCKET)))


@dataclasses.dataclass(frozen=True)
class Plan:
    """The stages of one run. Small and picklable: the local pool sends it to its worker processes.

    Attributes:
        files: (key, uri, size in bytes) of every input file (``preprocess.readers``).
        parts: how many parts the documents and instances stages are split into (``PreprocessConfig.parts``).
        work: where the stages meet (under ``staging``, removed when the dataset is published).
        staging: where the shards are written (the dataset's staging location).
        heldout: the held-out split (``preprocess.heldout``), built by the plan ``evaluation`` returns.
        inputs: the config's ``inputs:`` sources, which the keys of their files name.
    """

    files: tuple[tuple[str, str, int], ...]
    parts: int
    bucket_bits: int
    source_cfg: SourceConfig
    instance_cfg: InstanceConfig
    output_cfg: OutputConfig
    seed: int
    work: str
    staging: str
    tokenizer_uri: str
    vocab_size: int
    mask_id: int
    output_schema: pa.Schema
    multilingual: MultilingualConfig = MultilingualConfig()
    heldout: HeldoutConfig = HeldoutConfig()
    inputs: tuple[InputSourceConfig, ...] = ()
    mixture: MixtureConfig = MixtureConfig()
    dedup: DedupConfig = DedupConfig()

    @classmethod
    def build(cls, cfg: PreprocessConfig, files, tok, staging: str, tokenizer_uri: str, slices: int) -> Plan:
        """The plan for ``files`` with the tokenizer ``tok`` (saved at ``tokenizer_uri``); ``slices``: the most
        pieces any executor cuts a stage into (each needs a document-store bucket of its own)."""
        output_schema = schema.instance_schema(tok.vocab_size, cfg.output.provenance, {
            "max_seq_length": cfg.instances.max_seq_length, "vocab_sha256": tok.identity()["vocab_sha256"]},
            packed=cfg.instances.kind != "pairs")
        if cfg.multilingual.enabled:
            languages.check_inputs(files, cfg.multilingual, tuple(cfg.inputs))
        mixture.check_sources([key for key, *_ in files], cfg.mixture)
        return cls(files=tuple(files), parts=cfg.parts, bucket_bits=bucket_bits_for(files, slices),
                   source_cfg=cfg.sources, instance_cfg=cfg.instances, output_cfg=cfg.output, seed=cfg.seed,
                   work=storage.join(staging, "_work"), staging=staging, tokenizer_uri=tokenizer_uri,
                   vocab_size=tok.vocab_size, mask_id=tok.mask_id, output_schema=output_schema,
                   multilingual=cfg.multilingual, heldout=cfg.heldout, inputs=tuple(cfg.inputs),
                   mixture=cfg.mixture, dedup=cfg.dedup)

    def evaluation(self) -> Plan:
        """The held-out split's plan: the index, instance and shard stages over the evaluation store that this plan's
        index stage wrote, by the same recipe but masked once (static masks, whatever the recipe's masking), into
        shards of its own under ``EVAL_DIR``; one part, the corpus's own mix (of languages and sources), no split of
        its own."""
        return dataclasses.replace(
            self, parts=1, work=storage.join(self.work, EVAL_DIR), staging=storage.join(self.staging, EVAL_DIR),
            instance_cfg=dataclasses.replace(self.instance_cfg, masking="static"),
            output_cfg=dataclasses.replace(self.output_cfg, num_shards=0), multilingual=MultilingualConfig(),
            heldout=HeldoutConfig(), mixture=MixtureConfig(), dedup=DedupConfig())

    @property
    def num_buckets(self) -> int:
        return 1 << self.bucket_bits

    def file_parts(self) -> list[list[tuple[str, str]]]:
        """(key, uri) of each part's input files: a size-balanced split (fewer parts than files at most)."""
        return split_parts(list(self.files), min(self.parts, len(self.files)))

    def instance_units(self, slices: int) -> list[list[int]]:
        """The instance stage's units (``stages.index.instance_units``: non-empty document buckets, or packing streams)
        of each of ``slices`` contiguous bucket ranges, after the index; a unit belongs to the range of its first
        bucket, so each is run once, whatever the slices."""
        corpus_index = storage.read_json(storage.join(self.work, INDEX_NAME))
        units = index_stage.instance_units(corpus_index, self.instance_cfg)
        starts = [index_stage.first_bucket(unit, corpus_index, self.instance_cfg) for unit in units]
        return [[unit for unit, start in zip(units, starts) if lo <= start < hi]
                for lo, hi in bucket_ranges(self.num_buckets, slices)]

    # Stage 1: documents
    def documents(self, part: int, lot: handoff.Lot | None) -> documents_stage.BuildDocumentStore:
        """(key, uri[, piece]) input units -> part ``part``'s share of the document store."""
        return documents_stage.BuildDocumentStore(self.source_cfg, self.tokenizer_uri, self.bucket_bits, self.work,
                                                  part, self.vocab_size, spread=lot is None,
                                                  multilingual=self.multilingual, heldout=self.heldout, seed=self.seed,
                                                  inputs=self.inputs)

    # Stage 2: index
    def index(self, lot: handoff.Lot | None) -> index_stage.IndexCorpus:
        """Anything -> after it, the corpus index; emits the non-empty buckets."""
        return index_stage.IndexCorpus(self.work, self.num_buckets, self.instance_cfg, spread=lot is None,
                                       multilingual=self.multilingual,
                                       heldout=(self.heldout, self.seed, self.vocab_size), mixture=self.mixture,
                                       dedup=(self.dedup, self.seed, self.tokenizer_uri))

    def dedup_keys(self, lo: int, hi: int) -> int:
        """The index stage without Beam, with a ``dedup`` section: first each bucket's text keys
        (``preprocess.dedup``); the documents they hold ..."""
        return sum(dedup.write_keys(self.work, bucket, self.dedup, self.seed, self.tokenizer_uri)
                   for bucket in range(lo, hi))

    def find_duplicates(self, task: tuple) -> tuple[int, int]:
        """... then each of ``dedup.tasks``: a range of text hashes (or of a band's) searched for repeats ..."""
        return dedup.run_task(self.work, task, self.num_buckets, self.dedup)

    def merge_duplicates(self, bits: int) -> dict:
        """... and the drops merged by bucket, before the held-out split and the counts."""
        return dedup.merge(self.work, bits, self.dedup)

    def select_heldout(self) -> dict:
        """The index stage without Beam, with a held-out split: first its selection (``heldout.write_thresholds``)."""
        return heldout.write_thresholds(self.work, self.heldout, self.seed)

    def split_buckets(self, lo: int, hi: int, selection: dict) -> list[dict]:
        """... then each bucket's held-out documents into the evaluation store (``heldout.split_bucket``) ..."""
        return [heldout.split_bucket(self.work, bucket, selection, self.vocab_size) for bucket in range(lo, hi)]

    def write_split(self, results: list[dict]) -> None:
        """... and their text hashes, before the buckets are counted (``heldout.write_split``)."""
        heldout.write_split(self.work, results, self.instance_cfg)

    def count_buckets(self, lo: int, hi: int) -> list[tuple]:
        """The index stage without Beam, first half: (bucket, documents, duplicate ids) of buckets ``[lo, hi)``
        (after a held-out split, without its text: ``heldout.count_training``)."""
        if self.heldout.enabled:
            held_out = heldout.read_text_hashes(self.work)
            return [heldout.count_training(self.work, bucket, held_out) for bucket in range(lo, hi)]
        return [docstore.bucket_count(self.work, bucket, dedup.dropped(self.work, bucket)) for bucket in range(lo, hi)]

    def write_index(self, counts: list[tuple]) -> None:
        """The index stage without Beam, second half: every bucket's counts -> the corpus index."""
        index_stage.write_index(counts, self.work, self.num_buckets, self.instance_cfg, self.multilingual,
                                self.mixture)

    # Stage 3: instances (after the index)
    def instances(self, part: int, lot: handoff.Lot | None) -> beam.PTransform:
        """Units (``instance_units``) -> part ``part``'s pieces of instances: pairs, or packed rows."""
        create = (pairs_stage.CreateInstances if self.instance_cfg.kind == "pairs"
                  else packed_stage.CreatePackedInstances)
        return create(self.tokenizer_uri, self.work, self.instance_cfg, self.seed, part, self.vocab_size, self.mask_id,
                      spread=lot is None, provenance=self.output_cfg.provenance, lot=lot)

    # Stage 4: shards
    def shards(self, lot: handoff.Lot | None) -> shards_stage.WriteShards:
        """Anything -> after it, the shards."""
        return shards_stage.WriteShards(self.work, self.staging, self.output_cfg, self.output_schema,
                                        spread=lot is None)

    def plan_shards(self) -> int:
        """The shards stage without Beam, first half: the shard plan; returns the number of shards."""
        return len(shards_stage.plan_shards(self.work, self.output_cfg))

    def write_shard(self, shard: int) -> str:
        """The shards stage without Beam, second half: one shard; returns its name."""
        return shards_stage.write_shard(self.work, self.staging, shard, self.output_schema)


__all__ = ["Plan", "bucket_bits_for", "resolve_inputs"]
