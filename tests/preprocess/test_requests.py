"""preprocess.requests: random-next requests merged, cut by rows, and split by a key."""
from __future__ import annotations

import numpy as np

from preprocess.batch import InstanceKeys
from preprocess.requests import merge_requests, split_by, take_requests


def _requests(first: int, a_lengths: list[int]) -> dict:
    n = len(a_lengths)
    index = np.arange(first, first + n, dtype=np.uint64)
    return {"keys": InstanceKeys(random=index, order=index * 3, tiebreak=index * 5), "targets": np.arange(n) + first,
            "target_b_length": np.full(n, 7), "a_lengths": np.asarray(a_lengths),
            "a_tokens": np.concatenate([np.full(k, first + i) for i, k in enumerate(a_lengths)]),
            "doc_a": [f"doc{first + i}" for i in range(n)]}


def test_split_by_gives_each_values_indices_in_order():
    values = np.array([3, 1, 3, 0, 1, 3])
    assert [(int(v), rows.tolist()) for v, rows in split_by(values)] == [(0, [3]), (1, [1, 4]), (3, [0, 2, 5])]
    assert list(split_by(np.array([], np.int64))) == []


def test_taken_rows_keep_their_own_segment_a_tokens():
    merged = merge_requests([_requests(0, [2, 1]), _requests(10, [3, 0, 2])])
    assert merged["doc_a"] == ["doc0", "doc1", "doc10", "doc11", "doc12"]
    taken = take_requests(merged, np.array([4, 0, 2]))
    assert taken["a_tokens"].tolist() == [12, 12, 0, 0, 10, 10, 10]
    assert taken["a_lengths"].tolist() == [2, 2, 3] and taken["targets"].tolist() == [12, 0, 10]
    assert taken["keys"].order.tolist() == [36, 0, 30] and taken["doc_a"] == ["doc12", "doc0", "doc10"]
