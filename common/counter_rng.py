"""Counter-based random numbers: the j-th number of stream s for a row with key k is
``splitmix64(mix(k ^ s) + (j + 1) * golden)``.

Each row's draws depend only on its own key, so results do not depend on how rows are batched, which worker
or rank draws them, or in which order, while numpy does the work for a whole batch at once. Preprocessing
(static masking, truncation, random segments) and the pretraining loader (dynamic masking) share it.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place: every caller passes a fresh array (fewer temporaries of its size)."""
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def random_bits(keys: np.ndarray, stream: int, counters: np.ndarray) -> np.ndarray:
    """uint64 random numbers for (key, counter) pairs; ``keys`` and ``counters`` broadcast."""
    return bits_from_base(stream_base(keys, stream), counters)


def stream_base(keys: np.ndarray, stream: int) -> np.ndarray:
    """Each key mixed with the stream number: the per-row part of ``random_bits``, computed once per row."""
    with np.errstate(over="ignore"):
        return _mix(np.asarray(keys, np.uint64) ^ np.uint64((stream * 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF))


def bits_from_base(base: np.ndarray, counters: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _mix(base + (np.asarray(counters, np.uint64) + np.uint64(1)) * _GOLDEN)


def row_random_bits(keys: np.ndarray, stream: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``random_bits(keys[rows], stream, cols)``, mixing each row's key once instead of once per position."""
    return bits_from_base(stream_base(keys, stream)[rows], cols)


def random_uniform(keys: np.ndarray, stream: int, counters: np.ndarray) -> np.ndarray:
    """Doubles in [0, 1) from ``random_bits``."""
    return uniform(random_bits(keys, stream, counters))


def uniform(bits: np.ndarray) -> np.ndarray:
    """uint64 random bits -> doubles in [0, 1) (their top 53 bits)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


__all__ = ["bits_from_base", "random_bits", "random_uniform", "row_random_bits", "stream_base", "uniform"]
