"""Hugging Face interop for ELECTRA: export our discriminator (or generator) as a ``transformers`` directory, and
load the encoder of one (ours or Google's ``electra-*-discriminator``) for finetuning.

Names already match ``transformers``' ``ElectraForPreTraining`` / ``ElectraForMaskedLM``, so the export writes the
state dict as it is; the reading, the non-finite check and the storage errors are ``pretrain.hf_compat``'s.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from common.errors import storage_failure
from pretrain.checkpoints import CheckpointError
from pretrain.electra import ElectraConfig, ElectraDiscriminator, ElectraGenerator, ElectraModel, ElectraPair
from pretrain.hf_compat import load_weights, non_finite

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
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json; pass a Hugging Face ELECTRA directory")
    raw = json.loads(path.read_text())
    if raw.get("model_type") != "electra":
        raise CheckpointError(f"{path}: model_type {raw.get('model_type')!r} is not 'electra'; load a BERT with "
                              "pretrain.hf_compat.load_pretrained")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{path}: only absolute position embeddings are supported")
    known = {f.name for f in dataclasses.fields(ElectraConfig)}
    return ElectraConfig(**{k: v for k, v in raw.items() if k in known})


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
    directory = Path(directory)
    if directory.is_dir() and any(directory.iterdir()) and not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: not empty and not an earlier export, which the export would replace; "
                              "pass a new or empty directory")
    bad = non_finite(state)
    if bad:
        raise CheckpointError(f"{directory}: not exported: {len(bad)} weight tensors hold NaN or inf (first "
                              f"{bad[0]}); export an earlier checkpoint of the run")
    _publish(directory, lambda partial: _write(model.config, architecture, state, partial, tokenizer_dir))


def _publish(directory: Path, write: Callable[[Path], None]) -> None:
    """``write`` into ``<directory>.partial``, then rename it to ``directory`` (replacing an earlier export), so a
    kill midway never leaves a half-written ``directory``; a write that fails for want of space or permission
    removes the partial copy and raises a one-line ``StorageError`` (as ``pretrain.hf_compat.export``)."""
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an export that was killed
    try:
        partial.mkdir(parents=True)
        write(partial)
    except Exception as error:
        failure = storage_failure(error, path=directory, doing="writing the Hugging Face export",
                                  note="the model is untouched: export it again")
        if failure is None:
            raise
        shutil.rmtree(partial, ignore_errors=True)  # gives back the space it took
        raise failure from error
    replaced = directory.with_name(directory.name + ".replaced")
    shutil.rmtree(replaced, ignore_errors=True)
    if directory.exists():
        os.rename(directory, replaced)  # a directory cannot be renamed over a non-empty one
    os.rename(partial, directory)
    shutil.rmtree(replaced, ignore_errors=True)


def _write(cfg: ElectraConfig, architecture: str, state: dict[str, torch.Tensor], directory: Path,
           tokenizer_dir: str | Path | None) -> None:
    from safetensors.torch import save_file

    config = {**dataclasses.asdict(cfg), "model_type": "electra", "architectures": [architecture],
              "position_embedding_type": "absolute", "tie_word_embeddings": True}
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    if tokenizer_dir is not None:
        tokenizer_dir = Path(tokenizer_dir)
        shutil.copytree(tokenizer_dir, directory / "tokenizer", dirs_exist_ok=True)
        meta = json.loads((tokenizer_dir / "tokenizer.json").read_text())
        if (tokenizer_dir / "vocab.txt").is_file():
            shutil.copyfile(tokenizer_dir / "vocab.txt", directory / "vocab.txt")
            lower = bool(meta.get("lowercase", True))
            (directory / "tokenizer_config.json").write_text(json.dumps(
                {"tokenizer_class": "ElectraTokenizer", "do_lower_case": lower,
                 "strip_accents": None if lower else False, "model_max_length": cfg.max_position_embeddings},
                indent=2) + "\n")


__all__ = ["export_discriminator", "export_generator", "load_config", "load_discriminator"]
