"""Vectorised finalisation of BERT instances: truncation, [CLS] A [SEP] B [SEP] assembly, static masking.

Randomness comes from a counter-based generator: the j-th random number of stream s for an instance
with key k is ``splitmix64(mix(k ^ s) + j * golden)``. Each instance's draws depend only on its own
key, so results do not depend on how instances are batched, which worker runs them, or in which order,
while numpy does the work for a whole batch at once. The distributions are the reference recipe's:
``truncate_seq_pair`` trims the longer segment one token at a time from a random end (the number of
front trims of a side is then Binomial(trims, 1/2), drawn here as the popcount of random bits), and
masking picks ``num_to_predict`` positions uniformly without replacement, then 80% [MASK] / 10% random
token / 10% unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.preprocess_config import InstanceConfig
from preprocess.instances import MaskingVocab

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
STREAM_B_START, STREAM_TRIM_A, STREAM_TRIM_B, STREAM_POSITIONS, STREAM_DECISION, STREAM_REPLACEMENT = range(1, 7)


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
    return _bits_from_base(_stream_base(keys, stream), counters)


def _stream_base(keys: np.ndarray, stream: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _mix(np.asarray(keys, np.uint64) ^ np.uint64((stream * 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF))


def _bits_from_base(base: np.ndarray, counters: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _mix(base + (np.asarray(counters, np.uint64) + np.uint64(1)) * _GOLDEN)


def row_random_bits(keys: np.ndarray, stream: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``random_bits(keys[rows], stream, cols)``, mixing each row's key once instead of once per position."""
    return _bits_from_base(_stream_base(keys, stream)[rows], cols)


def random_uniform(keys: np.ndarray, stream: int, counters: np.ndarray) -> np.ndarray:
    """Doubles in [0, 1) from ``random_bits``."""
    return _uniform(random_bits(keys, stream, counters))


def _uniform(bits: np.ndarray) -> np.ndarray:
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


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
    """Concatenation of ``arange(s, s + n)`` for every (s, n)."""
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    row_starts = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, np.int64) - row_starts, lengths) + np.arange(total)


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


def finalize_batch(pool: np.ndarray, a_ranges: np.ndarray, b_ranges: np.ndarray, keys: np.ndarray,
                   cfg: InstanceConfig, vocab: MaskingVocab) -> FinalizedBatch:
    """Build masked instances from token ranges of ``pool``.

    Args:
        pool: token ids the ranges index into; every A and B segment is a slice of it.
        a_ranges, b_ranges: int64 arrays of shape (n, 2), half-open ``[start, end)`` before truncation.
        keys: uint64 per instance; all of its randomness derives from it.
    """
    dtype = pool.dtype
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
    # Column c of a row reads A's token c-1 up to [SEP], then B's; the cells past the row's end read the pool's
    # zero padding (never used), and [CLS]/[SEP] are written over their columns.
    width = int(lengths.max())
    cols = np.arange(width)[None, :]
    rows = np.arange(len(lengths))
    pool = np.concatenate([pool, np.zeros(width + 1, dtype=dtype)])
    tokens = pool[np.where(cols <= len_a[:, None], (a0 - 1)[:, None], (b0 - len_a - 2)[:, None]) + cols]
    valid = cols < lengths[:, None]
    separators = [(rows, len_a + 1), (rows, lengths - 1)]
    tokens[:, 0] = vocab.cls_id
    for columns in separators:
        tokens[columns] = vocab.sep_id

    never_mask = np.zeros(len(vocab.is_continuation), dtype=bool)
    never_mask[list(vocab.never_mask_ids)] = True
    candidate = valid & ~never_mask[tokens]
    candidate[:, 0] = False
    for columns in separators:
        candidate[columns] = False
    num_to_predict = np.minimum(cfg.max_predictions_per_seq,
                                np.maximum(1, np.rint(lengths * cfg.masked_lm_prob).astype(np.int64)))
    if cfg.whole_word_mask:
        rows_flat, cols_flat = np.nonzero(valid)
        row_starts = np.cumsum(lengths) - lengths
        chosen = np.zeros_like(valid)
        chosen[valid] = _choose_whole_words(tokens[valid], candidate[valid], rows_flat, cols_flat, row_starts,
                                            lengths, num_to_predict, keys, vocab)
    else:
        chosen = _choose_positions(candidate, num_to_predict, keys)

    chosen_rows, chosen_cols = np.nonzero(chosen)  # row-major: ascending columns within a row
    labels = tokens[chosen_rows, chosen_cols]
    decision = _uniform(row_random_bits(keys, STREAM_DECISION, chosen_rows, chosen_cols))
    replacement = vocab.replacement_ids[(_uniform(row_random_bits(keys, STREAM_REPLACEMENT, chosen_rows, chosen_cols))
                                         * len(vocab.replacement_ids)).astype(np.int64)]
    shown = np.where(decision < 0.8, vocab.mask_id, np.where(decision < 0.9, labels, replacement))
    tokens[chosen_rows, chosen_cols] = shown.astype(dtype)
    return FinalizedBatch(
        input_ids=tokens[valid], lengths=lengths, segment_a_len=len_a + 2, masked_positions=chosen_cols,
        masked_counts=np.bincount(chosen_rows, minlength=len(lengths)), masked_labels=labels,
        truncated=(trim_a + trim_b) > 0)


def _choose_positions(candidate: np.ndarray, num_to_predict: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Uniformly random positions without replacement: per row, the candidates with the smallest random keys.

    A position's key is its 53-bit random number (the double ``random_uniform`` would give, scaled) with the
    column in the low bits, so keys are unique within a row and order as a stable sort of the doubles would.
    Each row's ``take`` smallest keys are found by a partial sort of its few smallest, not a sort of the row.

    Args:
        candidate: (rows, width) bool, the positions that may be chosen.
    """
    rows, width = candidate.shape
    cols = np.arange(width, dtype=np.uint64)[None, :]
    col_bits = max(1, width - 1).bit_length()
    score = _bits_from_base(_stream_base(keys, STREAM_POSITIONS)[:, None], cols)  # a fresh (rows, width) array
    score >>= np.uint64(11)
    score <<= np.uint64(col_bits)
    score |= cols
    never = np.uint64(0xFFFFFFFFFFFFFFFF)
    score[~candidate] = never
    take = np.minimum(num_to_predict, candidate.sum(axis=1))
    most = int(take.max(initial=0))
    if most == 0:
        return np.zeros_like(candidate)
    smallest = np.partition(score, most - 1, axis=1)[:, :most] if most < width else score.copy()
    smallest.sort(axis=1)
    threshold = smallest[np.arange(rows), np.maximum(take - 1, 0)]
    return (score <= threshold[:, None]) & candidate & (take > 0)[:, None]


def _choose_whole_words(tokens, candidate, rows, cols, row_starts, lengths, num_to_predict, keys, vocab):
    """The reference's whole-word rule: words in random order, skip one that would overflow, stop when full."""
    chosen = np.zeros(len(tokens), dtype=bool)
    continuation = vocab.is_continuation[tokens] & candidate
    word_keys = _uniform(row_random_bits(keys, STREAM_POSITIONS, rows, cols))
    for row in range(len(lengths)):
        start, end = int(row_starts[row]), int(row_starts[row] + lengths[row])
        groups: list[list[int]] = []
        for flat in range(start, end):
            if not candidate[flat]:
                continue
            if groups and groups[-1][-1] == flat - 1 and continuation[flat]:
                groups[-1].append(flat)
            else:
                groups.append([flat])
        groups.sort(key=lambda g: word_keys[g[0]])
        count, limit = 0, int(num_to_predict[row])
        for group in groups:
            if count >= limit:
                break
            if count + len(group) > limit:
                continue
            chosen[group] = True
            count += len(group)
    return chosen


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


def instance_keys(seed: int, doc_id: str, plans: list) -> InstanceKeys:
    """Keys of (duplicate, plan) pairs of one document, from a BLAKE2b of (seed, document, duplicate).

    ``order`` and ``tiebreak`` come from independent 64-bit halves, so two instances tie only if both collide.
    """
    import hashlib

    bases = {}
    for dupe in {d for d, _ in plans}:
        digest = hashlib.blake2b(f"{seed}\x1finstance\x1f{doc_id}\x1f{dupe}".encode(), digest_size=16).digest()
        bases[dupe] = (int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little"))
    first = np.asarray([bases[d][0] for d, _ in plans], np.uint64)
    second = np.asarray([bases[d][1] for d, _ in plans], np.uint64)
    index = np.asarray([p.index for _, p in plans], np.uint64)
    random = random_bits(first, 0, index)
    return InstanceKeys(random, random_bits(random, 7, np.zeros_like(index)), random_bits(second, 8, index))
