"""Hugging Face interop for DeBERTa-v3: export our discriminator (and generator) as ``transformers`` directories and
load the encoder of one (ours or Microsoft's ``deberta-v3-*``) for finetuning.

A pretraining run exports the pair (``export_pair``): the discriminator as the directory itself, its word
embeddings E_G + E_Delta (GDES), its replaced-token head as ``mask_predictions.*`` beside ``deberta.*`` (as in
Microsoft's releases, whose config.json names no architecture: ``AutoModel`` loads the encoder and ignores the
head); the generator as ``DebertaV2ForMaskedLM`` (``legacy: false``, head ``lm_predictions.lm_head``) in
``generator/``. ``load_pair`` reads such a directory back to continue pretraining (``model.init_from``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from common.errors import CheckpointError
from models.deberta_v2.model import DebertaV2Config, DebertaV2ForReplacedTokenDetection, DebertaV2Model
from models.deberta_v2.pair import GENERATOR_DEPTH, DebertaPair, DebertaPairConfig, generator_config
from models.hf_io import (
    ExportPart,
    config_from_dict,
    is_complete,
    load_weights,
    non_finite,
    read_json_object,
    write_export,
)

MODEL_TYPE = "deberta-v2"
GENERATOR = "generator"  # the generator's subdirectory of a pair's export (the family's ``export_parts``)
_WORDS = "deberta.embeddings.word_embeddings"
_HEADS = ("lm_predictions.", "mask_predictions.", "cls.", "pooler.", "classifier.", "qa_outputs.")


def load_config(directory: str | Path) -> DebertaV2Config:
    """The ``DebertaV2Config`` of a DeBERTa-v2/v3 directory's config.json (``pos_att_type`` as "p2c|c2p" or a
    list); the v2 variants this encoder does not implement (a convolution layer, a factorised embedding) refused."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json; pass a Hugging Face DeBERTa-v2 directory")
    raw = read_json_object(path)
    if isinstance(raw.get("pos_att_type"), str):
        raw["pos_att_type"] = [kind.strip() for kind in raw["pos_att_type"].lower().split("|") if kind.strip()]
    if raw.get("conv_kernel_size", 0) or raw.get("embedding_size", raw.get("hidden_size")) != raw.get("hidden_size"):
        raise CheckpointError(f"{path}: conv_kernel_size or an embedding_size other than hidden_size (DeBERTa-v2 "
                              "xlarge/xxlarge) is not implemented; pass a DeBERTa-v3 directory")
    try:
        return config_from_dict(raw, path, MODEL_TYPE, DebertaV2Config)
    except ValueError as error:  # the dataclass's own checks (an attention variant not implemented)
        raise CheckpointError(f"{path}: {error}") from None


def _read_state(directory: Path) -> dict[str, torch.Tensor]:
    state = {k: v for k, v in load_weights(directory).items() if not k.endswith("embeddings.position_ids")}
    bad = non_finite(state)
    if bad:
        raise CheckpointError(f"{directory}: {len(bad)} weight tensors hold NaN or inf (first {bad[0]}); export an "
                              "earlier checkpoint of the run")
    return state


def _load_strict(module: nn.Module, state: dict[str, torch.Tensor], directory: Path,
                 allowed_missing: tuple[str, ...] = ()) -> None:
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise CheckpointError(f"{directory}: weights do not fit its config.json "
                              f"({str(error).splitlines()[-1].strip()})") from None
    missing = [k for k in result.missing_keys if k not in allowed_missing]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"{directory}: weights do not match a DeBERTa-v2 model of its config.json: unexpected "
                              f"{result.unexpected_keys[:5]}, missing {missing[:5]}")


def load_encoder(directory: str | Path) -> DebertaV2Model:
    """The encoder (embeddings and layers) of a DeBERTa-v2 directory, every weight from the file; heads (ours,
    transformers' task heads) are left out, and so is a stored absolute position table the config does not use."""
    directory = Path(directory)
    cfg = load_config(directory)
    encoder = DebertaV2Model(cfg)
    state = {}
    for key, value in _read_state(directory).items():
        if key.startswith(_HEADS):
            continue
        key = key.removeprefix("deberta.")
        if key == "embeddings.position_embeddings.weight" and not cfg.position_biased_input:
            continue
        state[key] = value
    _load_strict(encoder, state, directory)
    return encoder


def pair_config(directory: str | Path) -> DebertaPairConfig:
    """The pair of a DeBERTa-v3 directory: its discriminator and the generator of ``generator/``, else one of
    half its depth."""
    discriminator, generator_dir = load_config(directory), Path(directory) / GENERATOR
    generator = load_config(generator_dir) if is_complete(generator_dir) else None
    try:
        return DebertaPairConfig(discriminator, generator or generator_config(discriminator, GENERATOR_DEPTH))
    except ValueError as error:
        raise CheckpointError(f"{generator_dir}: {error}") from None


def load_pair(directory: str | Path) -> tuple[DebertaPair, list[str]]:
    """The pair of ``directory`` with its weights (E_Delta = the discriminator's table - the generator's), and the
    names of what was initialised fresh: the generator when there is none (Microsoft's releases hold the
    discriminator only): it starts from the discriminator's word embeddings, E_Delta from zero."""
    directory = Path(directory)
    pair = DebertaPair(pair_config(directory))
    discriminator = _read_state(directory)
    words = discriminator.pop(f"{_WORDS}.weight")
    generator_dir = directory / GENERATOR
    fresh = []
    if is_complete(generator_dir):
        generator = _read_state(generator_dir)
        _load_strict(pair.generator, generator, generator_dir)
    else:
        fresh = [f"the generator (no {generator_dir}; it starts from the discriminator's word embeddings)"]
        with torch.no_grad():
            pair.generator.deberta.embeddings.word_embeddings.weight.copy_(words)
    discriminator[f"{_WORDS}.delta"] = words - pair.generator.deberta.embeddings.word_embeddings.weight.detach()
    if not pair.config.discriminator.position_biased_input:
        discriminator.pop("deberta.embeddings.position_embeddings.weight", None)
    _load_strict(pair.discriminator, discriminator, directory)
    return pair, fresh


def discriminator_state(discriminator: DebertaV2ForReplacedTokenDetection) -> dict[str, torch.Tensor]:
    """Its state dict as a standalone model holds it: a GDES table (``delta``) as E_G + E_Delta, under ``weight``."""
    state = dict(discriminator.state_dict())
    delta = state.pop(f"{_WORDS}.delta", None)
    if delta is not None:
        state[f"{_WORDS}.weight"] = discriminator.deberta.embeddings.word_embeddings.weight.detach()
    return state


def _part(cfg: DebertaV2Config, state: dict[str, torch.Tensor], architectures: list[str] | None) -> ExportPart:
    config = {**dataclasses.asdict(cfg), "model_type": MODEL_TYPE, "legacy": False, "tie_word_embeddings": True}
    if architectures:
        config["architectures"] = architectures
    return ExportPart(config, state, cfg.max_position_embeddings, tokenizer_class="BertTokenizer")


def export_pair(model: DebertaPair, directory: str | Path, tokenizer_dir: str | Path | None = None) -> None:
    """The discriminator as ``directory`` and the generator as ``directory/generator``, each with the tokenizer,
    published together by one rename (``write_export``'s ``parts``). Non-finite weights are refused."""
    main = _part(model.config.discriminator, discriminator_state(model.discriminator), None)
    generator = _part(model.config.generator, dict(model.generator.state_dict()), ["DebertaV2ForMaskedLM"])
    write_export(directory, main.config, main.state, tokenizer_dir, max_length=main.max_length,
                 tokenizer_class=main.tokenizer_class, parts={GENERATOR: generator})


def export_discriminator(model: DebertaPair | DebertaV2ForReplacedTokenDetection, directory: str | Path,
                         tokenizer_dir: str | Path | None = None) -> None:
    """The discriminator alone (what finetuning reads), as ``export_pair`` writes it."""
    discriminator = model.discriminator if isinstance(model, DebertaPair) else model
    main = _part(discriminator.config, discriminator_state(discriminator), None)
    write_export(directory, main.config, main.state, tokenizer_dir, max_length=main.max_length,
                 tokenizer_class=main.tokenizer_class)


__all__ = ["GENERATOR", "MODEL_TYPE", "discriminator_state", "export_discriminator", "export_pair", "load_config",
           "load_encoder", "load_pair", "pair_config"]
