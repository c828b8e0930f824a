"""Hugging Face interop for ELECTRA: export our discriminator (or generator) as a ``transformers`` directory, and
load the encoder of one (ours or Google's ``electra-*-discriminator``) for finetuning.

Names already match ``transformers``' ``ElectraForPreTraining`` / ``ElectraForMaskedLM``, so the export writes the
state dict as it is; the reading, the non-finite check and the storage errors are ``pretrain.hf_compat``'s.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from pretrain.checkpoints import CheckpointError
from pretrain.electra import ElectraConfig, ElectraDiscriminator, ElectraGenerator, ElectraModel, ElectraPair
from pretrain.hf_compat import load_weights, non_finite, read_config, write_export

_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")  # older files store them; ours are computed


def export_discriminator(model: ElectraPair | ElectraDiscriminator, directory: str | Path,
                         tokenizer_dir: str | Path | None = None) -> None:
    """Write ``config.json`` (``model_type`` electra, ``ElectraForPreTraining``) and ``model.safetensors`` that
    ``transformers.ElectraForPreTraining.from_pretrained`` (and ``AutoModel``) load; the tokenizer goes along
    as in ``pretrain.hf_compat.export``. Non-finite weights are refused; the directory appears whole or not at all
    (written as ``<directory>.partial``, then renamed)."""
    discriminator = model.discriminator if isinstance(model, ElectraPair) else model
    _export(discriminator, "ElectraForPreTraining", discriminator.state_dict(), directory, tokenizer_dir)


def export_generator(model: ElectraPair | ElectraGenerator, directory: str | Path,
                     tokenizer_dir: str | Path | None = None) -> None:
    """The generator as ``ElectraForMaskedLM`` (its output layer stored once, tied to the word embeddings)."""
    generator = model.generator if isinstance(model, ElectraPair) else model
    state = {k: v for k, v in generator.state_dict().items() if k != "generator_lm_head.weight"}
    _export(generator, "ElectraForMaskedLM", state, directory, tokenizer_dir)


def load_config(directory: str | Path) -> ElectraConfig:
    """The ``ElectraConfig`` of a Hugging Face ELECTRA directory's config.json (``hf_compat.read_config``)."""
    return read_config(directory, "electra", ElectraConfig)


def load_discriminator(directory: str | Path) -> ElectraModel:
    """The encoder (``ElectraModel``: embeddings, projection, layers) of an ELECTRA directory, every weight from
    the file; its ``config`` is the directory's. The pretraining heads are left out; finetuning adds its own."""
    cfg = load_config(directory)
    encoder = ElectraModel(cfg)
    state = {}
    for key, value in load_weights(directory).items():
        key = key.removeprefix("electra.")
        if not key.startswith(("discriminator_predictions.", "generator_")) and key not in _BUFFERS:
            state[key] = value
    bad = non_finite(state)
    if bad:
        raise CheckpointError(f"{directory}: {len(bad)} weight tensors hold NaN or inf (first {bad[0]}); export an "
                              "earlier checkpoint of the run")
    result = encoder.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"{directory}: weights do not match an ELECTRA encoder of this config: unexpected "
                              f"{result.unexpected_keys[:5]}, missing {result.missing_keys[:5]}")
    return encoder


def _export(model: nn.Module, architecture: str, state: dict[str, torch.Tensor], directory: str | Path,
            tokenizer_dir: str | Path | None) -> None:
    config = {**dataclasses.asdict(model.config), "model_type": "electra", "architectures": [architecture],
              "position_embedding_type": "absolute", "tie_word_embeddings": True}
    write_export(directory, config, state, tokenizer_dir, max_length=model.config.max_position_embeddings,
                 tokenizer_class="ElectraTokenizer")


__all__ = ["export_discriminator", "export_generator", "load_config", "load_discriminator"]
