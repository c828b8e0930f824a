"""Stable hashes and seeded RNGs: every random choice derives from (seed, stable key).

Python's ``hash()`` changes with PYTHONHASHSEED across worker processes, so it is never used for
anything that must be reproducible.
"""
from __future__ import annotations

import hashlib
import random

_SEPARATOR = "\x1f"


def stable_hash64(*parts: object) -> int:
    """An unsigned 64-bit hash of the parts' string forms, identical on every machine and process."""
    text = _SEPARATOR.join(str(part) for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def rng_for(seed: int, *key: object) -> random.Random:
    """A ``random.Random`` seeded from the run seed and a stable key (e.g. document id, duplicate index)."""
    return random.Random(stable_hash64(seed, *key))


def document_hash(doc_id: str) -> int:
    """Where a document lives in the document store; independent of the seed so stores can be reused."""
    return stable_hash64("doc", doc_id)
