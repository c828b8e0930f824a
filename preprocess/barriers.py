"""The barrier stages: run-wide facts computed inside the pipeline and handed on through small files.

Instance creation needs the corpus index (every bucket's document count, so documents have global
indices) and shard assembly needs every group's row count. Both are computed after a barrier (a
single-key GroupByKey that completes only when everything upstream has), written as JSON under the
work directory, and read by the next stage's DoFns. So the whole job can run as one Beam pipeline, or
as several (one per part) that meet at the same files, on any runner and without side inputs.
"""
from __future__ import annotations

import math

import apache_beam as beam
import pyarrow as pa

from common import storage
from common.errors import InputError
from common.preprocess_config import InstanceConfig, OutputConfig
from preprocess import docstore, packing, shards
from preprocess.file_dofns import CountBucket
from preprocess.transforms import INDEX_NAME, unit_shift

SHARD_PLAN_NAME = "shard_plan.json"
ROWS_PER_GROUP = 16384  # instances per key-range group (bounds what one shard writer sorts)
ROWS_PER_UNIT = 65536   # instances per unit of the instance stage (bounds what one of its DoFns holds at once)


class Barrier(beam.PTransform):
    """One element, emitted only after every element of the input has been produced."""

    def expand(self, pcoll):
        return (pcoll | "One" >> beam.Map(lambda _: (0, None)) | "Wait" >> beam.GroupByKey()
                | "Done" >> beam.Map(lambda _: None))


def bits_for(count: float) -> int:
    return max(0, math.ceil(math.log2(max(count, 1))))


def bucket_ranges(num_buckets: int, slices: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` bucket ranges that split ``num_buckets`` into ``slices`` contiguous parts."""
    return [(i * num_buckets // slices, (i + 1) * num_buckets // slices) for i in range(slices)]


def read_metas(prefix: str) -> dict[str, dict]:
    return {uri: storage.read_json(uri) for uri in storage.list_files(prefix) if uri.endswith(".json")}


def write_index(rows, work: str, num_buckets: int, cfg: InstanceConfig) -> list[int]:
    """Bucket offsets (global document indices), corpus counts and the group layout -> index.json."""
    counts = {bucket: (count, duplicates) for bucket, count, duplicates in rows}
    offsets = [0]
    for bucket in range(num_buckets):
        offsets.append(offsets[-1] + counts.get(bucket, (0, []))[0])
    documents = docstore.add_counts(list(read_metas(storage.join(work, docstore.COUNTS_DIR)).values()))
    corpus = {"sentences": documents["sentences"], "tokens": documents["tokens"]}
    needed = 2 if cfg.sentence_objective == "nsp" else 1  # a random next segment comes from another document
    if offsets[-1] < needed:
        raise InputError(f"only {offsets[-1]} usable document(s) in the input; "
                         f"{'next-sentence prediction needs at least 2' if needed == 2 else 'nothing to build'} "
                         "(check the inputs and the sources.min_document_* settings)")
    estimated_rows = corpus["tokens"] * cfg.dupe_factor / max(1, cfg.max_seq_length - 3)
    index = {"bucket_offsets": offsets, "group_bits": min(20, bits_for(estimated_rows / ROWS_PER_GROUP)),
             "corpus": corpus, "counts": sorted([b, c, d] for b, (c, d) in counts.items())}
    if cfg.kind == "full_sentences":
        index["stream_bits"] = packing.stream_bits_for(corpus["tokens"])  # the corpus's size alone chooses it
    else:  # units: runs of buckets, so that the stage's elements grow with the input alone
        index["unit_bits"] = min(num_buckets.bit_length() - 1, bits_for(estimated_rows / ROWS_PER_UNIT))
    storage.write_json(storage.join(work, INDEX_NAME), index)
    return instance_units(index, cfg)


def instance_units(index: dict, cfg: InstanceConfig) -> list[int]:
    """What the instance stage works on, from the corpus index: the units (runs of document buckets,
    ``transforms.unit_buckets``) that hold documents, or for ``full_sentences`` the packing streams that have
    documents (``preprocess.packing``)."""
    offsets = index["bucket_offsets"]
    non_empty = [bucket for bucket in range(len(offsets) - 1) if offsets[bucket + 1] > offsets[bucket]]
    if cfg.kind != "full_sentences":
        return sorted({bucket >> unit_shift(index) for bucket in non_empty})
    bucket_bits = (len(offsets) - 1).bit_length() - 1
    stream_bits = index["stream_bits"]
    return [stream for stream in range(1 << stream_bits)
            if any(offsets[b + 1] > offsets[b] for b in packing.stream_buckets(stream, stream_bits, bucket_bits))]


def first_bucket(unit: int, index: dict, cfg: InstanceConfig) -> int:
    """The document bucket an instance-stage unit starts at: the slice of buckets that holds it runs it."""
    if cfg.kind != "full_sentences":
        return unit << unit_shift(index)
    bucket_bits = (len(index["bucket_offsets"]) - 1).bit_length() - 1
    return packing.stream_buckets(unit, index["stream_bits"], bucket_bits)[0]


def spread(pcoll, label: str, enabled: bool):
    """``pcoll`` redistributed over the runner's workers (a Reshuffle), or as it is where ``enabled`` is False:
    a runner with one worker in this process, where a Reshuffle only costs time (every element is encoded,
    buffered and decoded; the five of a one-process run were 0.2 CPU-s of its fixed cost on the sample corpus)."""
    return pcoll | label >> beam.Reshuffle() if enabled else pcoll


class IndexCorpus(beam.PTransform):
    """After the document store is complete: count every bucket, write the index, emit non-empty buckets."""

    def __init__(self, work: str, num_buckets: int, cfg: InstanceConfig, spread: bool = True):
        super().__init__()
        self._work, self._num_buckets, self._cfg, self._spread = work, num_buckets, cfg, spread

    def expand(self, trigger):
        work, num_buckets, cfg = self._work, self._num_buckets, self._cfg
        buckets = trigger | "AfterDocuments" >> Barrier() | "Buckets" >> beam.FlatMap(lambda _: range(num_buckets))
        return (spread(buckets, "SpreadBuckets", self._spread)
                | "Count" >> beam.ParDo(CountBucket(work))
                | "AllCounts" >> beam.Map(lambda row: (0, row)) | "Collect" >> beam.GroupByKey()
                | "WriteIndex" >> beam.FlatMap(lambda kv: write_index(kv[1], work, num_buckets, cfg)))


def plan_shards(work: str, cfg: OutputConfig) -> list[int]:
    """Rows per key-range group over all parts, and where their pieces are -> shard_plan.json; checks nothing was
    lost on the way."""
    group_bits = storage.read_json(storage.join(work, INDEX_NAME))["group_bits"]
    group_rows = [0] * (1 << group_bits)
    metas = list(read_metas(storage.join(work, "pieces")).values())
    layouts = {(meta.get("group_bits"), meta.get("transport_bits")) for meta in metas}  # None: an older version's
    if len(layouts) > 1 or any(bits != group_bits for bits, _ in layouts):
        raise RuntimeError(f"the pieces under {storage.join(work, 'pieces')} were cut by different layouts "
                           f"({sorted(layouts, key=str)}, the index has {group_bits} group bits): they come from "
                           "different runs or versions, so nothing is published; rerun the instances step of every "
                           "part")
    for meta in metas:
        for group, rows in meta["groups"]:
            group_rows[group] += rows
    transport_shift = group_bits - next(iter(layouts))[1] if layouts else 0
    total = sum(group_rows)
    planned = sum(m["instances"] for m in read_metas(storage.join(work, "planned")).values())
    if planned != total:
        raise RuntimeError(f"{planned} instances were planned but {total} written: the runner lost or "
                           "duplicated elements, so nothing is published")
    num_shards = cfg.num_shards or max(1, math.ceil(total / cfg.target_rows_per_shard))
    storage.write_json(storage.join(work, SHARD_PLAN_NAME), {"group_rows": group_rows, "num_shards": num_shards,
                                                             "transport_shift": transport_shift})
    return list(range(num_shards))


def write_shard(work: str, output_dir: str, shard: int, output_schema: pa.Schema) -> str:
    """Assemble shard ``shard`` of the shard plan and record its manifest entry; returns its name."""
    plan = storage.read_json(storage.join(work, SHARD_PLAN_NAME))
    entry = shards.assemble_shard(work, output_dir, shard, plan["num_shards"], plan["group_rows"], output_schema,
                                  transport_shift=plan["transport_shift"])
    storage.write_json(storage.join(work, "shards", f"s{shard:06d}.json"), entry)
    return entry["name"]


class WriteShards(beam.PTransform):
    """After every piece is written: plan the shards, then assemble them in parallel."""

    def __init__(self, work: str, output_dir: str, cfg: OutputConfig, output_schema: pa.Schema, spread: bool = True):
        super().__init__()
        self._args = (work, output_dir, cfg, output_schema)
        self._spread = spread

    def expand(self, trigger):
        work, output_dir, cfg, output_schema = self._args
        planned = trigger | "AfterPieces" >> Barrier() | "Plan" >> beam.FlatMap(lambda _: plan_shards(work, cfg))
        return (spread(planned, "SpreadShards", self._spread)
                | "Assemble" >> beam.Map(lambda shard: write_shard(work, output_dir, shard, output_schema)))
