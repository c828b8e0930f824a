"""Hugging Face interop for ALBERT: export ours as a directory ``transformers.AlbertForPreTraining`` loads, and
load any ALBERT directory (config.json + safetensors or .bin) into ours.

Parameter names already match ``transformers``' ``AlbertForPreTraining``, so conversion only deals with the
differences between checkpoints: the tied decoder (weight = the word embeddings, bias = ``predictions.bias``) is
stored once, older files carry ``position_ids`` buffers, an encoder-only ``AlbertModel`` has no ``albert.`` prefix
and no heads. Reading weights (safetensors, or a ``.bin`` as weights only) and the NaN/inf check are
``models.hf_io``'s.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from common.errors import CheckpointError
from models.albert.model import AlbertConfig, AlbertForPreTraining
from models.hf_io import load_weights, non_finite, read_config, write_export

_TIED = ("predictions.decoder.weight", "predictions.decoder.bias")  # stored once, as transformers saves them
_BUFFERS = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")
_PREFIXES = ("albert.", "predictions.", "sop_classifier.")


def load_albert_config(directory: str | Path) -> AlbertConfig:
    """The ``AlbertConfig`` of a Hugging Face ALBERT directory's config.json (``models.hf_io.read_config``)."""
    return read_config(directory, "albert", AlbertConfig)


def to_albert_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys of our ``AlbertForPreTraining`` from an HF ``AlbertForPreTraining``/``AlbertModel``/``AlbertForMaskedLM``,
    without the tied copies and buffers."""
    out = {}
    for key, value in state.items():
        if not key.startswith(_PREFIXES):
            key = "albert." + key  # an encoder-only AlbertModel checkpoint
        if key.endswith(("LayerNorm.gamma", "LayerNorm.beta")):  # the original TF-converted names
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key not in _TIED and key not in _BUFFERS:
            out[key] = value
    if "predictions.bias" not in out and "predictions.decoder.bias" in state:
        out["predictions.bias"] = state["predictions.decoder.bias"]  # files that kept only the decoder's name
    return out


def load_albert(directory: str | Path) -> tuple[AlbertForPreTraining, list[str]]:
    """Our model with the directory's weights; returns it and the names of freshly initialised parameters.

    Encoder weights must all be present; the pretraining heads may be missing (an encoder-only or masked-LM
    checkpoint), in which case they keep their initialisation and are listed. Weights holding NaN or inf are
    refused: training or finetuning from them could only diverge.
    """
    cfg = load_albert_config(directory)
    state = to_albert_state_dict(load_weights(directory))
    bad = non_finite(state)
    if bad:
        raise CheckpointError(f"{directory}: not loaded: {len(bad)} weight tensors hold NaN or inf (first {bad[0]}); "
                              "export an earlier checkpoint of the run")
    model = AlbertForPreTraining(cfg)
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # shapes that disagree with config.json
        first = str(error).strip().splitlines()[-1].strip()
        raise CheckpointError(f"{directory}: weights do not match its config.json ({first}); the directory mixes "
                              "files of two models: export or download it again") from None
    missing = [k for k in result.missing_keys if k not in _TIED]
    encoder_missing = [k for k in missing if k.startswith("albert.")]
    if result.unexpected_keys or encoder_missing:
        raise CheckpointError(f"{directory}: weights do not match an ALBERT of this config: unexpected "
                              f"{result.unexpected_keys[:5]}, missing {encoder_missing[:5]}")
    return model, missing


def export_albert(model: AlbertForPreTraining, directory: str | Path, tokenizer_dir: str | Path | None = None) -> None:
    """Write ``config.json`` and ``model.safetensors`` (SOP head kept) that ``transformers`` loads, with the
    tokenizer, as ``models.hf_io.write_export`` writes every export (whole or not at all; NaN/inf refused)."""
    state = {k: v for k, v in model.state_dict().items() if k not in _TIED}
    write_export(directory, hf_config(model.config), state, tokenizer_dir,
                 max_length=model.config.max_position_embeddings)


def hf_config(cfg: AlbertConfig) -> dict:
    """config.json for ``transformers``: our fields (its names) and the model type. No bos/eos ids: ALBERT's
    defaults (2, 3) name SentencePiece pieces that are other tokens in our vocabularies, and the encoder uses none."""
    return {**dataclasses.asdict(cfg), "model_type": "albert", "architectures": ["AlbertForPreTraining"],
            "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": None}


__all__ = ["export_albert", "hf_config", "load_albert", "load_albert_config", "to_albert_state_dict"]
