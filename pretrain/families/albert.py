"""ALBERT (Lan et al. 2020) as a ``Family``: factorized embeddings and cross-layer parameter sharing
(``models.albert.model``), trained with BERT's objective module on any dataset of the objectives menu (sentence-order
prediction, ``objective.sentence_objective: sop``, is ALBERT's), exported as ``AlbertForPreTraining``.

ALBERT's forward takes BERT's arguments (unpadding, ``position_ids``, ``document_ids``), so
``pretrain.families.bert_loss.PretrainingLoss`` trains it as it trains BERT: padding-free and document attention
included, with the same statistics and logged metrics. Its MFU counts every application of the shared layers.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from common.configlib import ConfigError
from models.albert.hf import export_albert, load_albert, load_albert_config
from models.albert.model import PRESETS, AlbertConfig, AlbertForPreTraining, flops_per_token, preset
from pretrain.checkpoints import finished_export
from pretrain.config import ModelConfig
from pretrain.families import Family
from pretrain.families.bert import BertFamily, load_state

_TIED = ("predictions.decoder.weight", "predictions.decoder.bias")  # the word embeddings and predictions.bias
_WORDS, _POSITIONS = "albert.embeddings.word_embeddings.weight", "albert.embeddings.position_embeddings.weight"


class AlbertFamily(Family):
    name = "albert"
    stat_names = BertFamily.stat_names
    architecture = "AlbertForPreTraining"
    summary = BertFamily.summary  # MLM plus the pair head's loss, named after the objective (sop_loss, ...)

    def __init__(self, model: ModelConfig, sentence_objective: str, output_dir: Path):
        self.model_cfg = model
        self.output_dir = Path(output_dir)
        self.sentence_objective = sentence_objective
        self.padding_free = model.padding_free
        if not model.init_from and model.preset not in PRESETS:
            raise ConfigError(f"model.preset is {model.preset!r}, not an ALBERT size; with model.family albert "
                              f"choose one of {', '.join(PRESETS)}")

    @classmethod
    def from_config(cls, cfg) -> AlbertFamily:
        return cls(cfg.model, cfg.objective.sentence_objective, Path(cfg.output_dir))

    def model_config(self, *, vocab_size: int, pad_token_id: int) -> AlbertConfig:
        """The preset at the dataset's vocabulary and the run's positions, with the run's dropout overrides
        (ALBERT v2's presets train without dropout)."""
        m = self.model_cfg
        dropout = m.dropout_overrides()
        return preset(m.preset, vocab_size=vocab_size, max_position_embeddings=m.max_position_embeddings,
                      pad_token_id=pad_token_id, **dropout)

    def new_model(self, *, vocab_size: int, pad_token_id: int) -> AlbertForPreTraining:
        return AlbertForPreTraining(self.model_config(vocab_size=vocab_size, pad_token_id=pad_token_id))

    def load_model(self, directory: Path) -> tuple[AlbertForPreTraining, list[str]]:
        return load_albert(directory)

    def positions(self, model: nn.Module) -> int:
        return model.config.max_position_embeddings

    def vocab_size(self, model: nn.Module) -> int:
        return model.config.vocab_size

    def set_activation_checkpointing(self, model: nn.Module, enabled: bool) -> None:
        """Each application of a shared group is recomputed in backward (``AlbertTransformer``): the activations
        kept are one hidden state per application, as BERT keeps one per layer."""
        model.albert.encoder.gradient_checkpointing = enabled

    def loss_module(self, model: nn.Module) -> nn.Module:
        from pretrain.families.bert_loss import PretrainingLoss

        return PretrainingLoss(model, self.sentence_objective, padding_free=self.padding_free)

    def flops_per_token(self, model: nn.Module, seq_len: int, masked_fraction: float) -> float:
        return flops_per_token(model.config, seq_len, masked_fraction=masked_fraction)

    def export(self, model: nn.Module, directory: Path, tokenizer_dir: Path | None) -> None:
        export_albert(model, directory, tokenizer_dir=tokenizer_dir)

    def model_from_state(self, state: dict[str, torch.Tensor], config=None) -> AlbertForPreTraining:
        state = {k: v for k, v in state.items() if k not in _TIED}
        return load_state(AlbertForPreTraining(config or self._config_from_weights(state)), state, tied=_TIED)

    def describe(self, model: nn.Module) -> str:
        """The parameters, and the depth they are applied at (what the FLOPs and the activations scale with)."""
        cfg = model.config
        return (f"{super().describe(model)} (ALBERT: {cfg.num_hidden_groups} shared group(s) applied over "
                f"{cfg.depth} layers, embeddings {cfg.embedding_size} -> {cfg.hidden_size})")

    def _config_from_weights(self, state: dict[str, torch.Tensor]) -> AlbertConfig:
        """The run's model config for weights read back from a checkpoint: the ``init_from`` directory's, or the
        preset's at the vocabulary and positions the embedding tables hold (flat or not)."""
        if self.model_cfg.init_from:
            return load_albert_config(finished_export(self.model_cfg.init_from) or Path(self.model_cfg.init_from))
        width = preset(self.model_cfg.preset).embedding_size
        config = self.model_config(vocab_size=state[_WORDS].numel() // width, pad_token_id=self._pad_token_id())
        return replace(config, max_position_embeddings=state[_POSITIONS].numel() // width)

    def _pad_token_id(self) -> int:
        """[PAD]'s id in the run's tokenizer (copied into the run directory at its start), as the run built its
        model with; 0, BERT's, when the run directory has none."""
        from common.tokenizer import load_tokenizer

        directory = self.output_dir / "tokenizer"
        if not directory.is_dir():
            return 0
        found = load_tokenizer(str(directory)).token_to_id("[PAD]")
        return 0 if found is None else found


TRAINING = AlbertFamily  # what pretrain.families.for_config builds for model.family: albert
