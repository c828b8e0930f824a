"""ELECTRA (Clark et al., 2020) as a ``Family``: a generator and a discriminator trained together, the
discriminator exported for finetuning.

The model is ``models.electra.model.ElectraPair`` of ``model.preset`` (electra_tiny, electra_small, electra_base) with
the generator at ``electra.generator_fraction`` of the discriminator's width (default: the preset's, the paper's
1/4 or 1/3); the loss is ``pretrain.families.electra_loss``'s, generator MLM + ``electra.discriminator_weight`` x the
discriminator's replaced-token loss, each a mean over the global batch's tokens (masked ones for the generator,
every real one for the discriminator) whatever the ranks and accumulation steps. The generator's samples are drawn
from a seed that is a stable hash of (run seed, step, rank, micro-batch), so a resumed run draws the replacements
the uninterrupted one drew.
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from models.electra.hf import export_pair, load_pair, pair_config
from models.electra.model import PRESETS, ElectraPair, ElectraPairConfig, flops_per_token, preset
from pretrain.checkpoints import finished_export
from pretrain.config import ElectraTrainingConfig, ModelConfig
from pretrain.families import Family
from pretrain.families.bert import load_state
from pretrain.families.electra_loss import STAT_NAMES, ElectraLoss, roc_auc, summary

# One parameter, several names: the discriminator reads the generator's embedding module, and the generator's
# output layer is the word embedding table. A checkpoint holds each once, under the generator's embeddings.
_TIED_PREFIX = "discriminator.electra.embeddings."
_TIED_HEAD = "generator.generator_lm_head.weight"
_WORD = "generator.electra.embeddings.word_embeddings.weight"
_POSITIONS = "generator.electra.embeddings.position_embeddings.weight"


def sample_seed(seed: int, step: int, rank: int, micro: int) -> int:
    """The generator's sampling seed for micro-batch ``micro`` of (0-based) step ``step`` on ``rank``: a stable
    hash (never Python's ``hash``, which varies per process), 63 bits for ``torch.Generator.manual_seed``."""
    key = f"electra-sample/{seed}/{step}/{rank}/{micro}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


class ElectraPretrainingLoss(ElectraLoss):
    """``ElectraLoss`` taking the loader's micro-batch: ``token_loss_scale`` scales the discriminator's loss as
    ``mlm_loss_scale`` does the generator's; the pair label is not used (ELECTRA has no sentence-pair task)."""

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                masked_positions: torch.Tensor, masked_labels: torch.Tensor, mlm_loss_scale: torch.Tensor,
                token_loss_scale: torch.Tensor, *, sample_seed: int, next_sentence_labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                return_scores: bool = False) -> tuple[torch.Tensor, ...]:
        """(loss, statistics), and with ``return_scores`` (evaluation) the discriminator's scores third."""
        del next_sentence_labels
        terms = self.terms(input_ids, token_type_ids, attention_mask, masked_positions, masked_labels,
                           sample_seed=sample_seed, mlm_loss_scale=mlm_loss_scale, disc_loss_scale=token_loss_scale,
                           position_ids=position_ids, document_ids=document_ids, return_scores=return_scores)
        loss = terms.generator_loss + self.discriminator_weight * terms.discriminator_loss
        return (loss, terms.stats, terms.scores) if return_scores else (loss, terms.stats)


def evaluation_seed(index: int) -> int:
    """The generator's sampling seed for evaluation micro-batch ``index``: of the index alone, so every run and
    ``pretrain.evaluate`` corrupt the held-out rows from the same uniforms (the draws, not the samples, are fixed)."""
    key = f"electra-evaluation/{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


class DiscriminatorEvaluation:
    """What ELECTRA and DeBERTa-v3 evaluate beyond their training figures: the discriminator's ROC AUC over every
    held-out real token, from its scores (sums cannot give it)."""

    evaluation_scores = True

    def evaluation_inputs(self, index: int) -> dict:
        return {"sample_seed": evaluation_seed(index), "return_scores": True}

    def evaluation_summary(self, stats: torch.Tensor, scores=None) -> dict[str, float]:
        record = Family.evaluation_summary(self, stats)
        record["disc_auc"] = roc_auc(scores) if scores is not None else float("nan")
        return record


class ElectraFamily(DiscriminatorEvaluation, Family):
    name = "electra"
    stat_names = STAT_NAMES
    architecture = "ElectraForPreTraining discriminator, ElectraForMaskedLM generator in generator/"

    def __init__(self, model: ModelConfig, electra: ElectraTrainingConfig, seed: int):
        if model.preset not in PRESETS:
            raise ValueError(f"model.preset {model.preset!r} is not an ELECTRA preset; choose one of "
                             f"{', '.join(sorted(PRESETS))}")
        if model.padding_free:
            raise ValueError("model.padding_free is not implemented for model.family electra; set it to false")
        self.model_cfg, self.electra_cfg, self.seed = model, electra, seed

    @classmethod
    def from_config(cls, cfg) -> ElectraFamily:
        return cls(cfg.model, cfg.electra, cfg.seed)

    @property
    def fraction(self) -> float:
        """The generator's width fraction: the config's, else the preset's."""
        fraction = self.electra_cfg.generator_fraction
        return PRESETS[self.model_cfg.preset][1] if fraction is None else fraction

    def pair_config(self, *, vocab_size: int, pad_token_id: int) -> ElectraPairConfig:
        m = self.model_cfg
        dropouts = m.dropout_overrides()
        return preset(m.preset, generator_fraction=self.fraction, vocab_size=vocab_size, pad_token_id=pad_token_id,
                      max_position_embeddings=m.max_position_embeddings, **dropouts)

    def new_model(self, *, vocab_size: int, pad_token_id: int) -> ElectraPair:
        return ElectraPair(self.pair_config(vocab_size=vocab_size, pad_token_id=pad_token_id))

    def load_model(self, directory: Path) -> tuple[ElectraPair, list[str]]:
        """An ELECTRA directory: our run's export (discriminator and generator/) continues the pair; a
        discriminator alone (Google's ``electra-*-discriminator``) gets a fresh generator beside it."""
        return load_pair(directory, self.electra_cfg.generator_fraction, self.fraction)

    def positions(self, model: nn.Module) -> int:
        return model.config.discriminator.max_position_embeddings

    def vocab_size(self, model: nn.Module) -> int:
        return model.config.discriminator.vocab_size

    def set_activation_checkpointing(self, model: nn.Module, enabled: bool) -> None:
        model.generator.electra.encoder.gradient_checkpointing = enabled
        model.discriminator.electra.encoder.gradient_checkpointing = enabled

    def loss_module(self, model: nn.Module) -> nn.Module:
        return ElectraPretrainingLoss(model, self.electra_cfg.discriminator_weight)

    def micro_batch_inputs(self, *, step: int, micro: int, rank: int) -> dict[str, int]:
        return {"sample_seed": sample_seed(self.seed, step, rank, micro)}

    def summary(self, stats: torch.Tensor) -> dict[str, float]:
        """``loss`` (generator MLM + weight x discriminator), then each network's loss and accuracy, the share of
        real tokens replaced and the discriminator's recall of them (``electra_objective.summary``)."""
        return summary(stats, self.electra_cfg.discriminator_weight)

    def flops_per_token(self, model: nn.Module, seq_len: int, masked_fraction: float) -> float:
        return flops_per_token(model.config, seq_len, masked_fraction=masked_fraction)

    def export(self, model: nn.Module, directory: Path, tokenizer_dir: Path | None) -> None:
        export_pair(model, directory, tokenizer_dir)

    def model_from_state(self, state: dict[str, torch.Tensor], config=None) -> ElectraPair:
        state = {k: v for k, v in state.items() if not k.startswith(_TIED_PREFIX) and k != _TIED_HEAD}
        model = ElectraPair(config or self._config_from_weights(state))
        tied = tuple(k for k in model.state_dict() if k.startswith(_TIED_PREFIX)) + (_TIED_HEAD,)
        return load_state(model, state, tied=tied)

    def _config_from_weights(self, state: dict[str, torch.Tensor]) -> ElectraPairConfig:
        """The run's pair for weights read back from a checkpoint: the ``init_from`` directory's, or the preset's at
        the vocabulary and positions the embedding tables hold (flat or not)."""
        if self.model_cfg.init_from:
            directory = finished_export(self.model_cfg.init_from) or Path(self.model_cfg.init_from)
            return pair_config(directory, self.electra_cfg.generator_fraction, self.fraction)
        width = PRESETS[self.model_cfg.preset][0].embedding_size
        config = self.pair_config(vocab_size=state[_WORD].numel() // width, pad_token_id=0)
        positions = state[_POSITIONS].numel() // width
        return ElectraPairConfig(discriminator=replace(config.discriminator, max_position_embeddings=positions),
                                 generator=replace(config.generator, max_position_embeddings=positions))

    def describe(self, model: nn.Module) -> str:
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        return (f"{count(model):,} parameters (generator {count(model.generator):,} and discriminator "
                f"{count(model.discriminator):,}, each counting the embeddings they share)")


__all__ = ["DiscriminatorEvaluation", "ElectraFamily", "ElectraPretrainingLoss", "evaluation_seed", "sample_seed"]


TRAINING = ElectraFamily  # what pretrain.families.for_config builds for model.family: electra
