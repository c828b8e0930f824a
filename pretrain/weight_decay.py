"""BERT's weight-decay recipe, for every optimizer of pretraining and finetuning: no decay on biases and
layer-normalisation parameters (found by module type, so ALBERT's ``full_layer_layer_norm`` and ELECTRA's are spared
as BERT's ``LayerNorm`` is)."""
from __future__ import annotations

import torch


def parameter_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """The trainable parameters of ``module`` as two optimizer groups: decayed, then not decayed (each in the order
    of ``named_parameters``)."""
    norms = {id(p) for m in module.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (no_decay if name.endswith("bias") or id(param) in norms else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
