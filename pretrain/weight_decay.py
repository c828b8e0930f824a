"""BERT's weight-decay recipe, for every optimizer of pretraining and finetuning: no decay on biases and
LayerNorm parameters."""
from __future__ import annotations

import torch

NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")  # parameter name endings


def parameter_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """The trainable parameters of ``module`` as two optimizer groups: decayed, then not decayed."""
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (no_decay if name.endswith(NO_DECAY) else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
