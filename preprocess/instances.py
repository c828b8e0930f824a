"""The BERT pretraining-instance recipe as pure functions with an explicit RNG.

A faithful port of google-research/bert ``create_pretraining_data.py`` (segment packing, short
sequences, NSP pairs, ``truncate_seq_pair``, static 80/10/10 masking, whole-word masking), reshaped
for a distributed pipeline:

* Documents are flat token arrays plus sentence offsets, so segments are token ranges and
  truncation is index arithmetic rather than list surgery.
* Planning (which sentences form A and B, whether B is random) happens per (document, duplicate)
  with one RNG. A random B names a target document by its *global* index, drawn uniformly from
  every other document of the corpus; the pipeline fetches that document and then
  ``finalize_instance`` builds the instance with an RNG of its own. Nothing here depends on which
  worker runs it or in what order.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from preprocess.config import InstanceConfig


@dataclass(frozen=True)
class MaskingVocab:
    """What the recipe needs to know about the vocabulary."""

    cls_id: int
    sep_id: int
    mask_id: int
    never_mask_ids: frozenset[int]     # special tokens: never chosen as a masked position
    is_continuation: np.ndarray        # bool per id: continues the previous token's word (whole-word masking)
    replacement_ids: np.ndarray        # ids the "random token" 10% draws from (no specials)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "MaskingVocab":
        return cls(
            cls_id=tokenizer.cls_id,
            sep_id=tokenizer.sep_id,
            mask_id=tokenizer.mask_id,
            never_mask_ids=frozenset(tokenizer.special_ids.values()),
            is_continuation=np.asarray(tokenizer.is_continuation, dtype=bool),
            replacement_ids=np.asarray(tokenizer.replacement_ids, dtype=np.int64),
        )


@dataclass(frozen=True)
class InstancePlan:
    """Segment A (and B, unless random) as token ranges ``[start, end)`` of the source document."""

    index: int                # position of this instance within its (document, duplicate)
    a_start: int
    a_end: int
    b_start: int              # for a random next: 0 (B comes from ``random_doc``)
    b_end: int
    is_random_next: bool
    target_b_length: int      # for a random next: tokens wanted from the random document
    random_doc: int           # global index of the document B is drawn from, or -1


@dataclass(frozen=True)
class Instance:
    input_ids: np.ndarray         # [CLS] A [SEP] B [SEP], masked
    segment_a_len: int            # len([CLS] A [SEP])
    masked_positions: np.ndarray  # ascending
    masked_labels: np.ndarray     # the original ids at those positions
    next_sentence_label: int      # 0: B follows A in the document; 1: B is random
    truncated: bool               # tokens were dropped to fit max_seq_length


def sentence_offsets(sentence_lengths: Sequence[int]) -> np.ndarray:
    """Token offset of each sentence start, plus the total length at the end."""
    offsets = np.zeros(len(sentence_lengths) + 1, dtype=np.int64)
    np.cumsum(sentence_lengths, out=offsets[1:])
    return offsets


def draw_other_document(rng: random.Random, doc_index: int, num_docs: int) -> int:
    """A document index drawn uniformly from every document except ``doc_index``."""
    if num_docs < 2:
        raise ValueError("next-sentence prediction needs at least two documents in the corpus")
    other = rng.randrange(num_docs - 1)
    return other + 1 if other >= doc_index else other


def plan_instances(offsets: np.ndarray, doc_index: int, num_docs: int, rng: random.Random,
                   cfg: InstanceConfig) -> list[InstancePlan]:
    """Pack a document's sentences into A/B segment pairs (google-research/bert's recipe).

    Args:
        offsets: ``sentence_offsets`` of the document (its sentences are never empty).
        doc_index: the document's global index, so a random B is never drawn from itself.
        num_docs: the number of documents in the whole corpus.
        rng: the RNG for this (document, duplicate); consumed in the reference order.
        cfg: the instance parameters.
    """
    max_num_tokens = cfg.max_seq_length - 3  # [CLS], [SEP], [SEP]
    # Mostly fill the sequence, but sometimes (short_seq_prob) aim shorter so the model also sees
    # short inputs. As in the reference, the target is drawn once per document and duplicate.
    target_seq_length = max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    plans: list[InstancePlan] = []
    num_sentences = len(offsets) - 1
    chunk_start = 0  # first sentence of the current chunk
    i = 0
    while i < num_sentences:
        chunk_len_tokens = int(offsets[i + 1] - offsets[chunk_start])
        if i == num_sentences - 1 or chunk_len_tokens >= target_seq_length:
            chunk_sentences = i + 1 - chunk_start
            # How many of the chunk's sentences go into A.
            a_end = 1
            if chunk_sentences >= 2:
                a_end = rng.randint(1, chunk_sentences - 1)
            a_start_tok = int(offsets[chunk_start])
            a_end_tok = int(offsets[chunk_start + a_end])
            if chunk_sentences == 1 or rng.random() < cfg.random_next_prob:
                random_doc = draw_other_document(rng, doc_index, num_docs)
                plans.append(InstancePlan(
                    index=len(plans), a_start=a_start_tok, a_end=a_end_tok, b_start=0, b_end=0,
                    is_random_next=True, target_b_length=target_seq_length - (a_end_tok - a_start_tok),
                    random_doc=random_doc))
                # The sentences after A were not used: put them back so they are not wasted.
                i -= chunk_sentences - a_end
            else:
                plans.append(InstancePlan(
                    index=len(plans), a_start=a_start_tok, a_end=a_end_tok, b_start=a_end_tok,
                    b_end=int(offsets[i + 1]), is_random_next=False, target_b_length=0, random_doc=-1))
            chunk_start = i + 1
        i += 1
    return plans


def take_random_segment(offsets: np.ndarray, target_b_length: int, rng: random.Random) -> tuple[int, int]:
    """Token range of a random B: from a random sentence on, until ``target_b_length`` is reached."""
    num_sentences = len(offsets) - 1
    start = rng.randint(0, num_sentences - 1)
    end = start + 1
    while end < num_sentences and offsets[end] - offsets[start] < target_b_length:
        end += 1
    return int(offsets[start]), int(offsets[end])


def truncate_seq_pair(a: tuple[int, int], b: tuple[int, int], max_num_tokens: int,
                      rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    """Trim the longer segment one token at a time, from the front or the back at random."""
    (a0, a1), (b0, b1) = a, b
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        # Randomly from the front or the back, to add more randomness and avoid biases.
        if (a1 - a0) > (b1 - b0):
            if rng.random() < 0.5:
                a0 += 1
            else:
                a1 -= 1
        else:
            if rng.random() < 0.5:
                b0 += 1
            else:
                b1 -= 1
    return (a0, a1), (b0, b1)


def _lazy_shuffled(items: list, rng: random.Random):
    """Yield ``items`` in uniformly random order, shuffling only as far as the caller reads."""
    for i in range(len(items)):
        j = rng.randrange(i, len(items))
        items[i], items[j] = items[j], items[i]
        yield items[i]


def create_masked_lm_predictions(input_ids: np.ndarray, rng: random.Random, cfg: InstanceConfig,
                                 vocab: MaskingVocab) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Static MLM masking: choose positions, then 80% [MASK], 10% random token, 10% unchanged.

    Returns the masked ids, the chosen positions (ascending) and their original ids. Special tokens
    are never chosen. With whole-word masking, all pieces of a word are masked together, and a word
    that would overflow ``num_to_predict`` is passed over, as in the reference.
    """
    ids = input_ids.tolist()
    candidates = [pos for pos, tok in enumerate(ids) if tok not in vocab.never_mask_ids]
    num_to_predict = min(cfg.max_predictions_per_seq, max(1, int(round(len(ids) * cfg.masked_lm_prob))))

    chosen: list[int] = []
    if cfg.whole_word_mask:
        groups: list[list[int]] = []
        continuation = vocab.is_continuation
        previous = -2
        for pos in candidates:
            if groups and previous == pos - 1 and continuation[ids[pos]]:
                groups[-1].append(pos)
            else:
                groups.append([pos])
            previous = pos
        for group in _lazy_shuffled(groups, rng):
            if len(chosen) >= num_to_predict:
                break
            if len(chosen) + len(group) > num_to_predict:
                continue
            chosen.extend(group)
    else:
        # Drawing k distinct positions is what "shuffle all, take the first k" amounts to.
        chosen = rng.sample(candidates, min(num_to_predict, len(candidates)))

    chosen.sort()
    output = list(ids)
    replacement_ids = vocab.replacement_ids
    for pos in chosen:
        if rng.random() < 0.8:
            output[pos] = vocab.mask_id
        elif rng.random() < 0.5:
            pass  # keep the original token
        else:
            output[pos] = int(replacement_ids[rng.randrange(len(replacement_ids))])
    positions = np.asarray(chosen, dtype=np.int64)
    labels = input_ids[positions] if chosen else np.zeros(0, dtype=input_ids.dtype)
    return np.asarray(output, dtype=input_ids.dtype), positions, labels


def finalize_instance(plan: InstancePlan, tokens: np.ndarray, b_source: np.ndarray,
                      b_offsets: np.ndarray | None, rng: random.Random, cfg: InstanceConfig,
                      vocab: MaskingVocab) -> Instance:
    """Build one masked instance from its plan.

    Args:
        plan: from ``plan_instances``.
        tokens: the flat token array of the plan's own document.
        b_source: where B is taken from: the random document's tokens for a random next, else ``tokens``.
        b_offsets: the random document's sentence offsets (only for a random next).
        rng: this instance's own RNG.
    """
    if plan.is_random_next:
        b_range = take_random_segment(b_offsets, plan.target_b_length, rng)
    else:
        b_range = (plan.b_start, plan.b_end)
    a_range = (plan.a_start, plan.a_end)
    max_num_tokens = cfg.max_seq_length - 3
    (a0, a1), (b0, b1) = truncate_seq_pair(a_range, b_range, max_num_tokens, rng)
    truncated = (a1 - a0) + (b1 - b0) < (a_range[1] - a_range[0]) + (b_range[1] - b_range[0])
    if a1 <= a0 or b1 <= b0:
        raise ValueError("empty segment: documents must not contain empty sentences")

    dtype = tokens.dtype
    input_ids = np.concatenate([
        np.asarray([vocab.cls_id], dtype=dtype), tokens[a0:a1], np.asarray([vocab.sep_id], dtype=dtype),
        b_source[b0:b1], np.asarray([vocab.sep_id], dtype=dtype)])
    masked, positions, labels = create_masked_lm_predictions(input_ids, rng, cfg, vocab)
    return Instance(input_ids=masked, segment_a_len=int(a1 - a0) + 2, masked_positions=positions,
                    masked_labels=labels, next_sentence_label=int(plan.is_random_next), truncated=truncated)
