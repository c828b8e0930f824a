"""The BERT pretraining-instance recipe as pure functions with an explicit RNG.

A faithful port of google-research/bert ``create_pretraining_data.py`` (segment packing, short
sequences, NSP pairs, ``truncate_seq_pair``, static 80/10/10 masking, whole-word masking), reshaped
for a distributed pipeline:

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


def sentence_offsets(sentence_lengths: Sequence[int]) -> np.ndarray:
    """Token offset of each sentence start, plus the total length at the end."""
    offsets = np.zeros(len(sentence_lengths) + 1, dtype=np.int64)
    np.cumsum(sentence_lengths, out=offsets[1:])
    return offsets


def draw_other_document(rng: random.Random, doc_index: int, num_docs: int) -> int:
    """A document index drawn uniformly from every document except ``doc_index``."""
    if num_docs < 2:
        raise ValueError("next-sentence prediction needs at least two documents in the corpus")
    other = _below(rng.getrandbits, num_docs - 1)
    return other + 1 if other >= doc_index else other


def _below(getrandbits, n: int) -> int:
    """``rng.randrange(n)`` for n >= 1, the same value from the same state (its rejection sampling, inlined)."""
    bits = n.bit_length()
    value = getrandbits(bits)
    while value >= n:
        value = getrandbits(bits)
    return value


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
    max_num_tokens = cfg.max_seq_length - 3  # [CLS], [SEP], [SEP]
    # Mostly fill the sequence, but sometimes (short_seq_prob) aim shorter so the model also sees
    # short inputs. As in the reference, the target is drawn once per document and duplicate.
    target_seq_length = max_num_tokens
    random_float, getrandbits = rng.random, rng.getrandbits
    if random_float() < cfg.short_seq_prob:
        target_seq_length = 2 + _below(getrandbits, max_num_tokens - 1)  # rng.randint(2, max_num_tokens)

    plans: list[InstancePlan] = []
    offsets = offsets.tolist()
    num_sentences = len(offsets) - 1
    # rng.randrange(num_docs - 1), inlined below (``_below``): the same draws, without a call per instance.
    other_docs = num_docs - 1
    other_bits = other_docs.bit_length()
    new_plan = tuple.__new__  # InstancePlan's fields by position: cheaper than keyword construction, once per instance
    chunk_start = 0  # first sentence of the current chunk
    while chunk_start < num_sentences:
        # The reference adds sentences until the chunk reaches the target or the document ends: the chunk's
        # last sentence is the first whose end reaches offsets[chunk_start] + target.
        i = min(bisect.bisect_left(offsets, offsets[chunk_start] + target_seq_length, chunk_start + 1),
                num_sentences) - 1
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
            # (index, a_start, a_end, b_start, b_end, is_random_next, target_b_length, random_doc)
            plans.append(new_plan(InstancePlan, (
                len(plans), a_start_tok, a_end_tok, 0, 0,
                True, target_seq_length - (a_end_tok - a_start_tok), other + 1 if other >= doc_index else other)))
            # The sentences after A were not used: put them back so they are not wasted.
            i -= chunk_sentences - a_end
        else:
            plans.append(new_plan(InstancePlan, (
                len(plans), a_start_tok, a_end_tok, a_end_tok, offsets[i + 1], False, 0, -1)))
        chunk_start = i + 1
    return plans
