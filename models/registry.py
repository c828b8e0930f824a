"""The model families by their Hugging Face ``model_type``: what pretraining, export and finetuning ask of a family
they know only by name.

A family is a subpackage of ``models`` whose ``__init__`` defines ``FAMILY``, a ``ModelFamily``; ``MODEL_TYPES``
lists the subpackages in this folder (a ``-`` of the ``model_type`` is a ``_`` in the folder's name: ``deberta_v2``
holds ``deberta-v2``), so adding a family adds a folder here (and its training glue in
``pretrain/families/``), nothing in this file. The family packages are imported only when asked for.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import models

if TYPE_CHECKING:  # the registry itself loads no torch: configs validate family names with it
    from torch import nn


@dataclass(frozen=True)
class ModelFamily:
    """One family, as the stages outside ``models`` use it."""

    model_type: str                                   # config.json's model_type, and the folder's name
    load_config: Callable[[str | Path], object]       # a Hugging Face directory's config as the family's dataclass
    load_encoder: Callable[[str | Path], nn.Module]   # its encoder, pretraining heads dropped
    encoder_class: type                               # what ``load_encoder`` gives
    pooled: bool                                      # whether the family's sequence head reads the pooled [CLS]
    export_parts: tuple[str, ...] = ()                # further networks a run's export holds in subdirectories
    context_pooler: bool = False                      # not pooled: the sequence head pools [CLS] itself (DeBERTa)
    encoder_prefix: str = ""                          # transformers' name of the encoder if not model_type


def _discover() -> tuple[str, ...]:
    names = [info.name.replace("_", "-") for info in pkgutil.iter_modules(models.__path__) if info.ispkg]
    return tuple(sorted(names, key=lambda name: (name != "bert", name)))  # BERT, the reference, first


MODEL_TYPES = _discover()


def family(model_type: str) -> ModelFamily:
    """The family of ``model_type``; a ``ValueError`` naming the known ones for any other."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not one of {', '.join(MODEL_TYPES)}")
    return importlib.import_module(f"models.{module_name(model_type)}").FAMILY


def module_name(model_type: str) -> str:
    """The folder (and module) name of ``model_type``: ``deberta-v2`` lives in ``models/deberta_v2``."""
    return model_type.replace("-", "_")


def of_encoder(encoder: nn.Module) -> ModelFamily:
    """The family whose ``encoder_class`` ``encoder`` is; a ``TypeError`` naming them for anything else."""
    for model_type in MODEL_TYPES:
        if type(encoder) is family(model_type).encoder_class:
            return family(model_type)
    raise TypeError(f"{type(encoder).__name__} is not an encoder of a model family; give one of "
                    f"{', '.join(family(t).encoder_class.__name__ for t in MODEL_TYPES)}")


__all__ = ["MODEL_TYPES", "ModelFamily", "family", "module_name", "of_encoder"]
