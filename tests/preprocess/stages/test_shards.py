"""preprocess.stages.shards: the shard plan read from the pieces' metadata, and what it refuses."""
from __future__ import annotations

import pytest

from common import storage
from common.preprocess_config import OutputConfig
from preprocess.layout import INDEX_NAME, SHARD_PLAN_NAME
from preprocess.stages import shards


def _piece_meta(work: str, transport: int, part: int, groups: list[list[int]], group_bits: int = 4,
                transport_bits: int = 2) -> None:
    storage.write_json(f"{work}/pieces/t{transport:06d}/p{part:04d}.json",
                       {"rows": sum(n for _, n in groups), "groups": groups, "group_bits": group_bits,
                        "transport_bits": transport_bits, "stats": {}})


def _work(tmp_path, planned: int) -> str:
    work = str(tmp_path / "work")
    storage.write_json(f"{work}/{INDEX_NAME}", {"bucket_offsets": [0, 1], "group_bits": 4})
    storage.write_json(f"{work}/planned/b000000.json", {"instances": planned})
    return work


def test_the_plan_counts_each_groups_rows_over_the_parts_and_says_where_the_pieces_are(tmp_path):
    work = _work(tmp_path, planned=60)
    _piece_meta(work, 0, 0, [[0, 10], [3, 5]])
    _piece_meta(work, 0, 1, [[1, 7], [3, 8]])
    _piece_meta(work, 3, 0, [[12, 20], [15, 10]])
    assert shards.plan_shards(work, OutputConfig(num_shards=2)) == [0, 1]
    plan = storage.read_json(f"{work}/{SHARD_PLAN_NAME}")
    assert plan["group_rows"] == [10, 7, 0, 13] + [0] * 8 + [20, 0, 0, 10]
    assert plan["num_shards"] == 2 and plan["transport_shift"] == 2


def test_pieces_of_two_layouts_or_lost_rows_publish_nothing(tmp_path):
    work = _work(tmp_path, planned=25)
    _piece_meta(work, 0, 0, [[0, 10]])
    _piece_meta(work, 1, 1, [[1, 15]], transport_bits=4)  # a part cut by another version's transport groups
    with pytest.raises(RuntimeError, match="different layouts.*rerun the instances step"):
        shards.plan_shards(work, OutputConfig())
    # A part written by the version before transport groups: one piece per group, no layout in its metadata.
    storage.remove_tree(f"{work}/pieces/t000001")
    storage.write_json(f"{work}/pieces/g000001/p0001.json", {"rows": 15, "stats": {}})
    with pytest.raises(RuntimeError, match=r"different layouts \(\[\(4, 2\), \(None, None\)\].*rerun"):
        shards.plan_shards(work, OutputConfig())
    storage.remove_tree(f"{work}/pieces")
    _piece_meta(work, 0, 0, [[0, 10]])
    with pytest.raises(RuntimeError, match="25 instances were planned but 10 written"):
        shards.plan_shards(work, OutputConfig())
