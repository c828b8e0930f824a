"""Hugging Face interop: load any BERT directory (config.json + safetensors or .bin) and export ours.

Parameter names already match ``transformers``' ``BertForPreTraining``, so conversion only deals with
the differences between checkpoints: an encoder-only ``BertModel`` has no ``bert.`` prefix and no heads,
older files carry a ``position_ids`` buffer, and the tied decoder is stored once.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from pretrain.model import BertConfig, BertForPreTraining

_TIED_OR_BUFFERS = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


class CheckpointError(ValueError):
    """A directory that is not a loadable BERT checkpoint; the message names it and what is wrong."""


def load_config(directory: str | Path) -> BertConfig:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json; pass a Hugging Face BERT directory")
    raw = json.loads(path.read_text())
    if raw.get("model_type", "bert") != "bert":
        raise CheckpointError(f"{path}: model_type {raw.get('model_type')!r} is not 'bert'")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{path}: only absolute position embeddings are supported")
    known = {f.name for f in dataclasses.fields(BertConfig)}
    return BertConfig(**{k: v for k, v in raw.items() if k in known})


def load_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    directory = Path(directory)
    if (directory / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(directory / "model.safetensors"))
    if (directory / "pytorch_model.bin").is_file():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise CheckpointError(f"{directory}: neither model.safetensors nor pytorch_model.bin found")


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
    """Write ``config.json`` and ``model.safetensors`` (NSP head kept) that ``transformers`` loads.

    With ``tokenizer_dir`` (a tokenizer saved by the preprocessing stage) the tokenizer goes along:
    as ``tokenizer/`` in our format, and, for a WordPiece vocabulary, also as the ``vocab.txt`` and
    ``tokenizer_config.json`` that ``transformers``' ``BertTokenizer`` reads.
    """
    import shutil

    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {**dataclasses.asdict(model.config), "model_type": "bert", "architectures": ["BertForPreTraining"],
              "position_embedding_type": "absolute", "tie_word_embeddings": True}
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()
             if k != "cls.predictions.decoder.weight"}  # tied to the word embeddings; stored once
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer_dir is not None:
        tokenizer_dir = Path(tokenizer_dir)
        shutil.copytree(tokenizer_dir, directory / "tokenizer", dirs_exist_ok=True)
        meta = json.loads((tokenizer_dir / "tokenizer.json").read_text())
        if (tokenizer_dir / "vocab.txt").is_file():
            shutil.copyfile(tokenizer_dir / "vocab.txt", directory / "vocab.txt")
            lower = bool(meta.get("lowercase", True))
            (directory / "tokenizer_config.json").write_text(json.dumps(
                {"tokenizer_class": "BertTokenizer", "do_lower_case": lower, "strip_accents": None if lower else False,
                 "model_max_length": model.config.max_position_embeddings}, indent=2) + "\n")
