"""Properties of the pure BERT instance recipe, with fixed RNGs."""
import random

import numpy as np
import pytest

from preprocess.config import InstanceConfig
from preprocess.hashing import rng_for, stable_hash64
from preprocess.instances import (MaskingVocab, create_masked_lm_predictions, draw_other_document,
                                  finalize_instance, plan_instances, sentence_offsets, take_random_segment,
                                  truncate_seq_pair)

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


def build_all(tokens, offsets, cfg, vocab, seed=1, doc_index=0, num_docs=10, other=None):
    """Plan and finalize every instance of one document; random B comes from ``other``."""
    instances = []
    plans = plan_instances(offsets, doc_index, num_docs, rng_for(seed, "plan"), cfg)
    for plan in plans:
        rng = rng_for(seed, "instance", plan.index)
        if plan.is_random_next:
            o_tokens, o_offsets = other
            instances.append((plan, finalize_instance(plan, tokens, o_tokens, o_offsets, rng, cfg, vocab)))
        else:
            instances.append((plan, finalize_instance(plan, tokens, tokens, None, rng, cfg, vocab)))
    return instances


def test_instances_are_well_formed_and_within_max_length():
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)
    vocab = make_vocab()
    rng = random.Random(0)
    doc, other = make_document(rng, 40), make_document(rng, 30)
    built = build_all(*doc, cfg, vocab, other=other)
    assert len(built) > 5
    for plan, inst in built:
        ids = inst.input_ids
        assert len(ids) <= cfg.max_seq_length
        assert ids[0] == CLS and ids[inst.segment_a_len - 1] == SEP and ids[-1] == SEP
        assert inst.segment_a_len >= 3 and len(ids) - inst.segment_a_len >= 2  # A and B non-empty
        assert list(inst.masked_positions) == sorted(set(inst.masked_positions.tolist()))
        assert 1 <= len(inst.masked_positions) <= cfg.max_predictions_per_seq
        special_positions = {0, inst.segment_a_len - 1, len(ids) - 1}
        assert not special_positions & set(inst.masked_positions.tolist())
        assert inst.next_sentence_label == int(plan.is_random_next)


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
    rng = random.Random(0)
    for doc_index in range(5):
        draws = {draw_other_document(rng, doc_index, 5) for _ in range(500)}
        assert draws == set(range(5)) - {doc_index}
    with pytest.raises(ValueError, match="at least two documents"):
        draw_other_document(rng, 0, 1)


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


def test_segment_longer_than_max_length_is_truncated():
    cfg = InstanceConfig(max_seq_length=32)
    vocab = make_vocab()
    tokens = np.arange(5, 505, dtype=np.uint16)  # one 500-token sentence
    offsets = sentence_offsets([500])
    other = (np.arange(5, 305, dtype=np.uint16), sentence_offsets([300]))
    [(plan, inst)] = build_all(tokens, offsets, cfg, vocab, other=other)
    assert inst.truncated and len(inst.input_ids) == cfg.max_seq_length


def test_truncate_seq_pair_trims_the_longer_side_from_both_ends():
    rng = random.Random(0)
    (a0, a1), (b0, b1) = truncate_seq_pair((0, 100), (0, 10), 50, rng)
    assert (a1 - a0) + (b1 - b0) == 50 and (b0, b1) == (0, 10)
    assert a0 > 0 and a1 < 100  # removed from the front and from the back
    assert truncate_seq_pair((0, 5), (0, 5), 20, rng) == ((0, 5), (0, 5))


def test_take_random_segment_reaches_target_or_document_end():
    offsets = sentence_offsets([5, 5, 5, 5])
    rng = random.Random(1)
    for _ in range(50):
        start, end = take_random_segment(offsets, 12, rng)
        assert start in offsets and end in offsets
        assert end - start >= 12 or end == offsets[-1]


def test_masking_proportions_80_10_10_over_many_draws():
    cfg = InstanceConfig(max_seq_length=128, masked_lm_prob=0.15, max_predictions_per_seq=20)
    vocab = make_vocab()
    rng = random.Random(7)
    counts = {"mask": 0, "same": 0, "random": 0}
    total_positions = 0
    for _ in range(2000):
        ids = np.asarray([CLS] + [rng.randrange(5, VOCAB_SIZE) for _ in range(100)] + [SEP], dtype=np.uint16)
        out, positions, labels = create_masked_lm_predictions(ids, rng, cfg, vocab)
        assert len(positions) == min(cfg.max_predictions_per_seq, round(len(ids) * cfg.masked_lm_prob))
        assert np.array_equal(labels, ids[positions])
        total_positions += len(positions)
        for pos in positions:
            if out[pos] == MASK:
                counts["mask"] += 1
            elif out[pos] == ids[pos]:
                counts["same"] += 1
            else:
                counts["random"] += 1
                assert out[pos] >= 5  # random replacements are never special tokens
        unmasked = np.setdiff1d(np.arange(len(ids)), positions)
        assert np.array_equal(out[unmasked], ids[unmasked])
    assert abs(counts["mask"] / total_positions - 0.8) < 0.01
    # 'same' also catches the rare random draw equal to the original token.
    assert abs(counts["same"] / total_positions - 0.1) < 0.01
    assert abs(counts["random"] / total_positions - 0.1) < 0.01


def test_max_predictions_caps_the_number_of_masks():
    cfg = InstanceConfig(max_seq_length=512, masked_lm_prob=0.5, max_predictions_per_seq=7)
    ids = np.asarray([CLS] + list(range(5, 205)) + [SEP], dtype=np.uint16)
    _, positions, _ = create_masked_lm_predictions(ids, random.Random(0), cfg, make_vocab())
    assert len(positions) == 7


def test_whole_word_masking_masks_all_pieces_of_a_word():
    # ids >= 500 are continuation pieces ("##x"); words are a start piece followed by 0-3 continuations.
    cont = range(500, VOCAB_SIZE)
    vocab = make_vocab(cont)
    cfg = InstanceConfig(max_seq_length=256, whole_word_mask=True, masked_lm_prob=0.15, max_predictions_per_seq=30)
    rng = random.Random(11)
    for _ in range(200):
        words = [[rng.randrange(5, 500)] + [rng.randrange(500, VOCAB_SIZE) for _ in range(rng.randint(0, 3))]
                 for _ in range(40)]
        ids = np.asarray([CLS] + [t for w in words for t in w] + [SEP], dtype=np.uint16)
        _, positions, _ = create_masked_lm_predictions(ids, rng, cfg, vocab)
        chosen = set(positions.tolist())
        assert len(chosen) <= cfg.max_predictions_per_seq
        pos = 1
        for word in words:
            span = set(range(pos, pos + len(word)))
            assert span <= chosen or not (span & chosen), "a word is masked entirely or not at all"
            pos += len(word)


def test_same_seed_and_key_give_identical_instances():
    cfg = InstanceConfig(max_seq_length=64)
    vocab = make_vocab()
    doc, other = make_document(random.Random(2), 25), make_document(random.Random(3), 25)
    first = build_all(*doc, cfg, vocab, seed=9, other=other)
    second = build_all(*doc, cfg, vocab, seed=9, other=other)
    third = build_all(*doc, cfg, vocab, seed=10, other=other)
    as_bytes = lambda built: [i.input_ids.tobytes() + i.masked_positions.tobytes() for _, i in built]
    assert as_bytes(first) == as_bytes(second)
    assert as_bytes(first) != as_bytes(third)


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
