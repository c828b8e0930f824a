"""Dynamic masking (RoBERTa): the loader masks rows stored unmasked, anew every epoch.

A row's masks are a pure function of (run seed, epoch, the row's index in the dataset): its key is the
counter-based draw (``common.counter_rng``) numbered by the row's index from a BLAKE2b hash of (seed, epoch), and
``common.masking`` derives every choice from that key. So an epoch shows each row new masks, and the masks do not
depend on the world size, the accumulation split, the batch the row lands in or its width, or on a resume (the
loader's position is (epoch, batch)). Pure numpy: no torch, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.counter_rng import random_bits
from common.hashing import stable_hash64
from common.masking import MaskingRecipe, MaskingVocab, mask_rows

ROW_KEY_STREAM = 0  # the stream of the epoch's base key that numbers rows


@dataclass(frozen=True)
class DynamicMasking:
    """The recipe, the vocabulary facts it needs (specials, word pieces) and the run's seed."""

    recipe: MaskingRecipe
    vocab: MaskingVocab
    seed: int
    never: np.ndarray = field(init=False, repr=False, compare=False)  # bool per id: never chosen

    def __post_init__(self):
        never = np.zeros(len(self.vocab.is_continuation), bool)
        never[list(self.vocab.never_mask_ids)] = True
        object.__setattr__(self, "never", never)

    @classmethod
    def for_dataset(cls, recipe: MaskingRecipe, tokenizer_dir: str | Path, seed: int) -> DynamicMasking:
        """With the word pieces of the dataset's own copy of its tokenizer (``Manifest.tokenizer_path``)."""
        from common.tokenizer import load_tokenizer

        return cls(recipe, MaskingVocab.from_tokenizer(load_tokenizer(str(tokenizer_dir))), seed)

    def row_keys(self, epoch: int, rows: np.ndarray) -> np.ndarray:
        """uint64 per row: distinct for distinct rows (a bijection of the index), new every epoch."""
        base = np.uint64(stable_hash64(self.seed, "dynamic-masking", epoch))
        return random_bits(base, ROW_KEY_STREAM, np.asarray(rows, np.int64).astype(np.uint64))

    def mask(self, tokens: np.ndarray, lengths: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        """Mask rows given flat (``tokens``, per-row ``lengths``): (masked tokens, flat positions within each row
        (uint16, ascending), per-row counts, flat labels)."""
        lengths = np.asarray(lengths, np.int64)
        width = int(lengths.max(initial=0))
        valid = np.arange(width)[None, :] < lengths[:, None]
        dense = np.zeros((len(lengths), width), tokens.dtype)
        dense[valid] = tokens
        masked = mask_rows(dense, valid & ~self.never[dense], lengths, keys, self.recipe, self.vocab)
        return (dense[valid], masked.cols.astype(np.uint16), np.bincount(masked.rows, minlength=len(lengths)),
                masked.labels)


__all__ = ["DynamicMasking"]
