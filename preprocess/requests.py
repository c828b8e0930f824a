"""Random-next requests: what crosses the instance stage's join, a row per instance whose segment B comes from
another document (its keys, the target document's global index, B's target length, segment A's tokens and, with
provenance, A's document id), merged and cut as whole arrays."""
from __future__ import annotations

import numpy as np

from preprocess.batch import InstanceKeys, ragged_arange


def split_by(values: np.ndarray):
    """(value, the indices where ``values`` holds it, in order) for each distinct value, in ascending order."""
    order = np.argsort(values, kind="stable")
    bounds = np.flatnonzero(np.diff(values[order])) + 1
    for rows in np.split(order, bounds) if len(order) else []:
        yield values[rows[0]], rows


def merge_requests(requests: list[dict]) -> dict:
    """Random-next requests (a row each: keys, target document, B's length, segment A's tokens) as one."""
    return {"keys": InstanceKeys.concat([r["keys"] for r in requests]),
            **{name: np.concatenate([r[name] for r in requests])
               for name in ("targets", "target_b_length", "a_tokens", "a_lengths")},
            "doc_a": None if requests[0]["doc_a"] is None else [doc for r in requests for doc in r["doc_a"]]}


def take_requests(requests: dict, rows: np.ndarray) -> dict:
    """The ``rows`` of merged requests."""
    lengths = requests["a_lengths"]
    return {"keys": requests["keys"].take(rows), "targets": requests["targets"][rows],
            "target_b_length": requests["target_b_length"][rows], "a_lengths": lengths[rows],
            "a_tokens": requests["a_tokens"][ragged_arange((np.cumsum(lengths) - lengths)[rows], lengths[rows])],
            "doc_a": None if requests["doc_a"] is None else [requests["doc_a"][i] for i in rows.tolist()]}


__all__ = ["merge_requests", "split_by", "take_requests"]
