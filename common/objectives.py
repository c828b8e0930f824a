"""The objectives menu's vocabulary: what a dataset's rows are for, shared by the preprocessing config that
chooses it, the manifest that records it and the pretraining loader that checks it. Imports nothing, so every
stage (the cluster renderer included) can read it.
"""
from __future__ import annotations

from dataclasses import dataclass

MASK_UNITS = ("token", "whole_word", "span", "ngram")
INSTANCE_KINDS = ("pairs", "full_sentences", "doc_sentences")
SENTENCE_OBJECTIVES = ("nsp", "sop", "none")
MASKING_TIMES = ("static", "dynamic")


@dataclass(frozen=True)
class ObjectiveEntry:
    """What the rows of a dataset are for (the manifest's ``objective``; version-1 manifests have none and read
    as the 2018 recipe: pairs, NSP, static masks).

    kind: ``pairs`` ([CLS] A [SEP] B [SEP]), ``full_sentences`` (sentences packed up to the maximum length across
        documents) or ``doc_sentences`` (the same within one document); packed kinds have ``doc_starts``.
    sentence_objective: ``nsp`` (B follows A, or is random), ``sop`` (A and B consecutive, maybe swapped) or
        ``none``.
    masking: ``static`` (masks stored in the shards) or ``dynamic`` (rows stored unmasked; the pretraining loader
        masks them, anew every epoch).
    mask_unit, masked_lm_prob, max_predictions_per_seq, mask_token_fraction, random_token_fraction: the static
        masks' recipe (``common.masking``: a chosen position shows [MASK] with probability mask_token_fraction, a
        random token with random_token_fraction, else itself); for a dynamic dataset only what preprocessing was
        asked for, the pretraining config decides.
    """

    kind: str = "pairs"
    sentence_objective: str = "nsp"
    masking: str = "static"
    mask_unit: str = "token"
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    mask_token_fraction: float = 0.8
    random_token_fraction: float = 0.1

    def __post_init__(self):
        for name, allowed in (("mask_unit", MASK_UNITS), ("kind", INSTANCE_KINDS),
                              ("sentence_objective", SENTENCE_OBJECTIVES), ("masking", MASKING_TIMES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"objective.{name} is {getattr(self, name)!r}; expected one of {', '.join(allowed)}")
        check_replacement_split(self.mask_token_fraction, self.random_token_fraction)

    @property
    def packed(self) -> bool:
        return self.kind != "pairs"

    @classmethod
    def from_document(cls, document: dict) -> ObjectiveEntry:
        entry = document.get("objective")
        if entry is not None:
            return cls(**{name: entry[name] for name in cls.__dataclass_fields__ if name in entry})
        instances = document.get("parameters", {}).get("instances", {})
        return cls(mask_unit="whole_word" if instances.get("whole_word_mask") else "token",
                   masked_lm_prob=float(instances.get("masked_lm_prob", 0.15)),
                   max_predictions_per_seq=int(instances.get("max_predictions_per_seq", 20)))


def check_replacement_split(mask_token_fraction: float, random_token_fraction: float) -> None:
    """The shares of chosen positions shown as [MASK] and as a random token: each in [0, 1], together at most 1
    (the rest show the token itself)."""
    if (min(mask_token_fraction, random_token_fraction) < 0
            or mask_token_fraction + random_token_fraction > 1 + 1e-12):
        raise ValueError(f"mask_token_fraction {mask_token_fraction} and random_token_fraction "
                         f"{random_token_fraction} must be >= 0 and add up to at most 1 (BERT: 0.8 and 0.1)")


def check_combination(kind: str, sentence_objective: str) -> None:
    """Pairs train a sentence-level head (nsp or sop); packed rows have no pairs, hence ``none``."""
    if (kind == "pairs") != (sentence_objective in ("nsp", "sop")):
        raise ValueError(f"kind {kind} with sentence_objective {sentence_objective}: pairs take nsp or sop, packed "
                         "kinds (full_sentences, doc_sentences) take none")


__all__ = ["INSTANCE_KINDS", "MASKING_TIMES", "MASK_UNITS", "ObjectiveEntry", "SENTENCE_OBJECTIVES",
           "check_combination", "check_replacement_split"]
