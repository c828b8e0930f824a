"""Properties of the BERT instance recipe: planning (pure, explicit RNG) and vectorised finalisation."""
import random

import numpy as np
import pytest

from common.counter_rng import random_bits
from common.hashing import stable_hash64
from common.masking import MaskingVocab
from common.preprocess_config import InstanceConfig
from preprocess.batch import finalize_batch, ragged_arange, random_segments, truncation_counts
from preprocess.instances import plan_instances, plan_sop_instances, sentence_offsets

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB_SIZE = 1000


def make_vocab(continuation_ids=()) -> MaskingVocab:
    is_continuation = np.zeros(VOCAB_SIZE, dtype=bool)
    is_continuation[list(continuation_ids)] = True
    return MaskingVocab(cls_id=CLS, sep_id=SEP, mask_id=MASK, never_mask_ids=frozenset({PAD, UNK, CLS, SEP, MASK}),
                        is_continuation=is_continuation, replacement_ids=np.arange(5, VOCAB_SIZE))


def make_document(rng: random.Random, num_sentences: int, lo=5, hi=30):
    lengths = [rng.randint(lo, hi) for _ in range(num_sentences)]
    tokens = np.asarray([rng.randrange(5, VOCAB_SIZE) for _ in range(sum(lengths))], dtype=np.uint16)
    return tokens, sentence_offsets(lengths)


def keys_for(n, salt=0):
    return random_bits(np.full(n, 12345 + salt, np.uint64), 0, np.arange(n, dtype=np.uint64))


def rows(batch):
    """Split a FinalizedBatch into per-row tuples for assertions."""
    starts = np.concatenate([[0], np.cumsum(batch.lengths)])
    m_starts = np.concatenate([[0], np.cumsum(batch.masked_counts)])
    for i in range(len(batch.lengths)):
        yield (batch.input_ids[starts[i]:starts[i + 1]], int(batch.segment_a_len[i]),
               batch.masked_positions[m_starts[i]:m_starts[i + 1]], batch.masked_labels[m_starts[i]:m_starts[i + 1]],
               bool(batch.truncated[i]))


def reference_truncate(la, lb, max_tokens):
    """google-research/bert's truncate_seq_pair, counting removals instead of flipping coins."""
    ta = tb = 0
    while la + lb > max_tokens:
        if la > lb:
            la, ta = la - 1, ta + 1
        else:
            lb, tb = lb - 1, tb + 1
    return ta, tb


def test_truncation_counts_match_the_reference_loop():
    lengths = [(a, b) for a in range(0, 60, 3) for b in range(0, 60, 4)]
    la, lb = np.asarray(lengths).T
    ta, tb = truncation_counts(la, lb, 40)
    assert [tuple(x) for x in zip(ta, tb)] == [reference_truncate(a, b, 40) for a, b in lengths]


def test_planned_instances_finalize_well_formed():
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)
    tokens, offsets = make_document(random.Random(0), 40)
    plans = [p for p in plan_instances(offsets, 0, 10, random.Random(1), cfg) if not p.is_random_next]
    ranges = np.asarray([(p.a_start, p.a_end, p.b_start, p.b_end) for p in plans])
    batch = finalize_batch(tokens, ranges[:, :2], ranges[:, 2:], keys_for(len(plans)), cfg, make_vocab())
    assert len(plans) > 3
    for ids, a_len, positions, labels, _ in rows(batch):
        assert len(ids) <= cfg.max_seq_length
        assert ids[0] == CLS and ids[a_len - 1] == SEP and ids[-1] == SEP
        assert a_len >= 3 and len(ids) - a_len >= 2
        assert list(positions) == sorted(set(positions.tolist()))
        assert 1 <= len(positions) <= cfg.max_predictions_per_seq
        assert not {0, a_len - 1, len(ids) - 1} & set(positions.tolist())


def test_segment_longer_than_max_length_is_truncated_from_both_ends():
    cfg = InstanceConfig(max_seq_length=32, masked_lm_prob=0.0)
    tokens = np.arange(5, 505, dtype=np.uint16)
    a_ranges = np.asarray([[0, 400]] * 200)
    b_ranges = np.asarray([[400, 500]] * 200)
    batch = finalize_batch(tokens, a_ranges, b_ranges, keys_for(200), cfg, make_vocab())
    firsts = set()
    for ids, a_len, positions, labels, truncated in rows(batch):
        assert truncated and len(ids) == 32 and a_len - 2 + len(ids) - a_len - 1 == 29
        restored = ids.copy()
        restored[positions] = labels
        a = restored[1:a_len - 1]
        assert np.all(np.diff(a.astype(int)) == 1)  # a contiguous slice of the original segment
        firsts.add(int(a[0]))
    assert min(firsts) > 5 and len(firsts) > 10  # trimmed from the front by varying amounts


def test_masking_proportions_80_10_10_over_many_rows():
    cfg = InstanceConfig(max_seq_length=128, masked_lm_prob=0.15, max_predictions_per_seq=20)
    rng = np.random.default_rng(7)
    n = 4000
    tokens = rng.integers(5, VOCAB_SIZE, size=n * 100).astype(np.uint16)
    starts = np.arange(n) * 100
    batch = finalize_batch(tokens, np.stack([starts, starts + 50], 1), np.stack([starts + 50, starts + 100], 1),
                           keys_for(n), cfg, make_vocab())
    counts = {"mask": 0, "same": 0, "random": 0}
    for ids, a_len, positions, labels, _ in rows(batch):
        assert len(positions) == min(20, round(len(ids) * 0.15))
        shown = ids[positions]
        counts["mask"] += int((shown == MASK).sum())
        counts["same"] += int((shown == labels).sum())
        counts["random"] += int(((shown != MASK) & (shown != labels)).sum())
        assert (shown[(shown != MASK)] >= 5).all()  # random replacements are never special tokens
    total = sum(counts.values())
    assert abs(counts["mask"] / total - 0.8) < 0.01
    assert abs(counts["same"] / total - 0.1) < 0.01 and abs(counts["random"] / total - 0.1) < 0.01


def test_the_replacement_split_is_configurable():
    n = 500
    tokens = np.random.default_rng(8).integers(5, VOCAB_SIZE, size=n * 100).astype(np.uint16)
    starts = np.arange(n) * 100
    all_mask = ({"mask_token_fraction": 1.0, "random_token_fraction": 0.0}, lambda shown, labels: shown == MASK)
    all_kept = ({"mask_token_fraction": 0.0, "random_token_fraction": 0.0}, lambda shown, labels: shown == labels)
    for split, check in (all_mask, all_kept):
        cfg = InstanceConfig(max_seq_length=128, masked_lm_prob=0.15, max_predictions_per_seq=20, **split)
        batch = finalize_batch(tokens, np.stack([starts, starts + 50], 1), np.stack([starts + 50, starts + 100], 1),
                               keys_for(n), cfg, make_vocab())
        for ids, _, positions, labels, _ in rows(batch):
            assert len(positions) and check(ids[positions], labels).all(), split


def test_masked_positions_are_uniform_over_candidates():
    cfg = InstanceConfig(max_seq_length=64, masked_lm_prob=0.15, max_predictions_per_seq=5)
    n = 20000
    tokens = np.full(60, 7, np.uint16)
    batch = finalize_batch(tokens, np.asarray([[0, 30]] * n), np.asarray([[30, 60]] * n), keys_for(n, 3), cfg,
                           make_vocab())
    hits = np.bincount(batch.masked_positions, minlength=64)[:63]
    candidates = [p for p in range(63) if p not in (0, 31, 62)]
    expected = len(batch.masked_positions) / len(candidates)
    assert hits[[0, 31, 62]].sum() == 0
    assert np.abs(hits[candidates] - expected).max() < 5 * np.sqrt(expected)


def test_max_predictions_caps_the_number_of_masks():
    cfg = InstanceConfig(max_seq_length=512, masked_lm_prob=0.5, max_predictions_per_seq=7)
    tokens = np.arange(5, 205, dtype=np.uint16)
    batch = finalize_batch(tokens, np.asarray([[0, 100]]), np.asarray([[100, 200]]), keys_for(1), cfg, make_vocab())
    assert batch.masked_counts.tolist() == [7]


def test_whole_word_masking_masks_all_pieces_of_a_word():
    cont = range(500, VOCAB_SIZE)  # ids >= 500 continue a word ("##x")
    cfg = InstanceConfig(max_seq_length=256, mask_unit="whole_word", masked_lm_prob=0.15, max_predictions_per_seq=30)
    rng = random.Random(11)
    words = [[rng.randrange(5, 500)] + [rng.randrange(500, VOCAB_SIZE) for _ in range(rng.randint(0, 3))]
             for _ in range(80)]
    tokens = np.asarray([t for w in words for t in w], np.uint16)
    half = sum(len(w) for w in words[:40])
    batch = finalize_batch(tokens, np.asarray([[0, half]] * 200), np.asarray([[half, len(tokens)]] * 200),
                           keys_for(200), cfg, make_vocab(cont))
    for ids, a_len, positions, labels, _ in rows(batch):
        chosen = set(positions.tolist())
        assert 0 < len(chosen) <= cfg.max_predictions_per_seq
        pos = 1
        for i, word in enumerate(words):
            pos += 1 if i == 40 else 0  # the [SEP] between A and B
            span = set(range(pos, pos + len(word)))
            assert span <= chosen or not (span & chosen), "a word is masked entirely or not at all"
            pos += len(word)


def test_results_do_not_depend_on_batching():
    """Each instance's randomness comes from its own key: one batch of 300 equals three of 100."""
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)
    tokens, offsets = make_document(random.Random(5), 400)
    starts = offsets[:300]
    a = np.stack([starts, starts + 20], 1)
    b = np.stack([starts + 20, starts + 70], 1)
    keys = keys_for(300, 9)
    whole = list(rows(finalize_batch(tokens, a, b, keys, cfg, make_vocab())))
    pieces = [r for s in (slice(0, 100), slice(100, 200), slice(200, 300))
              for r in rows(finalize_batch(tokens, a[s], b[s], keys[s], cfg, make_vocab()))]
    for x, y in zip(whole, pieces):
        assert all(np.array_equal(u, v) if isinstance(u, np.ndarray) else u == v for u, v in zip(x, y))


def test_random_segment_reaches_target_or_document_end():
    # Two documents side by side (sentence boundaries 0..20 and 20..44); B comes from the second one only.
    boundaries = np.concatenate([sentence_offsets([5, 5, 5, 5]), 20 + sentence_offsets([6, 6, 6, 6])[1:]])
    ranges = random_segments(boundaries, np.full(500, 4), np.full(500, 8), np.full(500, 14), keys_for(500))
    assert set(ranges[:, 0]) == {20, 26, 32, 38}  # every sentence of the document can start B
    for start, end in ranges:
        assert start in boundaries and end in boundaries and 20 <= start < end <= 44
        assert end - start >= 14 or end == 44


def test_ragged_arange():
    assert ragged_arange(np.asarray([3, 10, 0]), np.asarray([2, 0, 3])).tolist() == [3, 4, 0, 1, 2]
    assert ragged_arange(np.asarray([7, 5]), np.asarray([0, 0])).tolist() == []
    rng = np.random.default_rng(0)
    for _ in range(500):  # empty ranges anywhere (first and last included), overlapping and descending starts
        n = int(rng.integers(1, 8))
        starts, lengths = rng.integers(0, 40, n), rng.integers(0, 4, n)
        expected = [value for start, length in zip(starts, lengths) for value in range(start, start + length)]
        got = ragged_arange(starts, lengths)
        assert got.dtype == np.int64 and got.tolist() == expected


def test_actual_next_b_follows_a_in_the_document():
    cfg = InstanceConfig(max_seq_length=512, masked_lm_prob=0.0, max_predictions_per_seq=1)
    rng = random.Random(3)
    tokens, offsets = make_document(rng, 30)
    plans = plan_instances(offsets, 0, 5, random.Random(1), cfg)
    actual = [p for p in plans if not p.is_random_next]
    assert actual
    for plan in actual:
        assert plan.b_start == plan.a_end and plan.b_end > plan.b_start
        assert plan.a_start in offsets and plan.a_end in offsets and plan.b_end in offsets  # sentence boundaries


def test_random_next_never_targets_the_document_itself():
    cfg = InstanceConfig(max_seq_length=64, random_next_prob=1.0)
    _, offsets = make_document(random.Random(0), 60)
    for doc_index in range(5):
        draws = {p.random_doc for seed in range(40) for p in plan_instances(offsets, doc_index, 5, random.Random(seed), cfg)
                 if p.is_random_next}
        assert draws == set(range(5)) - {doc_index}
    with pytest.raises(ValueError, match="at least two documents"):
        plan_instances(offsets, 0, 1, random.Random(0), cfg)


def test_random_next_put_back_unused_sentences():
    """After a random B, A's unused chunk sentences start the next instance (reference behaviour)."""
    cfg = InstanceConfig(max_seq_length=40, short_seq_prob=0.0, random_next_prob=1.0)
    offsets = sentence_offsets([10] * 12)
    plans = plan_instances(offsets, 0, 3, random.Random(5), cfg)
    assert all(p.is_random_next for p in plans)
    # Every token of the document is covered by some A segment, in order, without gaps.
    starts = [p.a_start for p in plans]
    assert starts == sorted(starts) and starts[0] == 0
    for prev, nxt in zip(plans, plans[1:]):
        assert nxt.a_start == prev.a_end


def test_one_sentence_document_gives_a_random_next_instance():
    cfg = InstanceConfig(max_seq_length=32)
    plans = plan_instances(sentence_offsets([7]), 2, 4, random.Random(0), cfg)
    assert len(plans) == 1 and plans[0].is_random_next and plans[0].random_doc != 2


def test_stable_hash_is_fixed_across_processes():
    # A fixed value: Python's hash() would change with PYTHONHASHSEED, this must not.
    assert stable_hash64("doc", "wiki:enwiki:12") == stable_hash64("doc", "wiki:enwiki:12")
    assert stable_hash64(1, "a") != stable_hash64(1, "b")
    assert stable_hash64("x") == int.from_bytes(__import__("hashlib").blake2b(b"x", digest_size=8).digest(), "little")


def test_short_seq_prob_yields_shorter_targets():
    cfg = InstanceConfig(max_seq_length=128, short_seq_prob=1.0, random_next_prob=0.0)
    offsets = sentence_offsets([4] * 200)
    lengths = []
    for seed in range(30):
        for plan in plan_instances(offsets, 0, 2, random.Random(seed), cfg):
            if not plan.is_random_next:
                lengths.append(plan.b_end - plan.a_start)
    assert min(lengths) < 40  # targets below max_num_tokens occur


def test_sentence_order_pairs_are_consecutive_spans_of_the_document_swapped_half_the_time():
    cfg = InstanceConfig(max_seq_length=64, sentence_objective="sop")
    swapped = total = 0
    for seed in range(200):
        _, offsets = make_document(random.Random(seed), 24)
        plans, dropped = plan_sop_instances(offsets, random.Random(1000 + seed), cfg)
        assert dropped == 0 and plans
        covered = []
        for plan in plans:
            assert not plan.is_random_next and plan.random_doc == -1
            first, second = ((plan.b_start, plan.b_end), (plan.a_start, plan.a_end)) if plan.swapped else \
                ((plan.a_start, plan.a_end), (plan.b_start, plan.b_end))
            # The earlier span ends where the later one starts; A is the later one exactly when swapped.
            assert first[0] < first[1] == second[0] < second[1]
            assert first[0] in offsets and second[1] in offsets  # the chunk is whole sentences
            covered.append((first[0], second[1]))
            swapped += plan.swapped
            total += 1
        # The chunks cover the document in order, each token once: nothing comes from another document.
        assert covered[0][0] == 0 and covered[-1][1] == offsets[-1]
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    assert total > 1000 and abs(swapped / total - 0.5) < 4 * (0.25 / total) ** 0.5


def test_sentence_order_splits_a_one_sentence_chunk_and_drops_a_one_token_one():
    cfg = InstanceConfig(max_seq_length=24, short_seq_prob=0.0, sentence_objective="sop")
    offsets = sentence_offsets([30, 1])  # a sentence longer than the target, then a lone one-token sentence
    cuts = set()
    for seed in range(300):
        plans, dropped = plan_sop_instances(offsets, random.Random(seed), cfg)
        assert dropped == 1 and len(plans) == 1
        plan = plans[0]
        spans = sorted([(plan.a_start, plan.a_end), (plan.b_start, plan.b_end)])
        assert spans[0][0] == 0 and spans[0][1] == spans[1][0] and spans[1][1] == 30
        cuts.add(spans[0][1])
    assert cuts == set(range(1, 30))  # at any token, both sides non-empty


def test_sentence_order_labels_follow_the_swap_after_finalisation():
    cfg = InstanceConfig(max_seq_length=48, masked_lm_prob=0.0, max_predictions_per_seq=1, sentence_objective="sop")
    tokens = np.arange(5, 805, dtype=np.uint16)  # token value = position + 5: order is visible in the row
    offsets = sentence_offsets([8] * 100)
    plans, _ = plan_sop_instances(offsets, random.Random(3), cfg)
    ranges = np.asarray([(p.a_start, p.a_end, p.b_start, p.b_end) for p in plans])
    batch = finalize_batch(tokens, ranges[:, :2], ranges[:, 2:], keys_for(len(plans)), cfg, make_vocab())
    for plan, (ids, a_len, positions, labels, _) in zip(plans, rows(batch)):
        ids = ids.copy()
        ids[positions] = labels
        a, b = ids[1:a_len - 1].astype(int), ids[a_len:-1].astype(int)
        assert (np.diff(a) == 1).all() and (np.diff(b) == 1).all()
        assert (a[0] > b[-1]) == plan.swapped  # A comes after B in the document exactly when swapped


def test_dynamic_masking_stores_rows_unmasked():
    static = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)
    dynamic = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, masking="dynamic")
    tokens, offsets = make_document(random.Random(8), 60)
    plans = [p for p in plan_instances(offsets, 0, 10, random.Random(2), static) if not p.is_random_next]
    ranges = np.asarray([(p.a_start, p.a_end, p.b_start, p.b_end) for p in plans])
    masked, unmasked = (finalize_batch(tokens, ranges[:, :2], ranges[:, 2:], keys_for(len(plans)), cfg, make_vocab())
                        for cfg in (static, dynamic))
    assert len(unmasked.masked_positions) == len(unmasked.masked_labels) == 0
    assert unmasked.masked_counts.tolist() == [0] * len(plans) and masked.masked_counts.min() > 0
    # The same rows as the static ones with their masks undone: only the masking changed.
    restored = masked.input_ids.copy()
    row_starts = np.repeat(np.cumsum(masked.lengths) - masked.lengths, masked.masked_counts)
    restored[row_starts + masked.masked_positions] = masked.masked_labels
    assert np.array_equal(restored, unmasked.input_ids) and MASK not in unmasked.input_ids
