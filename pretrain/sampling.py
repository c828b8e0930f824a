"""The order in which an epoch visits the rows of a dataset, computed a window at a time.

Pure functions of (number of rows, seed, epoch, global batch, window): no dataset, no ranks, no I/O.

* The preprocessing stage already shuffles rows globally (every shard is a random sample of the corpus
  in random order), so an epoch permutes *blocks* of ``BLOCK_ROWS`` consecutive rows, not single rows:
  a block is read with a few contiguous reads, where a row-level permutation makes every row a random
  read of a page, which a dataset larger than the page cache pays from disk. The block permutation is a
  keyed Feistel network with cycle walking, evaluated on the fly for any range of positions, so no rank
  holds an array with one entry per row (or per block). The rows after the last whole block (fewer than
  ``BLOCK_ROWS``) open every epoch.
* The epoch's row sequence is cut into windows of ``window_batches`` global batches. A window's rows are
  shuffled, sorted by length and cut into global batches (so a batch is padded only to its longest row,
  and rows of one block meet in a batch no more often than rows of equal length do), and the batches of
  the window are visited in a seeded random order. The end of the sequence that does not fill a global
  batch is left out of that epoch; the next epoch draws a new permutation.
* Everything derives from ``(seed, epoch)`` and ``(seed, epoch, window)`` through BLAKE2b, so every rank
  and every resumed run computes the same batches, whatever the number of ranks.

``ORDER_VERSION`` names this order. A data position saved by one order version cannot be resumed by
another: the same (epoch, batch) would name other samples.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from common.hashing import stable_hash64

ORDER_VERSION = 2  # 1: a full np.random permutation of the rows per epoch and a global shuffle of its batches
BLOCK_ROWS = 256  # rows read together: 75-300 KB of tokens at sequence lengths 128-512

_FEISTEL_ROUNDS = 6
_SLICE_ROWS = 1 << 18


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijective avalanche of uint64 values (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class Permutation:
    """A seeded bijection of ``[0, size)`` that maps any array of positions to row ids without a table.

    A balanced Feistel network permutes ``[0, 4**half_bits)``, the smallest power of four that holds
    ``size``; values that land outside ``[0, size)`` are encrypted again (cycle walking), which keeps the
    map a bijection of ``[0, size)``. At most three quarters of the domain lies outside, so a position
    needs a few rounds of walking on average.
    """

    def __init__(self, size: int, seed: int):
        if size < 0:
            raise ValueError(f"a permutation of {size} elements")
        self.size = size
        self.half_bits = max(1, (max(1, size - 1).bit_length() + 1) // 2)
        self._mask = np.uint64((1 << self.half_bits) - 1)
        self._keys = [np.uint64(stable_hash64(seed, "feistel-round", r)) for r in range(_FEISTEL_ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half_bits)
        left, right = x >> shift, x & self._mask
        for key in self._keys:
            left, right = right, left ^ (_mix64(right ^ key) & self._mask)
        return (left << shift) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.size):
            raise IndexError(f"positions outside [0, {self.size})")
        out = self._encrypt(positions.astype(np.uint64))
        outside = np.flatnonzero(out >= np.uint64(self.size))
        while outside.size:
            out[outside] = self._encrypt(out[outside])
            outside = outside[out[outside] >= np.uint64(self.size)]
        return out.astype(np.int64)


class EpochOrder:
    """The global batches of one epoch, computed one window at a time (the current window is cached).

    ``lengths_of(rows)`` returns the token count of each row id; it is called once per window.
    """

    def __init__(self, num_rows: int, *, epoch: int, seed: int, global_batch: int, window_batches: int,
                 lengths_of: Callable[[np.ndarray], np.ndarray]):
        if global_batch < 1 or window_batches < 1:
            raise ValueError("global_batch and window_batches must be at least 1")
        self.num_batches = num_rows // global_batch
        self.epoch, self.seed = epoch, seed
        self.global_batch, self.window_batches = global_batch, window_batches
        self._lengths_of = lengths_of
        whole_blocks = num_rows // BLOCK_ROWS
        self._tail_start, self._tail_rows = whole_blocks * BLOCK_ROWS, num_rows - whole_blocks * BLOCK_ROWS
        self._blocks = Permutation(whole_blocks, stable_hash64(seed, "epoch", epoch))
        self._window_index, self._window = -1, None

    def __len__(self) -> int:
        return self.num_batches

    def batch(self, index: int) -> np.ndarray:
        """Row ids of global batch ``index`` of the epoch, sorted by length."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} of an epoch of {self.num_batches}")
        window, within = divmod(index, self.window_batches)
        if window != self._window_index:
            self._window, self._window_index = self._build_window(window), window
        return self._window[within]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Row ids at positions ``[start, stop)`` of the epoch's row sequence."""
        positions = np.arange(start, stop, dtype=np.int64)
        out = self._tail_start + positions  # the rows after the last whole block come first
        in_blocks = positions >= self._tail_rows
        if in_blocks.any():
            offset = positions[in_blocks] - self._tail_rows
            first, last = offset[0] // BLOCK_ROWS, offset[-1] // BLOCK_ROWS
            blocks = self._blocks(np.arange(first, last + 1, dtype=np.int64))
            out[in_blocks] = blocks[offset // BLOCK_ROWS - first] * BLOCK_ROWS + offset % BLOCK_ROWS
        return out

    def _build_window(self, window: int) -> np.ndarray:
        first = window * self.window_batches
        count = min(self.window_batches, self.num_batches - first)
        rows = self.rows(first * self.global_batch, (first + count) * self.global_batch)
        lengths = np.empty(len(rows), np.int32)
        for lo in range(0, len(rows), _SLICE_ROWS):  # in slices: the lookups' temporaries stay small
            lengths[lo:lo + _SLICE_ROWS] = self._lengths_of(rows[lo:lo + _SLICE_ROWS])
        shuffle = np.random.Generator(np.random.PCG64(stable_hash64(self.seed, "window", self.epoch, window)))
        mixed = shuffle.permutation(len(rows))
        rows, lengths = rows[mixed], lengths[mixed]
        batches = rows[np.argsort(lengths, kind="stable")].reshape(count, self.global_batch)
        return batches[shuffle.permutation(count)]


def epoch_batches(lengths: np.ndarray, *, epoch: int, seed: int, global_batch: int,
                  window_batches: int = 64) -> np.ndarray:
    """Every global batch of an epoch at once, shape (num_batches, global_batch): for tests and small data."""
    lengths = np.asarray(lengths)
    order = EpochOrder(len(lengths), epoch=epoch, seed=seed, global_batch=global_batch,
                       window_batches=window_batches, lengths_of=lambda rows: lengths[rows])
    if not len(order):
        return np.zeros((0, global_batch), np.int64)
    return np.stack([order.batch(b) for b in range(len(order))])


__all__ = ["BLOCK_ROWS", "EpochOrder", "ORDER_VERSION", "Permutation", "epoch_batches"]
