"""DeBERTa-v3 (He et al., 2021) as a ``Family`` (``model.family: deberta-v2``): a generator and a discriminator with
gradient-disentangled embedding sharing, trained together; the discriminator exported for finetuning.

The model is ``models.deberta_v2.pair.DebertaPair`` of ``model.preset`` (deberta_v3_tiny, deberta_v3_small,
deberta_v3_base): the generator the discriminator's width at half its depth. The loss is
``pretrain.families.deberta_loss``'s: generator MLM + ``electra.discriminator_weight`` x replaced-token detection,
each a mean over the global batch's tokens, the generator's samples drawn from the seed ELECTRA's runs use (a stable
hash of run seed, step, rank and micro-batch), so a resumed run draws what the uninterrupted one drew. The
``electra`` section's ``discriminator_weight`` is the objective's lambda; its ``generator_fraction`` (ELECTRA's
width) does not apply.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from models.deberta_v2.hf import export_pair, load_pair, pair_config
from models.deberta_v2.pair import PRESETS, DebertaPair, DebertaPairConfig, flops_per_token, preset
from pretrain.checkpoints import finished_export
from pretrain.config import ElectraTrainingConfig, ModelConfig
from pretrain.families import Family
from pretrain.families.bert import load_state
from pretrain.families.deberta_loss import STAT_NAMES, DebertaPretrainingLoss, summary
from pretrain.families.electra import DiscriminatorEvaluation, sample_seed

_WORD = "generator.deberta.embeddings.word_embeddings.weight"


class DebertaFamily(DiscriminatorEvaluation, Family):
    name = "deberta-v2"
    stat_names = STAT_NAMES
    architecture = "DebertaV2 discriminator (E_G + E_Delta), DebertaV2ForMaskedLM generator in generator/"

    def __init__(self, model: ModelConfig, electra: ElectraTrainingConfig, seed: int, sentence_objective: str):
        if model.preset not in PRESETS:
            raise ValueError(f"model.preset {model.preset!r} is not a DeBERTa-v3 preset; choose one of "
                             f"{', '.join(sorted(PRESETS))}")
        if model.padding_free:
            raise ValueError("model.padding_free is not implemented for model.family deberta-v2 (its relative "
                             "attention runs on the padded grid); set it to false")
        if electra.generator_fraction is not None:
            raise ValueError("electra.generator_fraction is ELECTRA's generator width; DeBERTa-v3's generator is "
                             "the discriminator's width at half its depth: leave it unset")
        if sentence_objective != "none":
            raise ValueError(f"model.family deberta-v2 trains no sentence-pair head, but objective."
                             f"sentence_objective is {sentence_objective!r}; set it to none")
        self.model_cfg, self.electra_cfg, self.seed = model, electra, seed

    @classmethod
    def from_config(cls, cfg) -> DebertaFamily:
        return cls(cfg.model, cfg.electra, cfg.seed, cfg.objective.sentence_objective)

    def pair_config(self, *, vocab_size: int, pad_token_id: int) -> DebertaPairConfig:
        m = self.model_cfg
        return preset(m.preset, vocab_size=vocab_size, pad_token_id=pad_token_id,
                      max_position_embeddings=m.max_position_embeddings, **m.dropout_overrides())

    def new_model(self, *, vocab_size: int, pad_token_id: int) -> DebertaPair:
        return DebertaPair(self.pair_config(vocab_size=vocab_size, pad_token_id=pad_token_id))

    def load_model(self, directory: Path) -> tuple[DebertaPair, list[str]]:
        """A DeBERTa-v3 directory: our run's export continues the pair (E_Delta = its discriminator's table minus
        its generator's); a discriminator alone (Microsoft's releases) gets a fresh generator beside it."""
        return load_pair(directory)

    def positions(self, model: nn.Module) -> int:
        return model.config.discriminator.max_position_embeddings

    def vocab_size(self, model: nn.Module) -> int:
        return model.config.discriminator.vocab_size

    def set_activation_checkpointing(self, model: nn.Module, enabled: bool) -> None:
        model.generator.deberta.encoder.gradient_checkpointing = enabled
        model.discriminator.deberta.encoder.gradient_checkpointing = enabled

    def loss_module(self, model: nn.Module) -> nn.Module:
        return DebertaPretrainingLoss(model, self.electra_cfg.discriminator_weight)

    def micro_batch_inputs(self, *, step: int, micro: int, rank: int) -> dict[str, int]:
        return {"sample_seed": sample_seed(self.seed, step, rank, micro)}

    def summary(self, stats: torch.Tensor) -> dict[str, float]:
        return summary(stats, self.electra_cfg.discriminator_weight)

    def flops_per_token(self, model: nn.Module, seq_len: int, masked_fraction: float) -> float:
        return flops_per_token(model.config, seq_len, masked_fraction=masked_fraction)

    def export(self, model: nn.Module, directory: Path, tokenizer_dir: Path | None) -> None:
        export_pair(model, directory, tokenizer_dir)

    def model_from_state(self, state: dict[str, torch.Tensor], config=None) -> DebertaPair:
        """Every parameter is stored once (GDES reads the generator's table, it does not hold it): no tied keys."""
        return load_state(DebertaPair(config or self._config_from_weights(state)), state)

    def _config_from_weights(self, state: dict[str, torch.Tensor]) -> DebertaPairConfig:
        """The ``init_from`` directory's pair, or the preset's at the vocabulary the (maybe flat) table holds."""
        if self.model_cfg.init_from:
            return pair_config(finished_export(self.model_cfg.init_from) or Path(self.model_cfg.init_from))
        width = PRESETS[self.model_cfg.preset].hidden_size
        config = self.pair_config(vocab_size=state[_WORD].numel() // width, pad_token_id=0)
        return config

    def describe(self, model: nn.Module) -> str:
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        return (f"{count(model):,} parameters (generator {count(model.generator):,}, discriminator "
                f"{count(model.discriminator):,} of which E_Delta "
                f"{model.discriminator.deberta.embeddings.word_embeddings.delta.numel():,})")


__all__ = ["DebertaFamily"]


TRAINING = DebertaFamily  # what pretrain.families.for_config builds for model.family: deberta-v2
