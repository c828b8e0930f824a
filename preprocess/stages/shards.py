"""The shards stage, after every piece is written: the shard plan (``layout.SHARD_PLAN_NAME``: rows per key-range
group over all parts, checked against what was planned), then the shards assembled from the pieces in parallel
(``preprocess.shards``), each with its manifest entry.
"""
from __future__ import annotations

import math

import apache_beam as beam
import pyarrow as pa

from common import storage
from common.preprocess_config import OutputConfig
from preprocess import shards
from preprocess.layout import INDEX_NAME, SHARD_PLAN_NAME
from preprocess.stages.barrier import Barrier, read_metas, spread


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
