"""Payloads handed between DoFns of one process by reference."""
from __future__ import annotations

import pickle

import pytest

from preprocess import handoff


def test_a_payload_is_taken_back_once_and_as_itself():
    payload = {"tokens": list(range(5))}
    ref = handoff.send(payload, by_reference=True)
    assert isinstance(ref, handoff.Ref) and handoff.receive(ref) is payload
    with pytest.raises(RuntimeError, match="taken twice"):
        handoff.receive(ref)


def test_without_reference_the_payload_travels_itself():
    payload = b"ipc bytes"
    assert handoff.send(payload, by_reference=False) is payload
    assert handoff.receive(payload) is payload


def test_a_ref_that_crossed_to_a_process_without_the_payload_fails_clearly():
    ref = pickle.loads(pickle.dumps(handoff.send("x", by_reference=True)))
    assert handoff.clear() == 1  # as in another process: nothing parked here
    with pytest.raises(RuntimeError, match="another process"):
        handoff.receive(ref)
