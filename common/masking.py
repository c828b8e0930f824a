"""Masked-language-model masking: which positions a row predicts and what the model is shown there.

One implementation for both places masking happens: in preprocessing (static: the masks are stored in the
shards) and in the pretraining loader (dynamic: drawn again for every epoch). Rows are a dense
``(rows, width)`` token matrix; every random draw comes from ``common.counter_rng`` keyed by the row's own
key, so a row's masks do not depend on its batch, worker or rank.

Modes (``MaskingRecipe.mode``):

* ``token`` — positions uniformly at random without replacement (BERT);
* ``whole_word`` — whole words in random order, all of a word's pieces together, a word that would overflow
  the budget skipped (BERT's whole-word masking, as in google-research/bert);
* ``span`` — contiguous spans of whole words (SpanBERT, Joshi et al. 2020): a span's length in words is drawn
  from a geometric distribution (``span_p``) truncated to ``1..span_max_words`` and renormalised, as SpanBERT's
  code does (mean 3.8 words at 0.2 and 10, the paper's figure), its first word uniformly, until the budget is
  reached; a span is shown as a whole ([MASK], random tokens or unchanged, as one decision);
* ``ngram`` — n-grams of whole words (ALBERT, Lan et al. 2020, section 4.1): every word start is a candidate, in
  random order; each draws its length n in ``1..ngram_max`` words with p(n) proportional to 1/n (6/11, 3/11, 2/11
  at 3), renormalised over the lengths that fit before its run of words ends ([SEP], padding) as ALBERT's code does
  at the end of a row; an n-gram that would overflow the budget is shortened a word at a time, skipped if even its
  first word does not fit, and skipped if it overlaps one already chosen, as google-research/albert's
  ``create_masked_lm_predictions`` does. Unlike SpanBERT's spans, ALBERT's code draws the [MASK]/random/unchanged
  decision for each token of an n-gram separately, and so does this mode: per position, as ``token`` does. Two
  departures: an n-gram never crosses [SEP] (ALBERT's candidate list skips specials, so its n-grams can join the
  two segments), and its length draws come from the row's key (ALBERT's use numpy's unseeded global generator).
  With ``ngram_max`` 1 it is exactly ``whole_word``.

The budget of a row is ``rate`` of its tokens (at least 1), capped by ``max_predictions``; special tokens are
never chosen. A chosen position is shown as [MASK] with probability ``mask_fraction``, unchanged with
probability ``1 - mask_fraction - random_fraction``, and as a random token otherwise (80/10/10 by default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from common.counter_rng import bits_from_base, row_random_bits, stream_base, uniform
from common.objectives import MASK_UNITS

STREAM_POSITIONS, STREAM_DECISION, STREAM_REPLACEMENT, STREAM_SPANS, STREAM_NGRAMS = 4, 5, 6, 9, 10
MODES = MASK_UNITS


@dataclass(frozen=True)
class MaskingVocab:
    """What building and masking rows need to know about the vocabulary."""

    cls_id: int
    sep_id: int
    mask_id: int
    never_mask_ids: frozenset[int]     # special tokens: never chosen
    is_continuation: np.ndarray        # bool per id: continues the previous token's word (whole words, spans)
    replacement_ids: np.ndarray        # ids the "random token" share draws from (no specials)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> MaskingVocab:
        return cls(cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, mask_id=tokenizer.mask_id,
                   never_mask_ids=frozenset(tokenizer.special_ids.values()),
                   is_continuation=np.asarray(tokenizer.is_continuation, dtype=bool),
                   replacement_ids=np.asarray(tokenizer.replacement_ids, dtype=np.int64))


@dataclass(frozen=True)
class MaskingRecipe:
    mode: str = "token"
    rate: float = 0.15
    max_predictions: int = 20
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    span_p: float = 0.2
    span_max_words: int = 10
    ngram_max: int = 3                 # ALBERT's max_ngram

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"masking mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if not 0.0 <= self.rate <= 1.0 or self.max_predictions < 1:
            raise ValueError("the masking rate must be in [0, 1] and max_predictions >= 1")
        if min(self.mask_fraction, self.random_fraction) < 0 or self.mask_fraction + self.random_fraction > 1 + 1e-12:
            raise ValueError("mask_fraction and random_fraction must be >= 0 and add up to at most 1")
        if not 0.0 < self.span_p <= 1.0 or self.span_max_words < 1:
            raise ValueError("span_p must be in (0, 1] and span_max_words >= 1")
        if isinstance(self.ngram_max, bool) or not isinstance(self.ngram_max, int) or self.ngram_max < 1:
            raise ValueError(f"ngram_max must be an integer >= 1 (ALBERT: 3), got {self.ngram_max!r}")

    @property
    def unchanged_below(self) -> float:
        """Decisions below ``mask_fraction`` show [MASK], then up to this bound the token itself, then a random one.
        Rounded so that the default split compares exactly as 0.8 and 0.9 do."""
        return round(self.mask_fraction + (1.0 - self.mask_fraction - self.random_fraction), 12)

    def budget(self, lengths: np.ndarray) -> np.ndarray:
        """Positions to predict per row of ``lengths`` tokens (before the cap by the row's candidates)."""
        return np.minimum(self.max_predictions, np.maximum(1, np.rint(lengths * self.rate).astype(np.int64)))


@dataclass
class Masked:
    rows: np.ndarray      # chosen positions, row-major (ascending columns within a row)
    cols: np.ndarray
    labels: np.ndarray    # the original ids there


def mask_rows(tokens: np.ndarray, candidate: np.ndarray, lengths: np.ndarray, keys: np.ndarray,
              recipe: MaskingRecipe, vocab: MaskingVocab) -> Masked:
    """Choose and apply the masks of every row of ``tokens`` (changed in place).

    Args:
        tokens: (rows, width) ids; cells past a row's length are ignored.
        candidate: (rows, width) bool, the positions that may be chosen (no specials, no padding).
        lengths: tokens per row (its budget is a share of them).
        keys: uint64 per row; all of its randomness derives from it.
    """
    budget = recipe.budget(np.asarray(lengths, np.int64))
    span_first = None
    if recipe.mode == "token":
        chosen = choose_positions(candidate, budget, keys)
    else:
        continuation = vocab.is_continuation[tokens] & candidate
        words = _words(candidate, continuation)
        if recipe.mode == "whole_word":
            chosen = _choose_whole_words(candidate, words, budget, keys)
        elif recipe.mode == "ngram":
            chosen = _choose_ngrams(candidate, words, budget, keys, recipe.ngram_max)
        else:
            chosen, span_first = _choose_spans(candidate, words, budget, keys, recipe)
    rows, cols = _cells(chosen)
    labels = tokens[rows, cols]
    decided_at = cols if span_first is None else span_first[rows, cols]
    decision = uniform(row_random_bits(keys, STREAM_DECISION, rows, decided_at))
    replacement = vocab.replacement_ids[(uniform(row_random_bits(keys, STREAM_REPLACEMENT, rows, cols))
                                         * len(vocab.replacement_ids)).astype(np.int64)]
    shown = np.where(decision < recipe.mask_fraction, vocab.mask_id,
                     np.where(decision < recipe.unchanged_below, labels, replacement))
    tokens[rows, cols] = shown.astype(tokens.dtype)
    return Masked(rows=rows, cols=cols, labels=labels)


def _cells(chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.nonzero`` of a 2-D boolean matrix (rows, then columns, row-major), from the flat indices: numpy's
    2-D nonzero costs several times more."""
    flat = np.flatnonzero(chosen)
    rows = flat // chosen.shape[1]
    return rows, flat - rows * chosen.shape[1]


def choose_positions(candidate: np.ndarray, budget: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Uniformly random positions without replacement: per row, the candidates with the smallest random keys.

    A position's key is its 53-bit random number with the column in the low bits, so keys are unique within a
    row and order as a stable sort of the corresponding doubles would. Each row's ``take`` smallest keys are
    found by a partial sort of its few smallest, not a sort of the row.
    """
    rows, width = candidate.shape
    cols = np.arange(width, dtype=np.uint64)[None, :]
    col_bits = max(1, width - 1).bit_length()
    score = bits_from_base(stream_base(keys, STREAM_POSITIONS)[:, None], cols)  # a fresh (rows, width) array
    score >>= np.uint64(11)
    score <<= np.uint64(col_bits)
    score |= cols
    score[~candidate] = np.uint64(0xFFFFFFFFFFFFFFFF)
    take = np.minimum(budget, candidate.sum(axis=1))
    most = int(take.max(initial=0))
    if most == 0:
        return np.zeros_like(candidate)
    smallest = np.partition(score, most - 1, axis=1)[:, :most] if most < width else score.copy()
    smallest.sort(axis=1)
    threshold = smallest[np.arange(rows), np.maximum(take - 1, 0)]
    return (score <= threshold[:, None]) & candidate & (take > 0)[:, None]


def _words(candidate: np.ndarray, continuation: np.ndarray) -> list[list[tuple[int, int]]]:
    """Per row, its words as ``[start, end)`` column ranges: a candidate that continues the candidate just before
    it joins that word; any other candidate starts one."""
    joins = continuation & np.pad(candidate, ((0, 0), (1, 0)))[:, :-1]
    starts = candidate & ~joins
    width = candidate.shape[1]
    out = []
    for row in range(candidate.shape[0]):
        first = np.flatnonzero(starts[row])
        breaks = np.append(np.flatnonzero(~joins[row]), width)
        ends = breaks[np.searchsorted(breaks, first, side="right")]
        out.append(list(zip(first.tolist(), ends.tolist())))
    return out


def _choose_whole_words(candidate, words, budget, keys) -> np.ndarray:
    """Words in random order (each keyed by the draw at its first column); one that would overflow the budget is
    skipped; stop when full."""
    chosen = np.zeros_like(candidate)
    base = stream_base(keys, STREAM_POSITIONS)
    for row, row_words in enumerate(words):
        if not row_words:
            continue
        firsts = np.asarray([start for start, _ in row_words], np.uint64)
        order = np.argsort(uniform(bits_from_base(base[row], firsts)), kind="stable")
        count, limit = 0, int(budget[row])
        for index in order:
            if count >= limit:
                break
            start, end = row_words[index]
            if count + end - start > limit:
                continue
            chosen[row, start:end] = True
            count += end - start
    return chosen


def _choose_spans(candidate, words, budget, keys, recipe: MaskingRecipe) -> tuple[np.ndarray, np.ndarray]:
    """SpanBERT's spans; also, per chosen position, the column of its span's first token (decisions are per span).

    Attempt ``j`` of a row draws its span length and first word from counters ``2j`` and ``2j + 1``. A span stops
    early at the end of a contiguous run of words (a segment's end) and at the budget (whole words only); words
    already chosen are not counted again. A row gives up after ``4 * budget + 8`` attempts.
    """
    chosen = np.zeros_like(candidate)
    first_col = np.zeros(candidate.shape, np.int64)
    base = stream_base(keys, STREAM_SPANS)
    log_keep = math.log1p(-recipe.span_p) if recipe.span_p < 1 else -math.inf
    # P(length <= span_max_words) of the untruncated distribution: drawing u in [0, that) inverts the truncated one
    truncated_mass = 1.0 - (1.0 - recipe.span_p) ** recipe.span_max_words
    for row, row_words in enumerate(words):
        limit = int(budget[row])
        if not row_words or limit == 0:
            continue
        attempts = 4 * limit + 8
        draws = uniform(bits_from_base(base[row], np.arange(2 * attempts, dtype=np.uint64))).reshape(attempts, 2)
        count = 0
        for u_length, u_start in draws:
            if count >= limit:
                break
            length = 1 if log_keep == -math.inf else 1 + int(math.log1p(-u_length * truncated_mass) / log_keep)
            length = min(length, recipe.span_max_words)  # guards the float rounding at the top end only
            index = int(u_start * len(row_words))
            span_start = row_words[index][0]
            for step in range(length):
                if index + step >= len(row_words):
                    break
                start, end = row_words[index + step]
                if step and start != row_words[index + step - 1][1]:
                    break  # the next word is past a gap: the span would not be contiguous
                if chosen[row, start]:
                    continue
                if count + end - start > limit:
                    break
                chosen[row, start:end] = True
                first_col[row, start:end] = span_start
                count += end - start
    return chosen, first_col


def _choose_ngrams(candidate, words, budget, keys, ngram_max: int) -> np.ndarray:
    chosen = np.zeros_like(candidate)
    for row, row_ngrams in enumerate(_ngrams(words, budget, keys, ngram_max)):
        for start, end, _ in row_ngrams:
            chosen[row, start:end] = True
    return chosen


def _ngrams(words, budget, keys, ngram_max: int) -> list[list[tuple[int, int, int]]]:
    """Per row, ALBERT's n-grams of whole words in the order chosen, as ``(first column, end column, words)``.

    Word starts are visited in the order of their draws at their first column (the order ``whole_word`` uses); a
    start's length is drawn at its first column too, so a row's n-grams depend on its key and its words only. A
    row's draws are vectorised; the visit is a loop, since whether an n-gram fits depends on those chosen before it.
    """
    out = []
    order_base, length_base = stream_base(keys, STREAM_POSITIONS), stream_base(keys, STREAM_NGRAMS)
    cumulative = np.cumsum(1.0 / np.arange(1, ngram_max + 1))  # p(n) proportional to 1/n
    for row, row_words in enumerate(words):
        limit = int(budget[row])
        out.append([])
        if not row_words or limit == 0:
            continue
        bounds = np.asarray(row_words, np.int64)
        starts, ends = bounds[:, 0], bounds[:, 1]
        firsts = starts.astype(np.uint64)
        order = np.argsort(uniform(bits_from_base(order_base[row], firsts)), kind="stable")
        # words left in each word's run (a run ends where the next word does not start at this word's end)
        run_ends = np.flatnonzero(np.append(starts[1:] != ends[:-1], True))
        index = np.arange(len(starts))
        longest = np.minimum(run_ends[np.searchsorted(run_ends, index)] - index + 1, ngram_max)
        drawn = uniform(bits_from_base(length_base[row], firsts)) * cumulative[longest - 1]
        lengths = np.minimum(np.searchsorted(cumulative, drawn, side="right") + 1, longest).tolist()
        starts_list, ends_list = starts.tolist(), ends.tolist()
        taken = [False] * len(starts_list)  # per word
        count = 0
        for first in order.tolist():
            if count >= limit:
                break
            n = lengths[first]
            while n > 1 and count + ends_list[first + n - 1] - starts_list[first] > limit:
                n -= 1  # shorten to fit the budget
            size = ends_list[first + n - 1] - starts_list[first]
            if count + size > limit or any(taken[first:first + n]):
                continue
            taken[first:first + n] = [True] * n
            out[-1].append((starts_list[first], ends_list[first + n - 1], n))
            count += size
    return out

__all__ = ["MODES", "Masked", "MaskingRecipe", "MaskingVocab", "choose_positions", "mask_rows"]
