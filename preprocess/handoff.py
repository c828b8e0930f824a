"""Large payloads handed between the DoFns of one pipeline by reference, when the whole pipeline runs in this process.

Beam's in-memory runner encodes every element that crosses a GroupByKey, buffers it and decodes it again on the
other side, copying each byte several times; the instance stage's batches and requests are most of the bytes of a
run (what handing them over by reference saves: ``bench/results/preprocess-handoff-cpu2-x86_64.json``). When the
whole pipeline runs in this process (the DirectRunner's in-memory mode, the local pool's per-worker pipelines) the
payload can stay where it is: the producer parks it and sends a small ``Ref`` through the GroupByKey, and the
consumer takes it back. Distributed runners get the payloads themselves.

The parking place is process-global by necessity: Beam pickles every DoFn, also the ones it runs in this process,
so the DoFns of one pipeline can meet only at a place the process holds. Each pipeline gets a lot of its own
(``open_lot``, used by ``preprocess.executors.beamrun.run_beam``), closed when the pipeline ends: what a failed pipeline
left behind is dropped, and pipelines running side by side never see each other's payloads.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterator

_lots: dict[tuple[int, int], dict[int, object]] = {}  # open lots of this process (see the module docstring)
_ids = itertools.count()
_lock = threading.Lock()  # a runner may run bundles on several threads of this process


class Ref:
    """Stands for a parked payload; it means something only in the process that parked it."""

    __slots__ = ("lot", "number")

    def __init__(self, lot: tuple[int, int], number: int):
        self.lot, self.number = lot, number

    def __reduce__(self):
        return Ref, (self.lot, self.number)


class Lot:
    """Where one pipeline parks its payloads. Pickled into the pipeline's DoFns, it stays this lot by its key."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, int]):
        self.key = key

    def __reduce__(self):
        return Lot, (self.key,)

    def park(self, payload) -> Ref:
        with _lock:
            parked = _lots.get(self.key)
            if parked is None:
                raise RuntimeError(f"handoff lot {self.key} is not open in this process: by-reference handoff is "
                                   "only for pipelines that run entirely in the process that opened the lot")
            number = next(_ids)
            parked[number] = payload
        return Ref(self.key, number)


@contextlib.contextmanager
def open_lot() -> Iterator[Lot]:
    """A lot for the payloads of one pipeline, open while the pipeline runs; what is left in it is dropped."""
    key = (os.getpid(), next(_ids))
    with _lock:
        _lots[key] = {}
    try:
        yield Lot(key)
    finally:
        with _lock:
            _lots.pop(key, None)


def send(payload, lot: Lot | None):
    """``payload`` itself, or with a ``lot`` a Ref to it there (taken back once by ``receive``)."""
    return payload if lot is None else lot.park(payload)


def receive(item):
    """The payload ``item`` stands for (``item`` itself unless it is a Ref)."""
    if not isinstance(item, Ref):
        return item
    with _lock:
        payload = _lots.get(item.lot, {}).pop(item.number, _lots)
    if payload is _lots:
        raise RuntimeError(f"payload {item.number} of lot {item.lot} was handed by reference to another process "
                           "(or taken twice, or after its pipeline ended): by-reference handoff is only for "
                           "pipelines that run entirely in one process")
    return payload


__all__ = ["Lot", "Ref", "open_lot", "receive", "send"]
