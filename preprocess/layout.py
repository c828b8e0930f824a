"""The layout of a run's work directory, which every stage, the plan and the executors read alike: the names of the
small files the barrier stages write, and the arithmetic that cuts document buckets into instance-stage units, slices
and random-next join ranges, and key-range groups into transport groups.
"""
from __future__ import annotations

import math

INDEX_NAME = "index.json"  # written by the index stage: bucket offsets, group bits, corpus counts
SHARD_PLAN_NAME = "shard_plan.json"  # written by the shards stage: rows per key-range group, the number of shards
HELDOUT_SELECTION_NAME = "heldout_selection.json"  # with a held-out split, by the index stage: seed, key limits
HELDOUT_NAME = "heldout.json"  # then: the selection, the held-out documents by source and their text hashes
EVAL_DIR = "eval"  # the held-out split: its work directory under the run's, its shards' directory in the dataset

# Finished rows cross the ByGroup GroupByKey keyed by a transport group: a run of adjacent key-range groups, at most
# 2**TRANSPORT_GROUP_BITS of them, so a flush is cut into batches of FLUSH_ROWS >> TRANSPORT_GROUP_BITS rows on
# average, or more. Key-range groups are sized for the shard writers, so their number grows with the corpus; cut by
# them, a flush came as a row or two per batch at full scale (comparisons.full_scale_layout in bench/results).
# WritePieceGroup writes a transport group as one piece, its key-range groups one after the other.
TRANSPORT_GROUP_BITS = 9
# The random-next join is keyed by a range of target units, at most 2**JOIN_RANGE_BITS of them, for the same reason:
# a unit's requests cut by every target unit came a few rows each once units numbered in the thousands.
JOIN_RANGE_BITS = 7


def bits_for(count: float) -> int:
    return max(0, math.ceil(math.log2(max(count, 1))))


def bucket_ranges(num_buckets: int, slices: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` bucket ranges that split ``num_buckets`` into ``slices`` contiguous parts."""
    return [(i * num_buckets // slices, (i + 1) * num_buckets // slices) for i in range(slices)]


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


def transport_bits(group_bits: int, most: int) -> int:
    """Bits of the transport groups (runs of adjacent key-range groups; at most ``2**most``) that finished rows
    cross the instance stage's GroupByKey by (``TRANSPORT_GROUP_BITS``)."""
    return min(group_bits, most)
