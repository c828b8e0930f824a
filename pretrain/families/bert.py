"""BERT (and RoBERTa, SpanBERT, ... : the objectives menu changes the data, not the model) as a ``Family``."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from common.errors import CheckpointError
from models.bert.hf import export, load_config, load_pretrained
from models.bert.model import BertForPreTraining, flops_per_token, preset
from pretrain.checkpoints import finished_export
from pretrain.config import ModelConfig
from pretrain.families import Family
from pretrain.families.bert_loss import STAT_NAMES, PretrainingLoss

_TIED = "cls.predictions.decoder.weight"  # the decoder is the word embeddings: one parameter, sometimes two names


class BertFamily(Family):
    name = "bert"
    stat_names = STAT_NAMES
    architecture = "BertForPreTraining"

    def __init__(self, model: ModelConfig, sentence_objective: str):
        self.model_cfg = model
        self.sentence_objective = sentence_objective
        self.padding_free = model.padding_free

    @classmethod
    def from_config(cls, cfg) -> BertFamily:
        return cls(cfg.model, cfg.objective.sentence_objective)

    def model_config(self, *, vocab_size: int, pad_token_id: int):
        m = self.model_cfg
        config = preset(m.preset, vocab_size=vocab_size, max_position_embeddings=m.max_position_embeddings,
                        pad_token_id=pad_token_id)
        return replace(config, **m.dropout_overrides())

    def new_model(self, *, vocab_size: int, pad_token_id: int) -> BertForPreTraining:
        return BertForPreTraining(self.model_config(vocab_size=vocab_size, pad_token_id=pad_token_id))

    def load_model(self, directory: Path) -> tuple[BertForPreTraining, list[str]]:
        return load_pretrained(directory)

    def positions(self, model: nn.Module) -> int:
        return model.config.max_position_embeddings

    def vocab_size(self, model: nn.Module) -> int:
        return model.config.vocab_size

    def set_activation_checkpointing(self, model: nn.Module, enabled: bool) -> None:
        model.bert.encoder.gradient_checkpointing = enabled

    def loss_module(self, model: nn.Module) -> nn.Module:
        return PretrainingLoss(model, self.sentence_objective, padding_free=self.padding_free)

    def summary(self, stats: torch.Tensor) -> dict[str, float]:
        """Token-mean MLM loss plus sequence-mean sentence-pair loss; the pair head's metrics are named after the
        objective (``nsp_loss``, ``sop_loss``) and left out when it trains none."""
        s = dict(zip(STAT_NAMES, stats.tolist()))
        mlm_loss = s["mlm_loss_sum"] / max(1.0, s["mlm_tokens"])
        pair_loss = s["pair_loss_sum"] / max(1.0, s["pair_sequences"])
        record = {"loss": mlm_loss + pair_loss, "mlm_loss": mlm_loss,
                  "mlm_accuracy": s["mlm_correct"] / max(1.0, s["mlm_tokens"])}
        if self.sentence_objective != "none" and s["pair_sequences"] > 0:
            record[f"{self.sentence_objective}_loss"] = pair_loss
            record[f"{self.sentence_objective}_accuracy"] = s["pair_correct"] / s["pair_sequences"]
        return record

    def flops_per_token(self, model: nn.Module, seq_len: int, masked_fraction: float) -> float:
        return flops_per_token(model.config, seq_len, masked_fraction=masked_fraction)

    def export(self, model: nn.Module, directory: Path, tokenizer_dir: Path | None) -> None:
        export(model, directory, tokenizer_dir=tokenizer_dir)

    def model_from_state(self, state: dict[str, torch.Tensor], config=None) -> BertForPreTraining:
        state = {k: v for k, v in state.items() if k != _TIED}
        return load_state(BertForPreTraining(config or self._config_from_weights(state)), state, tied=(_TIED,))

    def _config_from_weights(self, state: dict[str, torch.Tensor]):
        """The run's model config for weights read back from a checkpoint: the ``init_from`` directory's, or the
        preset's at the vocabulary and positions the embedding tables hold (flat or not)."""
        if self.model_cfg.init_from:
            return load_config(finished_export(self.model_cfg.init_from) or Path(self.model_cfg.init_from))
        hidden = preset(self.model_cfg.preset).hidden_size
        config = self.model_config(vocab_size=state["bert.embeddings.word_embeddings.weight"].numel() // hidden,
                                   pad_token_id=0)
        return replace(config, max_position_embeddings=state["bert.embeddings.position_embeddings.weight"].numel()
                       // hidden)


def load_state(model: nn.Module, state: dict[str, torch.Tensor], *, tied: tuple[str, ...] = ()) -> nn.Module:
    """``model`` with ``state`` loaded (flat tensors reshaped, as a ZeRO consolidation may give them); every
    parameter but the ``tied`` ones must be there and nothing else."""
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    state = {k: v.reshape(shapes[k]) if k in shapes and v.numel() == shapes[k].numel() else v for k, v in state.items()}
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise CheckpointError(f"weights do not fit the run's model config ({str(error).splitlines()[-1].strip()})")
    missing = set(result.missing_keys) - set(tied)
    if missing or result.unexpected_keys:
        raise CheckpointError(f"weights do not fit the run's model config (missing {sorted(missing)[:3]}, "
                              f"unexpected {result.unexpected_keys[:3]})")
    return model


TRAINING = BertFamily  # what pretrain.families.for_config builds for model.family: bert
