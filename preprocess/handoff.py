"""Large payloads handed between the DoFns of one process by reference, when the runner runs them all there.

Beam's in-memory runner encodes every element that crosses a GroupByKey, buffers it and decodes it again on the
other side, copying each byte several times: 65 MB through one GroupByKey cost 0.4 CPU-s more than small
elements, and the instance stage groups 43 MiB on the benchmark corpus. When the whole pipeline runs in this
process (the DirectRunner's in-memory mode, and the local pool's per-worker pipelines) the payload can stay where
it is: the producer parks it here and sends a small ``Ref`` through the GroupByKey, and the consumer takes it
back. Distributed runners get the payloads themselves.
"""
from __future__ import annotations

import itertools
import os
import threading

_parked: dict[tuple[int, int], object] = {}
_ids = itertools.count()
_lock = threading.Lock()  # a runner may run bundles on several threads of this process


class Ref:
    """Stands for a parked payload; it means something only in the process that parked it."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, int]):
        self.key = key

    def __reduce__(self):
        return Ref, (self.key,)


def send(payload, by_reference: bool):
    """``payload`` itself, or with ``by_reference`` a Ref to it (taken back once by ``receive``)."""
    if not by_reference:
        return payload
    with _lock:
        key = (os.getpid(), next(_ids))
        _parked[key] = payload
    return Ref(key)


def receive(item):
    """The payload ``item`` stands for (``item`` itself unless it is a Ref)."""
    if not isinstance(item, Ref):
        return item
    with _lock:
        payload = _parked.pop(item.key, _parked)
    if payload is _parked:
        raise RuntimeError(f"payload {item.key} was handed by reference to another process (or taken twice): "
                           "by-reference handoff is only for runners that run the whole pipeline in one process")
    return payload


def clear() -> int:
    """Forget payloads that no one took back (a pipeline that failed midway); returns how many."""
    with _lock:
        count = len(_parked)
        _parked.clear()
    return count
