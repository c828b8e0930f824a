"""The BERT pretraining-instance recipe as pure functions with an explicit RNG.

A faithful port of google-research/bert ``create_pretraining_data.py`` (segment packing, short
sequences, NSP pairs, ``truncate_seq_pair``, static 80/10/10 masking, whole-word masking), and of
ALBERT's sentence-order pairs (``plan_sop_instances``), reshaped for a distributed pipeline:

* Documents are flat token arrays plus sentence offsets, so segments are token ranges and
  truncation is index arithmetic rather than list surgery.
* Planning (which sentences form A and B, whether B is random) happens per (document, duplicate)
  with one RNG. A random B names a target document by its *global* index, drawn uniformly from
  every other document of the corpus; the pipeline fetches that document, and
  ``preprocess.batch.finalize_batch`` then truncates, assembles and masks instances in bulk, each
  with randomness keyed by the instance alone. Nothing depends on which worker runs it or in what order.
"""
from __future__ import annotations

import bisect
import random
from typing import NamedTuple, Sequence

import numpy as np

from common.preprocess_config import InstanceConfig


class InstancePlan(NamedTuple):
    """Segment A (and B, unless random) as token ranges ``[start, end)`` of the source document.

    A tuple rather than a frozen dataclass: a run builds one per instance, and a tuple is much cheaper to make.
    """

    index: int                # position of this instance within its (document, duplicate)
    a_start: int
    a_end: int
    b_start: int              # for a random next: 0 (B comes from ``random_doc``)
    b_end: int
    is_random_next: bool
    target_b_length: int      # for a random next: tokens wanted from the random document
    random_doc: int           # global index of the document B is drawn from, or -1
    swapped: bool             # sentence-order prediction: A is the later span (label 1); always False for NSP


def sentence_offsets(sentence_lengths: Sequence[int]) -> np.ndarray:
    """Token offset of each sentence start, plus the total length at the end."""
    offsets = np.zeros(len(sentence_lengths) + 1, dtype=np.int64)
    np.cumsum(sentence_lengths, out=offsets[1:])
    return offsets


def _below(getrandbits, n: int) -> int:
    """``rng.randrange(n)`` for n >= 1, the same value from the same state (its rejection sampling, inlined)."""
    bits = n.bit_length()
    value = getrandbits(bits)
    while value >= n:
        value = getrandbits(bits)
    return value


def _target_length(rng: random.Random, cfg: InstanceConfig) -> int:
    """Tokens a pair aims at. Mostly the whole sequence, but sometimes (short_seq_prob) shorter so that the model
    also sees short inputs. As in the reference, drawn once per document and duplicate."""
    max_num_tokens = cfg.max_seq_length - 3  # [CLS], [SEP], [SEP]
    if rng.random() < cfg.short_seq_prob:
        return 2 + _below(rng.getrandbits, max_num_tokens - 1)  # rng.randint(2, max_num_tokens)
    return max_num_tokens


def _chunk_end(offsets: list[int], chunk_start: int, target: int) -> int:
    """The last sentence of the chunk that starts at sentence ``chunk_start``: as in the reference, sentences are
    added until the chunk reaches ``target`` tokens or the document ends, so it is the first sentence whose end
    reaches ``offsets[chunk_start] + target`` (or the document's last)."""
    return min(bisect.bisect_left(offsets, offsets[chunk_start] + target, chunk_start + 1), len(offsets) - 1) - 1


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
    if num_docs < 2:
        raise ValueError("next-sentence prediction needs at least two documents in the corpus")
    target_seq_length = _target_length(rng, cfg)
    random_float, getrandbits = rng.random, rng.getrandbits

    plans: list[InstancePlan] = []
    offsets = offsets.tolist()
    num_sentences = len(offsets) - 1
    # rng.randrange(num_docs - 1), inlined below (``_below``): the same draws, without a call per instance.
    other_docs = num_docs - 1
    other_bits = other_docs.bit_length()
    new_plan = tuple.__new__  # InstancePlan's fields by position: cheaper than keyword construction, once per instance
    chunk_start = 0  # first sentence of the current chunk
    while chunk_start < num_sentences:
        i = _chunk_end(offsets, chunk_start, target_seq_length)
        chunk_sentences = i + 1 - chunk_start
        # How many of the chunk's sentences go into A.
        a_end = 1
        if chunk_sentences >= 2:
            a_end = 1 + _below(getrandbits, chunk_sentences - 1)  # rng.randint(1, chunk_sentences - 1)
        a_start_tok = offsets[chunk_start]
        a_end_tok = offsets[chunk_start + a_end]
        if chunk_sentences == 1 or random_float() < cfg.random_next_prob:
            other = getrandbits(other_bits)
            while other >= other_docs:
                other = getrandbits(other_bits)
            # (index, a_start, a_end, b_start, b_end, is_random_next, target_b_length, random_doc, swapped)
            plans.append(new_plan(InstancePlan, (
                len(plans), a_start_tok, a_end_tok, 0, 0,
                True, target_seq_length - (a_end_tok - a_start_tok), other + 1 if other >= doc_index else other,
                False)))
            # The sentences after A were not used: put them back so they are not wasted.
            i -= chunk_sentences - a_end
        else:
            plans.append(new_plan(InstancePlan, (
                len(plans), a_start_tok, a_end_tok, a_end_tok, offsets[i + 1], False, 0, -1, False)))
        chunk_start = i + 1
    return plans


SOP_SWAP_PROB = 0.5  # ALBERT swaps half of the pairs (``random_next_prob`` is NSP's and does not apply)


def plan_sop_instances(offsets: np.ndarray, rng: random.Random, cfg: InstanceConfig) -> tuple[list[InstancePlan], int]:
    """ALBERT's sentence-order pairs (Lan et al. 2020; google-research/albert create_pretraining_data.py).

    Chunks are formed as for NSP (the same target length, short_seq_prob included). A is the chunk's first
    ``randint(1, sentences - 1)`` sentences and B the rest of the same chunk, so both are consecutive spans of
    the same document, never of another one. With probability 0.5 they are swapped (``swapped``: label 1;
    in order: label 0). Unlike ALBERT's code, which takes a random document's B for a chunk of one sentence,
    such a chunk is split at a random token (both sides non-empty); a chunk of one sentence of a single token
    cannot be split and is dropped, and counted.

    Args:
        offsets: ``sentence_offsets`` of the document (its sentences are never empty).
        rng: the RNG for this (document, duplicate).
        cfg: the instance parameters.
    Returns:
        The plans (``is_random_next`` always False) and the number of one-token chunks dropped.
    """
    target_seq_length = _target_length(rng, cfg)
    random_float, getrandbits = rng.random, rng.getrandbits
    offsets = offsets.tolist()
    num_sentences = len(offsets) - 1
    plans: list[InstancePlan] = []
    dropped = 0
    chunk_start = 0
    while chunk_start < num_sentences:
        i = _chunk_end(offsets, chunk_start, target_seq_length)
        start, end = offsets[chunk_start], offsets[i + 1]
        chunk_sentences = i + 1 - chunk_start
        if chunk_sentences >= 2:
            split = offsets[chunk_start + 1 + _below(getrandbits, chunk_sentences - 1)]
        elif end - start >= 2:
            split = start + 1 + _below(getrandbits, end - start - 1)  # a random token of the one sentence
        else:
            dropped += 1
            chunk_start = i + 1
            continue
        swapped = random_float() < SOP_SWAP_PROB
        a_start, a_end, b_start, b_end = (split, end, start, split) if swapped else (start, split, split, end)
        plans.append(InstancePlan(len(plans), a_start, a_end, b_start, b_end, False, 0, -1, swapped))
        chunk_start = i + 1
    return plans, dropped
