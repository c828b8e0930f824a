"""A checkpoint's WordPiece vocabulary grown with a domain's words, as users of SciBERT- and BioBERT-style domain
adaptation add the words their text keeps cutting into pieces (google-research/bert#9, #396).

* The words come from a list, or are the most frequent words of a corpus that the tokenizer cuts into
  ``min_pieces`` pieces or more (``frequent_split_words``), as the tokenizer normalises and splits them.
* A new word takes one of BERT's ``[unusedN]`` slots first (by N), then an id after the last; every other id keeps
  its token, so the checkpoint's rows stay where they were and a word that was not added is tokenized as before
  (``plan_growth``).
* Every vocabulary-sized tensor (the word embeddings, a tied or untied MLM decoder and its bias) grows to the new
  size, and a new word's row starts as the mean of the rows of the pieces the old tokenizer cut it into
  (``grow_weights``).

Pure functions of a tokenizer and a state dict; ``pretrain.grow_vocab`` is the command.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import torch

from common.errors import InputError

UNUSED_SLOT = re.compile(r"^\[unused(\d+)\]$")
# The names of vocabulary-sized tensors in the families' Hugging Face layouts (embeddings, MLM heads).
VOCAB_TENSOR = re.compile(r"(word_embeddings|predictions|lm_head|generator_lm_head)")


@dataclass(frozen=True)
class Growth:
    """Where each new word goes: ``ids[i]`` for ``words[i]``, whose pieces under the old tokenizer are
    ``pieces[i]``; ``tokens`` is the new vocabulary (token at its id)."""

    words: tuple[str, ...]
    ids: tuple[int, ...]
    pieces: tuple[tuple[int, ...], ...]
    tokens: tuple[str, ...]
    old_size: int
    reused_slots: int
    skipped: tuple[str, ...]  # already whole tokens of the vocabulary

    @property
    def new_size(self) -> int:
        return len(self.tokens)

    def describe(self) -> str:
        appended = len(self.words) - self.reused_slots
        return (f"added {len(self.words)} word(s) ({self.reused_slots} in [unused] slots, {appended} appended), "
                f"vocabulary {self.old_size:,} -> {self.new_size:,}"
                + (f"; {len(self.skipped)} already in it" if self.skipped else ""))


def frequent_split_words(tokenizer, texts: Iterable[str], top: int, min_pieces: int = 3,
                         min_count: int = 5) -> list[tuple[str, int, int]]:
    """The ``top`` most frequent words of ``texts`` (as the tokenizer normalises and splits them) that hold a
    letter, occur ``min_count`` times or more and are cut into ``min_pieces`` pieces or more: (word, count, pieces),
    most frequent first (ties by word)."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(tokenizer.words(text))
    found = []
    for word, count in counts.items():
        if count < min_count or not any(ch.isalpha() for ch in word) or tokenizer.token_to_id(word) is not None:
            continue
        pieces = len(tokenizer.encode(word))
        if pieces >= min_pieces:
            found.append((word, count, pieces))
    return sorted(found, key=lambda entry: (-entry[1], entry[0]))[:top]


def plan_growth(tokenizer, words: Iterable[str]) -> Growth:
    """The new vocabulary with ``words`` (normalised as the tokenizer does; each must be one word to it) in the
    ``[unusedN]`` slots first, then appended; words already whole tokens are skipped, repeats kept once."""
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    slots = sorted((int(m.group(1)), i) for i, t in enumerate(tokens) if (m := UNUSED_SLOT.match(t)))
    free = [i for _, i in slots]
    new_words, ids, pieces, skipped = [], [], [], []
    for raw in words:
        split = tokenizer.words(raw)
        if len(split) != 1:
            raise InputError(f"{raw!r} is {len(split)} words to this tokenizer ({split[:5]}), not one: list words "
                             "without spaces or punctuation inside")
        word = split[0]
        if word in new_words:
            continue
        if tokenizer.token_to_id(word) is not None:
            skipped.append(word)
            continue
        word_id = free.pop(0) if free else len(tokens)
        if word_id == len(tokens):
            tokens.append(word)
        else:
            tokens[word_id] = word
        new_words.append(word)
        ids.append(word_id)
        pieces.append(tuple(tokenizer.encode(word)))
    reused = sum(1 for i in ids if i < tokenizer.vocab_size)
    return Growth(tuple(new_words), tuple(ids), tuple(pieces), tuple(tokens), tokenizer.vocab_size, reused,
                  tuple(skipped))


def grow_weights(state: dict[str, torch.Tensor], growth: Growth) -> dict[str, torch.Tensor]:
    """``state`` with every vocabulary-sized tensor (``VOCAB_TENSOR``, first dimension the old vocabulary's size)
    grown to the new size, each new word's row the mean of its pieces' rows; the other tensors as they are.

    Raises:
        InputError: No tensor of the state is vocabulary-sized (the state is not of this vocabulary).
    """
    out, grown = dict(state), []
    for name, value in state.items():
        if not VOCAB_TENSOR.search(name) or value.dim() == 0 or value.shape[0] != growth.old_size:
            continue
        extra = growth.new_size - growth.old_size
        tensor = torch.cat([value, value.new_zeros((extra, *value.shape[1:]))]) if extra else value.clone()
        for word_id, pieces in zip(growth.ids, growth.pieces):
            tensor[word_id] = value[list(pieces)].float().mean(0).to(value.dtype)
        out[name] = tensor
        grown.append(name)
    if not grown:
        raise InputError(f"no tensor of the checkpoint has {growth.old_size:,} rows (the tokenizer's vocabulary): "
                         "the tokenizer is not this model's")
    return out


__all__ = ["Growth", "UNUSED_SLOT", "VOCAB_TENSOR", "frequent_split_words", "grow_weights", "plan_growth"]
