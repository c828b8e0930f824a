"""Properties of the masking modes over many draws: budgets, special tokens, whole words, span and n-gram lengths,
the replacement split, and independence from batching."""
import math

import numpy as np
import pytest

from common.masking import MaskingRecipe, MaskingVocab, _choose_spans, _ngrams, _words, mask_rows

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB_SIZE = 1000
CONTINUATION_IDS = np.arange(500, 1000)  # ids >= 500 continue the previous token's word


def vocab() -> MaskingVocab:
    continuation = np.zeros(VOCAB_SIZE, bool)
    continuation[CONTINUATION_IDS] = True
    return MaskingVocab(cls_id=CLS, sep_id=SEP, mask_id=MASK, never_mask_ids=frozenset({PAD, UNK, CLS, SEP, MASK}),
                        is_continuation=continuation, replacement_ids=np.arange(5, VOCAB_SIZE))


def rows(count: int, width: int, seed: int, continuation_share: float = 0.3):
    """[CLS] A [SEP] B [SEP] rows of random lengths, padded; some pieces continue a word."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, width + 1, count)
    tokens = np.zeros((count, width), np.int64)
    for r, n in enumerate(lengths):
        body = np.where(rng.random(n) < continuation_share, rng.integers(500, 1000, n), rng.integers(5, 500, n))
        tokens[r, :n] = body
        tokens[r, 0], tokens[r, n // 2], tokens[r, n - 1] = CLS, SEP, SEP
    valid = np.arange(width)[None, :] < lengths[:, None]
    candidate = valid & (tokens > MASK)
    keys = rng.integers(0, 2**63, count, dtype=np.uint64)
    return tokens, candidate, lengths, keys


def chosen_matrix(masked, shape) -> np.ndarray:
    chosen = np.zeros(shape, bool)
    chosen[masked.rows, masked.cols] = True
    return chosen


@pytest.mark.parametrize("mode", ["token", "whole_word", "span", "ngram"])
@pytest.mark.parametrize("rate", [0.15, 0.4])
def test_budget_candidates_and_labels(mode, rate):
    tokens, candidate, lengths, keys = rows(300, 96, seed=1)
    original = tokens.copy()
    recipe = MaskingRecipe(mode=mode, rate=rate, max_predictions=40)
    masked = mask_rows(tokens, candidate, lengths, keys, recipe, vocab())
    chosen = chosen_matrix(masked, tokens.shape)
    assert not (chosen & ~candidate).any(), "a special token or padding was chosen"
    counts = chosen.sum(axis=1)
    budget = np.minimum(recipe.budget(lengths), candidate.sum(axis=1))
    assert (counts <= budget).all()
    if mode == "token":
        assert (counts == budget).all()
    else:  # whole words can leave a few positions of the budget unused, never most of it
        assert counts.sum() >= 0.9 * budget.sum()
    assert (masked.labels == original[masked.rows, masked.cols]).all()
    assert (tokens[~chosen] == original[~chosen]).all(), "an unchosen position changed"


@pytest.mark.parametrize("mode", ["whole_word", "span", "ngram"])
def test_words_are_masked_whole(mode):
    tokens, candidate, lengths, keys = rows(300, 128, seed=2, continuation_share=0.5)
    continuation = vocab().is_continuation[tokens] & candidate
    masked = mask_rows(tokens, candidate, lengths, keys, MaskingRecipe(mode=mode, rate=0.3, max_predictions=60),
                       vocab())
    chosen = chosen_matrix(masked, tokens.shape)
    checked = 0
    for r, row_words in enumerate(_words(candidate, continuation)):
        for start, end in row_words:
            assert chosen[r, start:end].all() or not chosen[r, start:end].any(), (r, start, end)
            checked += end - start > 1
    assert checked > 1000


@pytest.mark.parametrize("mode", ["token", "ngram"])
def test_the_replacement_split_over_many_draws(mode):
    tokens, candidate, lengths, keys = rows(3000, 128, seed=3)
    original = tokens.copy()
    masked = mask_rows(tokens, candidate, lengths, keys, MaskingRecipe(mode=mode, rate=0.15, max_predictions=20),
                       vocab())
    shown = tokens[masked.rows, masked.cols]
    n = len(shown)
    shares = {"mask": (shown == MASK).mean(), "unchanged": (shown == original[masked.rows, masked.cols]).mean()}
    shares["random"] = 1 - shares["mask"] - shares["unchanged"]
    for name, expected in (("mask", 0.8), ("unchanged", 0.1 + 1 / VOCAB_SIZE), ("random", 0.1)):
        assert abs(shares[name] - expected) < 5 * math.sqrt(expected * (1 - expected) / n) + 0.002, (name, shares)


def test_a_span_is_shown_as_one_decision():
    tokens, candidate, lengths, keys = rows(500, 128, seed=4, continuation_share=0.0)
    original = tokens.copy()
    recipe = MaskingRecipe(mode="span", rate=0.3, max_predictions=60, mask_fraction=0.5, random_fraction=0.0)
    continuation = vocab().is_continuation[tokens] & candidate
    _, first = _choose_spans(candidate, _words(candidate, continuation), recipe.budget(lengths), keys, recipe)
    masked = mask_rows(tokens, candidate, lengths, keys, recipe, vocab())
    shown_mask = tokens[masked.rows, masked.cols] == MASK
    assert (tokens[masked.rows, masked.cols][~shown_mask] == original[masked.rows, masked.cols][~shown_mask]).all()
    spans = {}
    for r, c, is_mask in zip(masked.rows, masked.cols, shown_mask):
        spans.setdefault((r, first[r, c]), set()).add(bool(is_mask))
    assert all(len(kinds) == 1 for kinds in spans.values())
    assert 0.4 < np.mean([kinds == {True} for kinds in spans.values()]) < 0.6


def test_span_lengths_follow_the_truncated_geometric_distribution():
    """Single-token words in long rows and a small budget, so spans rarely meet the budget or each other."""
    count, width, p, most = 40, 6000, 0.2, 10
    tokens = np.full((count, width), 7, np.int64)
    candidate = np.ones((count, width), bool)
    keys = np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    recipe = MaskingRecipe(mode="span", rate=0.03, max_predictions=10_000, span_p=p, span_max_words=most)
    chosen, first = _choose_spans(candidate, _words(candidate, np.zeros_like(candidate)), recipe.budget(np.full(
        count, width)), keys, recipe)
    lengths = [np.bincount(first[r][chosen[r]]) for r in range(count)]
    lengths = np.concatenate([row[row > 0] for row in lengths])
    weights = [p * (1 - p) ** (k - 1) for k in range(1, most + 1)]  # SpanBERT's truncated, renormalised geometric
    expected = sum(k * w for k, w in zip(range(1, most + 1), weights)) / sum(weights)
    assert expected == pytest.approx(3.8, abs=0.05)  # the mean span length the SpanBERT paper reports
    assert len(lengths) > 1500
    assert abs(lengths.mean() - expected) < 0.25, (lengths.mean(), expected)
    assert lengths.max() <= most and (lengths == 1).mean() == pytest.approx(weights[0] / sum(weights), abs=0.04)


@pytest.mark.parametrize("mode", ["token", "whole_word", "span", "ngram"])
def test_a_rows_masks_do_not_depend_on_its_batch(mode):
    tokens, candidate, lengths, keys = rows(40, 64, seed=5)
    recipe = MaskingRecipe(mode=mode, rate=0.2, max_predictions=30)
    together = tokens.copy()
    mask_rows(together, candidate, lengths, keys, recipe, vocab())
    for r in (0, 17, 39):
        alone = tokens[r:r + 1].copy()
        mask_rows(alone, candidate[r:r + 1], lengths[r:r + 1], keys[r:r + 1], recipe, vocab())
        assert (alone[0] == together[r]).all()


def test_bad_recipes_are_refused():
    for kwargs, message in (({"mode": "random"}, "masking mode"), ({"rate": 1.5}, "rate"),
                            ({"mask_fraction": 0.8, "random_fraction": 0.3}, "add up"), ({"span_p": 0.0}, "span_p"),
                            ({"ngram_max": 0}, "ngram_max"), ({"ngram_max": 2.5}, "ngram_max")):
        with pytest.raises(ValueError, match=message):
            MaskingRecipe(**kwargs)


def _ngram_length_shares(width: int, most: int, budget: int) -> np.ndarray:
    """The exact distribution of the first n-gram's length in a row of ``width`` one-piece words: its start is
    uniform over the words, p(n) is proportional to 1/n over the lengths left in the row, then cut to the budget."""
    shares = np.zeros(most + 1)
    for start in range(width):
        weights = 1 / np.arange(1, min(width - start, most) + 1)
        for n, weight in enumerate(weights / weights.sum(), start=1):
            shares[min(n, budget)] += weight / width
    return shares[1:]


@pytest.mark.parametrize("budget, albert", [(3, [6 / 11, 3 / 11, 2 / 11]), (2, [6 / 11, 5 / 11, 0]), (1, [1, 0, 0])])
def test_ngram_lengths_follow_one_over_n_and_are_shortened_to_the_budget(budget, albert):
    """A row's first n-gram meets nothing chosen before it, so its length is the draw itself, cut to the budget (a
    3-gram that would overflow a budget of 2 becomes a 2-gram, as google-research/albert does). Chi-square against the
    exact shares: p < 1e-6 under them, while uniform lengths would score about 2,900 at budget 3 (144 at 2)."""
    count, width = 12_000, 64
    candidate = np.ones((count, width), bool)
    keys = np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    chosen = _ngrams(_words(candidate, np.zeros_like(candidate)), np.full(count, budget), keys, ngram_max=3)
    assert all(sum(end - start for start, end, _ in row) <= budget for row in chosen)
    first = np.asarray([row[0][2] for row in chosen])
    assert all(end - start == n for row in chosen for start, end, n in row)  # one-piece words
    expected = _ngram_length_shares(width, 3, budget)
    assert np.allclose(expected, albert, atol=0.02)  # the row's end shortens a few n-grams starting in its last words
    observed = np.bincount(first, minlength=4)[1:]
    assert observed[expected == 0].sum() == 0
    seen = expected > 0
    chi_square = (((observed - count * expected) ** 2)[seen] / (count * expected[seen])).sum()
    assert chi_square < -2 * math.log(1e-6), (observed, count * expected)  # chi-square with 2 dof: exact tail


def test_ngrams_stop_at_a_gap_and_with_ngram_max_1_are_whole_words():
    tokens, candidate, lengths, keys = rows(400, 96, seed=6, continuation_share=0.4)
    continuation = vocab().is_continuation[tokens] & candidate
    words = _words(candidate, continuation)
    recipe = MaskingRecipe(mode="ngram", rate=0.4, max_predictions=60)
    long_ones = 0
    for r, row in enumerate(_ngrams(words, recipe.budget(lengths), keys, ngram_max=3)):
        for start, end, n in row:
            assert candidate[r, start:end].all(), "an n-gram crossed [SEP]"
            assert sum(start <= s < end for s, _ in words[r]) == n  # n whole words
            long_ones += n > 1
    assert long_ones > 1000
    whole, unigrams = tokens.copy(), tokens.copy()
    mask_rows(whole, candidate, lengths, keys, MaskingRecipe(mode="whole_word"), vocab())
    mask_rows(unigrams, candidate, lengths, keys, MaskingRecipe(mode="ngram", ngram_max=1), vocab())
    assert (whole == unigrams).all()


def test_an_ngrams_tokens_are_replaced_by_separate_decisions():
    """ALBERT's code decides [MASK] or not for each token of an n-gram: at 50/50 about half the 2-grams are mixed
    (a span, decided once, never is)."""
    tokens, candidate, lengths, keys = rows(1500, 128, seed=7, continuation_share=0.0)
    original = tokens.copy()
    recipe = MaskingRecipe(mode="ngram", rate=0.3, max_predictions=60, mask_fraction=0.5, random_fraction=0.0)
    chosen = _ngrams(_words(candidate, np.zeros_like(candidate)), recipe.budget(lengths), keys, ngram_max=3)
    mask_rows(tokens, candidate, lengths, keys, recipe, vocab())
    shown = [tokens[r, start:end] == MASK for r, row in enumerate(chosen) for start, end, n in row if n == 2]
    assert all(((tokens[r, s:e] == MASK) | (tokens[r, s:e] == original[r, s:e])).all()
               for r, row in enumerate(chosen) for s, e, _ in row)
    mixed = np.mean([bool(pair[0] != pair[1]) for pair in shown])
    assert len(shown) > 2000 and abs(mixed - 0.5) < 0.05, mixed
