"""What a run trains, resolved from its ``objective`` config and checked against the dataset's manifest.

The manifest says what the rows are (``common.objectives.ObjectiveEntry``): pairs or packed documents, which
sentence-level labels they carry, whether their masks are stored. The config must agree with it, or the run
would train on something other than it says (an NSP head on packed rows' zero labels, stored masks masked
again, no masks at all); every disagreement is refused at start-up, all of them in one line that names the
manifest and the fix. Pure: no torch, no I/O beyond the manifest already read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import ConfigError
from common.manifest import Manifest
from common.masking import MaskingRecipe
from pretrain.config import ObjectiveConfig


@dataclass(frozen=True)
class Recipe:
    """The resolved objective of a run."""

    sentence_objective: str               # nsp | sop | none: the pair head's loss, if any
    document_attention: bool              # packed rows attend within each document block, positions restart
    dynamic_masking: MaskingRecipe | None  # the loader's masks; None: the masks stored in the shards
    packed: bool                          # the rows carry doc_starts

    def describe(self) -> str:
        if self.dynamic_masking is None:
            masks = "static masks from the shards"
        else:
            m = self.dynamic_masking
            masks = (f"dynamic {m.mode} masking of {m.rate:g} of the tokens (at most {m.max_predictions} a row; "
                     f"[MASK] {m.mask_fraction:g}, random {m.random_fraction:g}), drawn anew every epoch")
        pair = "no sentence-pair loss" if self.sentence_objective == "none" else f"{self.sentence_objective} loss"
        attention = "attention within each document" if self.document_attention else "full attention"
        return f"objective: {masks}; {pair}; {attention}"


def resolve(objective: ObjectiveConfig, manifest: Manifest) -> Recipe:
    """The run's recipe on the dataset of ``manifest``; ``ConfigError`` naming every mismatch otherwise."""
    entry = manifest.objective
    problems = []
    if objective.masking != entry.masking:
        problems.append(f"its rows are masked {entry.masking} but objective.masking is {objective.masking}: set "
                        f"objective.masking: {entry.masking}, or point data.path at a dataset preprocessed with "
                        f"instances.masking: {objective.masking}")
    if objective.sentence_objective != entry.sentence_objective:
        problems.append(f"its rows are {entry.kind} with sentence objective {entry.sentence_objective} but "
                        f"objective.sentence_objective is {objective.sentence_objective}: set "
                        f"objective.sentence_objective: {entry.sentence_objective}, or point data.path at a dataset "
                        f"preprocessed with instances.sentence_objective: {objective.sentence_objective}")
    if objective.attention == "document" and not entry.packed:
        problems.append(f"objective.attention document needs packed rows (doc_starts) but its rows are "
                        f"{entry.kind}: set objective.attention: full, or preprocess with instances.kind "
                        "full_sentences or doc_sentences")
    if entry.masking == "static":
        stored = {"mask_unit": entry.mask_unit, "masked_lm_prob": entry.masked_lm_prob,
                  "max_predictions": entry.max_predictions_per_seq, "mask_token_fraction": entry.mask_token_fraction,
                  "random_token_fraction": entry.random_token_fraction}
        for name, value in stored.items():
            given = getattr(objective, name)
            if given is not None and given != value:
                problems.append(f"its masks are stored ({name} {value}) but objective.{name} is {given}: remove "
                                f"objective.{name} (static masks are the dataset's), or preprocess with "
                                "instances.masking: dynamic")
    if problems:
        raise ConfigError(f"{manifest.path} does not match the config's objective: " + "; ".join(problems))
    return Recipe(sentence_objective=entry.sentence_objective, document_attention=objective.attention == "document",
                  dynamic_masking=_dynamic(objective, manifest) if entry.masking == "dynamic" else None,
                  packed=entry.packed)


def _dynamic(objective: ObjectiveConfig, manifest: Manifest) -> MaskingRecipe:
    """The loader's masking: the config's values, an unset one the manifest's (what preprocessing recorded);
    an unset cap lets the rate decide (a row of the longest length predicts ceil(rate x length) at most)."""
    unit = objective.mask_unit or manifest.objective.mask_unit
    rate = objective.masked_lm_prob if objective.masked_lm_prob is not None else manifest.objective.masked_lm_prob
    cap = objective.max_predictions or max(1, math.ceil(rate * manifest.max_seq_length))
    split = {name: getattr(objective, key) if getattr(objective, key) is not None else getattr(manifest.objective, key)
             for name, key in (("mask_fraction", "mask_token_fraction"), ("random_fraction", "random_token_fraction"))}
    return MaskingRecipe(mode=unit, rate=rate, max_predictions=cap, **split)


__all__ = ["Recipe", "resolve"]


def other_vocabulary(directory, manifest: Manifest):
    """The tokenizer of a model directory (``tokenizer/``, ``vocab.txt`` or a Hugging Face ``tokenizer.json``, the
    first found) when it is not the
    vocabulary ``manifest``'s dataset was made with; None when it is, or when the directory has neither."""
    from pathlib import Path

    from common.tokenizer import load_tokenizer

    for name in ("tokenizer", "vocab.txt", "tokenizer.json"):
        candidate = Path(directory) / name
        if candidate.exists():
            theirs = load_tokenizer(str(candidate), lowercase=manifest.tokenizer.lowercase).identity()
            return candidate if theirs["vocab_sha256"] != manifest.tokenizer.vocab_sha256 else None
    return None
