"""Properties of the three masking modes over many draws: budgets, special tokens, whole words, span lengths,
the replacement split, and independence from batching."""
import math

import numpy as np
import pytest

from common.masking import MaskingRecipe, MaskingVocab, _choose_spans, _words, mask_rows

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


@pytest.mark.parametrize("mode", ["token", "whole_word", "span"])
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


@pytest.mark.parametrize("mode", ["whole_word", "span"])
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


def test_the_replacement_split_over_many_draws():
    tokens, candidate, lengths, keys = rows(3000, 128, seed=3)
    original = tokens.copy()
    masked = mask_rows(tokens, candidate, lengths, keys, MaskingRecipe(rate=0.15, max_predictions=20), vocab())
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


@pytest.mark.parametrize("mode", ["token", "whole_word", "span"])
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
                            ({"mask_fraction": 0.8, "random_fraction": 0.3}, "add up"), ({"span_p": 0.0}, "span_p")):
        with pytest.raises(ValueError, match=message):
            MaskingRecipe(**kwargs)
