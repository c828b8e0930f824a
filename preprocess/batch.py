"""Vectorised finalisation of BERT instances: truncation, [CLS] A [SEP] B [SEP] assembly, static masking (none
for ``masking: dynamic``).

Randomness comes from the counter-based generator of ``common.counter_rng``, keyed by each instance alone, so
results do not depend on how instances are batched, which worker runs them, or in which order, while numpy does
the work for a whole batch at once. The distributions are the reference recipe's: ``truncate_seq_pair`` trims the
longer segment one token at a time from a random end (the number of front trims of a side is then
Binomial(trims, 1/2), drawn here as the popcount of random bits); masking is ``common.masking``'s.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from common.counter_rng import random_bits, random_uniform
from common.masking import Masked, MaskingRecipe, MaskingVocab, mask_rows
from common.preprocess_config import InstanceConfig

STREAM_B_START, STREAM_TRIM_A, STREAM_TRIM_B = 1, 2, 3  # masking uses streams 4-6, 9 and 10 (common.masking)


def truncation_counts(len_a: np.ndarray, len_b: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens ``truncate_seq_pair`` removes from A and from B: the longer side until they are equal, then B, A, …"""
    excess = np.maximum(len_a + len_b - max_tokens, 0)
    first = np.minimum(excess, np.abs(len_a - len_b))
    rest = excess - first
    a_longer = len_a > len_b
    return np.where(a_longer, first, 0) + rest // 2, np.where(a_longer, 0, first) + (rest + 1) // 2


def _front_trims(keys: np.ndarray, stream: int, trims: np.ndarray) -> np.ndarray:
    """Binomial(trims, 1/2) per instance: how many of the removed tokens come off the front."""
    words = int(max(1, -(-int(trims.max(initial=0)) // 64)))
    bits = random_bits(keys[:, None], stream, np.arange(words)[None, :])
    full = trims[:, None] // 64
    partial = trims[:, None] % 64
    index = np.arange(words)[None, :]
    masks = np.where(index < full, np.uint64(0xFFFFFFFFFFFFFFFF),
                     np.where(index == full, (np.uint64(1) << partial.astype(np.uint64)) - np.uint64(1), np.uint64(0)))
    return np.bitwise_count(bits & masks).sum(axis=1).astype(np.int64)


def ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for every (s, n).

    A running sum of steps: 1 within a range, a jump to its start at each range's first position (two passes over
    the output, where repeating each start and adding an arange took three and a slower repeat)."""
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    present = lengths > 0
    starts, lengths = np.asarray(starts, np.int64)[present], lengths[present]
    steps = np.ones(total, np.int64)
    steps[0] = starts[0]
    steps[(np.cumsum(lengths) - lengths)[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(steps, out=steps)


@dataclass
class FinalizedBatch:
    """Ragged columns of finished instances, in input order."""

    input_ids: np.ndarray          # flat, all rows
    lengths: np.ndarray            # tokens per row
    segment_a_len: np.ndarray
    masked_positions: np.ndarray   # flat, ascending within a row
    masked_counts: np.ndarray
    masked_labels: np.ndarray      # flat
    truncated: np.ndarray
    doc_starts: np.ndarray | None = None   # packed rows only: flat, each row's document blocks' first columns
    doc_counts: np.ndarray | None = None   # packed rows only: blocks per row


def finalize_batch(pool: np.ndarray, a_ranges: np.ndarray, b_ranges: np.ndarray, keys: np.ndarray,
                   cfg: InstanceConfig, vocab: MaskingVocab) -> FinalizedBatch:
    """Build masked instances from token ranges of ``pool``.

    Args:
        pool: token ids the ranges index into; every A and B segment is a slice of it.
        a_ranges, b_ranges: int64 arrays of shape (n, 2), half-open ``[start, end)`` before truncation.
        keys: uint64 per instance; all of its randomness derives from it.
    """
    a0, a1 = a_ranges[:, 0].astype(np.int64), a_ranges[:, 1].astype(np.int64)
    b0, b1 = b_ranges[:, 0].astype(np.int64), b_ranges[:, 1].astype(np.int64)
    trim_a, trim_b = truncation_counts(a1 - a0, b1 - b0, cfg.max_seq_length - 3)
    front_a, front_b = _front_trims(keys, STREAM_TRIM_A, trim_a), _front_trims(keys, STREAM_TRIM_B, trim_b)
    a0, a1 = a0 + front_a, a1 - (trim_a - front_a)
    b0, b1 = b0 + front_b, b1 - (trim_b - front_b)
    len_a, len_b = a1 - a0, b1 - b0
    if (len_a < 1).any() or (len_b < 1).any():
        raise ValueError("empty segment: documents must not contain empty sentences")
    lengths = len_a + len_b + 3
    # Rows as a dense (n, width) matrix: a few whole-matrix passes instead of ragged gathers and scatters.
    # Column c of a row reads A's token c-1 up to [SEP], then B's; [CLS]/[SEP] are written over their columns, and
    # the cells past the row's end (never used) read whatever token the index is clipped to: the pool is not copied.
    width = int(lengths.max())
    cols = np.arange(width)[None, :]
    rows = np.arange(len(lengths))
    at = np.where(cols <= len_a[:, None], (a0 - 1)[:, None], (b0 - len_a - 2)[:, None])
    at += cols  # in place: one (n, width) index matrix, not two
    tokens = pool.take(at, mode="clip")
    valid = cols < lengths[:, None]
    separators = [(rows, len_a + 1), (rows, lengths - 1)]
    tokens[:, 0] = vocab.cls_id
    for columns in separators:
        tokens[columns] = vocab.sep_id

    candidate = mask_candidates(tokens, valid, vocab)
    candidate[:, 0] = False
    for columns in separators:
        candidate[columns] = False
    masked = mask_instances(tokens, candidate, lengths, keys, cfg, vocab)
    return FinalizedBatch(
        input_ids=tokens[valid], lengths=lengths, segment_a_len=len_a + 2, masked_positions=masked.cols,
        masked_counts=np.bincount(masked.rows, minlength=len(lengths)), masked_labels=masked.labels,
        truncated=(trim_a + trim_b) > 0)


def mask_candidates(tokens: np.ndarray, valid: np.ndarray, vocab: MaskingVocab) -> np.ndarray:
    """The positions masking may choose: every token of the row but the special ones ([CLS], [SEP], …)."""
    never_mask = np.zeros(len(vocab.is_continuation), dtype=bool)
    never_mask[list(vocab.never_mask_ids)] = True
    return valid & ~never_mask[tokens]


def mask_instances(tokens: np.ndarray, candidate: np.ndarray, lengths: np.ndarray, keys: np.ndarray,
                   cfg: InstanceConfig, vocab: MaskingVocab) -> Masked:
    """The static masks of a batch of rows (``common.masking.mask_rows``; ``tokens`` changed in place), or none for
    ``masking: dynamic``: the rows are stored unmasked and the pretraining loader masks them anew every epoch."""
    if cfg.masking == "dynamic":
        none = np.zeros(0, np.int64)
        return Masked(rows=none, cols=none, labels=np.zeros(0, tokens.dtype))
    return mask_rows(tokens, candidate, lengths, keys, masking_recipe(cfg), vocab)


def masking_recipe(cfg: InstanceConfig) -> MaskingRecipe:
    return MaskingRecipe(mode=cfg.mask_unit, rate=cfg.masked_lm_prob, max_predictions=cfg.max_predictions_per_seq,
                         mask_fraction=cfg.mask_token_fraction, random_fraction=cfg.random_token_fraction)


def random_segments(boundaries: np.ndarray, first_sentence: np.ndarray, end_sentence: np.ndarray,
                    target_b_length: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """A random B for each instance: from a random sentence of its target document until the target length.

    Args:
        boundaries: token offsets of sentence starts of consecutive documents, and the end (strictly increasing).
        first_sentence, end_sentence: each target document's sentences, ``[first, end)`` indices of boundaries.
    Returns:
        (n, 2) ``[start, end)`` token offsets, in the coordinates of ``boundaries``.
    """
    starts = random_uniform(keys, STREAM_B_START, np.zeros(len(keys), np.uint64))
    first_sentence = np.asarray(first_sentence, np.int64)
    sentences = np.asarray(end_sentence, np.int64) - first_sentence
    first = first_sentence + (starts * sentences).astype(np.int64)
    # The first sentence end that reaches the target, else the document's end.
    want = boundaries[first] + np.maximum(np.asarray(target_b_length, np.int64), 1)
    last = np.minimum(np.maximum(np.searchsorted(boundaries, want, side="left"), first + 1), first_sentence + sentences)
    return np.stack([boundaries[first], boundaries[last]], axis=1)


@dataclass
class InstanceKeys:
    """Per-instance uint64 keys: ``random`` drives its draws, ``order``/``tiebreak`` place it in the shuffle."""

    random: np.ndarray
    order: np.ndarray
    tiebreak: np.ndarray

    def take(self, rows: np.ndarray) -> "InstanceKeys":
        return InstanceKeys(self.random[rows], self.order[rows], self.tiebreak[rows])

    @staticmethod
    def concat(parts: list["InstanceKeys"]) -> "InstanceKeys":
        return InstanceKeys(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("random", "order", "tiebreak")))


def instance_keys(seed: int, runs: list[tuple[str, int]], counts: Sequence[int], index: np.ndarray) -> InstanceKeys:
    """Keys of instances planned in runs, one run per (document, duplicate): ``counts[i]`` instances of run ``i``
    after those of the runs before it, each with its ``index`` within its run. A run's keys come from a BLAKE2b of
    (seed, document, duplicate); ``order`` and ``tiebreak`` from independent 64-bit halves, so two instances tie
    only if both collide.
    """
    bases = np.asarray([key_bases(seed, doc_id, dupe) for doc_id, dupe in runs], np.uint64).reshape(-1, 2)
    return keys_from_bases(np.repeat(bases[:, 0], counts), np.repeat(bases[:, 1], counts), index)


def key_bases(seed: int, unit: str, dupe: int) -> tuple[int, int]:
    """The two 64-bit halves of a BLAKE2b of (seed, unit, duplicate): a unit is a document, or a packing stream."""
    digest = hashlib.blake2b(f"{seed}\x1finstance\x1f{unit}\x1f{dupe}".encode(), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


def keys_from_bases(first: np.ndarray, second: np.ndarray, index: np.ndarray) -> InstanceKeys:
    """The keys of instance ``index`` of the units whose ``key_bases`` are (first, second)."""
    index = np.asarray(index, np.uint64)
    random = random_bits(first, 0, index)
    return InstanceKeys(random, random_bits(random, 7, np.zeros_like(index)), random_bits(second, 8, index))
