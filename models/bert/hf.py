"""BERT's Hugging Face interop: load any BERT directory (config.json + safetensors or .bin) and export ours.

Parameter names already match ``transformers``' ``BertForPreTraining``, so conversion only deals with
the differences between checkpoints: an encoder-only ``BertModel`` has no ``bert.`` prefix and no heads,
older files carry a ``position_ids`` buffer, and the tied decoder is stored once.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from common.errors import CheckpointError
from models.bert.model import BertConfig, BertForPreTraining
from models.hf_io import load_weights, read_config, write_export

_TIED_OR_BUFFERS = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def load_config(directory: str | Path) -> BertConfig:
    return read_config(directory, "bert", BertConfig)


def to_pretraining_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys of our ``BertForPreTraining`` from an HF ``BertForPreTraining``/``BertModel``/``BertForMaskedLM``."""
    out = {}
    for key, value in state.items():
        if not key.startswith(("bert.", "cls.")):
            key = "bert." + key  # an encoder-only BertModel checkpoint
        if key.endswith(("LayerNorm.gamma", "LayerNorm.beta")):  # the original TF-converted names
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key not in _TIED_OR_BUFFERS:
            out[key] = value
    return out


def load_pretrained(directory: str | Path) -> tuple[BertForPreTraining, list[str]]:
    """Our model with the directory's weights; returns it and the names of freshly initialised parameters.

    Encoder weights must all be present; the pretraining heads may be missing (an encoder-only
    checkpoint), in which case they keep their initialisation and are listed.
    """
    cfg = load_config(directory)
    model = BertForPreTraining(cfg)
    state = to_pretraining_state_dict(load_weights(directory))
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k != "cls.predictions.decoder.weight"]
    if result.unexpected_keys or any(k.startswith("bert.") for k in missing):
        raise CheckpointError(f"{directory}: weights do not match a BERT of this config: unexpected "
                              f"{result.unexpected_keys[:5]}, missing {[k for k in missing if k.startswith('bert.')][:5]}")
    return model, missing


def export(model: BertForPreTraining, directory: str | Path, tokenizer_dir: str | Path | None = None) -> None:
    """Write ``config.json`` and ``model.safetensors`` (NSP head kept) that ``transformers`` loads (``write_export``).

    With ``tokenizer_dir`` (a tokenizer saved by the preprocessing stage) the tokenizer goes along:
    as ``tokenizer/`` in our format, and as the files ``transformers``' ``AutoTokenizer`` reads
    (``models.hf_tokenizer``: a WordPiece ``vocab.txt``, or a SentencePiece model's ``tokenizer.json``).
    """
    config = {**dataclasses.asdict(model.config), "model_type": "bert", "architectures": ["BertForPreTraining"],
              "position_embedding_type": "absolute", "tie_word_embeddings": True}
    state = {k: v for k, v in model.state_dict().items()
             if k != "cls.predictions.decoder.weight"}  # tied to the word embeddings; stored once
    write_export(directory, config, state, tokenizer_dir, max_length=model.config.max_position_embeddings,
                 note="the checkpoint is untouched: export it again with `python -m pretrain.export`")
