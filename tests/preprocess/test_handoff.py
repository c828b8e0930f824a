"""Payloads handed between DoFns of one pipeline by reference, parked in the pipeline's lot."""
from __future__ import annotations

import pickle

import pytest

from preprocess import handoff


def test_a_payload_is_taken_back_once_and_as_itself():
    payload = {"tokens": list(range(5))}
    with handoff.open_lot() as lot:
        ref = handoff.send(payload, lot)
        assert isinstance(ref, handoff.Ref) and handoff.receive(ref) is payload
        with pytest.raises(RuntimeError, match="taken twice"):
            handoff.receive(ref)


def test_without_a_lot_the_payload_travels_itself():
    payload = b"ipc bytes"
    assert handoff.send(payload, None) is payload
    assert handoff.receive(payload) is payload


def test_a_pickled_lot_and_ref_stay_the_same_lot_and_payload():
    # Beam pickles the DoFns that hold the lot and the elements that carry the refs, also in this process.
    with handoff.open_lot() as lot:
        copy = pickle.loads(pickle.dumps(lot))
        ref = pickle.loads(pickle.dumps(handoff.send("x", copy)))
        assert handoff.receive(ref) == "x"


def test_closing_a_lot_drops_its_payloads_and_leaves_other_lots_alone():
    with handoff.open_lot() as other:
        kept = handoff.send("kept", other)
        with handoff.open_lot() as lot:
            dropped = handoff.send("dropped", lot)
        with pytest.raises(RuntimeError, match="after its pipeline ended"):
            handoff.receive(dropped)
        assert handoff.receive(kept) == "kept"
    with pytest.raises(RuntimeError, match="not open in this process"):
        lot.park("late")
