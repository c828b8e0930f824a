"""Hugging Face interop for ALBERT: export ours as a directory ``transformers.AlbertForPreTraining`` loads, and
load any ALBERT directory (config.json + safetensors or .bin) into ours.

Parameter names already match ``transformers``' ``AlbertForPreTraining``, so conversion only deals with the
differences between checkpoints: the tied decoder (weight = the word embeddings, bias = ``predictions.bias``) is
stored once, older files carry ``position_ids`` buffers, an encoder-only ``AlbertModel`` has no ``albert.`` prefix
and no heads. Reading weights (safetensors, or a ``.bin`` as weights only) and the NaN/inf check are
``pretrain.hf_compat``'s.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch

from common.errors import storage_failure
from pretrain.albert import AlbertConfig, AlbertForPreTraining
from pretrain.checkpoints import CheckpointError
from pretrain.hf_compat import load_weights, non_finite

_TIED = ("predictions.decoder.weight", "predictions.decoder.bias")  # stored once, as transformers saves them
_BUFFERS = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")
_PREFIXES = ("albert.", "predictions.", "sop_classifier.")


def load_albert_config(directory: str | Path) -> AlbertConfig:
    """The ``AlbertConfig`` of a Hugging Face ALBERT directory's config.json (keys we do not model are ignored)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json; pass a Hugging Face ALBERT directory")
    raw = json.loads(path.read_text())
    if raw.get("model_type") != "albert":
        raise CheckpointError(f"{path}: model_type {raw.get('model_type')!r} is not 'albert'; load a BERT directory "
                              "with pretrain.hf_compat.load_pretrained")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{path}: only absolute position embeddings are supported")
    known = {f.name for f in dataclasses.fields(AlbertConfig)}
    try:
        return AlbertConfig(**{k: v for k, v in raw.items() if k in known})
    except ValueError as error:
        raise CheckpointError(f"{path}: {error}") from None


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
    """Write ``config.json`` and ``model.safetensors`` (SOP head kept) that ``transformers`` loads.

    As ``pretrain.hf_compat.export``: with ``tokenizer_dir`` the tokenizer goes along (``tokenizer/`` in our
    format; a WordPiece vocabulary also as ``vocab.txt`` + a ``BertTokenizer`` config). Weights holding NaN or inf
    are refused. The files are written into ``<directory>.partial``, renamed to ``directory`` at the end, so a kill
    midway never leaves a half-written ``directory``; a write that fails for want of space or permission removes
    it and raises a one-line ``StorageError``.
    """
    directory = Path(directory)
    if directory.is_dir() and any(directory.iterdir()) and not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: not empty and not an earlier export, which the export would replace; "
                              "pass a new or empty directory")
    bad = non_finite(model.state_dict())
    if bad:
        raise CheckpointError(f"{directory}: not exported: {len(bad)} weight tensors hold NaN or inf (first "
                              f"{bad[0]}); export an earlier checkpoint of the run")
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an export that was killed
    try:
        partial.mkdir(parents=True)
        _write_export(model, partial, tokenizer_dir)
    except Exception as error:
        failure = storage_failure(error, path=directory, doing="writing the Hugging Face export",
                                  note="the checkpoint is untouched: export it again")
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


def hf_config(cfg: AlbertConfig) -> dict:
    """config.json for ``transformers``: our fields (its names) and the model type. No bos/eos ids: ALBERT's
    defaults (2, 3) name SentencePiece pieces that are other tokens in our vocabularies, and the encoder uses none."""
    return {**dataclasses.asdict(cfg), "model_type": "albert", "architectures": ["AlbertForPreTraining"],
            "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": None}


def _write_export(model: AlbertForPreTraining, directory: Path, tokenizer_dir: str | Path | None) -> None:
    from safetensors.torch import save_file

    (directory / "config.json").write_text(json.dumps(hf_config(model.config), indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in _TIED}
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


__all__ = ["export_albert", "hf_config", "load_albert", "load_albert_config", "to_albert_state_dict"]
