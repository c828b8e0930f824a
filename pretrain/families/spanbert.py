"""SpanBERT (Joshi et al. 2020) as a ``Family``: BERT trained with masked-LM plus the span-boundary objective
(``objective.span_boundary: true`` with ``model.family: bert``), exported as the plain BERT it trains.

The boundary head (``models.bert.span_boundary``) belongs to the loss module (``spanbert_loss.SpanBoundaryLoss``),
not to the model: DeepSpeed trains and checkpoints it with the run, so a resumed run continues it exactly, and the
export (``BertForPreTraining``, which ``transformers`` loads and ``python -m finetune`` reads) never holds it. Its
initial weights come from a generator seeded by the run's seed, the same on every rank.

The loss needs the dataset's [CLS] and [SEP] ids (a span beside one has no boundary target) and span masks: both come
from the dataset's manifest when the loss module is built, at the run's start; a dataset whose masks are not spans
is refused there in one line.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from common.errors import ConfigError
from common.hashing import stable_hash64
from models.bert.span_boundary import SpanBoundaryHead, flops_per_target
from pretrain.config import ModelConfig, ObjectiveConfig
from pretrain.families.bert import BertFamily
from pretrain.families.spanbert_loss import STAT_NAMES, SpanBoundaryLoss, summary

HEAD = "span_boundary."  # the head's names in the loss module's state (and so in a checkpoint's)


class SpanBertFamily(BertFamily):
    stat_names = STAT_NAMES

    def __init__(self, model: ModelConfig, objective: ObjectiveConfig, data_path: str, seed: int):
        super().__init__(model, objective.sentence_objective)
        self.objective, self.data_path, self.seed = objective, data_path, seed

    @classmethod
    def from_config(cls, cfg) -> SpanBertFamily:
        return cls(cfg.model, cfg.objective, cfg.data.path, cfg.seed)

    def head_seed(self) -> int:
        """The boundary head's initialisation seed: a stable hash of the run's seed (63 bits)."""
        return stable_hash64(self.seed, "span-boundary-head") >> 1

    def boundary_excluded(self) -> tuple[int, ...]:
        """The dataset's [CLS] and [SEP] ids, after checking that its masks are spans (``ConfigError`` otherwise)."""
        from common.manifest import Manifest
        from pretrain.recipe import resolve

        manifest = Manifest.read(Path(self.data_path))
        recipe = resolve(self.objective, manifest)
        unit = manifest.objective.mask_unit if recipe.dynamic_masking is None else recipe.dynamic_masking.mode
        if unit != "span":
            raise ConfigError(f"objective.span_boundary predicts masked spans from their boundaries, but the masks of "
                              f"{manifest.path} are {unit} masks: set objective.mask_unit: span on a dynamically "
                              "masked dataset, or preprocess with instances.mask_unit: span")
        special = manifest.tokenizer.special_ids
        return special["[CLS]"], special["[SEP]"]

    def loss_module(self, model: nn.Module) -> nn.Module:
        return SpanBoundaryLoss(model, self.sentence_objective, boundary_excluded=self.boundary_excluded(),
                                seed=self.head_seed(), padding_free=self.padding_free)

    def loss_parameters(self, model_config) -> int:
        """The boundary head's (about 2 M at BERT-base), counted on the meta device."""
        with torch.device("meta"):
            return sum(p.numel() for p in SpanBoundaryHead(model_config).parameters())

    def summary(self, stats: torch.Tensor) -> dict[str, float]:
        return summary(stats, self.sentence_objective)

    def flops_per_token(self, model: nn.Module, seq_len: int, masked_fraction: float) -> float:
        """BERT's, plus the boundary head's two layers and decoder for every masked token."""
        head = flops_per_target(model.config) * masked_fraction
        return super().flops_per_token(model, seq_len, masked_fraction) + head

    def model_from_state(self, state: dict[str, torch.Tensor], config=None) -> nn.Module:
        """The BERT of a checkpoint's weights: the boundary head's are left out."""
        return super().model_from_state({k: v for k, v in state.items() if not k.startswith(HEAD)}, config)

    def describe(self, model: nn.Module) -> str:
        return f"{super().describe(model)} (and the span-boundary head, trained but not exported)"

