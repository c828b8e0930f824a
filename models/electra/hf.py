"""Hugging Face interop for ELECTRA: export our discriminator (or generator) as a ``transformers`` directory, and
load the encoder of one (ours or Google's ``electra-*-discriminator``) for finetuning.

A pretraining run exports the pair (``export_pair``): the discriminator, what finetuning reads, as the directory
itself, and the generator in its ``generator/`` subdirectory (``ElectraForMaskedLM``, e.g. for a fill-mask
pipeline). ``load_pair`` reads such a directory back to continue pretraining (``model.init_from``).

Names already match ``transformers``' ``ElectraForPreTraining`` / ``ElectraForMaskedLM``, so the export writes the
state dict as it is; the reading, the non-finite check and the storage errors are ``models.hf_io``'s.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from common.errors import CheckpointError
from models.electra.model import (
    ElectraConfig,
    ElectraDiscriminator,
    ElectraGenerator,
    ElectraModel,
    ElectraPair,
    ElectraPairConfig,
    generator_config,
)
from models.hf_io import ExportPart, is_complete, load_weights, non_finite, read_config, write_export

_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")  # older files store them; ours are computed
GENERATOR = "generator"  # the generator's subdirectory of a pair's export (the family's ``export_parts``)
_TIED_HEAD = "generator_lm_head.weight"  # the word embeddings, stored once


def export_discriminator(model: ElectraPair | ElectraDiscriminator, directory: str | Path,
                         tokenizer_dir: str | Path | None = None) -> None:
    """Write ``config.json`` (``model_type`` electra, ``ElectraForPreTraining``) and ``model.safetensors`` that
    ``transformers.ElectraForPreTraining.from_pretrained`` (and ``AutoModel``) load; the tokenizer goes along
    as in ``models.bert.hf.export``. Non-finite weights are refused; the directory appears whole or not at all
    (written as ``<directory>.partial``, then renamed)."""
    discriminator = model.discriminator if isinstance(model, ElectraPair) else model
    _export(directory, tokenizer_dir, _discriminator_part(discriminator))


def export_generator(model: ElectraPair | ElectraGenerator, directory: str | Path,
                     tokenizer_dir: str | Path | None = None) -> None:
    """The generator as ``ElectraForMaskedLM`` (its output layer stored once, tied to the word embeddings)."""
    generator = model.generator if isinstance(model, ElectraPair) else model
    _export(directory, tokenizer_dir, _generator_part(generator))


def export_pair(model: ElectraPair, directory: str | Path, tokenizer_dir: str | Path | None = None) -> None:
    """The discriminator as ``directory`` and the generator as ``directory/generator``, both with the tokenizer,
    published together by one rename (``write_export``'s ``parts``): a kill midway leaves the earlier export whole,
    or none, never a discriminator without its generator."""
    _export(directory, tokenizer_dir, _discriminator_part(model.discriminator),
            {GENERATOR: _generator_part(model.generator)})


def pair_config(directory: str | Path, generator_fraction: float | None, fallback_fraction: float) -> ElectraPairConfig:
    """The pair of an ELECTRA directory: its discriminator and the generator of its ``generator/`` subdirectory,
    else one of ``generator_fraction`` (``fallback_fraction`` when None) of the discriminator's width."""
    discriminator, generator_dir = load_config(directory), Path(directory) / GENERATOR
    if not is_complete(generator_dir):
        fraction = fallback_fraction if generator_fraction is None else generator_fraction
        return ElectraPairConfig.from_discriminator(discriminator, fraction)
    generator = load_config(generator_dir)
    if generator_fraction is not None and generator != generator_config(discriminator, generator_fraction):
        raise CheckpointError(f"{generator_dir}: its generator is {generator.hidden_size} wide, not "
                              f"electra.generator_fraction {generator_fraction:g} of {discriminator.hidden_size}; "
                              "leave electra.generator_fraction unset to continue with it")
    try:
        return ElectraPairConfig(discriminator=discriminator, generator=generator)
    except ValueError as error:
        raise CheckpointError(f"{generator_dir}: {error}") from None


def load_pair(directory: str | Path, generator_fraction: float | None = None,
              fallback_fraction: float = 0.25) -> tuple[ElectraPair, list[str]]:
    """The pair of ``directory`` (``pair_config``) with its weights, and the names of what was initialised fresh:
    the generator when the directory has none (a released ``electra-*-discriminator``: a new generator learns
    beside it, sharing its embeddings). A generator whose embeddings are not the discriminator's is refused:
    the two share one table, so it is not the pair of this discriminator."""
    directory = Path(directory)
    pair = ElectraPair(pair_config(directory, generator_fraction, fallback_fraction))
    discriminator = _read_state(directory, drop=("generator_",))
    _load_strict(pair.discriminator, discriminator, directory, allowed_missing=())
    generator_dir = directory / GENERATOR
    if not is_complete(generator_dir):
        return pair, [f"the generator (no {generator_dir}; its embeddings are the discriminator's)"]
    generator = _read_state(generator_dir, drop=(_TIED_HEAD,))
    shared = [k for k in generator if k.startswith("electra.embeddings.")]
    differ = [k for k in shared if k not in discriminator or not torch.equal(generator[k], discriminator[k])]
    if differ:
        raise CheckpointError(f"{generator_dir}: its embeddings ({differ[0]}) are not the discriminator's in "
                              f"{directory}; pass the directory of one ELECTRA pair (our run's hf/)")
    _load_strict(pair.generator, {k: v for k, v in generator.items() if k not in shared}, generator_dir,
                 allowed_missing=(*(f"electra.embeddings.{k}" for k in pair.embeddings.state_dict()), _TIED_HEAD))
    return pair, []


def _read_state(directory: Path, drop: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The directory's weights without the computed buffers and the ``drop`` prefixes, finite or refused."""
    state = {k: v for k, v in load_weights(directory).items()
             if not k.startswith(drop) and not k.endswith(_BUFFERS)}
    bad = non_finite(state)
    if bad:
        raise CheckpointError(f"{directory}: {len(bad)} weight tensors hold NaN or inf (first {bad[0]}); export an "
                              "earlier checkpoint of the run")
    return state


def _load_strict(module: nn.Module, state: dict[str, torch.Tensor], directory: Path,
                 allowed_missing: tuple[str, ...]) -> None:
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise CheckpointError(f"{directory}: weights do not fit its config.json "
                              f"({str(error).splitlines()[-1].strip()})") from None
    missing = [k for k in result.missing_keys if k not in allowed_missing]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"{directory}: weights do not match an ELECTRA model of its config.json: unexpected "
                              f"{result.unexpected_keys[:5]}, missing {missing[:5]}")


def load_config(directory: str | Path) -> ElectraConfig:
    """The ``ElectraConfig`` of a Hugging Face ELECTRA directory's config.json (``models.hf_io.read_config``)."""
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


def _discriminator_part(discriminator: ElectraDiscriminator) -> ExportPart:
    return _part(discriminator, "ElectraForPreTraining", discriminator.state_dict())


def _generator_part(generator: ElectraGenerator) -> ExportPart:
    state = {k: v for k, v in generator.state_dict().items() if k != _TIED_HEAD}  # the word embeddings, stored once
    return _part(generator, "ElectraForMaskedLM", state)


def _part(model: nn.Module, architecture: str, state: dict[str, torch.Tensor]) -> ExportPart:
    config = {**dataclasses.asdict(model.config), "model_type": "electra", "architectures": [architecture],
              "position_embedding_type": "absolute", "tie_word_embeddings": True}
    return ExportPart(config, state, model.config.max_position_embeddings, tokenizer_class="ElectraTokenizer")


def _export(directory: str | Path, tokenizer_dir: str | Path | None, main: ExportPart,
            parts: dict[str, ExportPart] | None = None) -> None:
    write_export(directory, main.config, main.state, tokenizer_dir, max_length=main.max_length,
                 tokenizer_class=main.tokenizer_class, parts=parts)


__all__ = ["GENERATOR", "export_discriminator", "export_generator", "export_pair", "load_config", "load_discriminator",
           "load_pair", "pair_config"]
